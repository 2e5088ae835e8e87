// Fuzzer of the C API (embscale/embscale_c.h): seeded random calls of every public function with
// hostile and edge arguments, and valid ones, on the CPU backend.
//
//   embscale_fuzz_capi [--cases N] [--seed S] [--case K] [--batch M] [--timeout SEC] [--no-fork] [--verbose]
//
// Case k of a run is generated from (seed, k) alone, so `--seed S --case K` replays one case. Cases run
// in batches in fork()ed children: a crash (signal, sanitizer report) or a hang ends that child only;
// the parent reports the case it was running and goes on with the next one, then exits non-zero if
// any case failed, crashed or hung.
//
// Properties checked for every call:
//  * it returns OK or a documented status code (embscale::StatusCode 0..5);
//  * a refusal comes with a non-empty embscale_last_error() whose text before the first ':' names an
//    argument of the function (or a field of its argument structs);
//  * a call made only of valid arguments succeeds, and one with an argument the library can tell is
//    wrong (a null required pointer, a bad enum, a bad dtype or shape, lengths that do not match,
//    too small a workspace, ...) is refused (with the specific code where one mutation decides it);
//  * inputs are never written; on a refused call the tables (weights) and the optimizer state are
//    unchanged (byte copies compared);
//  * nothing is written outside a buffer (guard bytes, when not built with AddressSanitizer, which
//    catches that itself), no crash, no sanitizer report, no hang.
//
// Every buffer passed is as large as the shape it comes with claims. Shapes whose element or byte count
// overflows 64 bits, or that have a negative extent, come with a small buffer: the library must refuse
// them before touching the data. A too-short buffer comes with its true (short) shape, so the library
// can see the mismatch.

#include "fuzz_capi.h"

namespace fuzz {
namespace {

void case_misc(Case& c) {
  c.op = "embscale_version/backend_available/backend_compiled";
  const int32_t b = c.rng.pick<int32_t>({0, 1, 2, -1, INT32_MIN, INT32_MAX});
  const int a = embscale_backend_available(b), k = embscale_backend_compiled(b);
  if (a != 0 && a != 1) c.fail(fmt("embscale_backend_available(%d) = %d", b, a));
  if (k != 0 && k != 1) c.fail(fmt("embscale_backend_compiled(%d) = %d", b, k));
  if ((b < 0 || b > 1) && (a || k)) c.fail(fmt("backend %d reported as present", b));
  if (b == 0 && !(a && k)) c.fail("the CPU backend is not reported as available");
  const char* v = embscale_version();
  if (v == nullptr || v[0] == '\0') c.fail("embscale_version() is empty");
  if (embscale_last_error() == nullptr) c.fail("embscale_last_error() is NULL");
}

// ---- the case table ---------------------------------------------------------------------------------
struct OpEntry {
  const char* name;
  int weight;
  std::function<void(Case&, bool)> run;
};

const std::vector<OpEntry>& ops() {
  static const std::vector<OpEntry> kOps = {
      {"amax_workspace_size", 2, [](Case& c, bool cu) { case_fp8_workspace_size(c, cu, 0); }},
      {"amax", 5, [](Case& c, bool cu) { case_amax(c, cu); }},
      {"compute_scale", 3, [](Case& c, bool cu) { case_compute_scale(c, cu); }},
      {"quantize", 4, [](Case& c, bool cu) { case_quantize(c, cu, false); }},
      {"dequantize", 4, [](Case& c, bool cu) { case_quantize(c, cu, true); }},
      {"quantize_current_scaling_workspace_size", 2, [](Case& c, bool cu) { case_fp8_workspace_size(c, cu, 1); }},
      {"quantize_current_scaling", 5, [](Case& c, bool cu) { case_quantize_current_scaling(c, cu); }},
      {"activation_amax_workspace_size", 2, [](Case& c, bool cu) { case_fp8_workspace_size(c, cu, 2); }},
      {"activation_amax", 5, [](Case& c, bool cu) { case_activation_amax(c, cu); }},
      {"cast_transpose", 4, [](Case& c, bool cu) { case_cast_transpose(c, cu); }},
      {"tbe_create", 6, [](Case& c, bool cu) { case_tbe_create(c, cu); }},
      {"tbe_forward", 18, [](Case& c, bool cu) { case_tbe_forward(c, cu); }},
      {"tbe_backward_workspace_size", 5, [](Case& c, bool cu) { case_tbe_backward(c, cu, 0); }},
      {"tbe_backward", 18, [](Case& c, bool cu) { case_tbe_backward(c, cu, 1); }},
      {"optimizer_check", 2, [](Case& c, bool) { case_optimizer_check(c); }},
      {"misc", 1, [](Case& c, bool) { case_misc(c); }},
  };
  return kOps;
}

const OpEntry& choose_op(Case& c) {
  int total = 0;
  for (const auto& e : ops()) total += e.weight;
  int r = static_cast<int>(c.rng.below(static_cast<uint64_t>(total)));
  for (const auto& e : ops()) {
    if (r < e.weight) return e;
    r -= e.weight;
  }
  return ops().back();
}

// Generates and runs case k; returns its failures (empty: passed). `start` is told the case's
// description (function and mutations) right before each library call, so a crash can be attributed.
std::vector<std::string> run_case(uint64_t seed, int64_t k, const std::function<void(const std::string&)>& start) {
  Case c(seed, k);
  const OpEntry& e = choose_op(c);
  static const bool cuda = embscale_backend_compiled(1) != 0;
  c.announce = start;
  start(e.name);
  e.run(c, cuda);
  std::vector<std::string> out;
  for (const auto& f : c.failures) out.push_back(c.op + " [" + join(c.muts) + "]: " + f);
  return out;
}

// ---- the driver: batches in fork()ed children -------------------------------------------------------
struct Options {
  int64_t cases = 3000;
  uint64_t seed = 20261201;
  int64_t only = -1;
  int64_t batch = 100;
  int timeout_s = 60;
  bool fork = true;
  bool verbose = false;
};

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = write(fd, s.data() + off, s.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    off += static_cast<size_t>(w);
  }
}

std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  if (s.size() > 600) s = s.substr(0, 600) + "...";
  return s;
}

