// CPU forward of the quantized TBE (embscale/tbe_quant.h): pooled (SUM, MEAN) and sequence lookups over
// tables of mixed weight types, on OpenMP.
//
// Work is split over (feature, bag) items; one thread reduces a bag in the order of its indices in fp32
// (acc[d] += w * value, value as tbe/quant_rows.h defines it, four columns a vector: vec4.h) and converts
// once to the output dtype, so results do not depend on the thread count or the schedule. Compile-time code
// is small on purpose: the index dtype is a template (2 copies), the weight type a switch per bag into one
// bag sum per type (8), and the output dtype a switch per output row; nothing is instantiated per
// combination.
// Built with -ffp-contract=off (as the training forward), so q * scale + bias stays two roundings on every
// compiler and flag set.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "core/numerics.h"
#include "tbe/bounds_report.h"
#include "tbe/cpu/prefetch.h"
#include "tbe/cpu/tbe_checks.h"
#include "tbe/cpu/thread_policy.h"
#include "tbe/cpu/vec4.h"
#include "tbe/quant_rows.h"
#include "tbe/tbe_quant_backend.h"

namespace embscale {
namespace cpu {
namespace {

using tbe_checks::BadIndex;

// Rows this many lookups ahead are prefetched at the start of each bag (as the training forward).
constexpr int64_t kPrefetchDistance = 32;

inline bool in_table(int64_t r, int64_t E) { return static_cast<uint64_t>(r) < static_cast<uint64_t>(E); }

// One feature's table, resolved once per call.
struct FeatureTable {
  const uint8_t* base;
  int64_t rows;
  int64_t row_bytes;
  int64_t dim;
  int64_t out_col;
  QuantWeightType type;
};

typedef uint8_t u8x4 __attribute__((vector_size(4)));
typedef uint8_t u8x8 __attribute__((vector_size(8)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));

// Codes kFirst .. kFirst + 3 of q (0..255 each) as fp32 lanes: each byte moved into the low byte of a
// zeroed 32-bit lane (one byte shuffle), then converted, exact.
template <int kFirst>
inline f32x4 codes_to_f32(u8x16 q) {
  constexpr int z = 16;  // a byte of the zero vector
  const u8x16 wide = __builtin_shufflevector(q, u8x16{}, kFirst, z, z, z, kFirst + 1, z, z, z, kFirst + 2, z, z, z,
                                             kFirst + 3, z, z, z);
  i32x4 i;
  std::memcpy(&i, &wide, sizeof(i));
  return __builtin_convertvector(i, f32x4);
}

// Sixteen int codes of columns [c, c + 16) as bytes, the lower column first: int8 one byte each, int4 the
// low then the high nibble of each byte, int2 the four 2-bit fields of each byte from the low bits up.
template <int kBits>
inline u8x16 codes16(const uint8_t* __restrict data, int64_t c) {
  if constexpr (kBits == 8) {
    u8x16 v;
    std::memcpy(&v, data + c, sizeof(v));
    return v;
  } else if constexpr (kBits == 4) {
    u8x8 v;
    std::memcpy(&v, data + c / 2, sizeof(v));
    const u8x8 lo = v & 15, hi = v >> 4;
    return __builtin_shufflevector(lo, hi, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  } else {
    u8x4 v;
    std::memcpy(&v, data + c / 4, sizeof(v));
    const u8x4 p0 = v & 3, p1 = (v >> 2) & 3, p2 = (v >> 4) & 3, p3 = v >> 6;
    const u8x8 a = __builtin_shufflevector(p0, p1, 0, 4, 1, 5, 2, 6, 3, 7);
    const u8x8 b = __builtin_shufflevector(p2, p3, 0, 4, 1, 5, 2, 6, 3, 7);
    return __builtin_shufflevector(a, b, 0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
  }
}

// Columns [c, c + 4 * kVecs) of a row of type kType (data: after the header) as kVecs vectors:
// column_value's arithmetic (tbe/quant_rows.h) lane by lane, so the same values. kVecs is 4 or 1 (an int
// row's 4-column block is widened from its bytes one at a time).
template <QuantWeightType kType, int kVecs>
inline void load_columns(const uint8_t* __restrict data, int64_t c, const tbe_quant::RowHeader& h,
                         const float* __restrict fp8_table, f32x4* out) {
  constexpr int kBits = tbe_quant::kBitsOf<kType>;
  if constexpr (kBits > 0) {
    if constexpr (kVecs == 4) {
      const u8x16 q = codes16<kBits>(data, c);
      out[0] = codes_to_f32<0>(q) * h.scale + h.bias;
      out[1] = codes_to_f32<4>(q) * h.scale + h.bias;
      out[2] = codes_to_f32<8>(q) * h.scale + h.bias;
      out[3] = codes_to_f32<12>(q) * h.scale + h.bias;
    } else {
      const f32x4 q = {static_cast<float>(tbe_quant::int_code<kBits>(data, c)),
                       static_cast<float>(tbe_quant::int_code<kBits>(data, c + 1)),
                       static_cast<float>(tbe_quant::int_code<kBits>(data, c + 2)),
                       static_cast<float>(tbe_quant::int_code<kBits>(data, c + 3))};
      out[0] = q * h.scale + h.bias;
    }
  } else {
#pragma GCC unroll 4
    for (int k = 0; k < kVecs; ++k) {
      const int64_t cc = c + 4 * k;
      if constexpr (tbe_quant::kIsFp8<kType>) {
        out[k] = f32x4{fp8_table[data[cc]], fp8_table[data[cc + 1]], fp8_table[data[cc + 2]], fp8_table[data[cc + 3]]} *
                 h.scale;
      } else if constexpr (kType == QuantWeightType::kFp16) {
        out[k] = load4(reinterpret_cast<const fp16_t*>(data + 2 * cc));
      } else if constexpr (kType == QuantWeightType::kBf16) {
        out[k] = load4(reinterpret_cast<const bf16_t*>(data + 2 * cc));
      } else {
        out[k] = load4(reinterpret_cast<const float*>(data + 4 * cc));
      }
    }
  }
}

// One valid lookup of a bag: its row's data (after the header), the header decoded, its weight.
struct Lookup {
  const uint8_t* data;
  tbe_quant::RowHeader header;
  float w;  // 1 for unweighted lookups (the product is then exact)
};

// acc[0, D) = sum over the n lookups of w * row, in lookup order: 16 columns at a time held in registers
// over all the lookups, then 4, then one (no partial sum goes through memory).
template <QuantWeightType kType>
void sum_lookups(const Lookup* __restrict lk, int64_t n, int64_t D, float* __restrict acc) {
  const float* fp8_table = nullptr;
  if constexpr (tbe_quant::kIsFp8<kType>) fp8_table = tbe_quant::fp8_values<kType>();
  const auto block = [&](auto vecs, int64_t c) __attribute__((always_inline)) {
    constexpr int kVecs = decltype(vecs)::value;
    f32x4 a[kVecs];
#pragma GCC unroll 4
    for (int k = 0; k < kVecs; ++k) a[k] = f32x4{};
    for (int64_t i = 0; i < n; ++i) {
      f32x4 v[kVecs];
      load_columns<kType, kVecs>(lk[i].data, c, lk[i].header, fp8_table, v);
#pragma GCC unroll 4
      for (int k = 0; k < kVecs; ++k) a[k] += lk[i].w * v[k];
    }
#pragma GCC unroll 4
    for (int k = 0; k < kVecs; ++k) std::memcpy(acc + c + 4 * k, &a[k], sizeof(a[k]));
  };
  int64_t c = 0;
  for (; c + 16 <= D; c += 16) block(std::integral_constant<int, 4>{}, c);
  for (; c + 4 <= D; c += 4) block(std::integral_constant<int, 1>{}, c);
  for (; c < D; ++c) {
    float a = 0.0f;
    for (int64_t i = 0; i < n; ++i) a += lk[i].w * tbe_quant::column_value<kType>(lk[i].data, c, lk[i].header);
    acc[c] = a;
  }
}

template <QuantWeightType kType>
inline Lookup make_lookup(const uint8_t* row, float w) {
  return Lookup{row + tbe_quant::kHeaderBytes<kType>, tbe_quant::row_header<kType>(row), w};
}

// The weight type as a template for f (one switch per bag).
template <class F>
inline void visit_type(QuantWeightType t, F&& f) {
  using Q = QuantWeightType;
  switch (t) {
    case Q::kFp32: return f(std::integral_constant<Q, Q::kFp32>{});
    case Q::kFp16: return f(std::integral_constant<Q, Q::kFp16>{});
    case Q::kBf16: return f(std::integral_constant<Q, Q::kBf16>{});
    case Q::kInt8: return f(std::integral_constant<Q, Q::kInt8>{});
    case Q::kInt4: return f(std::integral_constant<Q, Q::kInt4>{});
    case Q::kInt2: return f(std::integral_constant<Q, Q::kInt2>{});
    case Q::kFp8E4M3: return f(std::integral_constant<Q, Q::kFp8E4M3>{});
    case Q::kFp8E5M2: return f(std::integral_constant<Q, Q::kFp8E5M2>{});
  }
}

// D values (divided by `div` when it is not 1) stored in the output dtype at element `at`.
inline void store_row(DType dt, void* out, int64_t at, const float* __restrict v, int64_t D, float div) {
  switch (dt) {
    case DType::kF16: {
      auto* o = static_cast<uint16_t*>(out) + at;
      for (int64_t d = 0; d < D; ++d) o[d] = float_to_fp16(div == 1.0f ? v[d] : v[d] / div);
      return;
    }
    case DType::kBF16: {
      auto* o = static_cast<uint16_t*>(out) + at;
      for (int64_t d = 0; d < D; ++d) o[d] = float_to_bf16(div == 1.0f ? v[d] : v[d] / div);
      return;
    }
    default: {  // fp32 (validated)
      float* o = static_cast<float*>(out) + at;
      if (div == 1.0f) {
        std::memcpy(o, v, static_cast<size_t>(D) * sizeof(float));
      } else {
        // Division (not a reciprocal multiply): each mean is the correctly rounded fp32 quotient.
        for (int64_t d = 0; d < D; ++d) o[d] = v[d] / div;
      }
      return;
    }
  }
}

template <typename I>
Status forward_impl(const Context& ctx, const QuantizedTableBatchedEmbedding& tbe, const QuantTbeForwardArgs& a) {
  const auto* weights = static_cast<const uint8_t*>(a.weights);
  const I* __restrict indices = static_cast<const I*>(a.indices.data);
  const I* __restrict offsets = static_cast<const I*>(a.offsets.data);
  const float* __restrict psw = static_cast<const float*>(a.per_sample_weights.data);
  const int64_t T = tbe.num_features(), B = a.batch_size, N = a.indices.numel();
  const BoundsCheckMode check = tbe_bounds::skips_bad_indices(a.bounds_check) ? BoundsCheckMode::kSkip : a.bounds_check;
  const bool mean = a.pooling == PoolingMode::kMean;
  const bool sequence = a.pooling == PoolingMode::kNone;
  const DType out_dt = a.output.dtype;
  const int64_t out_stride = sequence ? (T > 0 ? tbe.feature_dim(0) : 0) : tbe.total_dim();
  const auto table_of = [&](int f) { return tbe.feature_table(f); };
  const auto rows_of = [&](int t) { return tbe.config().tables[t].num_rows; };

  tbe_bounds::BoundsViolation violation;
  if (!tbe_checks::offsets_valid(offsets, T * B, N, &violation))
    return tbe_bounds::violation_error(B, N, violation, table_of, rows_of);

  std::vector<FeatureTable> features(static_cast<size_t>(T));
  int64_t row_bytes_sum = 0;
  for (int f = 0; f < T; ++f) {
    const int t = tbe.feature_table(f);
    features[f] = FeatureTable{weights + tbe.table_offset(t), tbe.config().tables[t].num_rows, tbe.row_bytes(t),
                               tbe.feature_dim(f), tbe.output_offset(f), tbe.config().tables[t].type};
    row_bytes_sum += tbe.row_bytes(t);
  }

  std::vector<float> zeros(static_cast<size_t>(std::max(tbe.max_dim(), 1)), 0.0f);
  // Sequence mode: rows before offsets[0] belong to no bag and are written as zeros.
  if (sequence && N > 0) {
    const int64_t first = std::min<int64_t>(static_cast<int64_t>(offsets[0]), N);
    for (int64_t r = 0; r < first; ++r) store_row(out_dt, a.output.data, r * out_stride, zeros.data(), out_stride, 1.0f);
  }

  const int64_t items = T * B;
  const int threads = threads_for_call(ctx, T > 0 ? N * (row_bytes_sum / T) : 0);
  BadIndex bad;
  int64_t skipped_total = 0;

#pragma omp parallel num_threads(threads) reduction(+ : skipped_total)
  {
    std::vector<float> acc_storage(static_cast<size_t>(std::max(tbe.max_dim(), 1)));
    float* __restrict acc = acc_storage.data();
    std::vector<Lookup> lookups;  // the valid lookups of the current bag (grown to the longest bag)
    BadIndex my_bad;
    int64_t my_skipped = 0;
    // A bad index: counted (kSkip), recorded (kError, the first in (bag, position) order) or ignored (kOff).
    const auto note_bad = [&](int64_t item, int64_t pos, int64_t idx) {
      if (check == BoundsCheckMode::kSkip) {
        ++my_skipped;
      } else if (check == BoundsCheckMode::kError && item < my_bad.item) {
        my_bad = BadIndex{item, pos, idx};
      }
    };

#pragma omp for schedule(dynamic, 16)
    for (int64_t item = 0; item < items; ++item) {
      const int f = static_cast<int>(item / B);
      const int64_t b = item % B;
      const FeatureTable& ft = features[f];
      const int64_t D = ft.dim;
      const int64_t start = static_cast<int64_t>(offsets[item]);
      const int64_t end = static_cast<int64_t>(offsets[item + 1]);
      if (!sequence) {
        // The rows of the lookups kPrefetchDistance ahead, within the feature.
        const int64_t prefetch_end = static_cast<int64_t>(offsets[(f + 1) * B]);
        for (int64_t pos = start + kPrefetchDistance; pos < std::min(end + kPrefetchDistance, prefetch_end); ++pos) {
          const int64_t r = static_cast<int64_t>(indices[pos]);
          if (in_table(r, ft.rows)) prefetch_row(ft.base + r * ft.row_bytes, ft.row_bytes);
        }
      }
      visit_type(ft.type, [&](auto type) {
        constexpr QuantWeightType kType = decltype(type)::value;
        if (sequence) {
          for (int64_t pos = start; pos < end; ++pos) {
            const int64_t idx = static_cast<int64_t>(indices[pos]);
            if (!in_table(idx, ft.rows)) {  // dropped in every mode: never read out of bounds
              note_bad(item, pos, idx);
              store_row(out_dt, a.output.data, pos * out_stride, zeros.data(), D, 1.0f);
              continue;
            }
            const Lookup one = make_lookup<kType>(ft.base + idx * ft.row_bytes, psw ? psw[pos] : 1.0f);
            sum_lookups<kType>(&one, 1, D, acc);
            store_row(out_dt, a.output.data, pos * out_stride, acc, D, 1.0f);
          }
          return;
        }
        if (static_cast<int64_t>(lookups.size()) < end - start) lookups.resize(static_cast<size_t>(end - start));
        int64_t count = 0;
        for (int64_t pos = start; pos < end; ++pos) {
          const int64_t idx = static_cast<int64_t>(indices[pos]);
          if (!in_table(idx, ft.rows)) {
            note_bad(item, pos, idx);
            continue;
          }
          lookups[count++] = make_lookup<kType>(ft.base + idx * ft.row_bytes, psw ? psw[pos] : 1.0f);
        }
        sum_lookups<kType>(lookups.data(), count, D, acc);
        const float div = mean && count > 0 ? static_cast<float>(count) : 1.0f;
        store_row(out_dt, a.output.data, b * out_stride + ft.out_col, acc, D, div);
      });
    }

    skipped_total += my_skipped;
    if (my_bad.item != INT64_MAX) {
#pragma omp critical(embscale_tbe_quant_forward_bad_index)
      {
        tbe_checks::keep_first(my_bad, &bad);
      }
    }
  }

  if (bad.item != INT64_MAX) {
    violation = tbe_bounds::BoundsViolation{};
    violation.kind = tbe_bounds::ViolationKind::kBadIndex;
    violation.position = bad.pos;
    violation.value = bad.value;
    violation.item = bad.item;
    violation.bag_start = static_cast<int64_t>(offsets[bad.item]);
    return tbe_bounds::violation_error(B, N, violation, table_of, rows_of);
  }
  if (check == BoundsCheckMode::kSkip && a.num_skipped != nullptr) *a.num_skipped = skipped_total;
  return Status::Ok();
}

}  // namespace

Status tbe_quant_forward(const Context& ctx, const QuantizedTableBatchedEmbedding& tbe,
                         const QuantTbeForwardArgs& args) {
  return dispatch_index(args.indices.dtype, "indices", [&](auto ti) {
    using I = typename decltype(ti)::type;
    return forward_impl<I>(ctx, tbe, args);
  });
}

}  // namespace cpu
}  // namespace embscale
