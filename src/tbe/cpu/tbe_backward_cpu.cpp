// CPU table-batched embedding backward fused with the optimizer (OpenMP, always deterministic).
//
// Steps, each a parallel loop except where noted:
//  1. offsets checked in order (serial, as in the forward), in every bounds-check mode;
//  2. per lookup i (parallel over bags): key = row_offset(table of its feature) + index, or a sentinel
//     for a skipped lookup (out of range in kSkip mode, or before offsets[0]); its grad_output row
//     offset; and its scale: 1 (SUM), per_sample_weights[i] (weighted), 1.0f / count (MEAN, count = the
//     bag's valid lookups, the fp32 reciprocal rounded once). In kError mode the first bad index in
//     (bag, position) order is reported here, before anything is written;
//  3. grad_per_sample_weights[i] = dot(weight row before the update, grad_output row), fp32 in d order;
//  4. (key, lookup) pairs sorted by key then lookup: a stable parallel LSD radix sort on the key's
//     significant bits (pairs start in lookup order). The order is total, so the result does not depend
//     on the thread count; it is the order the CUDA backend also sums in;
//  5. run-length encode into unique rows (segments), serially;
//  6. per unique row (parallel): g[d] = sum over its lookups, in sorted lookup order, of
//     scale * grad_output[row][d] in fp32 (acc = acc + scale*x, never contracted into an FMA; compiled for
//     x86-64-v2/v3/v4 and run at the level cpu_isa.h chooses, bit-identical at each),
//     then the optimizer (update_row, written once against the optimizers' traits, tbe/optimizer_traits.h;
//     row sums as 8 interleaved partial sums, row_sum) and rounding to the weights' dtype (tbe/rounding.h),
//     written exactly once. In dense mode (optimizer none) g is written instead:
//     unique_grads row u holds its table's D columns and zeros in columns [D, max_dim()).
// Scratch comes from the caller's workspace (Layout below, core/workspace.h).
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "tbe/tbe_backend.h"
#include "core/dispatch.h"
#include "core/numerics.h"
#include "core/workspace.h"
#include "tbe/optimizer.h"
#include "tbe/optimizer_table.h"
#include "tbe/optimizer_traits.h"
#include "tbe/rounding.h"
#include "tbe/cpu/cpu_isa.h"
#include "tbe/cpu/prefetch.h"
#include "tbe/cpu/tbe_checks.h"
#include "tbe/cpu/thread_policy.h"

