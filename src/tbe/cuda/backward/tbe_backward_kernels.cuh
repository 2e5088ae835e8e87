// CUDA table-batched embedding backward fused with the optimizer: the kernels (workspace, CUB calls,
// dispatch and launch order live in tbe_backward.cu; the row kernels are instantiated per weights
// dtype in tbe_backward_rows_{f32,f16,bf16}.cu).
//
// Pipeline (all on one stream, no host readback except the error-mode report):
//   linearize  lookup i of bag (f, b) -> key = row_offsets[f] + indices[i] (an invalid index in skip
//              mode, or a lookup outside every bag, gets the sentinel key total_rows, which sorts past
//              every valid key and is dropped); value = the bag item f*B+b when the pooled gradient row
//              is all a lookup needs, else the lookup id i (then bag_of[i] = item is stored too).
//   CUB        radix sort of (key, value) on the key's significant bits (stable: ties keep lookup
//              order), unique keys and run starts (CUB unique-by-key over the positions), run
//              lengths from consecutive starts (classify's tally pass).
//   classify   by run length: short rows stay where they are (the lane-group kernel walks the unique
//              rows directly), the longer warp rows go to the warp list, block rows and the superchunk
//              slots of hot rows (see below) to the block path's work list, hot rows to the hot list;
//              all lists in key order (a tally pass, then a place pass).
//   grad psw   (optional) per lookup, dot(weight row, gradient row) - before any weight is written.
//   rows       a lane group per short row (4, 2 or 1 rows per warp) or a warp per row, block per long
//              row, block per superchunk of a hot row + a warp per hot row to combine; each unique row
//              is updated by exactly one owner.
//
// Canonical summation order (the determinism contract). A row's gradient over its sorted segment is
//   total = 0; for each superchunk S (kSuperChunk consecutive lookups): sp = 0;
//     for each chunk C of S (kChunk consecutive lookups): p = 0; for each lookup j of C: p = p + c_j;
//     sp = sp + p;   then total = total + sp
// with c_j = s_j * grad, s_j = 1 (SUM), psw_j (weighted) or the fp32 reciprocal of the bag's valid
// lookup count (MEAN), every operation a correctly rounded fp32 multiply or add (no FMA). A segment of
// at most kChunk lookups is thus summed exactly as the CPU backend's flat loop; longer ones differ from
// it only in the association of the adds. kChunk and kSuperChunk are constants, not
// tunables: the warp path walks the nesting sequentially, the block path computes the chunk partials
// of a superchunk on different warps and adds them in chunk order, the multi-block path computes one
// superchunk per block and the combine step adds the superchunk partials in order. So every path
// performs the same fp32 operations in the same order, and results are bit-identical across runs,
// across tunings (max_warp_segment, max_block_segment, block_threads) and across paths. Row-level sums
// for the optimizer (sum of g'^2, the updated row's norm) are warp reductions in a fixed tree.
//
// Columns: a pass covers kPassCols = 32 lanes x kVec columns; lane l owns columns
// pass*kPassCols + l*kVec .. +kVec-1. Rows wider than one pass loop over passes; the gradient of the
// first kCachedPasses passes is kept in registers, wider rows recompute it (same operations, same bits)
// for each sweep the optimizer needs (row sum, norm, apply).
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "core/numerics.h"
#include "tbe/optimizer.h"
#include "tbe/rounding.h"
#include "core/cuda/arch_traits.cuh"
#include "core/cuda/pdl.cuh"
#include "tbe/cuda/forward/tbe_forward_kernels.cuh"  // bounds-check scratch words, report kinds, finalize kernel
#include "embscale/tbe.h"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

// ---- constants -------------------------------------------------------------------------------------

constexpr int kChunk = 32;                          // lookups per chunk of the canonical order
constexpr int kChunksPerSuper = 32;                 // chunks per superchunk
constexpr int kSuperChunk = kChunk * kChunksPerSuper;  // lookups per superchunk (and per multi-block part)
constexpr int kVec = 4;                             // columns per lane per pass
constexpr int kPassCols = ArchTraits::kWarpSize * kVec;  // columns per pass
constexpr int kCachedPasses = 2;                    // passes whose gradient stays in registers
constexpr int kUnroll = 4;                          // gradient rows in flight per lane

// Per-device defaults of TbeBackwardTuning, chosen by the H200 sweeps over D in {64, 128, 160, 192,
// 256, 320}, uniform and Zipf(1.15) lookups (bench/results/2026-11-30-nvidia-h200-bwd-sweep.md): uniform
// inputs are insensitive to the thresholds (within 0.5%); under Zipf, warps for segments up to 128
// lookups beat FBGEMM's 32 by 10-17% for rows the lane groups take (up to kGroupMaxCols = 512 columns);
// wider rows keep 32. Blocks for segments up to 512 lookups (longer ones: superchunk slots + combine):
// re-measured on the kernels with counter-fed work and programmatic launch, 512 beat 1024 under Zipf
// at every D of the sweep (D=128 -8 us, 256 -15, 320 -80; 2048 slower; uniform unchanged).
constexpr int kDefaultMaxWarpSegment = 32;
constexpr int kDefaultMaxWarpSegmentLaneGroupCols = 128;
constexpr int kLaneGroupCols = 512;  // = kGroupMaxCols (defined with the lane-group path below)
constexpr int kDefaultMaxBlockSegment = 512;
constexpr int kDefaultBlockThreads = 256;
constexpr int kMaxBlockThreads = 512;  // the block paths' __launch_bounds__ (<= 128 registers a thread)

constexpr int kLinearizeItems = 256;  // bags per block of the linearize kernel (= its threads)
constexpr int kLinearizeSpan = 8192;  // lookups of a linearize block whose bags fit its shared table
constexpr int kLinearizeLoads = 4;    // indices a linearize thread loads at once
constexpr int kRowThreads = 256;      // threads per block of the warp-per-row, combine and psw kernels
constexpr int kWarpRowsMinBlocks = 3; // warp-per-row kernel: 3 x 256 threads per SM (<= 85 registers)
// The lane-group variant, per weights dtype (H200 A/B of 2, 3 and 4 blocks per SM, same inputs,
// bench/results/2026-11-30-nvidia-h200-tuning.md): fp32 rows run best without spills (2 blocks, <= 128
// registers; 3 spilled and were 23% slower), fp16/bf16 rows, whose stochastic rounding makes them
// compute-bound, with more warps (4 blocks, <= 64 registers).
template <typename W>
constexpr int group_rows_min_blocks() { return sizeof(W) == 4 ? 2 : 4; }

// Counters in the workspace (zeroed at the start of every call).
enum Counter : int {
  kBlockCount = 0,  // block rows in the work list
  kHotCount = 1,    // rows in the hot list (the combine's)
  kSlotCount = 2,   // superchunk slots handed out to hot rows
  kNumRuns = 3,     // number of runs of equal sorted keys (sentinel run included), from CUB
  kWarpCount = 4,   // rows in the warp list (lane groups on: the warp rows they do not take)
  // Work handed out by the row kernels (zeroed again by the combine kernel, the last of the rows
  // phase, for the next one): the next batch of the lane groups' walk, of the whole-warp kernel's,
  // and the next item of the block work list.
  kGroupNext = 5,
  kWarpNext = 6,
  kBlockNext = 7,
  kNumCounters = 8
};
constexpr int kFirstSchedCounter = kGroupNext;
constexpr int kNumSchedCounters = 3;

// Warp-path rows of up to this many lookups go to the lane groups (when that path is on); longer ones
// take a whole warp (second launch of the warp-row kernel, over the warp list).
constexpr int kGroupMaxLookups = 8;
// The whole-warp kernel over the warp list hands out about this many batches per warp.
constexpr int kWarpListGrabs = 4;
// The lane-group path orders rows by length and prefetches when lookups per unique row exceed this.
constexpr int kRepeatLookups = 2;

constexpr uint32_t kNoBag = 0xffffffffu;  // bag_of of a dropped lookup
constexpr uint32_t kWholeRow = 0x80000000u;  // work-list flag of a block row (unique indices are < 2^31)

enum ContribKind : int { kContribPlain = 0, kContribWeighted = 1, kContribMean = 2 };

