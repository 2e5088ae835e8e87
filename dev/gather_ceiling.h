// The bare-gather ceiling of a TBE forward benchmark (CUDA): the same rows of the same weights read
// with nothing else done (no bags, no sums to memory, no output), as many in flight as the device
// allows. For rows of a few sectors the achievable share of FBGEMM's byte floor is bounded by how many
// random rows per second the memory system serves, not by bytes; this measures that bound on the run's
// own lookups, so a kernel's time can be stated as a fraction of it.
#pragma once

#include <cstdint>
#include <vector>

#include "bench_util.h"
#include "embscale/context.h"
#include "embscale/status.h"

namespace embscale {
namespace dev {

// byte_offsets: [N] host, the byte offset in `weights` (device) of each looked-up row; row_bytes: one
// size for every row, or one per row (mixed D), each a positive multiple of 4 (rows that are all
// multiples of 16 bytes are read 16 bytes per lane, others 4). Times `cfg` calls of the gather kernel
// into *t.
Status gather_ceiling(const Context& ctx, const void* weights, const std::vector<int64_t>& byte_offsets,
                      const std::vector<int32_t>& row_bytes, const tools::TimingConfig& cfg, tools::Timing* t);

}  // namespace dev
}  // namespace embscale
