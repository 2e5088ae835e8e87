// CPU table-batched embedding forward: pooled (SUM, MEAN) and sequence (no pooling) lookups.
//
// The kernel (tbe_forward_kernel.inc: bag sums in vector registers, prefetch, bounds handling) is
// compiled here once per instruction-set level, each copy in a namespace of its own: x86-64-v2 (the
// library's baseline, 4-lane vectors), and on x86-64 also x86-64-v3 (AVX2, 8 lanes) and x86-64-v4
// (AVX-512, 16 lanes) under target pragmas (cpu_isa.h). tbe_forward() runs the level cpu_isa.h chooses, on the
// number of threads thread_policy.h gives the call's size. Every level sums in the same order without
// FMA contraction (this file is built with -ffp-contract=off), so outputs are bit-identical.
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
#include "tbe/cpu/cpu_isa.h"
#include "tbe/cpu/prefetch.h"
#include "tbe/cpu/tbe_checks.h"
#include "tbe/cpu/thread_policy.h"
#include "tbe/cpu/vec4.h"

namespace embscale {
namespace cpu {
namespace {

// Rows this many lookups ahead are prefetched, issued a bag at a time: with bags of 20 rows that keeps
// 30-50 random rows in flight per thread; 32 beat 16 and 64 against FBGEMM's CPU TBE (docs/tbe_cpu.md,
// bench/results/2026-12-02-cpu-fwd-prefetch.md).
constexpr int64_t kPrefetchDistance = 32;
// fp32 rows of 128 columns or more with AVX-512 are summed 128 columns at a time, each lookup prefetching
// the row this many lookups on from inside the loop (docs/tbe_cpu.md,
// bench/results/2026-12-02-cpu-interleaved-prefetch.md).
constexpr int64_t kInterleavedPrefetch = 16;
// fp32 rows of 32 to 127 columns with AVX-512 also prefetch from inside the loop, this many lookups on
// (docs/tbe_cpu.md, bench/results/2026-12-03-cpu-xeon-narrow-interleaved-prefetch.md).
constexpr int64_t kNarrowInterleavedPrefetch = 32;

using tbe_checks::BadIndex;

struct ForwardParams {
  const TableBatchedEmbedding* tbe;
  const TbeForwardArgs* args;
  int64_t T, B, N;
  int threads;
};

namespace x86_64_v2 {
constexpr int kLanes = 4;
#include "tbe/cpu/tbe_forward_kernel.inc"
}  // namespace x86_64_v2

#if EMBSCALE_CPU_WIDE_ISAS
EMBSCALE_CPU_TARGET_V3_BEGIN
namespace x86_64_v3 {
constexpr int kLanes = 8;
#include "tbe/cpu/tbe_forward_kernel.inc"
}  // namespace x86_64_v3
EMBSCALE_CPU_TARGET_END

EMBSCALE_CPU_TARGET_V4_BEGIN
namespace x86_64_v4 {
constexpr int kLanes = 16;
#include "tbe/cpu/tbe_forward_kernel.inc"
}  // namespace x86_64_v4
EMBSCALE_CPU_TARGET_END
#endif  // EMBSCALE_CPU_WIDE_ISAS

}  // namespace

Status tbe_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args) {
  ForwardParams p;
  p.tbe = &tbe;
  p.args = &args;
  p.T = tbe.num_features();
  p.B = args.batch_size;
  p.N = args.indices.numel();
  // Bytes of rows gathered: the lookups times the features' mean row size.
  const int64_t row_bytes =
      p.T > 0 ? p.N * (tbe.total_dim() / p.T) * static_cast<int64_t>(dtype_size(args.weights.dtype)) : 0;
  p.threads = threads_for_call(ctx, row_bytes);
#if EMBSCALE_CPU_WIDE_ISAS
  switch (active_cpu_isa()) {
    case CpuIsa::kX86_64_v4: return x86_64_v4::forward(p);
    case CpuIsa::kX86_64_v3: return x86_64_v3::forward(p);
    case CpuIsa::kX86_64_v2: break;
  }
#endif
  return x86_64_v2::forward(p);
}

}  // namespace cpu
}  // namespace embscale