// Plain parameters of one backward call (pointers are device memory).
struct BwdParams {
  // inputs
  void* weights;                   // [num_weights] of W
  const void* grad_output;         // pooled [B, total_dim] / sequence [N, D] of G
  const void* indices;             // [N] of I
  const void* offsets;             // [T*B+1] of I
  const float* psw;                // [N] or null
  const int64_t* weight_offsets;   // [T]
  const int64_t* num_rows;         // [T]
  const int32_t* dims;             // [T]
  const int32_t* output_offsets;   // [T+1]
  const int64_t* row_offsets;      // [T]
  int64_t* scratch;                // [8] bounds-check records (tbe_fwd::ScratchWord)
  float* momentum1;
  float* momentum2;
  float* grad_psw;                 // [N] or null
  int64_t* unique_rows_out;        // dense mode [N]
  int64_t* num_unique_out;         // dense mode [1]
  float* unique_grads;             // dense mode [N * max_dim]
  // workspace
  void* keys_in;                   // [N] of K
  void* keys_sorted;               // [N] of K
  uint32_t* vals_in;               // [N]
  uint32_t* vals_sorted;           // [N]
  uint32_t* bag_of;                // [N] bag item of each lookup (when values are lookup ids)
  int32_t* bag_count;              // [T*B] valid lookups per bag (MEAN)
  void* unique_keys;               // [N] of K
  uint32_t* run_lengths;           // [N]
  uint32_t* run_starts;            // [N]
  uint32_t* work_list;             // [max_block_rows + max_slots] block path: rows | kWholeRow, hot slots
  uint32_t* warp_list;             // [max_warp_rows] warp rows the lane groups do not take
  uint32_t* hot_list;              // [max_hot]
  uint32_t* hot_base;              // [max_hot] first slot of each hot row
  uint32_t* slot_row;              // [max_slots] unique index of the slot's row
  uint32_t* slot_super;            // [max_slots] superchunk index within the row
  float* partials;                 // [max_slots * max_dim]
  uint32_t* counters;              // [kNumCounters]
  // sizes and modes
  int64_t batch_size;              // B
  int64_t num_indices;             // N
  int64_t num_items;               // T*B
  int64_t total_rows;              // sentinel key
  int64_t grad_stride;             // grad_output row stride (elements)
  int64_t max_hot;
  int64_t max_slots;
  int num_features;
  int max_dim;
  int key64;                       // keys are uint64 (else uint32)
  int check;                       // tbe_fwd::CheckKind
  int check_report;                // skip mode: rows exit when the bounds-check report is set
  int sequence;                    // grad_output is [N, D]
  int vals_are_items;              // sorted values are bag items (else lookup ids)
  int need_bag_of;
  int contrib;                     // ContribKind
  int mean;
  int w_vec;                       // weights rows allow kVec-element vector access
  int g_vec;                       // grad_output rows allow kVec-element vector access
  int ug_vec;                      // unique_grads rows allow kVec-element vector stores
  int max_warp_segment;
  int warp_min_len;                // the warp kernel without lane groups takes rows longer than this
  int list_warp_rows;              // classify lists the warp rows longer than kGroupMaxLookups
  int max_block_segment;
  int wait_at_start;               // the first row kernel of a call: griddepcontrol.wait before anything
  OptimizerParams opt;
  opt::AdamCorrections corrections;
  WeightRounding rounding;
  uint64_t rounding_key;
};

// ---- small device functions --------------------------------------------------------------------------

template <typename I>
__device__ __forceinline__ int64_t load_index_bwd(const I* p) {
  return static_cast<int64_t>(__ldg(p));
}

__device__ __forceinline__ void record_min_position_bwd(int64_t* word, int64_t position) {
  atomicMax(reinterpret_cast<unsigned long long*>(word), ~static_cast<unsigned long long>(position));
}

__device__ __forceinline__ int64_t unique_key(const BwdParams& p, int64_t u) {
  return p.key64 ? static_cast<int64_t>(static_cast<const uint64_t*>(p.unique_keys)[u])
                 : static_cast<int64_t>(static_cast<const uint32_t*>(p.unique_keys)[u]);
}

// Skip mode: broken offsets (reported by the finalize kernel before the rows run) mean no update.
__device__ __forceinline__ bool rows_disabled(const BwdParams& p) {
  return p.check_report && *reinterpret_cast<volatile const int64_t*>(p.scratch + tbe_fwd::kReport) != tbe_fwd::kReportNone;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = ArchTraits::kWarpSize / 2; o > 0; o /= 2) v = __fadd_rn(v, __shfl_xor_sync(ArchTraits::kFullMask, v, o));
  return v;
}

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
// fp16: the hardware conversion (exact, one instruction), as the forward and FP8 kernels use; the
// portable decode of core/numerics.h branches on inf/NaN/subnormal for every element.
template <>
__device__ __forceinline__ float to_float<fp16_t>(fp16_t v) { return __half2float(__ushort_as_half(v.bits)); }
template <>
__device__ __forceinline__ float to_float<bf16_t>(bf16_t v) { return bf16_to_float(v.bits); }

// Asks L2 to fetch the line holding p (no register written, no fault reported).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// kVec elements from p (n valid of them; the rest read as 0). vec: p is kVec-element aligned and all
// kVec exist, one 16-byte (fp32) or 8-byte (fp16/bf16) access. ro: the data is read-only for the
// kernel's lifetime (grad_output), so the non-coherent path may be used. Otherwise (weights, partials)
// the data is read once: a streaming load (evict-first), so it does not push grad_output rows, which
// every lookup of a bag reads again, out of L2.
template <typename T, bool kRo>
__device__ __forceinline__ void load_vec(const T* p, bool vec, int n, float* x) {
  if (vec && n == kVec) {
    if constexpr (sizeof(T) == 4) {
      const float4 v = kRo ? __ldg(reinterpret_cast<const float4*>(p)) : __ldcs(reinterpret_cast<const float4*>(p));
      x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
    } else {
      const uint2 v = kRo ? __ldg(reinterpret_cast<const uint2*>(p)) : __ldcs(reinterpret_cast<const uint2*>(p));
      const uint32_t w[2] = {v.x, v.y};
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        x[2 * k] = to_float<T>(T{static_cast<uint16_t>(w[k] & 0xffffu)});
        x[2 * k + 1] = to_float<T>(T{static_cast<uint16_t>(w[k] >> 16)});
      }
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (k < n) {
      if constexpr (sizeof(T) == 4) {
        x[k] = kRo ? __ldg(reinterpret_cast<const float*>(p) + k) : __ldcs(reinterpret_cast<const float*>(p) + k);
      } else {
        const uint16_t b = kRo ? __ldg(reinterpret_cast<const unsigned short*>(p) + k)
                               : __ldcs(reinterpret_cast<const unsigned short*>(p) + k);
        x[k] = to_float<T>(T{b});
      }
    } else {
      x[k] = 0.0f;
    }
  }
}

