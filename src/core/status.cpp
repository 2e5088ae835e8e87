// Status names and formatting; dtype and backend names.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "embscale/context.h"
#include "embscale/dtype.h"
#include "embscale/status.h"

namespace embscale {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kOutOfRange: return "out_of_range";
    case StatusCode::kWorkspaceTooSmall: return "workspace_too_small";
    case StatusCode::kBackendError: return "backend_error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kF8E5M2: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
    case DType::kF8E4M3: return "fp8e4m3";
    case DType::kF8E5M2: return "fp8e5m2";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
  }
  return "unknown";
}

static std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool parse_dtype(const std::string& name, DType* out) {
  static const struct { const char* name; DType t; } kNames[] = {
      {"fp32", DType::kF32},      {"float32", DType::kF32},    {"float", DType::kF32},
      {"f32", DType::kF32},       {"fp16", DType::kF16},       {"float16", DType::kF16},
      {"half", DType::kF16},      {"f16", DType::kF16},        {"bf16", DType::kBF16},
      {"bfloat16", DType::kBF16}, {"fp8e4m3", DType::kF8E4M3}, {"e4m3", DType::kF8E4M3},
      {"fp8_e4m3", DType::kF8E4M3}, {"float8_e4m3fn", DType::kF8E4M3}, {"fp8e5m2", DType::kF8E5M2},
      {"e5m2", DType::kF8E5M2},   {"fp8_e5m2", DType::kF8E5M2}, {"float8_e5m2", DType::kF8E5M2},
      {"int32", DType::kI32},     {"i32", DType::kI32},        {"int", DType::kI32},
      {"32", DType::kI32},        {"int64", DType::kI64},      {"i64", DType::kI64},
      {"long", DType::kI64},      {"64", DType::kI64},
  };
  const std::string n = lower(name);
  for (const auto& e : kNames) {
    if (n == e.name) {
      if (out) *out = e.t;
      return true;
    }
  }
  return false;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
  }
  return "unknown";
}

bool parse_backend(const std::string& name, Backend* out) {
  const std::string n = lower(name);
  if (n == "cpu") {
    if (out) *out = Backend::kCpu;
    return true;
  }
  if (n == "cuda" || n == "gpu") {
    if (out) *out = Backend::kCuda;
    return true;
  }
  return false;
}

}  // namespace embscale
