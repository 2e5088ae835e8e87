// CPU table-batched embedding forward: pooled (SUM, MEAN) and sequence (no pooling) lookups.
//
// Work is split over (feature, bag) items with OpenMP; each bag is reduced by one thread in the order
// of its indices, in fp32, into a per-thread accumulator of D floats, then converted once to the output
// dtype. So the result is bit-identical for any thread count and schedule. The inner loop over D is a
// plain a[d] += w * row[d] over restrict pointers (16-bit weights decoded branch-free), which the
// compiler vectorises; rows a few lookups ahead are prefetched because every row is a random gather.
//
// Runtime -> compile-time dispatch happens once, in tbe_forward(): weights dtype x output dtype x
// index dtype x weighted.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "api/tbe_backend.h"
#include "common/numerics.h"
#include "cpu/prefetch.h"
#include "cpu/tbe_checks.h"

namespace embscale {
namespace cpu {
namespace {

// Rows this many lookups ahead are prefetched (a row of D=128 fp32 is 8 cache lines), so the memory
// latency of several random row gathers overlaps with summing the current row.
constexpr int64_t kPrefetchDistance = 8;

inline float load_weight(const float* p) { return *p; }
inline float load_weight(const bf16_t* p) { return bits_float(static_cast<uint32_t>(p->bits) << 16); }
// fp16 -> fp32 without branches so the loop over D vectorises: the exponent/mantissa field shifted into
// fp32 position and multiplied by 2^112 is exact for normal and subnormal halves alike (the rebias is a
// power of two); exponent 31 (inf/NaN) is patched to the fp32 all-ones exponent by a mask.
inline float load_weight(const fp16_t* p) {
  const uint32_t h = p->bits;
  const uint32_t em = (h & 0x7fffu) << 13;
  const float scaled = bits_float(em) * 5.192296858534828e33f;  // 2^112
  const uint32_t special = 0u - static_cast<uint32_t>(em >= 0x0f800000u);  // all ones for inf/NaN
  const uint32_t mag = (float_bits(scaled) & ~special) | ((em | 0x7f800000u) & special);
  return bits_float(mag | ((h & 0x8000u) << 16));
}

using tbe_checks::BadIndex;

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
  const float* __restrict psw = a.per_sample_weights;
  O* __restrict out = static_cast<O*>(a.output.data);
  const int64_t T = p.T, B = p.B, N = p.N;
  const BoundsCheckMode check = a.bounds_check;
  const bool mean = a.pooling == PoolingMode::kMean;
  const bool sequence = a.pooling == PoolingMode::kNone;
  // On the CPU the per-feature tables of DeviceMeta are host memory.
  const TableBatchedEmbedding::DeviceMeta& meta = tbe.device_meta();
  const int64_t out_stride = sequence ? (T > 0 ? tbe.feature_dim(0) : 0) : tbe.total_dim();

  // Offsets: monotone, and the last equals N; the first violation in order is reported.
  if (check != BoundsCheckMode::kOff) EMBSCALE_RETURN_IF_ERROR(tbe_checks::check_offsets(offsets, T, B, N));

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
          if (check != BoundsCheckMode::kOff && (idx < 0 || idx >= E)) {
            if (check == BoundsCheckMode::kSkip) {
              ++my_skipped;
            } else if (item < my_bad.item) {
              my_bad = BadIndex{item, pos, idx};
            }
            for (int64_t d = 0; d < D; ++d) o[d] = from_float<O>(0.0f);
            continue;
          }
          const W* __restrict row = table + idx * D;
          const float w = kWeighted ? psw[pos] : 1.0f;
          for (int64_t d = 0; d < D; ++d) o[d] = from_float<O>(kWeighted ? w * load_weight(row + d) : load_weight(row + d));
        }
        continue;
      }

      for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
      int64_t count = 0;
      // Prefetch runs ahead across bag boundaries within the feature: consecutive bags of one feature
      // are adjacent in indices and usually processed by the same thread.
      const int64_t prefetch_end = static_cast<int64_t>(offsets[(f + 1) * B]);
      for (int64_t pos = start; pos < end; ++pos) {
        if (pos + kPrefetchDistance < prefetch_end) {
          const int64_t ahead = static_cast<int64_t>(indices[pos + kPrefetchDistance]);
          if (ahead >= 0 && ahead < E) prefetch_row(table + ahead * D, D);
        }
        const int64_t idx = static_cast<int64_t>(indices[pos]);
        if (check != BoundsCheckMode::kOff && (idx < 0 || idx >= E)) {
          if (check == BoundsCheckMode::kSkip) {
            ++my_skipped;
          } else if (item < my_bad.item) {
            my_bad = BadIndex{item, pos, idx};
          }
          continue;
        }
        const W* __restrict row = table + idx * D;
        if (kWeighted) {
          const float w = psw[pos];
          for (int64_t d = 0; d < D; ++d) acc[d] += w * load_weight(row + d);
        } else {
          for (int64_t d = 0; d < D; ++d) acc[d] += load_weight(row + d);
        }
        ++count;
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

  if (bad.item != INT64_MAX) return tbe_checks::bad_index_error(tbe, offsets, B, bad);
  if (check == BoundsCheckMode::kSkip && a.num_skipped != nullptr) *a.num_skipped = skipped_total;
  return Status::Ok();
}

template <typename W, typename O, typename I>
Status dispatch_weighted(const Params& p) {
  return p.args->per_sample_weights ? forward_impl<W, O, I, true>(p) : forward_impl<W, O, I, false>(p);
}

template <typename W, typename O>
Status dispatch_index(const Params& p) {
  return p.args->indices.dtype == DType::kI32 ? dispatch_weighted<W, O, int32_t>(p)
                                              : dispatch_weighted<W, O, int64_t>(p);
}

template <typename W>
Status dispatch_output(const Params& p) {
  switch (p.args->output.dtype) {
    case DType::kF32: return dispatch_index<W, float>(p);
    case DType::kF16: return dispatch_index<W, fp16_t>(p);
    case DType::kBF16: return dispatch_index<W, bf16_t>(p);
    default: break;
  }
  return invalid_argument(std::string("output: dtype ") + dtype_name(p.args->output.dtype) + " is not supported");
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
  switch (args.weights.dtype) {
    case DType::kF32: return dispatch_output<float>(p);
    case DType::kF16: return dispatch_output<fp16_t>(p);
    case DType::kBF16: return dispatch_output<bf16_t>(p);
    default: break;
  }
  return invalid_argument(std::string("weights: dtype ") + dtype_name(args.weights.dtype) + " is not supported");
}

}  // namespace cpu
}  // namespace embscale