// Updated weights are written once: streaming stores (evict-first), as load_vec's weight loads.
template <typename W>
__device__ __forceinline__ void store_weights(W* p, bool vec, int n, const W* v) {
  if (vec && n == kVec) {
    if constexpr (sizeof(W) == 4) {
      __stcs(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
    } else {
      const uint32_t a = static_cast<uint32_t>(v[0].bits) | (static_cast<uint32_t>(v[1].bits) << 16);
      const uint32_t b = static_cast<uint32_t>(v[2].bits) | (static_cast<uint32_t>(v[3].bits) << 16);
      __stcs(reinterpret_cast<uint2*>(p), make_uint2(a, b));
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    if (k < n) p[k] = v[k];
}

__device__ __forceinline__ void store_floats(float* p, bool vec, int n, const float* v) {
  if (vec && n == kVec) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    if (k < n) p[k] = v[k];
}

// ---- linearize (+ bounds checks) -------------------------------------------------------------------

// grid = ceil(T*B / kLinearizeItems), block = kLinearizeItems. Block x owns bags [x*256, x*256+256) and
// the lookups between their first and last offsets (block 0 also those before offsets[0], the last
// block those after offsets[T*B]: they belong to no bag and get the sentinel key). Reads and writes are
// coalesced: a lookup finds its bag in shared memory, from a table of every lookup's bag that the
// bags' threads fill when the block's offsets are non-decreasing and span at most kLinearizeSpan
// lookups (one shared load per lookup), else by binary search in the offsets.
template <typename K, typename I>
__global__ void __launch_bounds__(kLinearizeItems) tbe_backward_linearize_kernel(const BwdParams p) {
  __shared__ int64_t off[kLinearizeItems + 1];
  __shared__ int cnt[kLinearizeItems];
  __shared__ int16_t bag_at[kLinearizeSpan];
  __shared__ unsigned long long skipped;
  const I* offsets = static_cast<const I*>(p.offsets);
  const I* indices = static_cast<const I*>(p.indices);
  const int64_t N = p.num_indices;
  const int64_t B = p.batch_size;
  const int64_t item0 = static_cast<int64_t>(blockIdx.x) * kLinearizeItems;
  const int nitems = static_cast<int>(p.num_items - item0 < kLinearizeItems ? p.num_items - item0 : kLinearizeItems);
  const bool check = p.check != tbe_fwd::kCheckOff;
  const int tid = static_cast<int>(threadIdx.x);
  for (int k = tid; k <= nitems; k += blockDim.x) {
    int64_t o = static_cast<int64_t>(offsets[item0 + k]);
    if (check && k < nitems) {
      const int64_t next = static_cast<int64_t>(offsets[item0 + k + 1]);
      if (next < o) record_min_position_bwd(p.scratch + tbe_fwd::kBadOffsetKey, item0 + k + 1);
    }
    off[k] = o < 0 ? 0 : (o > N ? N : o);  // clamped: nothing outside [0, N) is ever read
  }
  if (tid < kLinearizeItems) cnt[tid] = 0;
  if (tid == 0) skipped = 0;
  __syncthreads();
  const int64_t lo = blockIdx.x == 0 ? 0 : off[0];
  const int64_t hi = item0 + nitems == p.num_items ? N : off[nitems];
  // The bag table: bag k covers [off[k], off[k+1]); [lo, off[0]) gets -1 and [off[nitems], hi) nitems.
  bool sorted = true;
  for (int k = tid; k < nitems; k += blockDim.x) sorted = sorted && off[k] <= off[k + 1];
  const bool table = __syncthreads_and(sorted) && hi - lo <= kLinearizeSpan;
  if (table) {
    for (int k = tid - 1; k <= nitems; k += blockDim.x) {
      const int64_t a = k < 0 ? lo : off[k], b = k < nitems ? off[k + 1] : hi;
      for (int64_t i = a; i < b; ++i) bag_at[i - lo] = static_cast<int16_t>(k);
    }
    __syncthreads();
  }
  unsigned my_skipped = 0;
  const auto linearize_one = [&](int64_t i, int64_t idx) {
    // bag k: the last k with off[k] <= i (k = -1 or k = nitems: no bag)
    int k;
    if (table) {
      k = bag_at[i - lo];
    } else {
      int a = 0, b = nitems + 1;  // off[a-1] <= i < off[b] over the virtual bounds
      while (a < b) {
        const int m = (a + b) >> 1;
        if (off[m] <= i) a = m + 1; else b = m;
      }
      k = a - 1;
    }
    K key = static_cast<K>(p.total_rows);
    int64_t item = 0;
    if (k >= 0 && k < nitems) {
      item = item0 + k;
      const int f = static_cast<int>(item / B);
      const int64_t E = p.num_rows[f];
      const bool in_range = static_cast<uint64_t>(idx) < static_cast<uint64_t>(E);
      const bool ok = !check || in_range;
      if (ok) {
        // Off mode trusts the indices but clamps an invalid one into its table, so no row outside the
        // tables is ever updated (its values are unspecified, as the forward's).
        key = static_cast<K>(p.row_offsets[f] + (in_range ? idx : E - 1));
        if (p.mean) atomicAdd(&cnt[k], 1);
      } else if (p.check == tbe_fwd::kCheckError) {
        record_min_position_bwd(p.scratch + tbe_fwd::kBadIndexKey, i);
      } else {
        ++my_skipped;
      }
    }
    static_cast<K*>(p.keys_in)[i] = key;
    p.vals_in[i] = static_cast<uint32_t>(p.vals_are_items ? item : i);
    if (p.need_bag_of) p.bag_of[i] = key == static_cast<K>(p.total_rows) ? kNoBag : static_cast<uint32_t>(item);
  };
  // kLinearizeLoads lookups per thread at a time, their indices loaded first (every i in [lo, hi) is a
  // valid position, bag or not).
  const int64_t step = blockDim.x;
  for (int64_t i0 = lo + tid; i0 < hi; i0 += kLinearizeLoads * step) {
    int64_t idx[kLinearizeLoads];
#pragma unroll
    for (int u = 0; u < kLinearizeLoads; ++u) idx[u] = i0 + u * step < hi ? load_index_bwd(indices + i0 + u * step) : 0;
#pragma unroll
    for (int u = 0; u < kLinearizeLoads; ++u)
      if (i0 + u * step < hi) linearize_one(i0 + u * step, idx[u]);
  }
  if (p.check == tbe_fwd::kCheckSkip && my_skipped != 0) atomicAdd(&skipped, static_cast<unsigned long long>(my_skipped));
  __syncthreads();
  if (p.mean)
    for (int k = tid; k < nitems; k += blockDim.x) p.bag_count[item0 + k] = cnt[k];
  if (tid == 0 && skipped != 0) atomicAdd(reinterpret_cast<unsigned long long*>(p.scratch + tbe_fwd::kSkipCount), skipped);
}

// ---- classify --------------------------------------------------------------------------------------

// The work lists in key order, built in two passes over the same split of the unique rows into
// contiguous ranges, one per block (kClassifyBlocks at most): tally counts each range's listed rows
// and hot-row slots; place writes them at the range's base (the tallies of the ranges before it) plus
// their rank within the range (a block scan per tile of rows). Lists: the block path's work list
// (block rows and hot-row slots), the hot rows (for the combine) and, when the lane groups take the
// rows of at most kGroupMaxLookups lookups, the longer warp rows. Key order matters for speed only
// (each row has one owner whatever the order): the row kernels walk their lists in order, so the rows
// they work on at once are from one or two tables, whose gradient rows then stay in L2 (with atomic
// appends in one pass, rows of ~10 tables at once read their gradient rows at ~40% L2 hit under Zipf
// lookups).
constexpr int kClassifyBlocks = 1024;

struct ClassTally {
  uint32_t block, hot, slots, warp;
};
struct ClassTallySum {
  __device__ __forceinline__ ClassTally operator()(const ClassTally& a, const ClassTally& b) const {
    return ClassTally{a.block + b.block, a.hot + b.hot, a.slots + b.slots, a.warp + b.warp};
  }
};

// Range [first, end) of unique rows of this block.
__device__ __forceinline__ void classify_range(uint32_t runs, uint32_t* first, uint32_t* end) {
  const uint32_t per = (runs + gridDim.x - 1) / gridDim.x;
  const uint64_t a = static_cast<uint64_t>(per) * blockIdx.x;
  *first = static_cast<uint32_t>(a < runs ? a : runs);
  *end = static_cast<uint32_t>(a + per < runs ? a + per : runs);
}

// A unique row's list membership from its key and run length (all zeros for the sentinel run and for
// the rows the warp kernel finds by walking the unique rows).
__device__ __forceinline__ ClassTally classify_row(const BwdParams& p, int64_t key, uint32_t len) {
  ClassTally t{0, 0, 0, 0};
  if (key == p.total_rows) return t;
  if (len <= static_cast<uint32_t>(p.max_warp_segment)) {
    t.warp = p.list_warp_rows && len > static_cast<uint32_t>(kGroupMaxLookups) ? 1 : 0;
  } else if (len <= static_cast<uint32_t>(p.max_block_segment)) {
    t.block = 1;
  } else {
    t.hot = 1;
    t.slots = (len + kSuperChunk - 1) / kSuperChunk;
  }
  return t;
}

// Pass 1: run_lengths of the block's rows from consecutive run starts (the encode step writes each
// run's key and start), and tally[b] = block b's counts; the totals go to the counters. Dense mode
// also writes unique_rows and num_unique here. K: the key type (instantiated by tbe_backward.cu only).
template <typename K>
__global__ void __launch_bounds__(kRowThreads) tbe_backward_classify_tally_kernel(const BwdParams p, ClassTally* tally) {
  using Reduce = cub::BlockReduce<ClassTally, kRowThreads>;
  __shared__ typename Reduce::TempStorage reduce;
  allow_dependent_launch();  // the place kernel waits for this one before it reads anything
  const K* keys = static_cast<const K*>(p.unique_keys);
  const uint32_t runs = p.counters[kNumRuns];
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.opt.type == OptimizerType::kNone) {
    const bool sentinel_last = runs > 0 && static_cast<int64_t>(keys[runs - 1]) == p.total_rows;
    *p.num_unique_out = static_cast<int64_t>(runs) - (sentinel_last ? 1 : 0);
  }
  if (rows_disabled(p)) return;
  uint32_t first = 0, end = 0;
  classify_range(runs, &first, &end);
  ClassTally mine{0, 0, 0, 0};
  for (uint32_t u = first + threadIdx.x; u < end; u += blockDim.x) {
    const uint32_t start = p.run_starts[u];
    const uint32_t stop = u + 1 < runs ? p.run_starts[u + 1] : static_cast<uint32_t>(p.num_indices);
    p.run_lengths[u] = stop - start;
    const int64_t key = static_cast<int64_t>(keys[u]);
    if (key == p.total_rows) continue;
    if (p.opt.type == OptimizerType::kNone) p.unique_rows_out[u] = key;
    mine = ClassTallySum()(mine, classify_row(p, key, stop - start));
  }
  const ClassTally total = Reduce(reduce).Reduce(mine, ClassTallySum());
  if (threadIdx.x == 0) {
    tally[blockIdx.x] = total;
    if (total.block != 0) atomicAdd(p.counters + kBlockCount, total.block);
    if (total.hot != 0) atomicAdd(p.counters + kHotCount, total.hot);
    if (total.slots != 0) atomicAdd(p.counters + kSlotCount, total.slots);
    if (total.warp != 0) atomicAdd(p.counters + kWarpCount, total.warp);
  }
}

// Pass 2 (same grid): block b's rows at the sum of the tallies of blocks 0..b-1 plus their rank.
template <typename K>
__global__ void __launch_bounds__(kRowThreads) tbe_backward_classify_place_kernel(const BwdParams p,
                                                                                  const ClassTally* tally) {
  using Reduce = cub::BlockReduce<ClassTally, kRowThreads>;
  using Scan = cub::BlockScan<ClassTally, kRowThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ ClassTally base_sh;
  grid_dependency_wait();  // the tally kernel's lengths and tallies
  allow_dependent_launch();
  if (rows_disabled(p)) return;
  const K* keys = static_cast<const K*>(p.unique_keys);
  const uint32_t runs = p.counters[kNumRuns];
  uint32_t first = 0, end = 0;
  classify_range(runs, &first, &end);
  // Nothing to place (the ranges of uniform lookups, say, hold only warp rows the lane groups take).
  const ClassTally own = tally[blockIdx.x];
  if (first >= end || (own.block | own.hot | own.warp) == 0) return;
  ClassTally before{0, 0, 0, 0};
  for (uint32_t b = threadIdx.x; b < blockIdx.x; b += blockDim.x) before = ClassTallySum()(before, tally[b]);
  before = Reduce(tmp.reduce).Reduce(before, ClassTallySum());
  if (threadIdx.x == 0) base_sh = before;
  __syncthreads();
  ClassTally base = base_sh;
  for (uint32_t tile = first; tile < end; tile += blockDim.x) {
    const uint32_t u = tile + threadIdx.x;
    const ClassTally mine =
        u < end ? classify_row(p, static_cast<int64_t>(keys[u]), p.run_lengths[u]) : ClassTally{0, 0, 0, 0};
    // (also orders tmp's reuse)
    if (!__syncthreads_or((mine.block | mine.hot | mine.warp) != 0)) continue;
    ClassTally rank, count;
    Scan(tmp.scan).ExclusiveScan(mine, rank, ClassTally{0, 0, 0, 0}, ClassTallySum(), count);
    if (mine.warp != 0) p.warp_list[base.warp + rank.warp] = u;
    // work list: the block rows and hot-row slots before this row, in key order
    const uint32_t w = base.block + rank.block + base.slots + rank.slots;
    if (mine.block != 0) p.work_list[w] = u | kWholeRow;
    if (mine.hot != 0) {
      const uint32_t h = base.hot + rank.hot, s0 = base.slots + rank.slots;
      p.hot_list[h] = u;
      p.hot_base[h] = s0;
      for (uint32_t s = 0; s < mine.slots; ++s) {
        p.slot_row[s0 + s] = u;
        p.slot_super[s0 + s] = s;
        p.work_list[w + s] = s0 + s;
      }
    }
    base = ClassTallySum()(base, count);
  }
}

// ---- gradient sums ---------------------------------------------------------------------------------

// Where lookup (sorted position q) reads its gradient row, and its scale.
struct LookupMeta {
  int64_t grad_off;  // element offset of the row's first column in grad_output (incl. feature column)
  float scale;       // 1 (SUM), psw (weighted) or 1/count rounded once (MEAN), as the CPU backend
};

__device__ __forceinline__ LookupMeta meta_of(const BwdParams& p, uint32_t v, uint32_t item) {
  LookupMeta m;
  if (p.sequence) {
    m.grad_off = static_cast<int64_t>(v) * p.grad_stride;
  } else {
    const uint32_t f = item / static_cast<uint32_t>(p.batch_size);
    const int64_t b = static_cast<int64_t>(item) - static_cast<int64_t>(f) * p.batch_size;
    m.grad_off = b * p.grad_stride + p.output_offsets[f];
  }
  m.scale = 1.0f;
  if (p.contrib == kContribWeighted) m.scale = __ldg(p.psw + v);
  else if (p.contrib == kContribMean) m.scale = __fdiv_rn(1.0f, static_cast<float>(p.bag_count[item]));
  return m;
}

__device__ __forceinline__ LookupMeta lookup_meta(const BwdParams& p, int64_t q) {
  const uint32_t v = p.vals_sorted[q];
  return meta_of(p, v, p.vals_are_items ? v : p.bag_of[v]);
}

// One chunk (n <= kChunk lookups from sorted position first) summed by one warp, lane's kVec columns
// of pass `pass`, in lookup order from 0: out[k] = ((0 + c_0) + c_1) + ...
// pre: the meta of lookup `first` when the caller already has it (saves a dependent load chain).
// kScaled: lookups carry a scale (weighted, MEAN); without one (plain SUM, scale 1) the multiply and its
// shuffle are left out: 1 * x is exact, so the sums are the same bits.
template <typename G, bool kScaled>
__device__ __forceinline__ void warp_chunk_sum_as(const BwdParams& p, int64_t first, int n, int col, int ncols,
                                                  float* out, const LookupMeta* pre) {
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  LookupMeta mine{0, 1.0f};
  if (lane < n) mine = (pre != nullptr && lane == 0) ? *pre : lookup_meta(p, first + lane);
  const G* grad = static_cast<const G*>(p.grad_output);
#pragma unroll
  for (int k = 0; k < kVec; ++k) out[k] = 0.0f;
  const bool vec = p.g_vec != 0;
  for (int j0 = 0; j0 < n; j0 += kUnroll) {
    float x[kUnroll][kVec];
    float sc[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      // Lookups past n read the chunk's first row (present), so the loads carry no predicate.
      const int src = j0 + j < n ? j0 + j : 0;
      const int64_t off = __shfl_sync(ArchTraits::kFullMask, mine.grad_off, src);
      sc[j] = kScaled ? __shfl_sync(ArchTraits::kFullMask, mine.scale, src) : 1.0f;
      load_vec<G, true>(grad + off + col, vec, ncols, x[j]);  // ncols == 0: zeros, no access
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      if (j0 + j < n) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) out[k] = __fadd_rn(out[k], kScaled ? __fmul_rn(sc[j], x[j][k]) : x[j][k]);
      }
    }
  }
}

