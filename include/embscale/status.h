// Status: errors are values. Every public entry point returns a Status whose message names the
// argument and what was wrong with it ("x: dtype int32 is not supported; expected fp32, fp16 or bf16").
// No exception escapes the API and nothing calls exit().
#pragma once

#include <string>
#include <utility>

namespace embscale {

// One code per kind of failure, the same in every capability (FP8, TBE) and backend. A dtype an op does
// not take is kInvalidArgument everywhere (no backend takes it, so no other build or backend would
// serve the call); kUnsupported is kept for valid requests that this build or backend cannot serve.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // a null pointer, a bad size, a mismatched shape, a dtype the op does not take
  kUnsupported,        // a valid request this build or backend cannot serve (no CUDA, a size limit)
  kOutOfRange,         // an index outside its table, offsets that are not monotone
  kWorkspaceTooSmall,  // the caller's workspace is smaller than the size query said
  kBackendError,       // the CUDA runtime reported an error
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: x: ..." or "ok".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string msg) { return Status(StatusCode::kInvalidArgument, std::move(msg)); }
inline Status unsupported(std::string msg) { return Status(StatusCode::kUnsupported, std::move(msg)); }
inline Status out_of_range(std::string msg) { return Status(StatusCode::kOutOfRange, std::move(msg)); }
inline Status workspace_too_small(std::string msg) { return Status(StatusCode::kWorkspaceTooSmall, std::move(msg)); }

}  // namespace embscale

#define EMBSCALE_RETURN_IF_ERROR(expr)            \
  do {                                            \
    ::embscale::Status _embscale_st = (expr);     \
    if (!_embscale_st.ok()) return _embscale_st;  \
  } while (0)
