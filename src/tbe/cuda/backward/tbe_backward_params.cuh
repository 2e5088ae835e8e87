// CUDA TBE backward: the constants of the kernels (canonical summation order, column mapping, block
// sizes, per-device tuning defaults), the workspace counters and the kernel parameters of each phase.
#pragma once

#include <cstdint>

#include "core/cuda/arch_traits.cuh"
#include "tbe/cuda/backward/tbe_backward_policy.cuh"
#include "embscale/tbe.h"
#include "tbe/optimizer.h"
#include "tbe/rounding.h"
#include "tbe/cuda/bounds_check.cuh"

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

// Per-architecture defaults of TbeBackwardTuning: tbe_backward_policy.cuh. The widest row the lane groups
// take (512 columns with 32 lanes):
constexpr int kLaneGroupCols = 4 * kPassCols;  // = kGroupMaxCols, 4 passes (defined with the lane-group path below)
constexpr int kMaxBlockThreads = 512;  // the block path's __launch_bounds__ (2 blocks an SM: <= 64 registers a thread)

constexpr int kLinearizeItems = 256;  // bags per block of the linearize kernel (= its threads)
constexpr int kLinearizeSpan = 8192;  // lookups of a linearize block whose bags fit its shared table
constexpr int kLinearizeLoads = 4;    // indices a linearize thread loads at once
constexpr int kRowThreads = 256;      // threads per block of the warp-per-row, combine and psw kernels
constexpr int kWarpRowsMinBlocks = 3; // warp-per-row kernel: 3 x 256 threads per SM (<= 85 registers)
// Blocks per SM of the lane-group kernel, by weights dtype and shape (kRows: rows per warp; 8 and 16 are
// the narrow shapes, rows up to 32 columns), measured (see the doc's History): fp32 rows of the wide
// shapes run best without spills (2 blocks, <= 128 registers); fp16/bf16 rows and fp32 rows of the
// narrow shapes with 3 (<= 80 registers): more warps in flight for short rows and the rounding's
// arithmetic, while at 4 blocks (<= 64 registers) the spills cost more than the warps bring.
// An optimizer with element-wise state holds it beside the weights: with two buffers (Adam's and LAMB's
// moments, up to three times the registers) 2 blocks (<= 128 registers) for every shape and weights dtype,
// as at 3 every narrow shape spilled; with one buffer (Adagrad, LARS-SGD, the partial row-wise forms) the
// stateless optimizers' counts.
template <typename W, int kRows, int kElementStateBuffers>
constexpr int group_rows_min_blocks() {
  if constexpr (kElementStateBuffers >= 2) return 2;
  else if constexpr (sizeof(W) == 4) return kRows >= 8 ? 3 : 2;
  else return 3;
}

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

// Warp-path rows of up to this many lookups go to the lane groups of the wide shapes (rows of more than
// 32 columns), up to kNarrowGroupMaxLookups to those of the narrow shapes (group_max_lookups); longer
// ones take a whole warp (second launch of the warp-row kernel, over the warp list).
constexpr int kGroupMaxLookups = 8;
constexpr int kNarrowGroupMaxLookups = 32;
// The one-row lane groups walk this many rows a batch when the widest row has at least
// kWideWalkMinDim columns (bench/results/2026-12-02-nvidia-h200-rows-in-flight.md).
constexpr int kWideWalkRows = 8;
constexpr int kWideWalkMinDim = 385;
// The lane-group path orders rows by length and prefetches when lookups per unique row exceed this.
constexpr int kRepeatLookups = 2;

constexpr uint32_t kNoBag = 0xffffffffu;  // bag_of of a dropped lookup
constexpr uint32_t kWholeRow = 0x80000000u;  // work-list flag of a block row (unique indices are < 2^31)

enum ContribKind : int { kContribPlain = 0, kContribWeighted = 1, kContribMean = 2 };

// ---- kernel parameters: one struct per phase, each with what its kernels read -----------------------
// (pointers are device memory)

// The linearize kernel's.
struct LinearizeParams {
  const void* indices;          // [N] of I
  const void* offsets;          // [T*B+1] of I
  const int64_t* num_rows;      // [T]
  const int64_t* row_offsets;   // [T]
  int64_t* scratch;             // [8] bounds-check records (tbe_bounds::ScratchWord)
  void* keys_in;                // [N] of K
  uint32_t* vals_in;            // [N]
  uint32_t* bag_of;             // [N] bag item of each lookup (written when values are lookup ids)
  int32_t* bag_count;           // [T*B] valid lookups per bag (MEAN)
  int64_t batch_size;           // B
  int64_t num_indices;          // N
  int64_t num_items;            // T*B
  int64_t total_rows;           // sentinel key
  int check;                    // tbe_bounds::CheckKind
  int vals_are_items;           // values are bag items (else lookup ids, and bag_of is written)
  int mean;                     // MEAN pooling: bag_count is written
};