// Child: runs cases [first, last) and reports on fd: "S k op" when case k starts, "D k description"
// before each library call, "F k text" per failure, "E" at the end.
[[noreturn]] void child_main(const Options& o, int64_t first, int64_t last, int fd) {
  g_tally = [fd](const char* fn, int rc) { write_all(fd, fmt("R %d ", rc) + fn + "\n"); };
  for (int64_t k = first; k < last; ++k) {
    bool started = false;
    auto fails = run_case(o.seed, k, [&](const std::string& what) {
      write_all(fd, fmt("%c %" PRId64 " ", started ? 'D' : 'S', k) + one_line(what) + "\n");
      started = true;
    });
    for (const auto& f : fails) write_all(fd, fmt("F %" PRId64 " ", k) + one_line(f) + "\n");
  }
  write_all(fd, "E\n");
  close(fd);
  std::fflush(nullptr);
  std::exit(0);  // normal exit, so LeakSanitizer checks the batch
}

struct Report {
  std::vector<std::string> failures;
  std::map<std::string, int> crashes_by_op;
};

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return fmt("killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  if (WIFEXITED(status)) return fmt("exited with status %d (a sanitizer report or an exit in the library)", WEXITSTATUS(status));
  return "ended abnormally";
}

int run_forked(const Options& o) {
  Report rep;
  int64_t next = 0;
  std::map<std::string, std::array<int, 7>> tally;  // per function: calls by status code (6: other)
  while (next < o.cases) {
    const int64_t last = std::min(o.cases, next + o.batch);
    int fds[2];
    if (pipe(fds) != 0) {
      std::perror("pipe");
      return 2;
    }
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
      close(fds[0]);
      child_main(o, next, last, fds[1]);
    }
    close(fds[1]);
    std::string pending;
    int64_t current = -1;
    std::string current_op;
    bool ended = false, timed_out = false;
    auto last_progress = std::chrono::steady_clock::now();
    for (;;) {
      pollfd p{fds[0], POLLIN, 0};
      const int pr = poll(&p, 1, 1000);
      if (pr < 0 && errno == EINTR) continue;
      if (pr == 0) {
        if (std::chrono::steady_clock::now() - last_progress > std::chrono::seconds(o.timeout_s)) {
          timed_out = true;
          kill(pid, SIGKILL);
          break;
        }
        continue;
      }
      char buf[4096];
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      pending.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        const std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        if (line.size() > 2 && (line[0] == 'S' || line[0] == 'D')) {
          long long k = 0;
          std::sscanf(line.c_str() + 2, "%lld", &k);
          const size_t sp = line.find(' ', 2);
          current = k;
          current_op = sp == std::string::npos ? "" : line.substr(sp + 1);
          last_progress = std::chrono::steady_clock::now();
          if (o.verbose) std::printf("case %lld %s\n", k, current_op.c_str());
        } else if (line.size() > 2 && line[0] == 'F') {
          long long k = 0;
          std::sscanf(line.c_str() + 2, "%lld", &k);
          const std::string text = line.substr(line.find(' ', 2) + 1);
          rep.failures.push_back(fmt("FAIL seed=%" PRIu64 " case=%lld: ", o.seed, k) + text);
          std::printf("%s\n", rep.failures.back().c_str());
          std::fflush(stdout);
        } else if (line.size() > 2 && line[0] == 'R') {
          int rc = 0;
          std::sscanf(line.c_str() + 2, "%d", &rc);
          const std::string fn = line.substr(line.find(' ', 2) + 1);
          auto& t = tally[fn];
          ++t[rc >= 0 && rc <= 5 ? rc : 6];
        } else if (line == "E") {
          ended = true;
        }
      }
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const bool clean = !timed_out && ended && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (clean) {
      next = last;
      continue;
    }
    if (!ended && current >= 0) {
      const std::string what = timed_out ? fmt("HANG (no progress in %d s)", o.timeout_s) : "CRASH " + describe_status(status);
      rep.failures.push_back(fmt("%s seed=%" PRIu64 " case=%" PRId64 " op=%s (replay: --seed %" PRIu64 " --case %" PRId64 ")",
                                 what.c_str(), o.seed, current, current_op.c_str(), o.seed, current));
      ++rep.crashes_by_op[current_op];
      std::printf("%s\n", rep.failures.back().c_str());
      std::fflush(stdout);
      next = current + 1;
    } else {
      rep.failures.push_back(fmt("EXIT seed=%" PRIu64 " cases %" PRId64 "..%" PRId64 ": the batch %s after its last case "
                                 "(a leak report?)", o.seed, next, last - 1, describe_status(status).c_str()));
      std::printf("%s\n", rep.failures.back().c_str());
      next = last;
    }
  }
  std::printf("fuzz_capi: %" PRId64 " cases, seed %" PRIu64 "; calls by status (ok, invalid_argument, unsupported, "
              "out_of_range, workspace_too_small, backend_error):\n", o.cases, o.seed);
  for (const auto& kv : tally) {
    std::printf("  %-50s", kv.first.c_str());
    for (int i = 0; i < 6; ++i) std::printf(" %6d", kv.second[i]);
    std::printf("\n");
  }
  if (!rep.failures.empty()) {
    std::printf("fuzz_capi: %zu failures (replay one with --seed %" PRIu64 " --case K):\n", rep.failures.size(), o.seed);
    for (const auto& f : rep.failures) std::printf("  %s\n", f.c_str());
    return 1;
  }
  std::printf("fuzz_capi: all cases passed\n");
  return 0;
}

