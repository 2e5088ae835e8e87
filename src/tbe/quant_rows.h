// The rows of the quantized TBE (embscale/tbe_quant.h states the layout): what a row of each weight type
// decodes to, written once for the CPU forward (tbe/cpu/tbe_quant_forward_cpu.cpp) and the host-side
// dequantize_rows (tbe/tbe_quant.cpp), so both read a byte the same way; and the int rows' quantizing rule
// (int_row_scale, int_code), written once as __host__ __device__ code for the host quantizer and the CUDA one
// (tbe/cuda/quant/tbe_quant_rows.cu), so the two write the same bytes. The CUDA forward decodes in its own
// vector form (tbe/cuda/quant/tbe_quant_decode.cuh), the same arithmetic value by value.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/hd.h"
#include "core/numerics.h"
#include "embscale/tbe_quant.h"

namespace embscale {
namespace tbe_quant {

EMBSCALE_HD int int_bits(QuantWeightType t) {
  switch (t) {
    case QuantWeightType::kInt8: return 8;
    case QuantWeightType::kInt4: return 4;
    case QuantWeightType::kInt2: return 2;
    default: return 0;
  }
}

EMBSCALE_HD bool is_fp8(QuantWeightType t) { return t == QuantWeightType::kFp8E4M3 || t == QuantWeightType::kFp8E5M2; }

// Bytes before a row's data: 4 for int rows (fp16 scale, fp16 bias) and fp8 rows (fp32 scale), else 0.
EMBSCALE_HD int header_bytes(QuantWeightType t) { return int_bits(t) > 0 || is_fp8(t) ? 4 : 0; }

// Bytes of a row's data (the header and the padding excluded): whole bytes, the last one's unused bits 0.
EMBSCALE_HD int64_t data_bytes(QuantWeightType t, int64_t dim) {
  switch (t) {
    case QuantWeightType::kFp32: return 4 * dim;
    case QuantWeightType::kFp16:
    case QuantWeightType::kBf16: return 2 * dim;
    case QuantWeightType::kInt4: return (dim + 1) / 2;
    case QuantWeightType::kInt2: return (dim + 3) / 4;
    default: return dim;  // int8, fp8
  }
}

inline float load_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof(f));
  return f;
}
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t u;
  std::memcpy(&u, p, sizeof(u));
  return u;
}

// The 256 values of an fp8 format's codes (core/numerics.h's decoding), built once.
template <QuantWeightType kType>
inline const float* fp8_values() {
  static const struct Table {
    float v[256];
    Table() {
      for (int c = 0; c < 256; ++c)
        v[c] = kType == QuantWeightType::kFp8E4M3 ? e4m3_to_float(static_cast<uint8_t>(c))
                                                  : e5m2_to_float(static_cast<uint8_t>(c));
    }
  } table;
  return table.v;
}

template <QuantWeightType kType>
constexpr int kBitsOf = kType == QuantWeightType::kInt8 ? 8 : kType == QuantWeightType::kInt4 ? 4
                        : kType == QuantWeightType::kInt2 ? 2 : 0;
template <QuantWeightType kType>
constexpr bool kIsFp8 = kType == QuantWeightType::kFp8E4M3 || kType == QuantWeightType::kFp8E5M2;

// A row's header: int rows' fp16 scale and bias, fp8 rows' fp32 scale (bias 0); (1, 0) for the others.
struct RowHeader {
  float scale = 1.0f, bias = 0.0f;
};
template <QuantWeightType kType>
inline RowHeader row_header(const uint8_t* row) {
  RowHeader h;
  if constexpr (kBitsOf<kType> > 0) {
    h.scale = fp16_to_float(load_u16(row));
    h.bias = fp16_to_float(load_u16(row + 2));
  } else if constexpr (kIsFp8<kType>) {
    h.scale = load_f32(row);
  }
  return h;
}
template <QuantWeightType kType>
constexpr int kHeaderBytes = kBitsOf<kType> > 0 || kIsFp8<kType> ? 4 : 0;

// Column c's code of an int row: the b bits at bit (c % (8 / b)) * b of byte c / (8 / b).
template <int kBits>
inline unsigned int_code(const uint8_t* data, int64_t c) {
  constexpr int kPerByte = 8 / kBits;
  return (static_cast<unsigned>(data[c / kPerByte]) >> ((c % kPerByte) * kBits)) & ((1u << kBits) - 1u);
}

