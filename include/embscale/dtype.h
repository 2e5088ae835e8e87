// Element types. Storage of the 16-bit and 8-bit float types is bit-exact IEEE / OCP FP8:
// fp16 (1-5-10), bf16 (1-8-7), fp8 e4m3 (1-4-3, "fn": no inf, max 448) and e5m2 (1-5-2, max 57344).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace embscale {

enum class DType : int { kF32 = 0, kF16, kBF16, kF8E4M3, kF8E5M2, kI32, kI64 };
// The enumerations' counts (here and next to every enum the C API takes): the values are 0 .. count - 1,
// and the C API checks every value it is given against them.
constexpr int kNumDTypes = static_cast<int>(DType::kI64) + 1;

// Bytes per element.
size_t dtype_size(DType t);
// Canonical name: "fp32", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int32", "int64".
const char* dtype_name(DType t);
// Accepts the canonical names and common aliases (float32, float, half, float16, bfloat16, e4m3, e5m2,
// int, long). Returns false for anything else.
bool parse_dtype(const std::string& name, DType* out);

inline bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
inline bool is_fp8_dtype(DType t) { return t == DType::kF8E4M3 || t == DType::kF8E5M2; }
inline bool is_index_dtype(DType t) { return t == DType::kI32 || t == DType::kI64; }

}  // namespace embscale
