// CUDA TBE backward as its steps, in launch order: prepare (tuning, workspace layout, kernel
// parameters, no launch), linearize, sort, encode, rows, finish. tbe_backward runs them all, in
// order; the library has no other caller. Internal (not part of the public API): dev/ runs them one
// at a time to time each phase. A step reads what the earlier steps left in the workspace, so after
// one full call with the same arguments and workspace a step may be repeated on its own: linearize
// and sort leave the keys in place, encode recomputes the unique rows and their lists, rows updates
// the weights (each repeat is one more optimizer step).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "embscale/tbe.h"
#include "tbe/cuda/backward/tbe_backward_params.cuh"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

struct ClassTally;  // tbe_backward_classify.cuh

// The workspace's buffers (the layout's slices).
struct Buffers {
  void *keys_in, *keys_sorted, *unique_keys, *cub_temp;
  uint32_t *vals_in, *vals_sorted, *bag_of, *run_lengths, *run_starts, *work_list, *warp_list, *hot_list, *hot_base,
      *slot_row, *slot_super, *counters;
  int32_t* bag_count;
  float* partials;
  ClassTally* tally;
  int n;  // lookups
};

}  // namespace tbe_bwd

// One call, prepared: what the steps launch and on which buffers.
struct TbeBackwardCall {
  const TableBatchedEmbedding* tbe = nullptr;
  const TbeBackwardArgs* args = nullptr;  // the caller's, kept alive until the last step
  cudaStream_t stream = nullptr;
  tbe_bwd::Buffers b{};
  tbe_bwd::LinearizeParams lp{};
  tbe_bwd::RowParams rp{};
  tbe_bwd::ClassifyParams cp{};
  size_t cub_bytes = 0;    // CUB's temporary storage in the workspace
  int end_bit = 0;         // radix-sort key bits
  bool key64 = false;      // 64-bit sort keys
  int block_threads = 0;   // threads per block of the block paths
  bool capturing = false;  // the stream is capturing a CUDA graph (asked only when bounds checks run)
  bool dense = false;      // optimizer none: unique rows and their gradients are returned
  int64_t N = 0, B = 0;    // lookups, batch size
};

// Resolves the tuning, lays out and checks the workspace and fills *call; launches nothing.
Status tbe_backward_prepare(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args,
                            void* workspace, size_t workspace_bytes, TbeBackwardCall* call);
// Keys and values (and the bounds checks; error mode reads its report back here, before any weight is written).
Status tbe_backward_linearize(const TbeBackwardCall& call);
// CUB radix sort of (key, value).
Status tbe_backward_sort(const TbeBackwardCall& call);
// Runs of equal keys (unique rows and their starts), then the classification of the unique rows.
Status tbe_backward_encode(const TbeBackwardCall& call);
// grad_per_sample_weights, the gradient sums and the optimizer update.
Status tbe_backward_rows(const TbeBackwardCall& call);
// Skip mode outside a graph capture: reads the report back (broken offsets become an error Status).
Status tbe_backward_finish(const TbeBackwardCall& call);

}  // namespace cuda
}  // namespace embscale