namespace embscale {
namespace cpu {
namespace {

// The row loop prefetches the weights, state and first gradient rows of the unique row this many rows
// ahead: about kRowPrefetchBytes of weights rows, at least 2 and at most 16 rows. Short rows want more rows
// in flight, long ones fewer (docs/tbe_cpu.md#backward, the measurements against FBGEMM's CPU TBE).
constexpr int64_t kRowPrefetchBytes = 1024;
inline int64_t row_prefetch_distance(int64_t max_row_bytes) {
  return std::clamp<int64_t>(kRowPrefetchBytes / std::max<int64_t>(max_row_bytes, 1), 2, 16);
}
constexpr int64_t kRowPrefetchGradRows = 2;

// sum over d in [0, D) of term(d) as an OpenMP SIMD reduction: partial sums across vector lanes, a fixed
// order for a given build, so the result is deterministic for any thread count (CUDA sums rows in its
// own fixed order).
template <typename F>
inline float row_sum(int D, F term) {
  float p[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int d = 0;
  for (; d + 8 <= D; d += 8)
    for (int k = 0; k < 8; ++k) p[k] += term(d + k);
  for (int k = 0; d + k < D; ++k) p[k] += term(d + k);
  return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

// What update_row reads besides the row: the optimizer, its state buffers and the rounding.
struct UpdateArgs {
  const OptimizerParams& op;
  const opt::AdamCorrections& corr;
  float* m1;  // TbeBackwardArgs::momentum1, null if absent
  float* m2;  // TbeBackwardArgs::momentum2, null if absent
  WeightRounding rounding;
  uint64_t rkey;
  const int64_t* rbases;  // TbeBackwardArgs::rounding_bases, null if absent
};

// Optimizer Opt's update of one unique row: its D weights w (element welem of the weights, row-wise
// state index key), its summed, clipped gradient g; wv: scratch for the row's new fp32 values (LAMB's
// directions). The weights are written once: in the same pass as their new values are computed, or,
// when the row is renormalised (max_norm) or takes a trust ratio (LAMB), after the norm it needs.
template <typename Opt, typename W>
void update_row(W* __restrict w, const float* __restrict g, float* __restrict wv, int D, int64_t key,
                int64_t welem, const UpdateArgs& u) {
  const OptimizerParams& op = u.op;
  float* __restrict m1 = u.m1;
  float* __restrict m2 = u.m2;
  // The element index stochastic rounding hashes for w[0] (TbeBackwardArgs::rounding_bases).
  const int64_t relem = u.rbases != nullptr ? u.rbases[key] : welem;
  const auto sum_sq_w = [&]() {
    return row_sum(D, [&](int d) {
      const float x = to_float(w[d]);
      return x * x;
    });
  };
  opt::RowTerms terms;
  if constexpr (Opt::kReduction != opt::RowReduction::kNone) {
    opt::RowSums sums;
    sums.grad = row_sum(D, [&](int d) { return opt::row_sq_term(g[d], to_float(w[d]), op); });
    if constexpr (Opt::kReduction == opt::RowReduction::kSumSqGradAndWeight) sums.weight = sum_sq_w();
    float* state = nullptr;
    if constexpr (Opt::kRowState) state = Opt::row_state(m1, m2) + key;
    terms = Opt::row_terms(state, sums, D, op, u.corr);
  }
  const auto new_value = [&](int d) {
    float* const e1 = Opt::kElementM1 ? m1 + welem + d : nullptr;
    float* const e2 = Opt::kElementM2 ? m2 + welem + d : nullptr;
    return Opt::apply(to_float(w[d]), g[d], terms, e1, e2, op, u.corr);
  };
  if constexpr (Opt::kTrustRatio) {
    // LAMB: every element's direction (its state updated), the row's ratio, then the steps.
    for (int d = 0; d < D; ++d) wv[d] = new_value(d);
    const float ratio = opt::trust_ratio(sum_sq_w(), row_sum(D, [&](int d) { return wv[d] * wv[d]; }));
    for (int d = 0; d < D; ++d)
      w[d] = round_weight<W>(opt::trust_step(to_float(w[d]), wv[d], ratio, op), u.rounding, u.rkey, relem + d);
    return;
  }
  if (!Opt::renormalises(op)) {
    for (int d = 0; d < D; ++d) w[d] = round_weight<W>(new_value(d), u.rounding, u.rkey, relem + d);
    return;
  }
  for (int d = 0; d < D; ++d) wv[d] = new_value(d);
  const float sum_w = row_sum(D, [&](int d) { return wv[d] * wv[d]; });
  const float factor = opt::max_norm_factor(sum_w, op);
  for (int d = 0; d < D; ++d) wv[d] *= factor;
  for (int d = 0; d < D; ++d) w[d] = round_weight<W>(wv[d], u.rounding, u.rkey, relem + d);
}

struct KeyPos {
  int64_t key;
  int64_t pos;
};

// The workspace (tbe_backward_workspace_size and the call build the same one): two pair arrays, the
// per-lookup row offsets and scales, and the segment starts; nothing without lookups.
struct Layout {
  WorkspaceLayout ws{WorkspaceLayout::Base::kAsGiven};
  WorkspaceSlice pairs, tmp, go_off, scale, seg;
  explicit Layout(int64_t N) {
    const size_t n = static_cast<size_t>(N);
    if (n == 0) return;
    pairs = ws.add(n * sizeof(KeyPos));
    tmp = ws.add(n * sizeof(KeyPos));
    go_off = ws.add(n * sizeof(int64_t));
    scale = ws.add(n * sizeof(float));
    seg = ws.add((n + 1) * sizeof(int64_t));
  }
};

using tbe_checks::BadIndex;

// The gradient sum of one unique row (tbe_backward_grad_sum.inc), compiled for each instruction-set level.
namespace x86_64_v2 {
#include "tbe/cpu/tbe_backward_grad_sum.inc"
}  // namespace x86_64_v2
#if EMBSCALE_CPU_WIDE_ISAS
EMBSCALE_CPU_TARGET_V3_BEGIN
namespace x86_64_v3 {
#include "tbe/cpu/tbe_backward_grad_sum.inc"
}  // namespace x86_64_v3
EMBSCALE_CPU_TARGET_END
EMBSCALE_CPU_TARGET_V4_BEGIN
namespace x86_64_v4 {
#include "tbe/cpu/tbe_backward_grad_sum.inc"
}  // namespace x86_64_v4
EMBSCALE_CPU_TARGET_END
#endif

template <typename G>
using SumRowGrads = void (*)(float*, int, const G*, const KeyPos*, int64_t, int64_t, const int64_t*, const float*);

// sum_row_grads<G> at the level cpu_isa.h chooses.
template <typename G>
SumRowGrads<G> sum_row_grads_for_cpu() {
#if EMBSCALE_CPU_WIDE_ISAS
  switch (active_cpu_isa()) {
    case CpuIsa::kX86_64_v4: return x86_64_v4::sum_row_grads<G>;
    case CpuIsa::kX86_64_v3: return x86_64_v3::sum_row_grads<G>;
    case CpuIsa::kX86_64_v2: break;
  }
#endif
  return x86_64_v2::sum_row_grads<G>;
}

struct Params {
  const TableBatchedEmbedding* tbe;
  const TbeBackwardArgs* args;
  int64_t T, B, N;
  int threads;
  void* ws;
  const Layout* layout;  // of ws
};

// Stable LSD radix sort of pairs[0, N) by key (every key < 2^key_bits), kDigitBits per pass, using
// tmp[0, N) as the other buffer; returns the array holding the result. The pairs arrive in lookup
// order, so ties keep it: the result is the (key, lookup) order, for any thread count. Each pass: per-
// thread digit counts over a contiguous slice, one exclusive scan (digit-major, thread-minor), and a
// scatter of each slice in order.
KeyPos* sort_pairs(KeyPos* pairs, KeyPos* tmp, int64_t N, int key_bits, int threads) {
  constexpr int kDigitBits = 11;
  constexpr int64_t kBuckets = int64_t{1} << kDigitBits;
  std::vector<int64_t> counts(static_cast<size_t>(std::max(threads, 1)) * kBuckets);
  KeyPos* src = pairs;
  KeyPos* dst = tmp;
  for (int shift = 0; shift < key_bits; shift += kDigitBits) {
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t lo = N * t / nt, hi = N * (t + 1) / nt;
      int64_t* c = counts.data() + t * kBuckets;
      std::fill(c, c + kBuckets, int64_t{0});
      for (int64_t i = lo; i < hi; ++i) ++c[(src[i].key >> shift) & (kBuckets - 1)];
#pragma omp barrier
#pragma omp single
      {
        int64_t running = 0;
        for (int64_t d = 0; d < kBuckets; ++d)
          for (int u = 0; u < nt; ++u) {
            const int64_t n = counts[u * kBuckets + d];
            counts[u * kBuckets + d] = running;
            running += n;
          }
      }
      for (int64_t i = lo; i < hi; ++i) dst[c[(src[i].key >> shift) & (kBuckets - 1)]++] = src[i];
    }
    std::swap(src, dst);
  }
  return src;
}

template <typename W, typename G, typename I>
Status backward_impl(const Params& p) {
  const TbeBackwardArgs& a = *p.args;
  const TableBatchedEmbedding& tbe = *p.tbe;
  W* __restrict weights = static_cast<W*>(a.weights.data);
  const I* __restrict indices = static_cast<const I*>(a.indices.data);
  const I* __restrict offsets = static_cast<const I*>(a.offsets.data);
  const float* __restrict psw = static_cast<const float*>(a.per_sample_weights.data);
  const G* __restrict grad = static_cast<const G*>(a.grad_output.data);
  const int64_t T = p.T, B = p.B, N = p.N;
  // kWarn is kSkip here: nothing is waited for on the CPU.
  const BoundsCheckMode check = tbe_bounds::skips_bad_indices(a.bounds_check) ? BoundsCheckMode::kSkip : a.bounds_check;
  const bool mean = a.pooling == PoolingMode::kMean;
  const bool sequence = a.pooling == PoolingMode::kNone;
  const TableBatchedEmbedding::DeviceMeta& meta = tbe.device_meta();  // host memory on the CPU
  const int64_t go_stride = sequence ? (T > 0 ? tbe.feature_dim(0) : 0) : tbe.total_dim();
  const int threads = p.threads;

  // 1. offsets
  const int64_t TB = T * B;
  EMBSCALE_RETURN_IF_ERROR(tbe_checks::check_offsets(tbe, offsets, T, B, N));
  if (N == 0) {
    if (opt::dense_mode(a.optimizer.type)) *a.num_unique = 0;
    if (check == BoundsCheckMode::kSkip && a.num_skipped != nullptr) *a.num_skipped = 0;
    return Status::Ok();
  }

  // A skipped lookup's key: total_rows() sorts after every real row and keeps keys within
  // bit_width(total_rows()) bits for the radix sort.
  const int64_t kSkippedKey = tbe.total_rows();
  int key_bits = 0;
  while ((kSkippedKey >> key_bits) != 0) ++key_bits;

  const Layout& L = *p.layout;
  KeyPos* pairs = L.ws.at<KeyPos>(p.ws, L.pairs);
  KeyPos* tmp = L.ws.at<KeyPos>(p.ws, L.tmp);
  int64_t* go_off = L.ws.at<int64_t>(p.ws, L.go_off);
  float* scale = L.ws.at<float>(p.ws, L.scale);
  int64_t* seg = L.ws.at<int64_t>(p.ws, L.seg);

  // 2. keys, grad_output rows, scales. Lookups before offsets[0] belong to no bag.
  const int64_t first = std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(offsets[0]), 0), N);
  for (int64_t pos = 0; pos < first; ++pos) {
    pairs[pos] = KeyPos{kSkippedKey, pos};
    go_off[pos] = 0;
    scale[pos] = 0.0f;
  }
  BadIndex bad;
  int64_t skipped_total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : skipped_total)
  {
    BadIndex my_bad;
#pragma omp for schedule(dynamic, 64)
    for (int64_t item = 0; item < TB; ++item) {
      const int f = static_cast<int>(item / B);
      const int64_t b = item % B;
      const int64_t E = meta.num_rows[f];
      const int64_t start = static_cast<int64_t>(offsets[item]);
      const int64_t end = static_cast<int64_t>(offsets[item + 1]);
      int64_t count = 0;
      for (int64_t pos = start; pos < end; ++pos) {
        const int64_t idx = static_cast<int64_t>(indices[pos]);
        const bool valid = idx >= 0 && idx < E;  // an invalid one is dropped in off mode too (unreported)
        if (!valid) {
          if (check == BoundsCheckMode::kSkip) {
            ++skipped_total;
          } else if (check == BoundsCheckMode::kError && item < my_bad.item) {
            my_bad = BadIndex{item, pos, idx};
          }
        } else {
          ++count;
        }
        pairs[pos] = KeyPos{valid ? meta.row_offsets[f] + idx : kSkippedKey, pos};
        go_off[pos] = sequence ? pos * go_stride : b * go_stride + meta.output_offsets[f];
      }
      const float mean_scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
      for (int64_t pos = start; pos < end; ++pos) scale[pos] = mean ? mean_scale : (psw ? psw[pos] : 1.0f);
    }
    if (my_bad.item != INT64_MAX) {
#pragma omp critical(embscale_tbe_backward_bad_index)
      {
        tbe_checks::keep_first(my_bad, &bad);
      }
    }
  }
  if (bad.item != INT64_MAX) return tbe_checks::bad_index_error(tbe, offsets, B, N, bad);

