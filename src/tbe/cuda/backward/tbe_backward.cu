// CUDA table-batched embedding backward fused with the optimizer: workspace layout, the CUB calls,
// the launch order and the bounds-check protocol around the kernels of tbe_backward_kernels.cuh.
//
// Enqueued on ctx.stream, in order (no allocation, no host readback except in error mode), each phase
// one step of tbe_backward_steps.cuh after prepare (the layout and the kernel parameters):
//   linearize   keys/values (+ checks); error and skip modes then run the finalize kernel (bounds_check.cuh),
//               which turns the records into a report (or *num_skipped) and clears them.
//               Error mode: the report is copied back and the stream synchronised HERE, before any
//               weight is written; a bad index or offset returns kOutOfRange and nothing is updated.
//   sort        CUB's onesweep radix sort of pairs (stable) on bits [0, bit_width(max key)) (sort_end_bit),
//               8 or 9 bits a pass (sort_pairs).
//   encode      counters cleared, cub::DeviceSelect::UniqueByKey (each run's key and start), then the
//               classify kernels (run lengths, the work lists in key order, hot-row slots).
//   rows        grad_per_sample_weights, then the warp (lane-group, then whole-warp over the warp
//               list), block-path (block rows and hot-row parts) and hot-combine kernels; all
//               persistent grids (resident blocks per SM x SMs), each reading its list length on the
//               device and taking its work from a counter (the combine zeroes the counters again).
//               From the place kernel on, kernels are launched with programmatic stream
//               serialization (launch_kernel, core/cuda/pdl.cuh): each may be scheduled while its
//               predecessor finishes.
// Skip mode: broken offsets set the report on the device and the row kernels then write nothing;
// outside a graph capture the report is read back at the end (the op synchronises, as the forward
// does) and becomes an error Status; inside a capture *num_skipped is -1 instead.
//
// Keys are uint32 when total_rows + 1 fits (half the sort traffic of uint64), else uint64; values are
// uint32 (lookup ids or bag items), so N and T*B must be below 2^31 and 2^32 - 1.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/dispatch/dispatch_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "tbe/tbe_backend.h"
#include "tbe/optimizer.h"
#include "tbe/rounding.h"
#include "core/cuda/check.cuh"
#include "core/cuda/device.cuh"
#include "core/dispatch.h"
#include "core/workspace.h"
#include "tbe/cuda/backward/tbe_backward_launch.cuh"
#include "tbe/cuda/backward/tbe_backward_steps.cuh"
#include "tbe/cuda/bounds_check.cuh"
#include "tbe/cuda/tbe_report.cuh"

