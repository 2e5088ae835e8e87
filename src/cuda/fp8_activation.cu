// activation_amax on CUDA: path choice (as amax: cluster for small inputs, else atomic or two-stage grid)
// and the one dispatch over {relu, gelu_tanh, silu} x {fp32, fp16, bf16} in x {fp32, fp16, bf16} out.
#include <string>
#include <type_traits>

#include "api/fp8_backend.h"
#include "cuda/fp8_activation.cuh"
#include "cuda/fp8_launch.cuh"

namespace embscale {
namespace cuda {

namespace {

template <typename T>
struct Tag {
  using type = T;
};

template <class F>
Status dispatch_float(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::kF32:
      return f(Tag<float>{});
    case DType::kF16:
      return f(Tag<fp16_t>{});
    case DType::kBF16:
      return f(Tag<bf16_t>{});
    default:
      return unsupported(std::string(what) + ": dtype " + dtype_name(dt) + " is not supported on CUDA");
  }
}

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

// Cluster availability is a property of the launch shape, identical for every instantiation; one
// representative kernel answers for all.
int activation_cluster_size() {
  return cluster_size_for(activation_amax_cluster_kernel<bf16_t, bf16_t, Activation::kRelu>, kClusterThreads);
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
        p.out = AmaxOutputs{amax_out, opts.nonfinite_flag, ws, 0u};
        if (path == AmaxPath::kCluster) {
          // Per-kernel query: it also enables the non-portable cluster size on this kernel.
          const int c = cluster_size_for(activation_amax_cluster_kernel<Tin, Tout, kAct>, kClusterThreads);
          if (c == 0) return Status(StatusCode::kBackendError, "activation_amax: cluster launch unavailable");
          return launch_kernel("activation_amax_cluster_kernel", activation_amax_cluster_kernel<Tin, Tout, kAct>,
                               dim3(c), dim3(kClusterThreads), c, stream, p);
        }
        EMBSCALE_RETURN_IF_ERROR(check_amax_workspace(ws, "activation_amax"));
        p.out.token = next_launch_token();
        const int64_t work = p.split.nvec + ceil_div(p.split.num_scalar(), 4);
        return launch_kernel("activation_amax_grid_kernel", activation_amax_grid_kernel<Tin, Tout, kAct>,
                             dim3(amax_grid_blocks(work)), dim3(kAmaxGridThreads), 0, stream, p,
                             path == AmaxPath::kTwoStage);
      });
    });
  });
}

}  // namespace cuda
}  // namespace embscale