template <typename G>
__device__ __forceinline__ void warp_chunk_sum(const BwdParams& p, int64_t first, int n, int col, int ncols,
                                               float* out, const LookupMeta* pre = nullptr) {
  if (p.contrib == kContribPlain) warp_chunk_sum_as<G, false>(p, first, n, col, ncols, out, pre);
  else warp_chunk_sum_as<G, true>(p, first, n, col, ncols, out, pre);
}

// Columns of pass `pass` owned by this lane: first column and how many of its kVec exist.
__device__ __forceinline__ void lane_cols(int pass, int D, int* col, int* ncols) {
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  *col = pass * kPassCols + lane * kVec;
  const int left = D - *col;
  *ncols = left <= 0 ? 0 : (left < kVec ? left : kVec);
}

// Warp path: the whole canonical nesting on one warp.
template <typename G>
struct WarpGrad {
  int64_t start;
  int64_t len;
  int D;
  LookupMeta first;  // meta of lookup `start`
  __device__ void operator()(const BwdParams& p, int pass, float* g) const {
    int col, ncols;
    lane_cols(pass, D, &col, &ncols);
    float total[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t s0 = 0; s0 < len; s0 += kSuperChunk) {
      float sp[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
      const int64_t s_end = len - s0 < kSuperChunk ? len : s0 + kSuperChunk;
      for (int64_t c0 = s0; c0 < s_end; c0 += kChunk) {
        const int n = static_cast<int>(s_end - c0 < kChunk ? s_end - c0 : kChunk);
        float part[kVec];
        warp_chunk_sum<G>(p, start + c0, n, col, ncols, part, c0 == 0 ? &first : nullptr);
#pragma unroll
        for (int k = 0; k < kVec; ++k) sp[k] = __fadd_rn(sp[k], part[k]);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) total[k] = __fadd_rn(total[k], sp[k]);
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) g[k] = total[k];
  }
};

// Shared memory of the block-level superchunk sum: the chunk partials of one superchunk.
struct SuperSmem {
  float part[kChunksPerSuper][kPassCols];
  float total[kPassCols];
};

// One superchunk (from sorted position first, n lookups) of one pass summed by the whole block: warps
// take chunks round-robin, then thread t adds column t's chunk partials in chunk order into sp[t].
// Returns with sp (in smem, caller-provided) complete and the block synchronised.
template <typename G>
__device__ __forceinline__ void block_super_sum(const BwdParams& p, SuperSmem& sm, int64_t first, int64_t n, int pass,
                                                int D, float* sp_out /* smem [kPassCols] */, bool accumulate) {
  const int warp = static_cast<int>(threadIdx.x) / ArchTraits::kWarpSize;
  const int nwarps = static_cast<int>(blockDim.x) / ArchTraits::kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  const int nchunks = static_cast<int>((n + kChunk - 1) / kChunk);
  int col, ncols;
  lane_cols(pass, D, &col, &ncols);
  for (int c = warp; c < nchunks; c += nwarps) {
    const int m = static_cast<int>(n - static_cast<int64_t>(c) * kChunk < kChunk ? n - static_cast<int64_t>(c) * kChunk
                                                                                 : kChunk);
    float part[kVec];
    warp_chunk_sum<G>(p, first + static_cast<int64_t>(c) * kChunk, m, col, ncols, part);
#pragma unroll
    for (int k = 0; k < kVec; ++k) sm.part[c][lane * kVec + k] = part[k];
  }
  __syncthreads();
  for (int t = static_cast<int>(threadIdx.x); t < kPassCols; t += blockDim.x) {
    float sp = 0.0f;
    for (int c = 0; c < nchunks; ++c) sp = __fadd_rn(sp, sm.part[c][t]);
    sp_out[t] = accumulate ? __fadd_rn(sp_out[t], sp) : sp;
  }
  __syncthreads();
}

// Block path: every warp of the block calls this with the same pass (it synchronises the block);
// every warp gets the same gradient for its lane's columns.
template <typename G>
struct BlockGrad {
  SuperSmem* sm;
  int64_t start;
  int64_t len;
  int D;
  __device__ void operator()(const BwdParams& p, int pass, float* g) const {
    const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
    for (int t = static_cast<int>(threadIdx.x); t < kPassCols; t += blockDim.x) sm->total[t] = 0.0f;
    __syncthreads();
    // total = total + sp per superchunk: block_super_sum with accumulate adds sp to total in place,
    // computing sp from 0 first, so the order is the canonical one.
    for (int64_t s0 = 0; s0 < len; s0 += kSuperChunk) {
      const int64_t n = len - s0 < kSuperChunk ? len - s0 : kSuperChunk;
      block_super_sum<G>(p, *sm, start + s0, n, pass, D, sm->total, true);
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) g[k] = sm->total[lane * kVec + k];
    __syncthreads();
  }
};

// Combine path: a warp adds a hot row's superchunk partials (workspace) in superchunk order.
struct CombineGrad {
  int64_t base_slot;
  int64_t supers;
  int D;
  __device__ void operator()(const BwdParams& p, int pass, float* g) const {
    int col, ncols;
    lane_cols(pass, D, &col, &ncols);
    float total[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t s = 0; s < supers; ++s) {
      float x[kVec];
      const float* src = p.partials + (base_slot + s) * p.max_dim + col;
      load_vec<float, false>(src, (p.max_dim % kVec) == 0, ncols, x);
#pragma unroll
      for (int k = 0; k < kVec; ++k) total[k] = __fadd_rn(total[k], x[k]);
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) g[k] = total[k];
  }
};

// ---- the row update --------------------------------------------------------------------------------

struct RowInfo {
  int64_t u;      // unique index
  int64_t key;    // linearised row = row-wise state index
  int64_t wbase;  // element offset of the row in the weights
  int D;
};

__device__ __forceinline__ RowInfo row_info(const BwdParams& p, int64_t u) {
  RowInfo r;
  r.u = u;
  r.key = unique_key(p, u);
  const int64_t start = p.run_starts[u];
  const uint32_t v = p.vals_sorted[start];
  const uint32_t item = p.vals_are_items ? v : p.bag_of[v];
  const int f = static_cast<int>(item / static_cast<uint32_t>(p.batch_size));
  r.D = p.dims[f];
  r.wbase = p.weight_offsets[f] + (r.key - p.row_offsets[f]) * r.D;
  return r;
}

// Applies the optimizer to one row given its gradient provider. Called by whole warps; in the block
// path by every warp of the block (the provider synchronises the block), with writer set on warp 0
// only: the other warps compute the same values and discard them.
template <typename W, typename Grad>
__device__ __forceinline__ void update_row(const BwdParams& p, const RowInfo& r, const Grad& grad_of, bool writer) {
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  const OptimizerParams& o = p.opt;
  const int D = r.D;
  const int passes = (D + kPassCols - 1) / kPassCols;
  W* wrow = static_cast<W*>(p.weights) + r.wbase;
  const bool wvec = p.w_vec != 0;

  // The gradient of a pass: the first kCachedPasses stay in registers after the first sweep.
  float cache[kCachedPasses][kVec];
  bool cached = false;
  const auto grad = [&](int pass, float* g) {
    if (cached && pass < kCachedPasses) {
#pragma unroll
      for (int c = 0; c < kCachedPasses; ++c)
        if (c == pass)
#pragma unroll
          for (int k = 0; k < kVec; ++k) g[k] = cache[c][k];
      return;
    }
    grad_of(p, pass, g);
#pragma unroll
    for (int c = 0; c < kCachedPasses; ++c)
      if (c == pass)
#pragma unroll
        for (int k = 0; k < kVec; ++k) cache[c][k] = g[k];
  };
  const auto end_sweep = [&]() { cached = true; };

  if (o.type == OptimizerType::kNone) {
    // Dense mode: the unclipped sum; columns [D, max_dim) of the row are zeros.
    float* dst = p.unique_grads + r.u * p.max_dim;
    for (int pass = 0; pass < passes; ++pass) {
      float g[kVec];
      grad(pass, g);
      int col, ncols;
      lane_cols(pass, D, &col, &ncols);
      if (writer && ncols > 0) store_floats(dst + col, p.ug_vec != 0, ncols, g);
    }
    if (writer)
      for (int d = D + lane; d < p.max_dim; d += ArchTraits::kWarpSize) dst[d] = 0.0f;
    return;
  }

  // The first pass's weights and the row-wise state are loaded before the gradient is summed, so
  // their latency overlaps the gradient loads (a short row then costs one round trip).
  float wpre[kVec];
  {
    int col, ncols;
    lane_cols(0, D, &col, &ncols);
    load_vec<W, false>(wrow + col, wvec, ncols, wpre);
  }
  float state_pre = 0.0f;
  if (o.type == OptimizerType::kRowwiseAdagrad) state_pre = p.momentum1[r.key];
  else if (o.type == OptimizerType::kPartialRowwiseAdam) state_pre = p.momentum2[r.key];
  const auto load_w = [&](int pass, int col, int ncols, float* w) {
    if (pass == 0) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) w[k] = wpre[k];
    } else {
      load_vec<W, false>(wrow + col, wvec, ncols, w);
    }
  };

  // Row scalars.
  float mult = 0.0f, corr = 1.0f, denom = 1.0f;
  if (opt::needs_row_sq_sum(o.type)) {
    float s = 0.0f;
    for (int pass = 0; pass < passes; ++pass) {
      float g[kVec], w[kVec];
      grad(pass, g);
      int col, ncols;
      lane_cols(pass, D, &col, &ncols);
      load_w(pass, col, ncols, w);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        if (k < ncols) s = __fadd_rn(s, opt::row_sq_term(opt::clip_grad(g[k], o), w[k], o));
    }
    end_sweep();
    s = warp_sum(s);
    if (o.type == OptimizerType::kRowwiseAdagrad) {
      float m = state_pre;
      mult = opt::rowwise_adagrad_multiplier(&m, s, D, o);
      corr = opt::rowwise_adagrad_correction(mult, o);
      if (writer && lane == 0) p.momentum1[r.key] = m;
    } else {
      float v = state_pre;
      denom = opt::partial_rowwise_adam_denominator(&v, s, D, o, p.corrections);
      if (writer && lane == 0) p.momentum2[r.key] = v;
    }
  }

  // New fp32 value of the lane's columns of one pass (element-wise state updated in place by writer).
  const auto new_values = [&](int pass, float* nv, bool write_state) {
    float g[kVec], w[kVec];
    grad(pass, g);
    int col, ncols;
    lane_cols(pass, D, &col, &ncols);
    load_w(pass, col, ncols, w);
    const int64_t e0 = r.wbase + col;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float gk = opt::clip_grad(g[k], o);
      float v = w[k];
      if (k < ncols) {
        switch (o.type) {
          case OptimizerType::kSgd: v = opt::sgd_apply(w[k], gk, o); break;
          case OptimizerType::kRowwiseAdagrad: v = opt::rowwise_adagrad_apply(w[k], gk, mult, corr); break;
          case OptimizerType::kAdam: {
            float m1 = p.momentum1[e0 + k], m2 = p.momentum2[e0 + k];
            v = opt::adam_apply(w[k], gk, &m1, &m2, o, p.corrections);
            if (write_state) {
              p.momentum1[e0 + k] = m1;
              p.momentum2[e0 + k] = m2;
            }
            break;
          }
          case OptimizerType::kPartialRowwiseAdam: {
            float m1 = p.momentum1[e0 + k];
            v = opt::partial_rowwise_adam_apply(w[k], gk, &m1, denom, o, p.corrections);
            if (write_state) p.momentum1[e0 + k] = m1;
            break;
          }
          default: break;
        }
      }
      nv[k] = v;
    }
  };
  const auto store = [&](int pass, const float* nv, float factor) {
    int col, ncols;
    lane_cols(pass, D, &col, &ncols);
    if (!writer || ncols <= 0) return;
    W out[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float v = factor == 1.0f ? nv[k] : nv[k] * factor;
      out[k] = round_weight<W>(v, p.rounding, p.rounding_key, r.wbase + col + k);
    }
    store_weights<W>(wrow + col, wvec, ncols, out);
  };

  const bool norm = o.type == OptimizerType::kRowwiseAdagrad && o.max_norm > 0.0f;
  if (!norm) {
    for (int pass = 0; pass < passes; ++pass) {
      float nv[kVec];
      new_values(pass, nv, writer);
      store(pass, nv, 1.0f);
    }
    return;
  }
  // max_norm: the norm of the whole updated row first, then the scaled stores (row-wise Adagrad has
  // no element-wise state, so computing the new values twice changes nothing).
  float sq = 0.0f;
  for (int pass = 0; pass < passes; ++pass) {
    float nv[kVec];
    new_values(pass, nv, false);
    int col, ncols;
    lane_cols(pass, D, &col, &ncols);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      if (k < ncols) sq = __fadd_rn(sq, __fmul_rn(nv[k], nv[k]));
  }
  end_sweep();
  const float factor = opt::max_norm_factor(warp_sum(sq), o);
  for (int pass = 0; pass < passes; ++pass) {
    float nv[kVec];
    new_values(pass, nv, false);
    store(pass, nv, factor);
  }
}