namespace embscale {
namespace cuda {
namespace {


int bit_width(uint64_t v) {
  int b = 0;
  while (v != 0) {
    ++b;
    v >>= 1;
  }
  return b;
}

struct Tuning {
  int max_warp = 0;
  int max_block = 0;
  int block_threads = tbe_bwd::BackwardPolicy::kBlockThreads;
};

// The caller's tuning with its zeros replaced by the architecture's defaults for this TBE's widest row.
Status resolve_tuning(const TbeBackwardTuning& t, int max_dim, Tuning* out) {
  Tuning r;
  r.max_warp = tbe_bwd::BackwardPolicy::max_warp_segment(max_dim, tbe_bwd::kLaneGroupCols);
  r.max_block = tbe_bwd::BackwardPolicy::max_block_segment(max_dim);
  if (t.max_warp_segment != 0) r.max_warp = t.max_warp_segment;
  if (t.max_block_segment != 0) r.max_block = t.max_block_segment;
  if (t.block_threads != 0) r.block_threads = t.block_threads;
  if (r.max_warp < 1) return invalid_argument("tuning.max_warp_segment: " + std::to_string(r.max_warp) + "; expected >= 1");
  if (r.max_block < r.max_warp)
    return invalid_argument("tuning.max_block_segment: " + std::to_string(r.max_block) +
                            " is less than max_warp_segment " + std::to_string(r.max_warp));
  if (r.block_threads < ArchTraits::kWarpSize || r.block_threads > tbe_bwd::kMaxBlockThreads ||
      r.block_threads % ArchTraits::kWarpSize != 0)
    return invalid_argument("tuning.block_threads: " + std::to_string(r.block_threads) +
                            "; the GPU backend takes a multiple of the warp size " + std::to_string(ArchTraits::kWarpSize) +
                            " in " + std::to_string(ArchTraits::kWarpSize) + ".." +
                            std::to_string(tbe_bwd::kMaxBlockThreads));
  *out = r;
  return Status::Ok();
}

// Sub-buffer offsets of the workspace (bytes from its first 256-byte aligned address).
struct Layout {
  WorkspaceLayout ws{WorkspaceLayout::Base::kAligned};  // the caller's buffer may start anywhere
  WorkspaceSlice keys_in, keys_sorted, vals_in, vals_sorted, bag_of, bag_count, unique_keys, run_lengths, run_starts,
      work_list, warp_list, hot_list, hot_base, slot_row, slot_super, partials, counters, classify_tally, cub_temp;
  size_t cub_bytes = 0;
  int64_t max_block_rows = 0, max_warp_rows = 0, max_hot = 0, max_slots = 0;
  bool key64 = false;
  int end_bit = 0;
};

// f(Tag<uint64_t>) when the sort keys are 64-bit, else f(Tag<uint32_t>): the key-width counterpart
// of core/dispatch.h's dtype dispatch.
template <class F>
Status dispatch_key(bool key64, F&& f) {
  return key64 ? f(Tag<uint64_t>{}) : f(Tag<uint32_t>{});
}

// Radix-sort passes. CUB's onesweep sort takes 8 key bits per pass; for 32-bit keys of 17..18 or
// 25..27 significant bits, 9-bit digits take one pass fewer (2 or 3 instead of 3 or 4).
constexpr int kRadixDigitBits = 8;  // CUB's onesweep digit
constexpr int kWideDigitBits = 9;   // NineBitDigits below

int ceil_div_int(int a, int b) { return (a + b - 1) / b; }

bool wide_digits(int end_bit, bool key64) {
  return !key64 && ceil_div_int(end_bit, kWideDigitBits) < ceil_div_int(end_bit, kRadixDigitBits);
}

// The sort covers the largest key. That is the sentinel total_rows where its place matters: dense
// mode (unique rows ascending) and skip/warn modes (a skipped lookup's sentinel may sit between a row's
// lookups). Elsewhere the sentinel marks only lookups before offsets[0] or from offsets[T*B] on, so
// sorting it as its low bits (row 0 when total_rows is a power of two) leaves its run (UniqueByKey
// compares whole keys; classify and the row kernels skip it) before or after all of row 0's lookups,
// whose run stays whole: the bit it needs is dropped (a power-of-two total saves a pass at 2^8, 2^27..).
int sort_end_bit(const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args) {
  const uint64_t total_rows = static_cast<uint64_t>(tbe.total_rows());
  const bool sentinel_ordered =
      args.optimizer.type == OptimizerType::kNone || embscale::tbe_bounds::skips_bad_indices(args.bounds_check);
  const uint64_t max_key = sentinel_ordered || total_rows == 0 ? total_rows : total_rows - 1;
  return std::max(1, bit_width(max_key));
}

// The 9-bit digits (wide_digits): CUB's own sm_90 policy for (uint32 key, uint32 value) with the digit
// width changed (the histogram and the digits' exclusive sum follow it). Same stable LSD order, so the
// same sorted output. The histogram pass (one read of the keys for all passes' digit counts) keeps 4
// private histograms per block instead of 1: repeated keys (Zipf lookups) hit the same bins, and the
// shared-memory atomics on them serialise. CUB's internals: NVIDIA only (on AMD rocPRIM's radix sort
// chooses its own digits).
#if !defined(__HIP_PLATFORM_AMD__)
struct NineBitDigits {
  using Tuned = cub::detail::radix::policy_hub<uint32_t, uint32_t, uint32_t>::Policy900;
  static constexpr int kBits = kWideDigitBits;
  static constexpr int kHistogramParts = 4;
  struct Policy : cub::ChainedPolicy<900, Policy, Policy> {
    static constexpr bool ONESWEEP = true;
    static constexpr int ONESWEEP_RADIX_BITS = kBits;
    using HistogramPolicy = cub::AgentRadixSortHistogramPolicy<128, 16, kHistogramParts, uint32_t, kBits>;
    using ExclusiveSumPolicy = cub::AgentRadixSortExclusiveSumPolicy<256, kBits>;
    using OnesweepPolicy =
        cub::AgentRadixSortOnesweepPolicy<Tuned::OnesweepPolicy::BLOCK_THREADS, Tuned::OnesweepPolicy::ITEMS_PER_THREAD,
                                          uint32_t, Tuned::OnesweepPolicy::RANK_NUM_PARTS,
                                          Tuned::OnesweepPolicy::RANK_ALGORITHM, Tuned::OnesweepPolicy::SCAN_ALGORITHM,
                                          Tuned::OnesweepPolicy::STORE_ALGORITHM, kBits>;
    // Paths onesweep does not take on sm_90, kept as CUB has them.
    using ScanPolicy = Tuned::ScanPolicy;
    using DownsweepPolicy = Tuned::DownsweepPolicy;
    using AltDownsweepPolicy = Tuned::AltDownsweepPolicy;
    using UpsweepPolicy = Tuned::UpsweepPolicy;
    using AltUpsweepPolicy = Tuned::AltUpsweepPolicy;
    using SingleTilePolicy = Tuned::SingleTilePolicy;
    using SegmentedPolicy = Tuned::SegmentedPolicy;
    using AltSegmentedPolicy = Tuned::AltSegmentedPolicy;
  };
  using MaxPolicy = Policy;
};
#endif

// Stable sort of n (key, value) pairs on key bits [0, end_bit); temp == nullptr: size query.
template <typename K>
cudaError_t sort_pairs(void* temp, size_t& bytes, const K* keys_in, K* keys_out, const uint32_t* vals_in,
                       uint32_t* vals_out, int n, int end_bit, cudaStream_t s) {
#if !defined(__HIP_PLATFORM_AMD__)
  if constexpr (sizeof(K) == 4) {
    if (wide_digits(end_bit, false)) {
      cub::DoubleBuffer<uint32_t> keys(const_cast<uint32_t*>(keys_in), keys_out);
      cub::DoubleBuffer<uint32_t> vals(const_cast<uint32_t*>(vals_in), vals_out);
      return cub::DispatchRadixSort<cub::SortOrder::Ascending, uint32_t, uint32_t, uint32_t,
                                    cub::detail::identity_decomposer_t, NineBitDigits>::Dispatch(temp, bytes, keys, vals,
                                                                                               static_cast<uint32_t>(n), 0,
                                                                                               end_bit, false, s);
    }
  }
#endif
  return cub::DeviceRadixSort::SortPairs(temp, bytes, keys_in, keys_out, vals_in, vals_out, n, 0, end_bit, s);
}

// The runs of equal sorted keys: each run's key and first position (its start), and their count, in
// one CUB pass (unique-by-key over the positions). The classify tally kernel derives the run lengths
// from consecutive starts (one pass over the keys instead of a run-length encode and a scan over all
// n positions). temp == nullptr: size query.
template <typename K>
cudaError_t select_runs(void* temp, size_t& bytes, const K* keys, K* unique_keys, uint32_t* starts, uint32_t* count,
                        int n, cudaStream_t s) {
  return cub::DeviceSelect::UniqueByKey(temp, bytes, keys, thrust::counting_iterator<uint32_t>(0), unique_keys, starts,
                                        count, n, s);
}

struct CallShape {
  int64_t N = 0, B = 0, items = 0, total_rows = 0;
  bool sequence = false, mean = false, vals_are_items = true;
};

CallShape call_shape(const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args) {
  CallShape c;
  c.N = args.indices.numel();
  c.B = args.batch_size;
  c.items = static_cast<int64_t>(tbe.num_features()) * c.B;
  c.total_rows = tbe.total_rows();
  c.sequence = args.pooling == PoolingMode::kNone;
  c.mean = args.pooling == PoolingMode::kMean;
  c.vals_are_items = !c.sequence && args.per_sample_weights.data == nullptr && args.grad_per_sample_weights.data == nullptr;
  return c;
}

template <typename K>
Status cub_bytes(int64_t N, int end_bit, cudaStream_t s, size_t* out) {
  const int n = static_cast<int>(N);
  size_t sort = 0, select = 0;
  EMBSCALE_RETURN_IF_ERROR(cuda_status(sort_pairs<K>(nullptr, sort, nullptr, nullptr, nullptr, nullptr, n, end_bit, s),
                                       "cub::DeviceRadixSort::SortPairs (size)"));
  EMBSCALE_RETURN_IF_ERROR(cuda_status(select_runs<K>(nullptr, select, nullptr, nullptr, nullptr, nullptr, n, s),
                                       "cub::DeviceSelect::UniqueByKey (size)"));
  *out = std::max(sort, select);
  return Status::Ok();
}

Status make_layout(const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, const Tuning& t, cudaStream_t s,
                   Layout* out) {
  const CallShape c = call_shape(tbe, args);
  if (c.N > INT32_MAX)
    return unsupported("indices: " + std::to_string(c.N) + " lookups; the CUDA backward supports up to 2^31 - 1");
  if (c.items >= static_cast<int64_t>(UINT32_MAX))
    return unsupported("batch_size: T*B = " + std::to_string(c.items) + " bags; the CUDA backward supports fewer than 2^32 - 1");
  Layout L;
  L.key64 = static_cast<uint64_t>(c.total_rows) >= UINT32_MAX;  // the sentinel total_rows must fit the key
  L.end_bit = sort_end_bit(tbe, args);
  const size_t N = static_cast<size_t>(c.N);
  const size_t kb = L.key64 ? 8 : 4;
  L.max_block_rows = c.N / (static_cast<int64_t>(t.max_warp) + 1) + 1;
  // Listed warp rows have more than group_max_lookups >= kGroupMaxLookups lookups each.
  static_assert(tbe_bwd::kNarrowGroupMaxLookups >= tbe_bwd::kGroupMaxLookups, "the warp list's bound");
  L.max_warp_rows = c.N / (tbe_bwd::kGroupMaxLookups + 1) + 1;
  L.max_hot = c.N / (static_cast<int64_t>(t.max_block) + 1) + 1;
  L.max_slots = c.N / tbe_bwd::kSuperChunk + L.max_hot + 1;
  L.keys_in = L.ws.add(N * kb);
  L.keys_sorted = L.ws.add(N * kb);
  L.vals_in = L.ws.add(N * 4);
  L.vals_sorted = L.ws.add(N * 4);
  L.bag_of = L.ws.add(c.vals_are_items ? 0 : N * 4);
  L.bag_count = L.ws.add(c.mean ? static_cast<size_t>(c.items) * 4 : 0);
  L.unique_keys = L.ws.add(N * kb);
  L.run_lengths = L.ws.add(N * 4);
  L.run_starts = L.ws.add(N * 4);
  L.work_list = L.ws.add(static_cast<size_t>(L.max_block_rows + L.max_slots) * 4);
  L.warp_list = L.ws.add(static_cast<size_t>(L.max_warp_rows) * 4);
  L.hot_list = L.ws.add(static_cast<size_t>(L.max_hot) * 4);
  L.hot_base = L.ws.add(static_cast<size_t>(L.max_hot) * 4);
  L.slot_row = L.ws.add(static_cast<size_t>(L.max_slots) * 4);
  L.slot_super = L.ws.add(static_cast<size_t>(L.max_slots) * 4);
  L.partials = L.ws.add(static_cast<size_t>(L.max_slots) * static_cast<size_t>(tbe.max_dim()) * 4);
  L.counters = L.ws.add(tbe_bwd::kNumCounters * 4);
  L.classify_tally = L.ws.add(tbe_bwd::kClassifyBlocks * sizeof(tbe_bwd::ClassTally));
  if (c.N > 0) {
    EMBSCALE_RETURN_IF_ERROR(dispatch_key(
        L.key64, [&](auto tk) { return cub_bytes<typename decltype(tk)::type>(c.N, L.end_bit, s, &L.cub_bytes); }));
  }
  L.cub_temp = L.ws.add(L.cub_bytes);
  *out = L;
  return Status::Ok();
}

tbe_bwd::Buffers buffers(void* ws, const Layout& L, int64_t N) {
  const auto u32 = [&](WorkspaceSlice s) { return L.ws.at<uint32_t>(ws, s); };
  tbe_bwd::Buffers b;
  b.keys_in = L.ws.at<void>(ws, L.keys_in);
  b.keys_sorted = L.ws.at<void>(ws, L.keys_sorted);
  b.unique_keys = L.ws.at<void>(ws, L.unique_keys);
  b.cub_temp = L.ws.at<void>(ws, L.cub_temp);
  b.vals_in = u32(L.vals_in);
  b.vals_sorted = u32(L.vals_sorted);
  b.bag_of = u32(L.bag_of);
  b.run_lengths = u32(L.run_lengths);
  b.run_starts = u32(L.run_starts);
  b.work_list = u32(L.work_list);
  b.warp_list = u32(L.warp_list);
  b.hot_list = u32(L.hot_list);
  b.hot_base = u32(L.hot_base);
  b.slot_row = u32(L.slot_row);
  b.slot_super = u32(L.slot_super);
  b.counters = u32(L.counters);
  b.bag_count = L.ws.at<int32_t>(ws, L.bag_count);
  b.partials = L.ws.at<float>(ws, L.partials);
  b.tally = L.ws.at<tbe_bwd::ClassTally>(ws, L.classify_tally);
  b.n = static_cast<int>(N);
  return b;
}

template <typename K, typename I>
Status launch_linearize(const tbe_bwd::LinearizeParams& p, cudaStream_t s) {
  const int64_t blocks = std::max<int64_t>(1, (p.num_items + tbe_bwd::kLinearizeItems - 1) / tbe_bwd::kLinearizeItems);
  tbe_bwd::tbe_backward_linearize_kernel<K, I><<<static_cast<unsigned>(blocks), tbe_bwd::kLinearizeItems, 0, s>>>(p);
  EMBSCALE_CHECK_LAUNCH("tbe_backward_linearize_kernel");
  return Status::Ok();
}

template <typename I>
Status launch_finalize(const tbe_bwd::LinearizeParams& p, int64_t* num_skipped, cudaStream_t s) {
  tbe_bounds::tbe_bounds_finalize_kernel<I><<<1, ArchTraits::kWarpSize, 0, s>>>(static_cast<const I*>(p.offsets),
                                                          static_cast<const I*>(p.indices), p.num_items,
                                                          p.num_indices, p.check, p.scratch, num_skipped);
  EMBSCALE_CHECK_LAUNCH("tbe_bounds_finalize_kernel (backward)");
  return Status::Ok();
}

template <typename K>
Status run_sort(const TbeBackwardCall& call) {
  const tbe_bwd::Buffers& b = call.b;
  size_t bytes = call.cub_bytes;
  return cuda_status(sort_pairs<K>(b.cub_temp, bytes, static_cast<const K*>(b.keys_in), static_cast<K*>(b.keys_sorted),
                                   b.vals_in, b.vals_sorted, b.n, call.end_bit, call.stream),
                     "cub::DeviceRadixSort::SortPairs");
}

template <typename K>
Status run_encode(const TbeBackwardCall& call) {
  const tbe_bwd::Buffers& b = call.b;
  size_t bytes = call.cub_bytes;
  return cuda_status(select_runs<K>(b.cub_temp, bytes, static_cast<const K*>(b.keys_sorted),
                                    static_cast<K*>(b.unique_keys), b.run_starts, b.counters + tbe_bwd::kNumRuns, b.n,
                                    call.stream),
                     "cub::DeviceSelect::UniqueByKey (runs)");
}

bool aligned(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

Status tbe_backward_workspace_size(const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, size_t* bytes) {
  Tuning t;
  EMBSCALE_RETURN_IF_ERROR(resolve_tuning(args.tuning, tbe.max_dim(), &t));
  Layout L;
  EMBSCALE_RETURN_IF_ERROR(make_layout(tbe, args, t, nullptr, &L));
  *bytes = L.ws.size();
  return Status::Ok();
}

Status tbe_backward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, void* ws,
                    size_t ws_bytes) {
  TbeBackwardCall call;
  EMBSCALE_RETURN_IF_ERROR(tbe_backward_prepare(ctx, tbe, args, ws, ws_bytes, &call));
  EMBSCALE_RETURN_IF_ERROR(tbe_backward_linearize(call));
  EMBSCALE_RETURN_IF_ERROR(tbe_backward_sort(call));
  EMBSCALE_RETURN_IF_ERROR(tbe_backward_encode(call));
  EMBSCALE_RETURN_IF_ERROR(tbe_backward_rows(call));
  return tbe_backward_finish(call);
}

Status tbe_backward_prepare(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args,
                            void* ws, size_t ws_bytes, TbeBackwardCall* call) {
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const TableBatchedEmbedding::DeviceMeta& meta = tbe.device_meta();
  Tuning t;
  EMBSCALE_RETURN_IF_ERROR(resolve_tuning(args.tuning, tbe.max_dim(), &t));
  Layout L;
  EMBSCALE_RETURN_IF_ERROR(make_layout(tbe, args, t, stream, &L));
  EMBSCALE_RETURN_IF_ERROR(L.ws.check(ctx, ws, ws_bytes, "backward_workspace_size()", tbe.known_pointers()));
  const CallShape c = call_shape(tbe, args);
  const bool dense = args.optimizer.type == OptimizerType::kNone;

  bool capturing = false;
  EMBSCALE_RETURN_IF_ERROR(tbe_report::capture_state(args.bounds_check, stream, &capturing));

  const tbe_bwd::Buffers b = buffers(ws, L, c.N);
  const int T = tbe.num_features();
  const bool skips = embscale::tbe_bounds::skips_bad_indices(args.bounds_check);  // skip and warn modes
  const int64_t* skip_report = skips ? meta.scratch + tbe_bounds::kReport : nullptr;

  tbe_bwd::LinearizeParams lp{};
  lp.indices = args.indices.data;
  lp.offsets = args.offsets.data;
  lp.num_rows = meta.num_rows;
  lp.row_offsets = meta.row_offsets;
  lp.scratch = meta.scratch;
  lp.keys_in = b.keys_in;
  lp.vals_in = b.vals_in;
  lp.bag_of = b.bag_of;
  lp.bag_count = b.bag_count;
  lp.batch_size = c.B;
  lp.num_indices = c.N;
  lp.num_items = c.items;
  lp.total_rows = c.total_rows;
  lp.check = args.bounds_check == BoundsCheckMode::kError ? tbe_bounds::kCheckError
             : skips                                      ? tbe_bounds::kCheckSkip
                                                          : tbe_bounds::kCheckOff;
  lp.vals_are_items = c.vals_are_items ? 1 : 0;
  lp.mean = c.mean ? 1 : 0;

  tbe_bwd::RowParams rp{};
  rp.weights = args.weights.data;
  rp.grad_output = args.grad_output.data;
  rp.psw = static_cast<const float*>(args.per_sample_weights.data);
  rp.weight_offsets = meta.weight_offsets;
  rp.dims = meta.dims;
  rp.output_offsets = meta.output_offsets;
  rp.row_offsets = meta.row_offsets;
  rp.momentum1 = static_cast<float*>(args.momentum1.data);
  rp.momentum2 = static_cast<float*>(args.momentum2.data);
  rp.grad_psw = static_cast<float*>(args.grad_per_sample_weights.data);
  rp.unique_grads = static_cast<float*>(args.unique_grads.data);
  rp.keys_in = b.keys_in;
  rp.vals_sorted = b.vals_sorted;
  rp.bag_of = b.bag_of;
  rp.bag_count = b.bag_count;
  rp.unique_keys = b.unique_keys;
  rp.run_lengths = b.run_lengths;
  rp.run_starts = b.run_starts;
  rp.work_list = b.work_list;
  rp.warp_list = b.warp_list;
  rp.hot_list = b.hot_list;
  rp.hot_base = b.hot_base;
  rp.slot_row = b.slot_row;
  rp.slot_super = b.slot_super;
  rp.partials = b.partials;
  rp.counters = b.counters;
  rp.skip_report = skip_report;
  rp.batch_size = c.B;
  rp.num_indices = c.N;
  rp.total_rows = c.total_rows;
  rp.grad_stride = c.sequence ? (T > 0 ? tbe.feature_dim(0) : 0) : tbe.total_dim();
  rp.max_dim = tbe.max_dim();
  rp.key64 = L.key64 ? 1 : 0;
  rp.sequence = c.sequence ? 1 : 0;
  rp.vals_are_items = c.vals_are_items ? 1 : 0;
  rp.contrib = c.mean ? tbe_bwd::kContribMean
                      : (args.per_sample_weights.data != nullptr ? tbe_bwd::kContribWeighted : tbe_bwd::kContribPlain);
  // Vector access: every row of every table (and every gradient row) starts at a multiple of kVec
  // elements of a suitably aligned base.
  const size_t wes = dtype_size(args.weights.dtype), ges = dtype_size(args.grad_output.dtype);
  bool w_vec = aligned(args.weights.data, wes * tbe_bwd::kVec), g_vec = aligned(args.grad_output.data, ges * tbe_bwd::kVec);
  bool dims_whole = true;
  for (int f = 0; f < T; ++f) {
    dims_whole = dims_whole && tbe.feature_dim(f) % tbe_bwd::kVec == 0;
    w_vec = w_vec && dims_whole && tbe.weight_offset(tbe.feature_table(f)) % tbe_bwd::kVec == 0;
    g_vec = g_vec && rp.grad_stride % tbe_bwd::kVec == 0 && (c.sequence || tbe.output_offset(f) % tbe_bwd::kVec == 0);
  }
  rp.w_vec = w_vec ? 1 : 0;
  rp.g_vec = g_vec ? 1 : 0;
  rp.ug_vec = (dense && aligned(args.unique_grads.data, 4 * tbe_bwd::kVec) && tbe.max_dim() % tbe_bwd::kVec == 0) ? 1 : 0;
  rp.whole_vecs = (dims_whole && g_vec && (dense ? rp.ug_vec != 0 : w_vec)) ? 1 : 0;
  // Element-wise state is laid out as the weights (fp32): with w_vec, its vectors are aligned where its
  // bases are.
  rp.state_vec = (w_vec && aligned(args.momentum1.data, 4 * tbe_bwd::kVec) &&
                  aligned(args.momentum2.data, 4 * tbe_bwd::kVec)) ? 1 : 0;
  rp.max_warp_segment = t.max_warp;
  rp.opt = args.optimizer;
  rp.corrections = opt::adam_corrections(args.optimizer);
  rp.rounding = args.rounding;
  rp.rounding_key = rounding_key(args.seed, args.optimizer.step);
  rp.rounding_bases = static_cast<const int64_t*>(args.rounding_bases.data);
  rp.group_max_lookups = tbe_bwd::group_max_lookups(tbe_bwd::group_shape(rp));

  tbe_bwd::ClassifyParams cp{};
  cp.unique_keys = b.unique_keys;
  cp.run_starts = b.run_starts;
  cp.run_lengths = b.run_lengths;
  cp.counters = b.counters;
  cp.work_list = b.work_list;
  cp.warp_list = b.warp_list;
  cp.hot_list = b.hot_list;
  cp.hot_base = b.hot_base;
  cp.slot_row = b.slot_row;
  cp.slot_super = b.slot_super;
  cp.unique_rows_out = static_cast<int64_t*>(args.unique_rows.data);
  cp.num_unique_out = args.num_unique;
  cp.skip_report = skip_report;
  cp.num_indices = c.N;
  cp.total_rows = c.total_rows;
  cp.dense = dense ? 1 : 0;
  cp.max_warp_segment = t.max_warp;
  cp.max_block_segment = t.max_block;
  cp.group_max_lookups = rp.group_max_lookups;


  call->tbe = &tbe;
  call->args = &args;
  call->stream = stream;
  call->b = b;
  call->lp = lp;
  call->rp = rp;
  call->cp = cp;
  call->cub_bytes = L.cub_bytes;
  call->end_bit = L.end_bit;
  call->key64 = L.key64;
  call->block_threads = t.block_threads;
  call->capturing = capturing;
  call->dense = dense;
  call->N = c.N;
  call->B = c.B;
  return Status::Ok();
}

Status tbe_backward_linearize(const TbeBackwardCall& call) {
  const TbeBackwardArgs& args = *call.args;
  if (call.N > 0 || args.bounds_check != BoundsCheckMode::kOff) {
    EMBSCALE_RETURN_IF_ERROR(dispatch_key(call.key64, [&](auto tk) {
      return dispatch_index(args.indices.dtype, "indices", [&](auto ti) {
        return launch_linearize<typename decltype(tk)::type, typename decltype(ti)::type>(call.lp, call.stream);
      });
    }));
  }
  if (args.bounds_check != BoundsCheckMode::kOff) {
    EMBSCALE_RETURN_IF_ERROR(dispatch_index(args.indices.dtype, "indices", [&](auto ti) {
      return launch_finalize<typename decltype(ti)::type>(call.lp, args.num_skipped, call.stream);
    }));
  }
  if (args.bounds_check == BoundsCheckMode::kError)
    return tbe_report::read_report(*call.tbe, call.B, call.N, call.stream, "tbe backward");
  return Status::Ok();
}

Status tbe_backward_sort(const TbeBackwardCall& call) {
  if (call.N == 0) return Status::Ok();
  return dispatch_key(call.key64, [&](auto tk) { return run_sort<typename decltype(tk)::type>(call); });
}

Status tbe_backward_encode(const TbeBackwardCall& call) {
  if (call.N == 0) {
    if (!call.dense) return Status::Ok();
    return cuda_status(cudaMemsetAsync(call.args->num_unique, 0, sizeof(int64_t), call.stream),
                       "cudaMemsetAsync (num_unique)");
  }
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(call.b.counters, 0, tbe_bwd::kNumCounters * 4, call.stream),
                                       "cudaMemsetAsync (counters)"));
  // Both passes on one grid: the same split of the unique rows into ranges.
  const unsigned blocks = static_cast<unsigned>(
      std::min<int64_t>((call.N + tbe_bwd::kRowThreads - 1) / tbe_bwd::kRowThreads, tbe_bwd::kClassifyBlocks));
  return dispatch_key(call.key64, [&](auto tk) -> Status {
    using K = typename decltype(tk)::type;
    EMBSCALE_RETURN_IF_ERROR(run_encode<K>(call));
    tbe_bwd::tbe_backward_classify_tally_kernel<K><<<blocks, tbe_bwd::kRowThreads, 0, call.stream>>>(call.cp, call.b.tally);
    EMBSCALE_CHECK_LAUNCH("tbe_backward_classify_tally_kernel");
    return launch_kernel("tbe_backward_classify_place_kernel", tbe_bwd::tbe_backward_classify_place_kernel<K>,
                         dim3(blocks), dim3(tbe_bwd::kRowThreads), 0, call.stream, call.cp,
                         static_cast<const tbe_bwd::ClassTally*>(call.b.tally));
  });
}

Status tbe_backward_rows(const TbeBackwardCall& call) {
  if (call.N == 0) return Status::Ok();
  tbe_bwd::RowGrids g;
  g.sms = sm_count();
  g.block_threads = call.block_threads;
  return dispatch_float(call.args->weights.dtype, "weights", [&](auto tw) {
    // instantiated in tbe_backward_rows_{f32,f16,bf16}.cu
    return tbe_bwd::launch_tbe_backward_rows<typename decltype(tw)::type>(call.rp, call.args->grad_output.dtype, g,
                                                                         call.stream);
  });
}

Status tbe_backward_finish(const TbeBackwardCall& call) {
  // warn mode never waits: broken offsets only leave *num_skipped = -1 (and no row written)
  if (call.args->bounds_check == BoundsCheckMode::kSkip && !call.capturing)
    return tbe_report::read_report(*call.tbe, call.B, call.N, call.stream, "tbe backward");
  return Status::Ok();
}

}  // namespace cuda
}  // namespace embscale