int run_inline(const Options& o) {
  const int64_t first = o.only >= 0 ? o.only : 0, last = o.only >= 0 ? o.only + 1 : o.cases;
  int failed = 0;
  for (int64_t k = first; k < last; ++k) {
    auto fails = run_case(o.seed, k, [&](const std::string& name) {
      if (o.verbose || o.only >= 0) std::printf("case %" PRId64 ": %s\n", k, name.c_str());
      std::fflush(stdout);
    });
    for (const auto& f : fails) std::printf("FAIL seed=%" PRIu64 " case=%" PRId64 ": %s\n", o.seed, k, f.c_str());
    failed += !fails.empty();
  }
  std::printf("fuzz_capi: %" PRId64 " cases, %d failed\n", last - first, failed);
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace fuzz


int main(int argc, char** argv) {
  fuzz::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--cases") o.cases = std::strtoll(value("--cases"), nullptr, 0);
    else if (a == "--seed") o.seed = std::strtoull(value("--seed"), nullptr, 0);
    else if (a == "--case") o.only = std::strtoll(value("--case"), nullptr, 0);
    else if (a == "--batch") o.batch = std::max<int64_t>(1, std::strtoll(value("--batch"), nullptr, 0));
    else if (a == "--timeout") o.timeout_s = std::max(1, std::atoi(value("--timeout")));
    else if (a == "--no-fork") o.fork = false;
    else if (a == "--verbose" || a == "-v") o.verbose = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--cases N] [--seed S] [--case K] [--batch M] [--timeout SEC] [--no-fork] [--verbose]\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf("fuzz_capi: seed %" PRIu64 ", %" PRId64 " cases%s (replay one case: --seed %" PRIu64 " --case K)\n", o.seed,
              o.only >= 0 ? int64_t{1} : o.cases, FUZZ_ASAN ? ", AddressSanitizer build" : "", o.seed);
  std::fflush(stdout);
  if (o.only >= 0 || !o.fork) return fuzz::run_inline(o);
  return fuzz::run_forked(o);
}