// ---- warp path, several rows per warp -----------------------------------------------------------------
//
// A warp updating one short row at a time has one row's loads in flight, so the warp path is bound by
// latency, not bandwidth. When every row fits kGroupVecs passes (max_dim <= kGroupMaxCols) and the
// optimizer has no element-wise state (SGD, row-wise Adagrad, dense mode), the warp is split into
// R lane groups of L = 32 / R lanes, each updating its own row, with R chosen per call from the widest
// row (group_rows): R = 4 up to one pass (128 columns at kVec = 4), 2 up to two passes, 1 up to four.
// Every lane then holds kGroupVecs vectors of kVec columns (P = kGroupVecs / R passes x R slots) in
// registers, whatever R: the loads of R rows (weights, row-wise state, first gradient row: all P passes)
// are issued together, and the gradient is summed once (no recomputation across sweeps).
//
// Lane gl of a group holds, as vector (pass q, slot k), the kVec columns that lane gl + k*L holds in
// pass q of update_row's mapping (columns q*kPassCols + (gl + k*L)*kVec ..). Every column is summed in
// the canonical order; the per-lane row sums run over the passes in order, exactly as update_row's
// per-lane sums, and are then reduced along warp_sum's xor tree (group_sum). So the results are
// bit-identical to update_row's (and hence to the block and multi-block paths).

constexpr int kGroupRows = 4;                                    // rows per warp for rows of one pass
constexpr int kGroupVecs = 4;                                    // kVec-column vectors per lane and row
constexpr int kGroupMaxCols = kGroupVecs * kPassCols;            // widest row of the lane-group path (R = 1)
static_assert(kLaneGroupCols == kGroupMaxCols, "the default warp threshold follows the lane-group path");
static_assert(kGroupMaxLookups <= kChunk, "the lane-group path sums one chunk");
static_assert(kGroupVecs % kGroupRows == 0, "rows of one pass need kGroupRows slots per lane");
static_assert(ArchTraits::kWarpSize % kGroupRows == 0, "kGroupRows must divide the warp");