  // 3. gradient w.r.t. the per-sample weights, from the weights before any update.
  if (a.grad_per_sample_weights.data != nullptr) {
    float* __restrict gpsw = static_cast<float*>(a.grad_per_sample_weights.data);
    for (int64_t pos = 0; pos < first; ++pos) gpsw[pos] = 0.0f;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 64)
    for (int64_t item = 0; item < TB; ++item) {
      const int f = static_cast<int>(item / B);
      const int64_t D = meta.dims[f];
      const int64_t start = static_cast<int64_t>(offsets[item]);
      const int64_t end = static_cast<int64_t>(offsets[item + 1]);
      for (int64_t pos = start; pos < end; ++pos) {
        if (pairs[pos].key == kSkippedKey) {
          gpsw[pos] = 0.0f;
          continue;
        }
        const W* __restrict row = weights + meta.weight_offsets[f] + static_cast<int64_t>(indices[pos]) * D;
        const G* __restrict go = grad + go_off[pos];
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += to_float(row[d]) * to_float(go[d]);
        gpsw[pos] = dot;
      }
    }
  }

  // 4. sort; 5. segments over the valid lookups (skipped ones sorted to the end).
  const KeyPos* sorted = sort_pairs(pairs, tmp, N, key_bits, threads);
  int64_t valid = N;
  while (valid > 0 && sorted[valid - 1].key == kSkippedKey) --valid;
  int64_t U = 0;
  for (int64_t i = 0; i < valid; ++i)
    if (i == 0 || sorted[i].key != sorted[i - 1].key) seg[U++] = i;
  seg[U] = valid;

