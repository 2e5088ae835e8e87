// CUDA table-batched embedding forward: grid sizing, the runtime -> compile-time dtype dispatch (core/dispatch.h),
// and the bounds-check protocol around the forward kernel (tbe_forward_kernels.cuh, tbe_forward_plain_kernels.cuh).
//
// Enqueued on ctx.stream, in order:
//   1. the forward kernel forward_plan.h picks (the bags kernel, or a plain kernel in its checked or
//      unchecked form): grid (bag tiles, features), sized from each feature's row plan so the feature
//      needing the most blocks gets exactly enough; blocks of other features past their last bag exit at
//      once.
//   2. (error and skip modes) tbe_bounds_finalize_kernel, one thread: first/last offset checks, the
//      report or the skip count, and the scratch records cleared for the next call.
//   3. the 5-word report is copied to the host and the stream synchronised; a report becomes a
//      kOutOfRange Status naming what was wrong:
//      * error mode: always (the documented synchronising mode), so it is refused during capture;
//      * skip mode: only when the stream is not being captured, so that broken offsets are an error
//        Status as on the CPU backend. Inside a capture skip mode never synchronises: broken bags are
//        skipped (nothing is read out of bounds) and *num_skipped is set to -1 instead of the count;
//      * warn mode: never (skip mode as inside a capture, always).
// Off mode only launches the forward kernel. No mode allocates.
//
// Launch parameters: ForwardPolicy (forward_policy.cuh). The three steps (begin_forward, launch_forward,
// end_forward) are declared in tbe_forward_launch.cuh; nothing here is global or mutable.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "tbe/tbe_backend.h"
#include "core/cuda/check.cuh"
#include "core/dispatch.h"
#include "tbe/cuda/forward/tbe_forward_launch.cuh"
#include "tbe/cuda/tbe_report.cuh"

