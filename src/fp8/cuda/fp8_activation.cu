// activation_amax on CUDA: path choice (as amax: cluster for small inputs, else atomic or two-stage grid)
// and the one dispatch over {relu, gelu_tanh, silu} x {fp32, fp16, bf16} in x {fp32, fp16, bf16} out.
#include <string>
#include <type_traits>

#include "fp8/fp8_backend.h"
#include "fp8/cuda/fp8_activation.cuh"
#include "fp8/cuda/fp8_launch.cuh"

namespace embscale {
namespace cuda {

namespace {

template <Activation kAct, class F>
Status with_act(F&& f) {
  return f(std::integral_constant<Activation, kAct>{});
}

template <class F>
Status dispatch_act(Activation act, F&& f) {
  switch (act) {
    case Activation::kRelu:
      return with_act<Activation::kRelu>(f);
    case Activation::kGeluTanh:
      return with_act<Activation::kGeluTanh>(f);
    case Activation::kSilu:
      return with_act<Activation::kSilu>(f);
  }
  return invalid_argument("act: unknown activation");
}

// Cluster availability is a property of the launch shape; one representative kernel answers for the
// path choice (so the workspace query needs no output dtype). The kernel actually launched is queried
// (and its non-portable size enabled) on its own, and a refused cluster launch falls back to the atomic
// path, which needs no workspace either.
int activation_cluster_size() {
  return cluster_size_for<activation_amax_cluster_kernel<bf16_t, bf16_t, Activation::kRelu>>(
      Fp8Policy::kClusterThreads);
}

AmaxPath activation_path(const TensorView& x, AmaxAlgo algo) {
  return choose_amax_path(algo, x.size_bytes(), activation_cluster_size() > 0);
}

}  // namespace

Status activation_amax_workspace_size(const TensorView& x, const AmaxOptions& opts, size_t* bytes) {
  *bytes = amax_grid_workspace_bytes(activation_path(x, opts.algo));
  return Status::Ok();
}

Status activation_amax(const Context& ctx, Activation act, const TensorView& x, const TensorView& y,
                       float* amax_out, const AmaxOptions& opts, void* ws, size_t ws_bytes) {
  (void)ws_bytes;
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  const int64_t n = x.numel();
  const AmaxPath path = activation_path(x, opts.algo);
  return dispatch_act(act, [&](auto act_c) -> Status {
    constexpr Activation kAct = decltype(act_c)::value;
    return dispatch_float(x.dtype, "x", [&](auto tin) -> Status {
      return dispatch_float(y.dtype, "y", [&](auto tout) -> Status {
        using Tin = typename decltype(tin)::type;
        using Tout = typename decltype(tout)::type;
        ActParams p;
        p.x = x.data;
        p.y = y.data;
        p.split = make_split(x.data, sizeof(Tin), n, y.data, sizeof(Tout));
        p.noop_flag = opts.noop_flag;
        p.out = AmaxOutputs{amax_out, opts.nonfinite_flag, static_cast<uint32_t*>(ws)};
        AmaxPath run_path = path;
        if (run_path == AmaxPath::kCluster) {
          const int c = cluster_size_for<activation_amax_cluster_kernel<Tin, Tout, kAct>>(Fp8Policy::kClusterThreads);
          if (c > 0) {
            const Status st = launch_kernel("activation_amax_cluster_kernel",
                                            activation_amax_cluster_kernel<Tin, Tout, kAct>, dim3(c),
                                            dim3(Fp8Policy::kClusterThreads), c, stream, p);
            if (st.ok()) return st;
          }
          run_path = AmaxPath::kAtomic;  // refused: the grid path (its error was cleared)
        }
        const bool two_stage = run_path == AmaxPath::kTwoStage;
        if (two_stage) {
          EMBSCALE_RETURN_IF_ERROR(check_amax_slots(ws, "activation_amax"));
        } else {
          EMBSCALE_RETURN_IF_ERROR(launch_amax_init(stream, amax_out, opts.nonfinite_flag, opts.noop_flag,
                                                    x.size_bytes()));
          if (n == 0) return Status::Ok();
        }
        const int64_t work = p.split.nvec + ceil_div(p.split.num_scalar(), 4);
        const int grid = amax_grid_blocks(
            work, resident_wave_blocks<activation_amax_grid_kernel<Tin, Tout, kAct>>(Fp8Policy::kAmaxGridThreads));
        EMBSCALE_RETURN_IF_ERROR(launch_kernel("activation_amax_grid_kernel",
                                               activation_amax_grid_kernel<Tin, Tout, kAct>, dim3(grid),
                                               dim3(Fp8Policy::kAmaxGridThreads), 0, stream, p, two_stage));
        if (!two_stage) return Status::Ok();
        return launch_amax_reduce_slots(stream, p.out.slots, grid, amax_out, opts.nonfinite_flag, opts.noop_flag);
      });
    });
  });
}

}  // namespace cuda
}  // namespace embscale
