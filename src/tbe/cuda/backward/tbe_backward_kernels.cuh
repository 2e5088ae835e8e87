// CUDA table-batched embedding backward fused with the optimizer: all of its kernels (one header per
// phase, listed below; workspace, CUB calls, dispatch and launch order live in tbe_backward.cu, the row
// kernels are instantiated per weights dtype in tbe_backward_rows_{f32,f16,bf16}.cu).
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
#pragma once

#include "tbe/cuda/backward/tbe_backward_params.cuh"      // constants, counters, per-phase parameters
#include "tbe/cuda/backward/tbe_backward_io.cuh"          // vector loads and stores, warp sum
#include "tbe/cuda/backward/tbe_backward_linearize.cuh"   // linearize (+ bounds checks)
#include "tbe/cuda/backward/tbe_backward_classify.cuh"    // run lengths, work lists
#include "tbe/cuda/backward/tbe_backward_grad_sums.cuh"   // the canonical gradient sums
#include "tbe/cuda/backward/tbe_backward_update.cuh"      // the optimizer update of one row
#include "tbe/cuda/backward/tbe_backward_lane_groups.cuh" // several short rows per warp
#include "tbe/cuda/backward/tbe_backward_row_kernels.cuh" // warp, block and hot-row kernels
#include "tbe/cuda/backward/tbe_backward_grad_psw.cuh"    // gradient of the per-sample weights
