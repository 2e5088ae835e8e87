// Standard output, checked: a command whose results cannot be written (a full disk, a closed stream, an
// I/O error) must not exit 0 with them lost. stdio keeps only an error flag, and the buffer of a failed
// write is dropped, so a later flush succeeds and the reason would be gone by the time the command ends:
// every flush goes through flush_stdout, which keeps the reason of the first failure, and every command
// ends through finish_stdout. Header-only, as the benchmark plumbing that prints records (bench_util.cpp)
// is also linked without the rest of the CLI.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli_args.h"

namespace embscale {
namespace tools {

// errno of the first failed flush of standard output (0: none failed).
inline int& stdout_errno() {
  static int first = 0;
  return first;
}

inline void flush_stdout() {
  if (std::fflush(stdout) != 0 && stdout_errno() == 0) stdout_errno() = errno != 0 ? errno : EIO;
}

// The exit status of `command` once its output is flushed: `status`, or, when a write to standard output
// failed, kExitFailed (a failed run keeps its own status) after one line on stderr,
// "error: <command>: error writing standard output: <reason>".
inline int finish_stdout(int status, const std::string& command) {
  flush_stdout();
  if (!std::ferror(stdout)) return status;
  const int e = stdout_errno();
  std::fprintf(stderr, "error: %s: error writing standard output%s%s\n", command.c_str(), e != 0 ? ": " : "",
               e != 0 ? std::strerror(e) : "");
  return status != 0 ? status : kExitFailed;
}

}  // namespace tools
}  // namespace embscale
