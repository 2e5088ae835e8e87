// Internal entry of the CUDA TBE backward that runs a subset of its phases, for benchmarks that time
// them separately (not part of the public API). Phases read what the earlier phases left in the
// workspace, so a phase may be repeated on its own once a full call has run with the same arguments
// and workspace: linearize and sort leave the keys in place, encode recomputes the unique rows and
// their lists, rows updates the weights (each repeat is one more optimizer step).
#pragma once

#include <cstddef>

#include "embscale/tbe.h"

namespace embscale {
namespace cuda {

enum TbeBackwardPhase : unsigned {
  kTbeBwdLinearize = 1u,  // keys and values (and the bounds checks, with their report in error mode)
  kTbeBwdSort = 2u,       // CUB radix sort of (key, value)
  kTbeBwdEncode = 4u,     // run-length encode, run starts, classification of the unique rows
  kTbeBwdRows = 8u,       // grad_per_sample_weights, gradient sums and the optimizer update
  kTbeBwdAll = 15u,
};

Status tbe_backward_phases(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args,
                           void* workspace, size_t workspace_bytes, unsigned phases);

}  // namespace cuda
}  // namespace embscale
