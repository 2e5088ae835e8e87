// CUDA forward of the quantized TBE (embscale/tbe_quant.h): grid sizing, the index dtype and pooled/sequence
// choice of kernel (tbe_quant_forward_kernels.cuh: 4 instantiations, the weight type a switch inside), and
// the bounds-check protocol, which is the training forward's (tbe/cuda/forward/tbe_forward.cu):
//   1. the forward kernel: grid (bag tiles, features), the tiles sized for the feature whose lane groups are
//      widest (tbe_quant_plan.h, evaluated the same way by the kernel), blocks past a feature's bags exit;
//   2. (error, skip and warn modes) tbe_bounds_finalize_kernel: the first/last offset checks, the report or
//      the skip count (to args.num_skipped), the scratch records cleared;
//   3. the report read back (error mode always, so it is refused under capture; skip mode outside a
//      capture; warn mode never) and worded by tbe/bounds_report.h as on the CPU.
// Nothing allocates; only step 3 synchronises.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/dispatch.h"
#include "tbe/bounds_report.h"
#include "tbe/cuda/quant/tbe_quant_forward_kernels.cuh"
#include "tbe/cuda/tbe_report.cuh"
#include "tbe/tbe_quant_backend.h"

namespace embscale {
namespace cuda {

using tbe_quant_fwd::QuantForwardParams;
using tbe_quant_fwd::QuantForwardPolicy;

Status tbe_quant_forward(const Context& ctx, const QuantizedTableBatchedEmbedding& tbe,
                         const QuantTbeForwardArgs& args) {
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const QuantizedTableBatchedEmbedding::DeviceMeta& meta = tbe.device_meta();
  const int T = tbe.num_features();
  const int64_t B = args.batch_size;
  const int64_t N = args.indices.numel();
  const bool sequence = args.pooling == PoolingMode::kNone;

  bool capturing = false;
  EMBSCALE_RETURN_IF_ERROR(tbe_report::capture_state(args.bounds_check, stream, &capturing));

  QuantForwardParams p;
  p.weights = static_cast<const uint8_t*>(args.weights);
  p.indices = args.indices.data;
  p.offsets = args.offsets.data;
  p.per_sample_weights = static_cast<const float*>(args.per_sample_weights.data);
  p.output = args.output.data;
  p.table_offsets = meta.table_offsets;
  p.num_rows = meta.num_rows;
  p.row_bytes = meta.row_bytes;
  p.dims = meta.dims;
  p.types = meta.types;
  p.output_offsets = meta.output_offsets;
  p.scratch = meta.scratch;
  p.batch_size = B;
  p.num_indices = N;
  p.out_row_stride = sequence ? tbe.feature_dim(0) : tbe.total_dim();
  p.num_features = T;
  p.pooling = args.pooling == PoolingMode::kSum    ? tbe_quant_fwd::kPoolSum
              : args.pooling == PoolingMode::kMean ? tbe_quant_fwd::kPoolMean
                                                   : tbe_quant_fwd::kPoolNone;
  p.check = args.bounds_check == BoundsCheckMode::kError                     ? tbe_bounds::kCheckError
            : embscale::tbe_bounds::skips_bad_indices(args.bounds_check) ? tbe_bounds::kCheckSkip
                                                                             : tbe_bounds::kCheckOff;
  p.out_kind = args.output.dtype == DType::kF16    ? tbe_quant_fwd::kOutF16
               : args.output.dtype == DType::kBF16 ? tbe_quant_fwd::kOutBF16
                                                   : tbe_quant_fwd::kOutF32;

  if (B > 0) {
    // Tiles: enough for the feature that fits the fewest bags in a block (the widest lane group).
    int widest = 1;
    for (int f = 0; f < T; ++f) {
      const int t = tbe.feature_table(f);
      const uint64_t address = reinterpret_cast<uintptr_t>(p.weights) + static_cast<uint64_t>(tbe.table_offset(t));
      const tbe_quant_fwd::QuantRowPlan plan = tbe_quant_fwd::quant_row_plan(
          tbe.config().tables[t].type, tbe.feature_dim(f), tbe.row_bytes(t), address);
      widest = std::max(widest, plan.group);
    }
    const int64_t bags_per_block = QuantForwardPolicy::kBlock / widest;
    const int64_t tiles = (B + bags_per_block - 1) / bags_per_block;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, INT_MAX)),
                    static_cast<unsigned>(std::min(T, 65535)));
    EMBSCALE_RETURN_IF_ERROR(dispatch_index(args.indices.dtype, "indices", [&](auto ti) -> Status {
      using I = typename decltype(ti)::type;
      if (sequence) {
        tbe_quant_fwd::tbe_quant_forward_kernel<I, false><<<grid, QuantForwardPolicy::kBlock, 0, stream>>>(p);
      } else {
        tbe_quant_fwd::tbe_quant_forward_kernel<I, true><<<grid, QuantForwardPolicy::kBlock, 0, stream>>>(p);
      }
      EMBSCALE_CHECK_LAUNCH("tbe_quant_forward_kernel");
      return Status::Ok();
    }));
  } else if (sequence && N > 0) {
    // No bags: every sequence row lies before the first bag (valid offsets are [N]) and is zeros.
    EMBSCALE_RETURN_IF_ERROR(cuda_status(
        cudaMemsetAsync(args.output.data, 0, static_cast<size_t>(N) * tbe.feature_dim(0) * dtype_size(args.output.dtype),
                        stream),
        "cudaMemsetAsync (sequence rows)"));
  }
  if (args.bounds_check == BoundsCheckMode::kOff) return Status::Ok();

  const int64_t items = static_cast<int64_t>(T) * B;
  EMBSCALE_RETURN_IF_ERROR(dispatch_index(args.indices.dtype, "indices", [&](auto ti) -> Status {
    using I = typename decltype(ti)::type;
    tbe_bounds::tbe_bounds_finalize_kernel<I><<<1, 32, 0, stream>>>(
        static_cast<const I*>(p.offsets), static_cast<const I*>(p.indices), items, N, p.check, p.scratch,
        args.num_skipped);
    EMBSCALE_CHECK_LAUNCH("tbe_bounds_finalize_kernel");
    return Status::Ok();
  }));
  if (args.bounds_check == BoundsCheckMode::kWarn || (args.bounds_check == BoundsCheckMode::kSkip && capturing))
    return Status::Ok();

  const auto table_of = [&](int f) { return tbe.feature_table(f); };
  const auto rows_of = [&](int t) { return tbe.config().tables[t].num_rows; };
  return tbe_report::read_report(meta.scratch, stream, "quantized tbe forward",
                                 [&](const embscale::tbe_bounds::BoundsViolation& v) {
                                   return embscale::tbe_bounds::violation_error(B, N, v, table_of, rows_of);
                                 });
}

}  // namespace cuda
}  // namespace embscale
