// cast_transpose on CUDA: decides whether full tiles may use the vectorised path (alignment of x, y, yt
// and the shape) and dispatches {fp32, fp16, bf16} x {e4m3, e5m2} once.
#include <algorithm>
#include <string>

#include "fp8/fp8_backend.h"
#include "fp8/cuda/fp8_launch.cuh"
#include "fp8/cuda/fp8_transpose.cuh"

namespace embscale {
namespace cuda {

namespace {

template <typename Tin, typename Tout>
Status launch_cast_transpose(cudaStream_t stream, const CastTransposeParams& p) {
  const int64_t ntiles = ceil_div(p.rows, kTileRows) * ceil_div(p.cols, kTileCols);
  const int64_t cap = static_cast<int64_t>(sm_count()) * Fp8Policy::kTransposeMaxBlocksPerSm;
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min(ntiles, cap)));
  return launch_kernel("cast_transpose_tiled_kernel", cast_transpose_tiled_kernel<Tin, Tout>, dim3(grid),
                       dim3(kTransposeThreads), 0, stream, p);
}

bool aligned(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

Status cast_transpose(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y,
                      const TensorView& yt, const float* noop_flag) {
  CastTransposeParams p;
  p.x = x.data;
  p.y = y.data;
  p.yt = yt.data;
  p.rows = x.shape[0];
  p.cols = x.shape[1];
  p.scale = scale;
  p.noop_flag = noop_flag;
  if (p.rows == 0 || p.cols == 0) return Status::Ok();
  const size_t esz = dtype_size(x.dtype);
  p.in_aligned = aligned(x.data, esz);
  // Fast path: every row of x and y starts 16-byte aligned (16-element groups are whole 16-byte loads
  // of x and one 16-byte store of y), every row of yt 16-byte aligned at multiples of 16 rows.
  p.vec_ok = aligned(x.data, 16) && aligned(y.data, 16) && p.cols % 16 == 0 && aligned(yt.data, 16) &&
             p.rows % 16 == 0;
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_float_fp8(x.dtype, "x", y.dtype, "y", [&](auto tin, auto tout) -> Status {
    return launch_cast_transpose<typename decltype(tin)::type, typename decltype(tout)::type>(stream, p);
  });
}

}  // namespace cuda
}  // namespace embscale