// Rows per warp of the lane-group path for this call (0: one row per warp, update_row). The closed set
// {4, 2, 1} is what tbe_backward_warp_rows_kernel is instantiated for.
__host__ __device__ inline int group_rows(const BwdParams& p) {
  const bool opt_ok = p.opt.type == OptimizerType::kSgd || p.opt.type == OptimizerType::kRowwiseAdagrad ||
                      p.opt.type == OptimizerType::kNone;
  if (!opt_ok) return 0;
  if (p.max_dim <= (kGroupVecs / 4) * kPassCols) return 4;
  if (p.max_dim <= (kGroupVecs / 2) * kPassCols) return 2;
  if (p.max_dim <= kGroupMaxCols) return 1;
  return 0;
}

__host__ __device__ inline bool group_path_ok(const BwdParams& p) { return group_rows(p) != 0; }

// The lane-group path is compiled per optimizer (a template argument of its kernel), so its element
// loops carry no test of the optimizer type.
enum GroupOpt : int { kGroupDense = 0, kGroupSgd = 1, kGroupAdagrad = 2 };
__host__ __device__ inline int group_opt(const BwdParams& p) {
  return p.opt.type == OptimizerType::kRowwiseAdagrad ? kGroupAdagrad
         : p.opt.type == OptimizerType::kSgd          ? kGroupSgd
                                                      : kGroupDense;
}

// Mask of lane group grp (of L lanes).
template <int L>
__device__ __forceinline__ unsigned group_mask(int grp) {
  if constexpr (L >= ArchTraits::kWarpSize) {
    return ArchTraits::kFullMask;
  } else {
    return ((1u << L) - 1u) << (grp * L);
  }
}

// warp_sum over the 32 lanes of the one-warp mapping, s[k] being lane gl + k*L's partial: xor steps
// 16 .. L pair slots of the same lane (done in registers, highest first), the remaining steps are
// shuffles within the group.
template <int R>
__device__ __forceinline__ float group_sum(float (&s)[R], unsigned gmask) {
  constexpr int L = ArchTraits::kWarpSize / R;
#pragma unroll
  for (int h = R / 2; h >= 1; h /= 2)
#pragma unroll
    for (int k = 0; k < h; ++k) s[k] = __fadd_rn(s[k], s[k + h]);
  float v = s[0];
#pragma unroll
  for (int o = L / 2; o > 0; o /= 2) v = __fadd_rn(v, __shfl_xor_sync(gmask, v, o, L));
  return v;
}

// Lookup q's meta for lane gl, q = b0 + gl of a row's sorted segment (the caller's `first` for q = 0).
__device__ __forceinline__ LookupMeta group_meta(const BwdParams& p, int64_t start, int64_t q, int64_t end,
                                                 const LookupMeta& first) {
  LookupMeta m{0, 1.0f};
  if (q < end) m = q == 0 ? first : lookup_meta(p, start + q);
  return m;
}

// One row of at most kChunk lookups (len from sorted position start; `first` = meta of lookup start) on
// one lane group of L = 32 / R lanes: total = 0 + (0 + part), part = ((0 + c_0) + c_1) + ..., as
// WarpGrad. Vector v = q*R + k is pass q, slot k.
template <typename W, typename G, int R, int kOpt>
__device__ __forceinline__ void group_update_row(const BwdParams& p, const RowInfo& r, int64_t start, int64_t len,
                                                 const LookupMeta& first, int gl, unsigned gmask) {
  constexpr int L = ArchTraits::kWarpSize / R;
  constexpr int P = kGroupVecs / R;
  constexpr int V = kGroupVecs;
  const OptimizerParams& o = p.opt;
  const int D = r.D;
  W* wrow = static_cast<W*>(p.weights) + r.wbase;
  const G* grad = static_cast<const G*>(p.grad_output);
  const bool wvec = p.w_vec != 0, gvec = p.g_vec != 0;
  constexpr bool dense = kOpt == kGroupDense;
  constexpr bool adagrad = kOpt == kGroupAdagrad;
  int col[V], ncols[V];
#pragma unroll
  for (int q = 0; q < P; ++q)
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int v = q * R + k;
      col[v] = q * kPassCols + (gl + k * L) * kVec;
      const int left = D - col[v];
      ncols[v] = left <= 0 ? 0 : (left < kVec ? left : kVec);
    }
  // Loads first: the metas of lookups 1..L-1, the weights, the row-wise state and the first gradient
  // row, all independent.
  LookupMeta next{0, 1.0f};
  if (gl > 0 && gl < len) next = lookup_meta(p, start + gl);
  float w[V][kVec], g[V][kVec];
  if (!dense) {
#pragma unroll
    for (int v = 0; v < V; ++v) load_vec<W, false>(wrow + col[v], wvec, ncols[v], w[v]);
  }
  const float state = adagrad ? p.momentum1[r.key] : 0.0f;
#pragma unroll
  for (int v = 0; v < V; ++v) load_vec<G, true>(grad + first.grad_off + col[v], gvec, ncols[v], g[v]);
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int e = 0; e < kVec; ++e) g[v][e] = __fadd_rn(0.0f, __fmul_rn(first.scale, g[v][e]));
  for (int64_t b0 = 0; b0 < len; b0 += L) {
    const LookupMeta mine = b0 == 0 ? next : group_meta(p, start, b0 + gl, len, first);
    const int nb = static_cast<int>(len - b0 < L ? len - b0 : L);
    // Two lookups' loads in flight; a missing second one re-reads the first (present) row.
    for (int j = b0 == 0 ? 1 : 0; j < nb; j += 2) {
      const bool two = j + 1 < nb;
      const int64_t off0 = __shfl_sync(gmask, mine.grad_off, j, L);
      const float sc0 = __shfl_sync(gmask, mine.scale, j, L);
      const int64_t off1 = __shfl_sync(gmask, mine.grad_off, two ? j + 1 : j, L);
      const float sc1 = __shfl_sync(gmask, mine.scale, two ? j + 1 : j, L);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        float x0[kVec], x1[kVec];
        load_vec<G, true>(grad + off0 + col[v], gvec, ncols[v], x0);
        load_vec<G, true>(grad + off1 + col[v], gvec, ncols[v], x1);
#pragma unroll
        for (int e = 0; e < kVec; ++e) g[v][e] = __fadd_rn(g[v][e], __fmul_rn(sc0, x0[e]));
        if (two)
#pragma unroll
          for (int e = 0; e < kVec; ++e) g[v][e] = __fadd_rn(g[v][e], __fmul_rn(sc1, x1[e]));
      }
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int e = 0; e < kVec; ++e) g[v][e] = __fadd_rn(0.0f, __fadd_rn(0.0f, g[v][e]));

  if (dense) {
    float* dst = p.unique_grads + r.u * p.max_dim;
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (ncols[v] > 0) store_floats(dst + col[v], p.ug_vec != 0, ncols[v], g[v]);
    for (int d = D + gl; d < p.max_dim; d += L) dst[d] = 0.0f;
    return;
  }
  // The optimizer's modes are the same for every element of the row: each is tested once here, so the
  // element loops below are straight-line code (the same opt:: functions, the same operations).
  if (o.gradient_clipping > 0.0f) {
#pragma unroll
    for (int v = 0; v < V; ++v)
#pragma unroll
      for (int e = 0; e < kVec; ++e) g[v][e] = opt::clip_grad(g[v][e], o);
  }
  float mult = 0.0f, corr = 1.0f;
  if constexpr (adagrad) {
    // Slot k's partial is lane gl + k*L's sum in update_row: its columns of pass 0, then pass 1, ...
    // Without L2 weight decay row_sq_term(g, w) is g*g.
    const bool l2 = o.weight_decay_mode == WeightDecayMode::kL2;
    float s[R];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      s[k] = 0.0f;
#pragma unroll
      for (int q = 0; q < P; ++q)
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float gv = g[q * R + k][e];
          const float t = l2 ? opt::row_sq_term(gv, w[q * R + k][e], o) : gv * gv;
          if (e < ncols[q * R + k]) s[k] = __fadd_rn(s[k], t);
        }
    }
    const float sum = group_sum<R>(s, gmask);
    float m = state;
    mult = opt::rowwise_adagrad_multiplier(&m, sum, D, o);
    corr = opt::rowwise_adagrad_correction(mult, o);
    if (gl == 0) p.momentum1[r.key] = m;
  }
  // New values in place of w (columns past D keep their zeros and are not stored).
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      w[v][e] = adagrad ? opt::rowwise_adagrad_apply(w[v][e], g[v][e], mult, corr) : opt::sgd_apply(w[v][e], g[v][e], o);
  if (adagrad && o.max_norm > 0.0f) {
    float sq[R];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      sq[k] = 0.0f;
#pragma unroll
      for (int q = 0; q < P; ++q)
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          if (e < ncols[q * R + k]) sq[k] = __fadd_rn(sq[k], __fmul_rn(w[q * R + k][e], w[q * R + k][e]));
    }
    const float factor = opt::max_norm_factor(group_sum<R>(sq, gmask), o);
    if (factor != 1.0f) {
#pragma unroll
      for (int v = 0; v < V; ++v)
#pragma unroll
        for (int e = 0; e < kVec; ++e) w[v][e] = w[v][e] * factor;
    }
  }
  // Stochastic rounding: the random bits' first step (rounding_base) once per row when the row's element
  // indices share their upper 32 bits (all rows but one every 2^32 elements), then one hash per element.
  // Each case is its own loop, so the element loops stay straight-line.
  const auto store_row = [&](auto round_one) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (ncols[v] <= 0) continue;
      W out[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = round_one(w[v][e], r.wbase + col[v] + e);
      store_weights<W>(wrow + col[v], wvec, ncols[v], out);
    }
  };
  if constexpr (sizeof(W) == sizeof(float)) {
    store_row([](float x, int64_t) { return x; });
  } else if (p.rounding != WeightRounding::kStochastic) {
    store_row([](float x, int64_t) { return round_weight<W>(x, WeightRounding::kNearest, 0, 0); });
  } else if ((static_cast<uint64_t>(r.wbase) >> 32) == (static_cast<uint64_t>(r.wbase + D - 1) >> 32)) {
    const uint32_t base = rounding_base(p.rounding_key, static_cast<uint32_t>(static_cast<uint64_t>(r.wbase) >> 32));
    store_row([base](float x, int64_t elem) {
      return stochastic_round<W>(x, rounding_bits_at(base, static_cast<uint32_t>(elem)));
    });
  } else {
    const uint64_t key = p.rounding_key;
    store_row([key](float x, int64_t elem) { return stochastic_round<W>(x, rounding_bits(key, elem)); });
  }
}

