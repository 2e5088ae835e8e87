// Naive float64 reference of the quantized TBE forward (embscale/tbe_quant.h), written from the layout and
// the maths, sharing no code with the library: it decodes the same packed bytes (fp16, bf16 and fp8 by
// their bit fields with reference_fp8.h, int codes by shifts), sums in double and drops invalid indices. Beside each output
// element it returns a magnitude (the sum of |w| * (|q * scale| + |bias|) over the bag, or |w * value|),
// from which a test derives its tolerance for the library's fp32 arithmetic.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "embscale/tbe_quant.h"
#include "reference_fp8.h"

namespace embscale {
namespace reference_quant {

inline uint16_t u16_at(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// fp16, bf16 and fp8 codes decoded from their bit fields (reference_fp8.h's decoder).
inline double half_value(uint16_t h) { return ref::decode(h, ref::format_of(DType::kF16)); }
inline double bf16_value(uint16_t b) { return ref::decode(b, ref::format_of(DType::kBF16)); }
inline double fp8_value(uint8_t v, bool e4m3) {
  return ref::decode(v, ref::format_of(e4m3 ? DType::kF8E4M3 : DType::kF8E5M2));
}

inline float f32_at(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// Column c of a row of D columns: value (double) and its magnitude term (|q * scale| + |bias|, or |value|).
inline void decode(QuantWeightType t, const uint8_t* row, int64_t c, double* value, double* mag) {
  int bits = 0;
  switch (t) {
    case QuantWeightType::kInt8: bits = 8; break;
    case QuantWeightType::kInt4: bits = 4; break;
    case QuantWeightType::kInt2: bits = 2; break;
    default: break;
  }
  if (bits > 0) {
    const double scale = half_value(u16_at(row)), bias = half_value(u16_at(row + 2));
    const int per_byte = 8 / bits;
    const int q = (row[4 + c / per_byte] >> ((c % per_byte) * bits)) & ((1 << bits) - 1);
    *value = q * scale + bias;
    *mag = std::fabs(q * scale) + std::fabs(bias);
    return;
  }
  switch (t) {
    case QuantWeightType::kFp8E4M3:
    case QuantWeightType::kFp8E5M2:
      *value = fp8_value(row[4 + c], t == QuantWeightType::kFp8E4M3) * f32_at(row);
      break;
    case QuantWeightType::kFp16: *value = half_value(u16_at(row + 2 * c)); break;
    case QuantWeightType::kBf16: *value = bf16_value(u16_at(row + 2 * c)); break;
    default: *value = f32_at(row + 4 * c); break;
  }
  *mag = std::fabs(*value);
}

struct Result {
  std::vector<double> out;  // the output's shape, row-major
  std::vector<double> mag;  // per element: see above
  int64_t skipped = 0;      // invalid indices dropped
};

// The forward of `tbe` on host inputs (indices and offsets as int64). pooling kNone: [N, D].
inline Result forward(const QuantizedTableBatchedEmbedding& tbe, const std::vector<uint8_t>& weights,
                      const std::vector<int64_t>& indices, const std::vector<int64_t>& offsets,
                      const std::vector<float>* psw, int64_t B, PoolingMode pooling) {
  const int T = tbe.num_features();
  const int64_t N = static_cast<int64_t>(indices.size());
  const bool sequence = pooling == PoolingMode::kNone;
  const int64_t width = sequence ? (T > 0 ? tbe.feature_dim(0) : 0) : tbe.total_dim();
  Result r;
  r.out.assign(static_cast<size_t>((sequence ? N : B) * width), 0.0);
  r.mag.assign(r.out.size(), 0.0);
  for (int f = 0; f < T; ++f) {
    const int t = tbe.feature_table(f);
    const QuantTableSpec& spec = tbe.config().tables[t];
    const uint8_t* base = weights.data() + tbe.table_offset(t);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t start = offsets[f * B + b], end = offsets[f * B + b + 1];
      int64_t count = 0;
      std::vector<double> sum(spec.dim, 0.0), mag(spec.dim, 0.0);
      for (int64_t p = start; p < end; ++p) {
        const int64_t idx = indices[p];
        if (idx < 0 || idx >= spec.num_rows) {
          ++r.skipped;
          continue;
        }
        ++count;
        const double w = psw ? (*psw)[p] : 1.0;
        const uint8_t* row = base + idx * tbe.row_bytes(t);
        for (int64_t c = 0; c < spec.dim; ++c) {
          double v, m;
          decode(spec.type, row, c, &v, &m);
          if (sequence) {
            r.out[p * width + c] = w * v;
            r.mag[p * width + c] = std::fabs(w) * m;
          } else {
            sum[c] += w * v;
            mag[c] += std::fabs(w) * m;
          }
        }
      }
      if (sequence) continue;
      const double div = pooling == PoolingMode::kMean && count > 0 ? static_cast<double>(count) : 1.0;
      for (int64_t c = 0; c < spec.dim; ++c) {
        r.out[b * width + tbe.output_offset(f) + c] = sum[c] / div;
        r.mag[b * width + tbe.output_offset(f) + c] = mag[c] / div;
      }
    }
  }
  return r;
}

}  // namespace reference_quant
}  // namespace embscale
