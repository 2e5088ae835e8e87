// The one runtime dtype -> template dispatch of host code, the CPU and CUDA backends' alike (it is
// plain C++17, so .cu files include it too): dispatch_float / dispatch_fp8 / dispatch_index call
// f(Tag<T>{}) with the C++ type T of a DType, so a template is instantiated once per supported type and
// chosen by one switch; nest them for several dtypes (dispatch_float_fp8 does for the FP8 casts). f
// returns a Status or nothing (then the dispatch returns Ok). A dtype outside the family is a caller
// error: kInvalidArgument naming `what`, worded like the entry points' own dtype checks (an op whose
// inputs were validated never reaches it). Storage types are core/numerics.h's (fp16_t, bf16_t, ...);
// code built on CUDA's own half types maps them itself.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "core/numerics.h"
#include "embscale/dtype.h"
#include "embscale/status.h"

namespace embscale {

template <typename T>
struct Tag {
  using type = T;
};

namespace dispatch_detail {

template <typename T, class F>
Status call(F&& f) {
  if constexpr (std::is_void_v<std::invoke_result_t<F, Tag<T>>>) {
    std::forward<F>(f)(Tag<T>{});
    return Status::Ok();
  } else {
    return std::forward<F>(f)(Tag<T>{});
  }
}

inline Status refuse(const char* what, DType dt, const char* expected) {
  return invalid_argument(std::string(what) + ": dtype " + dtype_name(dt) + " is not supported; expected " + expected);
}

}  // namespace dispatch_detail

// f(Tag<float | fp16_t | bf16_t>)
template <class F>
Status dispatch_float(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::kF32: return dispatch_detail::call<float>(std::forward<F>(f));
    case DType::kF16: return dispatch_detail::call<fp16_t>(std::forward<F>(f));
    case DType::kBF16: return dispatch_detail::call<bf16_t>(std::forward<F>(f));
    default: return dispatch_detail::refuse(what, dt, "fp32, fp16 or bf16");
  }
}

// f(Tag<fp8e4m3_t | fp8e5m2_t>)
template <class F>
Status dispatch_fp8(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::kF8E4M3: return dispatch_detail::call<fp8e4m3_t>(std::forward<F>(f));
    case DType::kF8E5M2: return dispatch_detail::call<fp8e5m2_t>(std::forward<F>(f));
    default: return dispatch_detail::refuse(what, dt, "fp8e4m3 or fp8e5m2");
  }
}

// f(Tag<int32_t | int64_t>)
template <class F>
Status dispatch_index(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::kI32: return dispatch_detail::call<int32_t>(std::forward<F>(f));
    case DType::kI64: return dispatch_detail::call<int64_t>(std::forward<F>(f));
    default: return dispatch_detail::refuse(what, dt, "int32 or int64");
  }
}

// f(Tag<float | fp16_t | bf16_t>, Tag<fp8e4m3_t | fp8e5m2_t>): the float tensor's type, then the fp8
// tensor's, whichever of them is the input.
template <class F>
Status dispatch_float_fp8(DType float_dt, const char* float_what, DType fp8_dt, const char* fp8_what, F&& f) {
  return dispatch_float(float_dt, float_what, [&](auto tf) {
    return dispatch_fp8(fp8_dt, fp8_what, [&](auto t8) { return f(tf, t8); });
  });
}

}  // namespace embscale