// Issues L2 prefetches for what group_update_row will load first for row r (weights, row-wise state,
// the first lookup's gradient row at grad_off): the same addresses, no registers held.
template <typename W, typename G, int R, int kOpt>
__device__ __forceinline__ void group_prefetch_row(const BwdParams& p, const RowInfo& r, int64_t grad_off, int gl) {
  constexpr int L = ArchTraits::kWarpSize / R;
  constexpr int P = kGroupVecs / R;
  const W* wrow = static_cast<const W*>(p.weights) + r.wbase;
  const G* grad = static_cast<const G*>(p.grad_output) + grad_off;
#pragma unroll
  for (int q = 0; q < P; ++q)
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int col = q * kPassCols + (gl + k * L) * kVec;
      if (col < r.D) {
        if (kOpt != kGroupDense) prefetch_l2(wrow + col);
        prefetch_l2(grad + col);
      }
    }
  if (kOpt == kGroupAdagrad && gl == 0) prefetch_l2(p.momentum1 + r.key);
}

// The order in which the lane groups take a batch's rows: the rows of mask c[0], then c[1], then c[2],
// each in lane order.
struct RowOrder {
  unsigned c[3];
  __device__ __forceinline__ bool empty() const { return (c[0] | c[1] | c[2]) == 0; }
  __device__ __forceinline__ void pop() {
    if (c[0] != 0) c[0] &= c[0] - 1;
    else if (c[1] != 0) c[1] &= c[1] - 1;
    else c[2] &= c[2] - 1;
  }
  // The n-th remaining row (lane index), -1 past the end.
  __device__ __forceinline__ int nth(int n) const {
    RowOrder o = *this;
    for (int i = 0; i < n; ++i) o.pop();
    const unsigned m = o.c[0] != 0 ? o.c[0] : o.c[1] != 0 ? o.c[1] : o.c[2];
    return m != 0 ? __ffs(m) - 1 : -1;
  }
};

// ---- row kernels -----------------------------------------------------------------------------------

// What the warp-row kernels broadcast of one row of a 32-row batch.
struct BatchRow {
  RowInfo r;
  LookupMeta first;  // meta of the row's first lookup
  int64_t start;     // first sorted position of the row's segment
  int64_t len;       // lookups in the segment
};

// Warp per row: persistent warps walk the unique rows directly, 32 consecutive rows at a time (or the
// warp list, see below), each warp taking its next batch from a counter (kGroupNext / kWarpNext; the
// first batch by warp index), so the batches in flight stay a narrow window of consecutive rows in
// key order whatever their lengths, and the window's gradient rows stay in L2 (with a fixed
// grid-stride split, fast and slow warps drifted apart: Zipf rows 872 -> 748 us with the block list
// below, uniform 1828 -> 1763). Lane j first loads row j's run, key, first lookup and table
// (coalesced, all chains of the batch in flight at once);
// then the warp updates the batch's short rows one after the other with that metadata broadcast, so
// a row costs one round trip (its gradient, weight and state loads together) plus the reductions.
// kRows > 0 (host-chosen: group_rows, one of 4, 2, 1): the rows of at most kGroupMaxLookups lookups,
// kRows at a time on the warp's lane groups (group_update_row for optimizer kOpt = group_opt); the
// longer warp-path rows are left to a second launch with kRows = 0 and warp_min_len = kGroupMaxLookups
// (two kernels rather than both paths in one: the whole-warp path's registers made the lane-group path
// spill). kRows = 0: the rows longer than warp_min_len, one at a time on the whole warp; kOpt unused (0).
template <typename W, typename G, int kRows, int kOpt>
__global__ void __launch_bounds__(kRowThreads, kRows > 0 ? group_rows_min_blocks<W>() : kWarpRowsMinBlocks)
    tbe_backward_warp_rows_kernel(const BwdParams p) {
  // The next row kernel works on other rows: it may start as this one's blocks finish (launch_kernel);
  // each waits for its predecessor before it completes. The first one waits for classify first.
  if (p.wait_at_start) grid_dependency_wait();
  allow_dependent_launch();
  if (rows_disabled(p)) {
    grid_dependency_wait();
    return;
  }
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  // kRows == 0 after the lane groups: the rows they leave are listed by classify (warp_list, key order)
  // and the warps walk that list in batches of about count / (kWarpListGrabs * warps) rows (a few, so
  // the long rows spread over all warps); otherwise the warps walk the unique rows, 32 at a time. The
  // next batch is taken from the counter when this one starts, so the atomic's latency is hidden.
  const bool listed = kRows == 0 && p.warp_min_len >= kGroupMaxLookups;
  const int64_t runs = p.counters[kNumRuns];
  const int64_t count = listed ? static_cast<int64_t>(p.counters[kWarpCount]) : runs;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / ArchTraits::kWarpSize);
  int64_t batch = ArchTraits::kWarpSize;
  if (listed) {
    batch = (count + kWarpListGrabs * warps - 1) / (kWarpListGrabs * warps);
    batch = batch < 1 ? 1 : (batch > ArchTraits::kWarpSize ? ArchTraits::kWarpSize : batch);
  }
  uint32_t* const next_batch = p.counters + (kRows > 0 ? kGroupNext : kWarpNext);
  // Lane groups of several rows (kRows >= 2: rows of up to 256 columns) with fp32 weights: see below.
  // Measured there only: fp16/bf16 rows are compute-bound, and with the second loop compiled in, the
  // one-row-per-warp lane groups (257..512 columns) ran D=320 uniform 13% slower.
  constexpr bool kRepeatPath = kRows >= 2 && sizeof(W) == sizeof(float);
  const bool repeats = kRepeatPath && runs * kRepeatLookups < p.num_indices;
  int64_t u0 = (static_cast<int64_t>(blockIdx.x) * (kRowThreads / ArchTraits::kWarpSize) +
                threadIdx.x / ArchTraits::kWarpSize) * batch;
  while (u0 < count) {
    int64_t after = u0 + warps * batch;
    if (lane == 0) after = warps * batch + atomicAdd(next_batch, static_cast<uint32_t>(batch));
    const bool in = lane < batch && u0 + lane < count;
    const int64_t u = !listed ? u0 + lane : (in ? static_cast<int64_t>(p.warp_list[u0 + lane]) : 0);
    bool mine = false;
    int64_t key = 0, wbase = 0;
    uint32_t start = 0, len = 0;
    int D = 0;
    LookupMeta first{0, 1.0f};
    if (in) {
      key = unique_key(p, u);
      len = p.run_lengths[u];
      const bool ours = kRows > 0 ? len <= static_cast<uint32_t>(kGroupMaxLookups)
                                  : len > static_cast<uint32_t>(p.warp_min_len);
      if (key != p.total_rows && len <= static_cast<uint32_t>(p.max_warp_segment) && ours) {
        mine = true;
        start = p.run_starts[u];
        const uint32_t v = p.vals_sorted[start];
        const uint32_t item = p.vals_are_items ? v : p.bag_of[v];
        const int f = static_cast<int>(item / static_cast<uint32_t>(p.batch_size));
        D = p.dims[f];
        wbase = p.weight_offsets[f] + (key - p.row_offsets[f]) * D;
        first = meta_of(p, v, item);
      }
    }
    unsigned todo = __ballot_sync(ArchTraits::kFullMask, mine);
    // Row src of the batch, broadcast from its lane to the whole warp.
    const auto batch_row = [&](int src) {
      BatchRow b;
      b.r.u = listed ? __shfl_sync(ArchTraits::kFullMask, u, src) : u0 + src;
      b.r.key = __shfl_sync(ArchTraits::kFullMask, key, src);
      b.r.wbase = __shfl_sync(ArchTraits::kFullMask, wbase, src);
      b.r.D = __shfl_sync(ArchTraits::kFullMask, D, src);
      b.first.grad_off = __shfl_sync(ArchTraits::kFullMask, first.grad_off, src);
      b.first.scale = __shfl_sync(ArchTraits::kFullMask, first.scale, src);
      b.start = __shfl_sync(ArchTraits::kFullMask, start, src);
      b.len = __shfl_sync(ArchTraits::kFullMask, len, src);
      return b;
    };
    if constexpr (kRows > 0) {
      static_assert(kRows <= kGroupVecs && kGroupVecs % kRows == 0 && ArchTraits::kWarpSize % kRows == 0,
                    "lane-group shape");
      constexpr int kLanes = ArchTraits::kWarpSize / kRows;
      const int grp = lane / kLanes, gl = lane % kLanes;
      const unsigned gmask = group_mask<kLanes>(grp);
      if (!kRepeatPath || !repeats) {
        // kRows rows at a time: group grp takes the grp-th remaining row of the batch.
        unsigned short_rows = todo;
        while (short_rows != 0) {
          unsigned t = short_rows;
          for (int i = 0; i < grp; ++i) t &= t - 1;
          const int j = t != 0 ? __ffs(t) - 1 : -1;
#pragma unroll
          for (int i = 0; i < kRows; ++i) short_rows &= short_rows - 1;
          const BatchRow b = batch_row(j < 0 ? 0 : j);
          if (j >= 0) group_update_row<W, G, kRows, kOpt>(p, b.r, b.start, b.len, b.first, gl, gmask);
        }
      } else if constexpr (kRepeatPath) {
        // Rows repeat (more than kRepeatLookups lookups per unique row on average, as under Zipf
        // lookups): the gradient rows mostly hit L2 and a round waits on latency, not bandwidth. The
        // lane groups share the warp's instruction stream, so a round lasts as long as its longest
        // row's chain of dependent gradient loads (the first lookup, then two more per step): the rows
        // are taken by length class (1 lookup, 2..3, 4..kGroupMaxLookups), so that short rows do not
        // wait for long ones, and the row each group takes next round has its weights, state and first
        // gradient row prefetched into L2 during this one. (Uniform lookups, ~1 per row, are
        // bandwidth-bound: both were measured slower there.)
        const unsigned single = __ballot_sync(ArchTraits::kFullMask, mine && len == 1);
        const unsigned pair = __ballot_sync(ArchTraits::kFullMask, mine && len >= 2 && len <= 3);
        RowOrder order{single, pair, todo & ~(single | pair)};
        while (!order.empty()) {
          const int j = order.nth(grp);
          const int jn = order.nth(grp + kRows);
          const BatchRow b = batch_row(j < 0 ? 0 : j);
          const BatchRow n = batch_row(jn < 0 ? 0 : jn);
          if (jn >= 0) group_prefetch_row<W, G, kRows, kOpt>(p, n.r, n.first.grad_off, gl);
#pragma unroll
          for (int i = 0; i < kRows; ++i) order.pop();
          if (j >= 0) group_update_row<W, G, kRows, kOpt>(p, b.r, b.start, b.len, b.first, gl, gmask);
        }
      }
    }
    if constexpr (kRows == 0) while (todo != 0) {
      const int j = __ffs(todo) - 1;
      todo &= todo - 1;
      const BatchRow b = batch_row(j);
      update_row<W>(p, b.r, WarpGrad<G>{b.start, b.len, b.r.D, b.first}, true);
    }
    u0 = __shfl_sync(ArchTraits::kFullMask, after, 0);
  }
  grid_dependency_wait();
}