// The classify kernels' (tally and place).
struct ClassifyParams {
  const void* unique_keys;      // [N] of K, each run's key (CUB)
  const uint32_t* run_starts;   // [N] each run's first sorted position (CUB)
  uint32_t* run_lengths;        // [N]
  uint32_t* counters;           // [kNumCounters]
  uint32_t* work_list;          // [max_block_rows + max_slots] block path: rows | kWholeRow, hot slots
  uint32_t* warp_list;          // [max_warp_rows] warp rows the lane groups do not take
  uint32_t* hot_list;           // [max_hot]
  uint32_t* hot_base;           // [max_hot] first slot of each hot row
  uint32_t* slot_row;           // [max_slots] unique index of the slot's row
  uint32_t* slot_super;         // [max_slots] superchunk index within the row
  int64_t* unique_rows_out;     // dense mode [N]
  int64_t* num_unique_out;      // dense mode [1]
  const int64_t* skip_report;   // skip mode: the bounds-check report word (see rows_disabled); else null
  int64_t num_indices;          // N
  int64_t total_rows;           // sentinel key
  int dense;                    // optimizer kNone: the unique rows and their count are outputs
  int max_warp_segment;
  int max_block_segment;
  int group_max_lookups;        // the lane groups take warp rows of up to this many lookups and the longer
                                // ones are listed (warp_list); 0: the lane groups are off, no list
};

// The row kernels' (warp rows, block work list, hot-row combine, grad_per_sample_weights).
struct RowParams {
  void* weights;                   // [num_weights] of W
  const void* grad_output;         // pooled [B, total_dim] / sequence [N, D] of G
  const float* psw;                // [N] or null
  const int64_t* weight_offsets;   // [T]
  const int32_t* dims;             // [T]
  const int32_t* output_offsets;   // [T+1]
  const int64_t* row_offsets;      // [T]
  float* momentum1;
  float* momentum2;
  float* grad_psw;                 // [N] or null
  float* unique_grads;             // dense mode [N * max_dim]
  const void* keys_in;             // [N] of K, in lookup order (grad_psw)
  const uint32_t* vals_sorted;     // [N]
  const uint32_t* bag_of;          // [N] (when values are lookup ids)
  const int32_t* bag_count;        // [T*B] (MEAN)
  const void* unique_keys;         // [N] of K
  const uint32_t* run_lengths;     // [N]
  const uint32_t* run_starts;      // [N]
  const uint32_t* work_list;       // classify's lists (ClassifyParams)
  const uint32_t* warp_list;
  const uint32_t* hot_list;
  const uint32_t* hot_base;
  const uint32_t* slot_row;
  const uint32_t* slot_super;
  float* partials;                 // [max_slots * max_dim]
  uint32_t* counters;              // [kNumCounters]
  const int64_t* skip_report;      // skip mode: the bounds-check report word (see rows_disabled); else null
  int64_t batch_size;              // B
  int64_t num_indices;             // N
  int64_t total_rows;              // sentinel key
  int64_t grad_stride;             // grad_output row stride (elements)
  int max_dim;
  int key64;                       // keys are uint64 (else uint32)
  int sequence;                    // grad_output is [N, D]
  int vals_are_items;              // sorted values are bag items (else lookup ids)
  int contrib;                     // ContribKind
  int w_vec;                       // weights rows allow kVec-element vector access
  int g_vec;                       // grad_output rows allow kVec-element vector access
  int ug_vec;                      // unique_grads rows allow kVec-element vector stores
  int whole_vecs;                  // every row read or written is whole aligned kVec vectors (lane groups)
  int max_warp_segment;
  int group_max_lookups;           // the lane groups' longest rows, the whole-warp kernel takes longer ones
                                   // (group_max_lookups; 0: no lane groups, the whole warps take every row)
  int wait_at_start;               // the first row kernel of a call: griddepcontrol.wait before anything
  OptimizerParams opt;
  opt::AdamCorrections corrections;
  WeightRounding rounding;
  uint64_t rounding_key;
  const int64_t* rounding_bases;   // [total_rows] or null (TbeBackwardArgs::rounding_bases)
  int state_vec;                   // the element-wise state buffers allow kVec-element vector access
};

// Skip mode: broken offsets (reported by the finalize kernel before classify and the rows run) mean no
// update; report is the report word in skip mode, null otherwise.
__device__ __forceinline__ bool rows_disabled(const int64_t* report) {
  return report != nullptr && *reinterpret_cast<volatile const int64_t*>(report) != tbe_bounds::kReportNone;
}

__device__ __forceinline__ int64_t unique_key(const RowParams& p, int64_t u) {
  return p.key64 ? static_cast<int64_t>(static_cast<const uint64_t*>(p.unique_keys)[u])
                 : static_cast<int64_t>(static_cast<const uint32_t*>(p.unique_keys)[u]);
}

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