// Column c of a row of type kType (data: the bytes after the header), in fp32: int rows
// float(q) * scale + bias (a product and a sum, each rounded to fp32), fp8 rows value(code) * scale,
// fp32/fp16/bf16 rows the element exactly. The CPU forward's vector loads compute the same per lane.
template <QuantWeightType kType>
inline float column_value(const uint8_t* data, int64_t c, const RowHeader& h) {
  if constexpr (kBitsOf<kType> > 0) {
    return static_cast<float>(int_code<kBitsOf<kType>>(data, c)) * h.scale + h.bias;
  } else if constexpr (kIsFp8<kType>) {
    return fp8_values<kType>()[data[c]] * h.scale;
  } else if constexpr (kType == QuantWeightType::kFp16) {
    return fp16_to_float(load_u16(data + 2 * c));
  } else if constexpr (kType == QuantWeightType::kBf16) {
    return bf16_to_float(load_u16(data + 2 * c));
  } else {
    return load_f32(data + 4 * c);
  }
}

// Calls f(c, value) for the D columns of a row of type kType in order (column_value).
template <QuantWeightType kType, class F>
inline void for_each_value(const uint8_t* __restrict row, int64_t D, F&& f) {
  const RowHeader h = row_header<kType>(row);
  const uint8_t* __restrict data = row + kHeaderBytes<kType>;
  for (int64_t c = 0; c < D; ++c) f(c, column_value<kType>(data, c, h));
}

// ---- the int rows' quantizing rule (tbe_quant.h), one fp32 rounding per operation on both backends ----

// Correctly rounded fp32 operations: the device forms are spelt out so that no compiler option (fast math,
// contraction) changes a quantized byte between the host and the device.
EMBSCALE_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
EMBSCALE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
EMBSCALE_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// An int row's header and the factor its codes are computed with, from the row's min and max.
struct IntRowScale {
  bool fits;         // false: the min or the scale overflows fp16, and the row is refused
  uint16_t scale_h;  // the header's fp16 scale
  uint16_t bias_h;   // the header's fp16 bias: the min rounded to nearest even
  float bias;        // float(bias_h): the codes count steps up from it
  float inverse;     // 1 / scale in fp32
};

EMBSCALE_HD IntRowScale int_row_scale(float mn, float mx, int bits) {
  IntRowScale r;
  r.bias_h = float_to_fp16(mn);
  r.bias = fp16_to_float(r.bias_h);
  const float range = sub_rn(mx, r.bias);
  float scale = range == 0.0f ? 1.0f : div_rn(range, static_cast<float>((1 << bits) - 1));
  scale = fp16_to_float(float_to_fp16(scale));
  r.fits = is_finite_f(r.bias) && is_finite_f(scale);
  if (scale == 0.0f) scale = 1.0f;
  float inverse = div_rn(1.0f, scale);
  if (!is_finite_f(inverse)) scale = inverse = 1.0f;
  r.scale_h = float_to_fp16(scale);
  r.inverse = inverse;
  return r;
}

// x's code: round((x - bias) * inverse) half to even, clamped to [0, 2^bits - 1].
EMBSCALE_HD unsigned int_code_of(float x, const IntRowScale& r, int bits) {
  const float q = rintf(mul_rn(sub_rn(x, r.bias), r.inverse));
  const float qmax = static_cast<float>((1 << bits) - 1);
  return static_cast<unsigned>(q < 0.0f ? 0.0f : (q > qmax ? qmax : q));
}

// Runtime type -> for_each_value<kType> (one switch per row; f is compiled once per type).
template <class F>
inline void visit_row(QuantWeightType t, const uint8_t* row, int64_t D, F&& f) {
  switch (t) {
    case QuantWeightType::kFp32: return for_each_value<QuantWeightType::kFp32>(row, D, f);
    case QuantWeightType::kFp16: return for_each_value<QuantWeightType::kFp16>(row, D, f);
    case QuantWeightType::kBf16: return for_each_value<QuantWeightType::kBf16>(row, D, f);
    case QuantWeightType::kInt8: return for_each_value<QuantWeightType::kInt8>(row, D, f);
    case QuantWeightType::kInt4: return for_each_value<QuantWeightType::kInt4>(row, D, f);
    case QuantWeightType::kInt2: return for_each_value<QuantWeightType::kInt2>(row, D, f);
    case QuantWeightType::kFp8E4M3: return for_each_value<QuantWeightType::kFp8E4M3>(row, D, f);
    case QuantWeightType::kFp8E5M2: return for_each_value<QuantWeightType::kFp8E5M2>(row, D, f);
  }
}

}  // namespace tbe_quant
}  // namespace embscale