  // Table of a linearised row: the last table whose first row is <= key.
  const int num_tables = tbe.num_tables();
  std::vector<int64_t> row_first(num_tables + 1);
  for (int t = 0; t <= num_tables; ++t) row_first[t] = t < num_tables ? tbe.row_offset(t) : tbe.total_rows();
  auto table_of = [&](int64_t key) {
    return static_cast<int>(std::upper_bound(row_first.begin(), row_first.end(), key) - row_first.begin()) - 1;
  };

  const OptimizerParams op = a.optimizer;
  const opt::OptimizerSpec& spec = *opt::optimizer_spec(op.type);  // a valid type (checked by the API layer)
  const bool dense = opt::dense_mode(op.type);
  const opt::AdamCorrections corr = opt::adam_corrections(op);
  const int max_dim = tbe.max_dim();
  float* __restrict m1 = static_cast<float*>(a.momentum1.data);
  float* __restrict m2 = static_cast<float*>(a.momentum2.data);
  const UpdateArgs update{op, corr, m1, m2, a.rounding, rounding_key(a.seed, op.step),
                          static_cast<const int64_t*>(a.rounding_bases.data)};
  const SumRowGrads<G> sum_grads = sum_row_grads_for_cpu<G>();

  const int64_t ahead = row_prefetch_distance(static_cast<int64_t>(max_dim) * static_cast<int64_t>(sizeof(W)));
  // 6. one owner per unique row.
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> g_storage(static_cast<size_t>(max_dim) + 16), w_storage(static_cast<size_t>(max_dim) + 16);
    float* __restrict gacc = g_storage.data();
    float* __restrict wv = w_storage.data();
    // Where unique row v's weights start, its table's D and its key.
    auto locate = [&](int64_t v, int* D, int64_t* welem) {
      const int64_t key = sorted[seg[v]].key;
      const int t = table_of(key);
      *D = tbe.config().tables[t].dim;
      *welem = tbe.weight_offset(t) + (key - row_first[t]) * *D;
      return key;
    };
#pragma omp for schedule(dynamic, 32)
    for (int64_t u = 0; u < U; ++u) {
      if (u + ahead < U) {
        int Dp;
        int64_t wp;
        const int64_t v = u + ahead;
        const int64_t kp = locate(v, &Dp, &wp);
        for (int64_t j = seg[v]; j < std::min(seg[v + 1], seg[v] + kRowPrefetchGradRows); ++j)
          prefetch_row(grad + go_off[sorted[j].pos], Dp);
        if (!dense) {
          prefetch_row(weights + wp, Dp);
          // optimizer state: one float per row (row-wise) or the row's D floats (element-wise)
          if (m1 != nullptr) {
            const bool rw = spec.momentum1.layout == opt::StateLayout::kRowwise;
            prefetch_row(m1 + (rw ? kp : wp), rw ? 1 : Dp);
          }
          if (m2 != nullptr) {
            const bool rw = spec.momentum2.layout == opt::StateLayout::kRowwise;
            prefetch_row(m2 + (rw ? kp : wp), rw ? 1 : Dp);
          }
        }
      }
      int D;
      int64_t welem;
      const int64_t key = locate(u, &D, &welem);
      float* __restrict g = dense ? static_cast<float*>(a.unique_grads.data) + u * max_dim : gacc;
      // g = 0 + the row's lookups in sorted order (the explicit 0 + keeps -0 out, as on CUDA).
      sum_grads(g, D, grad, sorted, seg[u], seg[u + 1], go_off, scale);
      if (dense) {
        for (int d = D; d < max_dim; ++d) g[d] = 0.0f;
        static_cast<int64_t*>(a.unique_rows.data)[u] = key;
        continue;
      }
      if (op.gradient_clipping > 0.0f)
        for (int d = 0; d < D; ++d) g[d] = opt::clip_grad(g[d], op);
      opt::visit_optimizer(op.type, [&](auto o) {
        using Opt = decltype(o);
        if constexpr (!Opt::kDense) update_row<Opt>(weights + welem, g, wv, D, key, welem, update);
      });
    }
  }

  if (dense) *a.num_unique = U;
  if (check == BoundsCheckMode::kSkip && a.num_skipped != nullptr) *a.num_skipped = skipped_total;
  return Status::Ok();
}

}  // namespace