namespace embscale {
namespace cuda {
namespace {

using tbe_fwd::TbeForwardParams;

constexpr int64_t kMaxGridX = INT_MAX;
constexpr int kMaxGridY = 65535;

Status launch_finalize(const TbeForwardParams& p, DType index_dtype, int64_t* num_skipped, int64_t* num_skipped_host,
                       cudaStream_t s) {
  const int64_t items = static_cast<int64_t>(p.num_features) * p.batch_size;
  return dispatch_index(index_dtype, "indices", [&](auto ti) -> Status {
    using I = typename decltype(ti)::type;
    tbe_bounds::tbe_bounds_finalize_kernel<I><<<1, ArchTraits::kWarpSize, 0, s>>>(static_cast<const I*>(p.offsets),
                                                            static_cast<const I*>(p.indices), items, p.num_indices,
                                                            p.check, p.scratch, num_skipped, num_skipped_host);
    EMBSCALE_CHECK_LAUNCH("tbe_bounds_finalize_kernel");
    return Status::Ok();
  });
}

}  // namespace

Status tbe_fwd::begin_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args,
                              CallShape shape, ForwardLaunch* out) {
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const TableBatchedEmbedding::DeviceMeta& meta = tbe.device_meta();
  const int T = tbe.num_features();
  const int64_t B = args.batch_size;
  const int64_t N = args.indices.numel();
  const bool sequence = args.pooling == PoolingMode::kNone;
  ForwardLaunch& l = *out;
  EMBSCALE_RETURN_IF_ERROR(tbe_report::capture_state(args.bounds_check, stream, &l.capturing));

  TbeForwardParams& p = l.p;
  p.weights = args.weights.data;
  p.indices = args.indices.data;
  p.offsets = args.offsets.data;
  p.per_sample_weights = static_cast<const float*>(args.per_sample_weights.data);
  p.output = args.output.data;
  p.weight_offsets = meta.weight_offsets;
  p.num_rows = meta.num_rows;
  p.dims = meta.dims;
  p.output_offsets = meta.output_offsets;
  p.scratch = meta.scratch;
  p.batch_size = B;
  p.num_indices = N;
  p.out_row_stride = sequence ? (T > 0 ? tbe.feature_dim(0) : 0) : tbe.total_dim();
  p.num_features = T;
  p.pooling = args.pooling == PoolingMode::kSum ? tbe_fwd::kPoolSum
              : args.pooling == PoolingMode::kMean ? tbe_fwd::kPoolMean
                                                   : tbe_fwd::kPoolNone;
  const bool skips = embscale::tbe_bounds::skips_bad_indices(args.bounds_check);  // skip and warn modes
  p.check = args.bounds_check == BoundsCheckMode::kError ? tbe_fwd::kCheckError
            : skips                                      ? tbe_fwd::kCheckSkip
                                                         : tbe_fwd::kCheckOff;
  p.kernel = tbe_fwd::kKernelBags;
  l.any_bags = T > 0 && B > 0;
  if (!l.any_bags) return Status::Ok();

  // The kernel, bags per lane group and tiles (forward_plan.h): the tiles cover the bags of the feature
  // whose row plan packs the fewest bags per block (the same kernel_plan the kernels evaluate, so the
  // sizes agree). Grid: x the tile, y the feature, each folded past its limit (the kernels loop).
  const int es = static_cast<int>(dtype_size(args.weights.dtype));
  const auto base = reinterpret_cast<uintptr_t>(args.weights.data);
  shape.elem_bytes = es;
  shape.batch_size = B;
  shape.plain = shape.plain && !sequence && p.per_sample_weights == nullptr && N < (int64_t{1} << 31) &&
                static_cast<int64_t>(T) * B < (int64_t{1} << 31);
  const tbe_fwd::LaunchPlan plan = tbe_fwd::plan_launch(shape, T, [&](int f) {
    const int t = tbe.feature_table(f);
    return tbe_fwd::FeatureRows{tbe.feature_dim(f), tbe.config().tables[t].num_rows,
                                base + static_cast<uintptr_t>(tbe.weight_offset(t)) * es};
  });
  p.kernel = plan.kernel;
  l.grid = dim3(static_cast<unsigned>(std::min(plan.tiles, kMaxGridX)), static_cast<unsigned>(std::min(T, kMaxGridY)));
  return Status::Ok();
}

Status tbe_fwd::launch_forward(const ForwardLaunch& l, const TbeForwardArgs& args, cudaStream_t stream) {
  if (!l.any_bags) return Status::Ok();
  return dispatch_float(args.weights.dtype, "weights", [&](auto tw) {
    return dispatch_float(args.output.dtype, "output", [&](auto to) {
      return dispatch_index(args.indices.dtype, "indices", [&](auto ti) {
        using W = typename decltype(tw)::type;
        using O = typename decltype(to)::type;
        using I = typename decltype(ti)::type;
        return tbe_fwd::launch_tbe_forward<W, O, I>(l.p, l.grid, stream);
      });
    });
  });
}

Status tbe_fwd::end_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args,
                            const ForwardLaunch& l) {
  if (args.bounds_check == BoundsCheckMode::kOff) return Status::Ok();
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  EMBSCALE_RETURN_IF_ERROR(launch_finalize(l.p, args.indices.dtype, args.num_skipped, args.num_skipped_host, stream));
  if (args.bounds_check == BoundsCheckMode::kWarn || (args.bounds_check == BoundsCheckMode::kSkip && l.capturing))
    return Status::Ok();
  return tbe_report::read_report(tbe, args.batch_size, args.indices.numel(), stream, "tbe forward");
}

Status tbe_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args) {
  tbe_fwd::CallShape shape;  // ForwardPolicy's kernel shape and bags rule; plain kernels where they apply
  shape.plain = true;
  tbe_fwd::ForwardLaunch l;
  EMBSCALE_RETURN_IF_ERROR(tbe_fwd::begin_forward(ctx, tbe, args, shape, &l));
  EMBSCALE_RETURN_IF_ERROR(tbe_fwd::launch_forward(l, args, static_cast<cudaStream_t>(ctx.stream)));
  return tbe_fwd::end_forward(ctx, tbe, args, l);
}

}  // namespace cuda
}  // namespace embscale
