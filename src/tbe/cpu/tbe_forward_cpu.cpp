// CPU table-batched embedding forward: pooled (SUM, MEAN) and sequence (no pooling) lookups.
//
// Work is split over (feature, bag) items with OpenMP; each bag is reduced by one thread in the order
// of its indices, in fp32, then converted once to the output dtype. So the result is bit-identical for
// any thread count and schedule. A bag is summed in column chunks held in vector registers (vec4.h):
// 64 columns at a time over all its rows, then 16, then 4, then single columns, so each step is one
// load and one add. The rows of the next bag are prefetched at the start of a bag because every row is
// a random gather.
//
// Runtime -> compile-time dispatch happens once, in tbe_forward(): weights dtype x output dtype x
// index dtype x weighted.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tbe/tbe_backend.h"
#include "core/dispatch.h"
#include "core/numerics.h"
#include "tbe/cpu/prefetch.h"
#include "tbe/cpu/tbe_checks.h"
#include "tbe/cpu/vec4.h"

namespace embscale {
namespace cpu {
namespace {

// Rows this many lookups ahead are prefetched, issued a bag at a time: with bags of 20 rows that keeps
// 20-40 random rows in flight per thread.
constexpr int64_t kPrefetchDistance = 16;

using tbe_checks::BadIndex;

// Sums columns [col, col + 4 * kVecs) of a bag's rows, in lookup order, into acc. kCheck: rows out of
// [0, E) are absent (the caller has already counted or reported them).
template <int kVecs, bool kCheck, bool kWeighted, typename W, typename I>
inline void sum_columns(const W* __restrict table, int64_t D, int64_t E, const I* __restrict idx,
                        const float* __restrict psw, int64_t n, int64_t col, float* __restrict acc) {
  f32x4 a[kVecs] = {};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = static_cast<int64_t>(idx[i]);
    if (kCheck && (r < 0 || r >= E)) continue;
    const W* __restrict row = table + r * D + col;
    const float w = kWeighted ? psw[i] : 1.0f;
    if (kVecs == 1) {
      a[0] += kWeighted ? w * load4(row) : load4(row);
      continue;
    }
#pragma GCC unroll 8
    for (int k = 0; k < kVecs; k += 2) {
      f32x4 lo, hi;
      load8(row + 4 * k, &lo, &hi);
      a[k] += kWeighted ? w * lo : lo;
      a[k + 1] += kWeighted ? w * hi : hi;
    }
  }
  std::memcpy(acc + col, a, sizeof(a));
}

// Four results in the output dtype (16-bit outputs rounded one by one, as everywhere on the CPU).
inline void store4(float* o, f32x4 v) { std::memcpy(o, &v, sizeof(v)); }
template <typename O>
inline void store4(O* o, f32x4 v) {
  for (int k = 0; k < 4; ++k) o[k] = from_float<O>(v[k]);
}

// The last D % 4 columns, one at a time.
template <bool kCheck, bool kWeighted, typename W, typename I>
inline void sum_tail(const W* __restrict table, int64_t D, int64_t E, const I* __restrict idx,
                     const float* __restrict psw, int64_t n, int64_t col, float* __restrict acc) {
  for (int64_t c = col; c < D; ++c) acc[c] = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = static_cast<int64_t>(idx[i]);
    if (kCheck && (r < 0 || r >= E)) continue;
    const W* __restrict row = table + r * D;
    const float w = kWeighted ? psw[i] : 1.0f;
    for (int64_t c = col; c < D; ++c) acc[c] += kWeighted ? w * load1(row + c) : load1(row + c);
  }
}

// acc[0, D) = the bag's sum (weighted when kWeighted), widest chunks first.
template <bool kCheck, bool kWeighted, typename W, typename I>
void sum_bag(const W* __restrict table, int64_t D, int64_t E, const I* __restrict idx, const float* __restrict psw,
             int64_t n, float* __restrict acc) {
  int64_t col = 0;
  // 16-bit weights need registers for decoding, so their widest chunk is 32 columns.
  constexpr int kWide = sizeof(W) == 4 ? 16 : 8;
  for (; col + 4 * kWide <= D; col += 4 * kWide) sum_columns<kWide, kCheck, kWeighted>(table, D, E, idx, psw, n, col, acc);
  for (; col + 16 <= D; col += 16) sum_columns<4, kCheck, kWeighted>(table, D, E, idx, psw, n, col, acc);
  for (; col + 4 <= D; col += 4) sum_columns<1, kCheck, kWeighted>(table, D, E, idx, psw, n, col, acc);
  if (col < D) sum_tail<kCheck, kWeighted>(table, D, E, idx, psw, n, col, acc);
}

struct Params {
  const TableBatchedEmbedding* tbe;
  const TbeForwardArgs* args;
  int64_t T, B, N;
  int threads;
};

template <typename W, typename O, typename I, bool kWeighted>
Status forward_impl(const Params& p) {
  const TbeForwardArgs& a = *p.args;
  const TableBatchedEmbedding& tbe = *p.tbe;
  const W* __restrict weights = static_cast<const W*>(a.weights.data);
  const I* __restrict indices = static_cast<const I*>(a.indices.data);
  const I* __restrict offsets = static_cast<const I*>(a.offsets.data);
  const float* __restrict psw = static_cast<const float*>(a.per_sample_weights.data);
  O* __restrict out = static_cast<O*>(a.output.data);
  const int64_t T = p.T, B = p.B, N = p.N;
  const BoundsCheckMode check = a.bounds_check;
  const bool mean = a.pooling == PoolingMode::kMean;
  const bool sequence = a.pooling == PoolingMode::kNone;
  // On the CPU the per-feature tables of DeviceMeta are host memory.
  const TableBatchedEmbedding::DeviceMeta& meta = tbe.device_meta();
  const int64_t out_stride = sequence ? (T > 0 ? tbe.feature_dim(0) : 0) : tbe.total_dim();

  // Offsets: monotone, and the last equals N; the first violation in order is reported.
  EMBSCALE_RETURN_IF_ERROR(tbe_checks::check_offsets(tbe, offsets, T, B, N));

  // Sequence mode: rows before offsets[0] belong to no bag and are written as zeros.
  if (sequence && N > 0) {
    const int64_t first = std::min<int64_t>(static_cast<int64_t>(offsets[0]), N);
    for (int64_t r = 0; r < first * out_stride; ++r) out[r] = from_float<O>(0.0f);
  }

  const int64_t items = T * B;
  BadIndex bad;
  int64_t skipped_total = 0;

#pragma omp parallel num_threads(p.threads) reduction(+ : skipped_total)
  {
    std::vector<float> acc_storage(static_cast<size_t>(std::max(tbe.max_dim(), 1)) + 16);
    float* __restrict acc = acc_storage.data();
    BadIndex my_bad;
    int64_t my_skipped = 0;

#pragma omp for schedule(dynamic, 16)
    for (int64_t item = 0; item < items; ++item) {
      const int f = static_cast<int>(item / B);
      const int64_t b = item % B;
      const W* __restrict table = weights + meta.weight_offsets[f];
      const int64_t E = meta.num_rows[f];
      const int64_t D = meta.dims[f];
      const int64_t start = static_cast<int64_t>(offsets[item]);
      const int64_t end = static_cast<int64_t>(offsets[item + 1]);

      if (sequence) {
        for (int64_t pos = start; pos < end; ++pos) {
          const int64_t idx = static_cast<int64_t>(indices[pos]);
          O* __restrict o = out + pos * out_stride;
          if (idx < 0 || idx >= E) {  // dropped in off mode too (unreported): never read out of bounds
            if (check == BoundsCheckMode::kSkip) {
              ++my_skipped;
            } else if (check == BoundsCheckMode::kError && item < my_bad.item) {
              my_bad = BadIndex{item, pos, idx};
            }
            for (int64_t d = 0; d < D; ++d) o[d] = from_float<O>(0.0f);
            continue;
          }
          const W* __restrict row = table + idx * D;
          const float w = kWeighted ? psw[pos] : 1.0f;
          int64_t d = 0;
          for (; d + 4 <= D; d += 4) {
            const f32x4 v = kWeighted ? w * load4(row + d) : load4(row + d);
            store4(o + d, v);
          }
          for (; d < D; ++d) o[d] = from_float<O>(kWeighted ? w * load1(row + d) : load1(row + d));
        }
        continue;
      }

      // Rows of the lookups kPrefetchDistance ahead, a bag's worth, within the feature: consecutive bags
      // of one feature are adjacent in indices and usually processed by the same thread.
      const int64_t prefetch_end = static_cast<int64_t>(offsets[(f + 1) * B]);
      for (int64_t pos = start + kPrefetchDistance; pos < std::min(end + kPrefetchDistance, prefetch_end); ++pos) {
        const int64_t ahead = static_cast<int64_t>(indices[pos]);
        if (ahead >= 0 && ahead < E) prefetch_row(table + ahead * D, D);
      }
      // Invalid indices are dropped in every mode (in off mode unreported), so none is read out of bounds.
      int64_t count = end - start;
      for (int64_t pos = start; pos < end; ++pos) {
        const int64_t idx = static_cast<int64_t>(indices[pos]);
        if (idx >= 0 && idx < E) continue;
        --count;
        if (check == BoundsCheckMode::kSkip) {
          ++my_skipped;
        } else if (check == BoundsCheckMode::kError && item < my_bad.item) {
          my_bad = BadIndex{item, pos, idx};
        }
      }
      const float* __restrict bag_psw = kWeighted ? psw + start : nullptr;
      if (count == end - start) {
        sum_bag<false, kWeighted>(table, D, E, indices + start, bag_psw, end - start, acc);
      } else {
        sum_bag<true, kWeighted>(table, D, E, indices + start, bag_psw, end - start, acc);
      }
      O* __restrict o = out + b * out_stride + meta.output_offsets[f];
      if (mean && count > 0) {
        // Division (not a reciprocal multiply) so each mean is the correctly rounded fp32 quotient.
        const float n = static_cast<float>(count);
        for (int64_t d = 0; d < D; ++d) o[d] = from_float<O>(acc[d] / n);
      } else {
        for (int64_t d = 0; d < D; ++d) o[d] = from_float<O>(acc[d]);
      }
    }

    skipped_total += my_skipped;
    if (my_bad.item != INT64_MAX) {
#pragma omp critical(embscale_tbe_forward_bad_index)
      {
        tbe_checks::keep_first(my_bad, &bad);
      }
    }
  }

  if (bad.item != INT64_MAX) return tbe_checks::bad_index_error(tbe, offsets, B, N, bad);
  if (check == BoundsCheckMode::kSkip && a.num_skipped != nullptr) *a.num_skipped = skipped_total;
  return Status::Ok();
}

template <typename W, typename O, typename I>
Status dispatch_weighted(const Params& p) {
  return p.args->per_sample_weights.data ? forward_impl<W, O, I, true>(p) : forward_impl<W, O, I, false>(p);
}

}  // namespace

Status tbe_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args) {
  Params p;
  p.tbe = &tbe;
  p.args = &args;
  p.T = tbe.num_features();
  p.B = args.batch_size;
  p.N = args.indices.numel();
  p.threads = ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads();
  return dispatch_float(args.weights.dtype, "weights", [&](auto tw) {
    return dispatch_float(args.output.dtype, "output", [&](auto to) {
      return dispatch_index(args.indices.dtype, "indices", [&](auto ti) {
        using W = typename decltype(tw)::type;
        using O = typename decltype(to)::type;
        using I = typename decltype(ti)::type;
        return dispatch_weighted<W, O, I>(p);
      });
    });
  });
}

}  // namespace cpu
}  // namespace embscale
