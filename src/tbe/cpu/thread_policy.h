// How many OpenMP threads a CPU TBE call fans out to.
//
// A parallel region costs each extra thread a wake-up, and on a machine whose cores are busy with other
// work a woken thread may wait a scheduler time slice (milliseconds) before it runs while the others
// wait for it at the region's end. So a call gets one thread per kRowBytesPerThread bytes of embedding
// rows it gathers (at least one), and never more than the caller's limit (Context::num_threads when set,
// else OpenMP's maximum). The value was measured on the loaded 2-core development machine, where a
// second thread only paid off (in the best of 40 calls) from about 10 MB of rows; below that it cost up
// to tens of milliseconds in the median (docs/tbe_cpu.md).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "embscale/context.h"

namespace embscale {
namespace cpu {

constexpr int64_t kRowBytesPerThread = int64_t{8} << 20;

inline int threads_for_row_bytes(int64_t row_bytes, int limit) {
  const int64_t wanted = std::max<int64_t>(1, row_bytes / kRowBytesPerThread);
  return static_cast<int>(std::min<int64_t>(wanted, std::max(limit, 1)));
}

// The threads of a call that gathers `row_bytes` bytes of rows under context `ctx`.
inline int threads_for_call(const Context& ctx, int64_t row_bytes) {
  return threads_for_row_bytes(row_bytes, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
}

}  // namespace cpu
}  // namespace embscale