Status tbe_backward_workspace_size(const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, size_t* bytes) {
  (void)tbe;
  *bytes = Layout(args.indices.numel()).ws.size();
  return Status::Ok();
}

Status tbe_backward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, void* ws,
                    size_t ws_bytes) {
  Params p;
  p.tbe = &tbe;
  p.args = &args;
  p.T = tbe.num_features();
  p.B = args.batch_size;
  p.N = args.indices.numel();
  // Bytes of gradient rows gathered: the lookups times the features' mean row size.
  const int64_t row_bytes =
      p.T > 0 ? p.N * (tbe.total_dim() / p.T) * static_cast<int64_t>(dtype_size(args.grad_output.dtype)) : 0;
  p.threads = threads_for_call(ctx, row_bytes);
  const Layout layout(p.N);
  EMBSCALE_RETURN_IF_ERROR(layout.ws.check(ctx, ws, ws_bytes, "backward_workspace_size()"));
  p.ws = ws;
  p.layout = &layout;
  return dispatch_float(args.weights.dtype, "weights", [&](auto tw) {
    return dispatch_float(args.grad_output.dtype, "grad_output", [&](auto tg) {
      return dispatch_index(args.indices.dtype, "indices", [&](auto ti) {
        using W = typename decltype(tw)::type;
        using G = typename decltype(tg)::type;
        using I = typename decltype(ti)::type;
        return backward_impl<W, G, I>(p);
      });
    });
  });
}

}  // namespace cpu
}  // namespace embscale
