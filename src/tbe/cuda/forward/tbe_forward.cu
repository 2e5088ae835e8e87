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
// Launch parameters: ForwardPolicy (forward_policy.cuh). tbe_forward_shaped takes them as an argument,
// for dev/ to measure other shapes on the same path; nothing here is global or mutable.
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

// The forward kernel of the weights, output and index dtypes (launch_tbe_forward, instantiated in
// tbe_forward_{f32,f16,bf16}.cu).
Status launch_forward(const TbeForwardParams& p, DType w_dtype, DType out_dtype, DType index_dtype, dim3 grid,
                   cudaStream_t s) {
  return dispatch_float(w_dtype, "weights", [&](auto tw) {
    return dispatch_float(out_dtype, "output", [&](auto to) {
      return dispatch_index(index_dtype, "indices", [&](auto ti) {
        using W = typename decltype(tw)::type;
        using O = typename decltype(to)::type;
        using I = typename decltype(ti)::type;
        return tbe_fwd::launch_tbe_forward<W, O, I>(p, grid, s);
      });
    });
  });
}

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

Status tbe_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args) {
  using Policy = tbe_fwd::ForwardPolicy;
  const tbe_fwd::ForwardShape shape{Policy::Bags::kBlock, Policy::Bags::kVecs, Policy::kFeatureInner, 0, nullptr, true};
  return tbe_fwd::tbe_forward_shaped(ctx, tbe, args, shape);
}

Status tbe_fwd::tbe_forward_shaped(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args,
                                   const ForwardShape& shape) {
  if (shape.bags_per_group < 0 || shape.bags_per_group > 64)
    return invalid_argument("bags_per_group: " + std::to_string(shape.bags_per_group) +
                            "; expected 0 (the policy's rule) or 1..64");
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const TableBatchedEmbedding::DeviceMeta& meta = tbe.device_meta();
  const int T = tbe.num_features();
  const int64_t B = args.batch_size;
  const int64_t N = args.indices.numel();
  const bool sequence = args.pooling == PoolingMode::kNone;

  bool capturing = false;
  EMBSCALE_RETURN_IF_ERROR(tbe_report::capture_state(args.bounds_check, stream, &capturing));

  TbeForwardParams p;
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
  p.feature_inner = shape.feature_inner ? 1 : 0;
  p.kernel = tbe_fwd::kKernelBags;

  // Grid: the tiles cover the bags of the feature whose row plan packs the fewest bags per block (the
  // same kernel_plan the kernel evaluates, so the sizes agree), divided by the bags per lane group; x is
  // the tile and y the feature (folded if T > 65535), or the other way round in feature-inner order
  // (tiles folded past 65535: the kernel loops over the bags of its tiles).
  if (T > 0 && B > 0) {
    const int es = static_cast<int>(dtype_size(args.weights.dtype));
    const auto base = reinterpret_cast<uintptr_t>(args.weights.data);
    // The kernel, bags per lane group and tiles (forward_plan.h). dev/'s bags-kernel shapes launch their
    // own kernels and keep the bags kernel's grid rule.
    tbe_fwd::CallShape call;
    call.elem_bytes = es;
    call.batch_size = B;
    call.plain = !sequence && p.per_sample_weights == nullptr && N < (int64_t{1} << 31) &&
                 static_cast<int64_t>(T) * B < (int64_t{1} << 31) && !shape.feature_inner;
    call.plain_kernels = shape.plain_kernels;
    call.block = shape.block;
    call.vecs = shape.vecs;
    call.bags_per_group = shape.bags_per_group;
    const tbe_fwd::LaunchPlan plan = tbe_fwd::plan_launch(call, T, [&](int f) {
      const int t = tbe.feature_table(f);
      return tbe_fwd::FeatureRows{tbe.feature_dim(f), tbe.config().tables[t].num_rows,
                                  base + static_cast<uintptr_t>(tbe.weight_offset(t)) * es};
    });
    p.kernel = plan.kernel;
    const int64_t tiles = plan.tiles;
    const dim3 grid = shape.feature_inner
                          ? dim3(static_cast<unsigned>(T), static_cast<unsigned>(std::min<int64_t>(tiles, kMaxGridY)))
                          : dim3(static_cast<unsigned>(std::min(tiles, kMaxGridX)),
                                 static_cast<unsigned>(std::min(T, kMaxGridY)));
    if (shape.launch != nullptr) {
      EMBSCALE_RETURN_IF_ERROR(shape.launch(p, grid, stream));
    } else {
      EMBSCALE_RETURN_IF_ERROR(launch_forward(p, args.weights.dtype, args.output.dtype, args.indices.dtype, grid, stream));
    }
  }
  if (args.bounds_check == BoundsCheckMode::kOff) return Status::Ok();

  EMBSCALE_RETURN_IF_ERROR(launch_finalize(p, args.indices.dtype, args.num_skipped, args.num_skipped_host, stream));
  if (args.bounds_check == BoundsCheckMode::kWarn || (args.bounds_check == BoundsCheckMode::kSkip && capturing))
    return Status::Ok();

  return tbe_report::read_report(tbe, B, N, stream, "tbe forward");
}

}  // namespace cuda
}  // namespace embscale
