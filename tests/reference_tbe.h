// Naive scalar reference for the table-batched embedding forward, written from the definition in
// include/embscale/tbe.h and independent of src/: it decodes fp16/bf16 from their bit layouts itself,
// computes the table offsets itself, and sums in double in index order. Alongside each output it
// returns the sum of |terms| and the number of terms, from which a test derives the fp32 rounding
// bound, and it reports the first bounds violation in (offsets, then feature, bag, position) order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "embscale/dtype.h"
#include "embscale/tbe.h"

namespace embscale {
namespace ref {

// fp16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; exponent 0 is subnormal (m * 2^-24).
inline double decode_fp16(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  double v;
  if (e == 0x1f)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), -24);
  else
    v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return sign ? -v : v;
}

// bf16: the upper 16 bits of an fp32.
inline double decode_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline double decode(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return decode_fp16(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return decode_bf16(static_cast<const uint16_t*>(data)[i]);
    default: return NAN;
  }
}

// Rounds x to the nearest value of a binary format with `man_bits` stored mantissa bits and smallest
// normal exponent `min_exp`, ties to even; beyond `max_finite` it overflows to infinity.
inline double round_to_format(double x, int man_bits, int min_exp, double max_finite) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e;
  std::frexp(x, &e);  // |x| = f * 2^e, f in [0.5, 1): unit exponent e - 1
  const int exp = std::max(e - 1, min_exp);
  const double step = std::ldexp(1.0, exp - man_bits);
  const double r = std::nearbyint(x / step) * step;  // default rounding mode: ties to even
  if (std::fabs(r) > max_finite) return r > 0 ? INFINITY : -INFINITY;
  return r;
}

inline double round_to_dtype(double x, DType dtype) {
  switch (dtype) {
    case DType::kF32: return round_to_format(x, 23, -126, 3.4028234663852886e38);
    case DType::kF16: return round_to_format(x, 10, -14, 65504.0);
    case DType::kBF16: return round_to_format(x, 7, -126, 3.3895313892515355e38);
    default: return NAN;
  }
}

struct Config {
  std::vector<int64_t> num_rows;  // [num_tables]
  std::vector<int> dims;          // [num_tables]
  std::vector<int> feature_table; // [T]
  DType weights_dtype = DType::kF32;
};

struct Result {
  bool ok = true;
  bool offsets_error = false;  // else an index error
  int feature = -1;
  int64_t bag = -1;
  int64_t position = -1;       // within the bag
  int64_t value = 0;           // the bad index
  int table = -1;
  int64_t skipped = 0;
  std::vector<double> out;      // [B, sum D] pooled, [N, D] sequence
  std::vector<double> abs_sum;  // same shape: sum of |terms| (divided by the count for MEAN)
  std::vector<int64_t> terms;   // same shape: number of terms summed
};

// offsets and indices are given as int64 values whatever their dtype on the backend.
inline Result tbe_forward(const Config& cfg, const void* weights, const std::vector<int64_t>& indices,
                          const std::vector<int64_t>& offsets, const float* per_sample_weights, int64_t B,
                          PoolingMode pooling, BoundsCheckMode check) {
  Result r;
  const int T = static_cast<int>(cfg.feature_table.size());
  const int64_t N = static_cast<int64_t>(indices.size());
  std::vector<int64_t> table_start(cfg.num_rows.size() + 1, 0);
  for (size_t t = 0; t < cfg.num_rows.size(); ++t) table_start[t + 1] = table_start[t] + cfg.num_rows[t] * cfg.dims[t];
  std::vector<int64_t> col(T + 1, 0);
  for (int f = 0; f < T; ++f) col[f + 1] = col[f] + cfg.dims[cfg.feature_table[f]];
  const bool sequence = pooling == PoolingMode::kNone;
  const int64_t width = sequence ? (T > 0 ? cfg.dims[cfg.feature_table[0]] : 0) : col[T];
  const int64_t rows = sequence ? N : B;
  r.out.assign(static_cast<size_t>(rows * width), 0.0);
  r.abs_sum.assign(r.out.size(), 0.0);
  r.terms.assign(r.out.size(), 0);

  if (check != BoundsCheckMode::kOff) {
    int64_t prev = 0;
    for (int64_t i = 0; i <= T * B; ++i) {
      if (offsets[i] < prev) {
        r.ok = false;
        r.offsets_error = true;
        r.position = i;
        return r;
      }
      prev = offsets[i];
    }
    if (offsets[T * B] != N) {
      r.ok = false;
      r.offsets_error = true;
      r.position = T * B;
      return r;
    }
  }

  for (int f = 0; f < T; ++f) {
    const int t = cfg.feature_table[f];
    const int64_t D = cfg.dims[t];
    for (int64_t b = 0; b < B; ++b) {
      const int64_t start = offsets[f * B + b], end = offsets[f * B + b + 1];
      std::vector<double> sum(static_cast<size_t>(D), 0.0), abs(static_cast<size_t>(D), 0.0);
      int64_t count = 0;
      for (int64_t p = start; p < end; ++p) {
        const int64_t idx = indices[p];
        if (idx < 0 || idx >= cfg.num_rows[t]) {
          if (check == BoundsCheckMode::kSkip || check == BoundsCheckMode::kWarn) {
            ++r.skipped;
          } else if (r.ok) {
            r.ok = false;
            r.feature = f;
            r.bag = b;
            r.position = p - start;
            r.value = idx;
            r.table = t;
          }
          continue;
        }
        const double w = per_sample_weights ? static_cast<double>(per_sample_weights[p]) : 1.0;
        ++count;
        for (int64_t d = 0; d < D; ++d) {
          const double term = w * decode(weights, cfg.weights_dtype, table_start[t] + idx * D + d);
          if (sequence) {
            r.out[p * width + d] = term;
            r.abs_sum[p * width + d] = std::fabs(term);
            r.terms[p * width + d] = 1;
          } else {
            sum[d] += term;
            abs[d] += std::fabs(term);
          }
        }
      }
      if (sequence) continue;
      const double div = (pooling == PoolingMode::kMean && count > 0) ? static_cast<double>(count) : 1.0;
      for (int64_t d = 0; d < D; ++d) {
        const int64_t o = b * width + col[f] + d;
        r.out[o] = sum[d] / div;
        r.abs_sum[o] = abs[d] / div;
        r.terms[o] = count;
      }
    }
  }
  return r;
}

// Bound on |backend - reference| for one output: fp32 accumulation of n products (each rounded once,
// then n-1 rounded additions, then one division for MEAN) is within (n + 2) * 2^-24 * sum|terms|;
// converting to the output dtype adds half an ulp, at most u_out * |value| for normal results plus
// half the smallest subnormal step.
inline double tolerance(double ref, double abs_sum, int64_t terms, DType out_dtype) {
  const double e32 = static_cast<double>(terms + 2) * std::ldexp(1.0, -24) * abs_sum;
  double u_out = std::ldexp(1.0, -24), atol = std::ldexp(1.0, -150);
  if (out_dtype == DType::kF16) {
    u_out = std::ldexp(1.0, -11);
    atol = std::ldexp(1.0, -25);
  } else if (out_dtype == DType::kBF16) {
    u_out = std::ldexp(1.0, -8);
    atol = std::ldexp(1.0, -134);
  }
  return e32 + u_out * (std::fabs(ref) + e32) + atol;
}

}  // namespace ref
}  // namespace embscale
