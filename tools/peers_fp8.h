// The amax peers `embscale bench fp8` measures next to embscale on the GPU, in the same run, on the
// same inputs and with the same timing. Each is a re-implementation from a published design, not a
// copy of its source:
//  * te_atomic:    TransformerEngine's upstream amax: memset the output, then one 512-thread,
//                  16-byte-vectorised grid-stride kernel (grid capped at 65535 blocks), a block
//                  reduction and one atomic max per block.
//  * te_two_stage: the two-stage variant: the same first kernel writes block maxima into an fp32
//                  workspace; one 256-thread block reduces them into the output (no memset, no atomics).
//  * cub:          cub::DeviceReduce::TransformReduce over |x| with a max operator.
// Plain C++ signatures (the stream is a cudaStream_t passed as void*), so the benchmark needs no CUDA
// headers. Compiled only when the CUDA backend is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "embscale/dtype.h"
#include "embscale/status.h"

namespace embscale {
namespace tools {
namespace peers {

enum class AmaxPeer { kTeAtomic = 0, kTeTwoStage, kCub };

const char* amax_peer_name(AmaxPeer p);  // "te_atomic", "te_two_stage", "cub"
std::vector<AmaxPeer> all_amax_peers();

// Scratch the peer needs for n elements of dtype (fp32, fp16 or bf16), in bytes; 0 for te_atomic.
// Query once and allocate outside the timed region.
Status amax_peer_workspace_size(AmaxPeer p, DType dtype, int64_t n, size_t* bytes);

// amax (one fp32 in device memory) = max |x| over x[0..n) (device memory), enqueued on stream.
// NaN elements are skipped, as fmaxf does.
Status amax_peer(AmaxPeer p, const void* x, DType dtype, int64_t n, float* amax, void* workspace,
                 size_t workspace_bytes, void* stream);

}  // namespace peers
}  // namespace tools
}  // namespace embscale