// The block path's work list: block rows and hot-row superchunk slots, in key order (classify), one
// kernel for both so that the rows of one table, long and hot, run at the same time and read their
// gradient rows through L2 together. Persistent blocks take the list's items in order from a counter
// (kBlockNext; the first one by block index), one item ahead.
template <typename W, typename G>
__global__ void __launch_bounds__(kMaxBlockThreads) tbe_backward_block_work_kernel(const BwdParams p) {
  __shared__ SuperSmem sm;
  __shared__ int64_t next_item[2];
  if (p.wait_at_start) grid_dependency_wait();
  allow_dependent_launch();
  if (rows_disabled(p)) {
    grid_dependency_wait();
    return;
  }
  const uint32_t count = p.counters[kBlockCount] + p.counters[kSlotCount];
  const bool writer = threadIdx.x < ArchTraits::kWarpSize;
  int parity = 0;
  for (int64_t i = blockIdx.x; i < count;) {
    if (threadIdx.x == 0)
      next_item[parity] = gridDim.x + atomicAdd(p.counters + kBlockNext, 1u);
    const uint32_t item = p.work_list[i];
    if (item & kWholeRow) {
      // a block row: its whole segment (at most max_block_segment lookups) and the update
      const int64_t u = item & ~kWholeRow;
      const RowInfo r = row_info(p, u);
      const BlockGrad<G> g{&sm, static_cast<int64_t>(p.run_starts[u]), static_cast<int64_t>(p.run_lengths[u]), r.D};
      update_row<W>(p, r, g, writer);
      __syncthreads();
    } else {
      // a hot-row slot: its superchunk's sum (all passes) to partials[slot]
      const int64_t slot = item;
      const int64_t u = p.slot_row[slot];
      const int64_t s = p.slot_super[slot];
      const RowInfo r = row_info(p, u);
      const int64_t len = p.run_lengths[u];
      const int64_t first = static_cast<int64_t>(p.run_starts[u]) + s * kSuperChunk;
      const int64_t n = len - s * kSuperChunk < kSuperChunk ? len - s * kSuperChunk : kSuperChunk;
      const int passes = (r.D + kPassCols - 1) / kPassCols;
      for (int pass = 0; pass < passes; ++pass) {
        block_super_sum<G>(p, sm, first, n, pass, r.D, sm.total, false);
        for (int t = static_cast<int>(threadIdx.x); t < kPassCols; t += blockDim.x) {
          const int col = pass * kPassCols + t;
          if (col < r.D) p.partials[slot * p.max_dim + col] = sm.total[t];
        }
        __syncthreads();
      }
    }
    // Both branches end on a block barrier after thread 0 wrote next_item[parity]; the slot is written
    // again two items later, after the next item's barriers.
    i = next_item[parity];
    parity ^= 1;
  }
  grid_dependency_wait();
}

// Multi-block combine: a warp per hot row adds its partials in order and applies the optimizer.
template <typename W>
__global__ void __launch_bounds__(kRowThreads) tbe_backward_hot_combine_kernel(const BwdParams p) {
  grid_dependency_wait();  // the block-path kernel's partials; every row kernel before it is complete
  // The work counters of the row kernels, ready for the next rows phase.
  if (blockIdx.x == 0 && threadIdx.x < kNumSchedCounters) p.counters[kFirstSchedCounter + threadIdx.x] = 0;
  if (rows_disabled(p)) return;
  const uint32_t count = p.counters[kHotCount];
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / ArchTraits::kWarpSize);
  for (int64_t h = static_cast<int64_t>(blockIdx.x) * (kRowThreads / ArchTraits::kWarpSize) +
                   threadIdx.x / ArchTraits::kWarpSize;
       h < count; h += warps) {
    const int64_t u = p.hot_list[h];
    const RowInfo r = row_info(p, u);
    const int64_t len = p.run_lengths[u];
    const CombineGrad g{ static_cast<int64_t>(p.hot_base[h]), (len + kSuperChunk - 1) / kSuperChunk, r.D};
    update_row<W>(p, r, g, true);
  }
}

// ---- gradient w.r.t. per-sample weights ------------------------------------------------------------

// A warp per 32 consecutive lookups (persistent): lookup i -> dot(weight row of i, gradient row of its
// bag or sequence row), lane partials over the lane's columns, then a fixed xor tree. Runs before any
// weight is written. Invalid (skipped) lookups and lookups outside every bag get 0.
template <typename W, typename G>
__global__ void __launch_bounds__(kRowThreads) tbe_backward_grad_psw_kernel(const BwdParams p) {
  if (rows_disabled(p)) return;
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / ArchTraits::kWarpSize);
  const G* grad = static_cast<const G*>(p.grad_output);
  const W* weights = static_cast<const W*>(p.weights);
  for (int64_t g0 = (static_cast<int64_t>(blockIdx.x) * (kRowThreads / ArchTraits::kWarpSize) +
                     threadIdx.x / ArchTraits::kWarpSize) * ArchTraits::kWarpSize;
       g0 < p.num_indices; g0 += warps * ArchTraits::kWarpSize) {
    const int n = static_cast<int>(p.num_indices - g0 < ArchTraits::kWarpSize ? p.num_indices - g0 : ArchTraits::kWarpSize);
    int64_t goff = 0, woff = -1;
    int d = 0;
    if (lane < n) {
      const int64_t i = g0 + lane;
      const uint32_t item = p.bag_of[i];
      if (item != kNoBag) {
        const int64_t key = p.key64 ? static_cast<int64_t>(static_cast<const uint64_t*>(p.keys_in)[i])
                                    : static_cast<int64_t>(static_cast<const uint32_t*>(p.keys_in)[i]);
        const uint32_t f = item / static_cast<uint32_t>(p.batch_size);
        d = p.dims[f];
        woff = p.weight_offsets[f] + (key - p.row_offsets[f]) * d;
        if (p.sequence) {
          goff = i * p.grad_stride;
        } else {
          const int64_t b = static_cast<int64_t>(item) - static_cast<int64_t>(f) * p.batch_size;
          goff = b * p.grad_stride + p.output_offsets[f];
        }
      }
    }
    for (int j = 0; j < n; ++j) {
      const int64_t wo = __shfl_sync(ArchTraits::kFullMask, woff, j);
      const int64_t go = __shfl_sync(ArchTraits::kFullMask, goff, j);
      const int D = __shfl_sync(ArchTraits::kFullMask, d, j);
      float s = 0.0f;
      if (wo >= 0) {
        for (int pass = 0; pass * kPassCols < D; ++pass) {
          int col, ncols;
          lane_cols(pass, D, &col, &ncols);
          if (ncols > 0) {
            float w[kVec], x[kVec];
            load_vec<W, false>(weights + wo + col, p.w_vec != 0, ncols, w);
            load_vec<G, true>(grad + go + col, p.g_vec != 0, ncols, x);
#pragma unroll
            for (int k = 0; k < kVec; ++k)
              if (k < ncols) s = __fadd_rn(s, __fmul_rn(w[k], x[k]));
          }
        }
      }
      s = warp_sum(s);
      if (lane == 0) p.grad_psw[g0 + j] = s;
    }
  }
}

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
