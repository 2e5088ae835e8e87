// Compiled shapes of the TBE forward bags kernel for pooled fp32 weights and output with int64 indices
// (the benchmark's headline case), so that several can be compared in one run of one build. The set is
// closed and small to bound compile time; docs/tbe_forward_cuda.md lists what each tested and what it
// measured.
#include "tbe_forward_variants.h"

#include <cuda_runtime.h>

#include <type_traits>

#include "core/cuda/check.cuh"
#include "tbe/cuda/forward/tbe_forward_launch.cuh"
#include "tbe/cuda/forward/tbe_forward_plain_kernels.cuh"

namespace embscale {
namespace dev {
namespace {

using cuda::tbe_fwd::FwdConfig;
using cuda::tbe_fwd::ForwardPolicy;
using cuda::tbe_fwd::TbeForwardParams;

template <typename C>
Status launch_pooled_f32(const TbeForwardParams& p, dim3 grid, cudaStream_t stream) {
  cuda::tbe_fwd::tbe_forward_bags_kernel<float, float, int64_t, true, C><<<grid, C::kBlock, 0, stream>>>(p);
  EMBSCALE_CHECK_LAUNCH("tbe_forward_bags_kernel");
  return Status::Ok();
}

//                     block floor unroll vecs no-L1
using B256U8 = FwdConfig<256, 3, 8, 1, false>;
using U4 = FwdConfig<256, 4, 4, 1, false>;
using U16 = FwdConfig<256, 2, 16, 1, false>;
using B128 = FwdConfig<128, 6, 8, 1, false>;
using V2 = FwdConfig<256, 2, 8, 2, false>;
using V2U4 = FwdConfig<256, 3, 4, 2, false>;
using NoL1 = FwdConfig<128, 8, 4, 1, true>;

// The warp kernel (tbe_forward_plain_kernels.cuh) in another shape or vector width, unchecked, for the calls
// without bounds checks where the library would run a plain kernel (p.kernel); anything else runs the
// library's launcher (checked calls its checked plain kernels). kBytes = 8: rows as 8-byte vectors (fp32
// D = 34..64 a whole warp), which the library reads 16 bytes a lane.
template <typename C, int kBytes>
Status launch_warp(const TbeForwardParams& p, dim3 grid, cudaStream_t stream) {
  if (p.kernel == cuda::tbe_fwd::kKernelBags || p.check != cuda::tbe_fwd::kCheckOff)
    return cuda::tbe_fwd::launch_tbe_forward<float, float, int64_t>(p, grid, stream);
  cuda::tbe_fwd::tbe_forward_warp_kernel<float, float, int64_t, C, kBytes><<<grid, C::kBlock, 0, stream>>>(p);
  EMBSCALE_CHECK_LAUNCH("tbe_forward_warp_kernel");
  return Status::Ok();
}

// A variant with the shape it launches (launch null: the library's launchers).
struct CompiledVariant {
  FwdVariant v;
  int block;
  int vecs;
  Status (*launch)(const TbeForwardParams& p, dim3 grid, cudaStream_t stream);
  bool plain_kernels;  // runs the warp kernel where the library would run a plain kernel
};

template <typename C>
CompiledVariant variant(const char* name, const char* what) {
  return CompiledVariant{{name, what}, C::kBlock, C::kVecs, &launch_pooled_f32<C>, false};
}

template <typename C, int kBytes>
CompiledVariant warp(const char* name, const char* what) {
  return CompiledVariant{{name, what}, C::kBlock, C::kVecs, &launch_warp<C, kBytes>, true};
}

const std::vector<CompiledVariant>& compiled() {
  static const std::vector<CompiledVariant> all = {
      {{"default", "the library's forward (ForwardPolicy): plain kernels where they apply, else the bags kernel"},
       ForwardPolicy::Bags::kBlock,
       ForwardPolicy::Bags::kVecs,
       nullptr,
       true},
      variant<B256U8>("b256u8", "256 threads, 3 blocks/SM, unroll 8 (the first default)"),
      variant<U4>("u4", "256 threads, 4 blocks/SM, unroll 4 (64 registers)"),
      variant<U16>("u16", "unroll 16, 2 blocks/SM (128 registers)"),
      variant<B128>("b128", "128 threads, 6 blocks/SM, unroll 8"),
      variant<V2>("v2", "2 vectors/lane (D=128 fp32: 16 lanes a bag, 2 bags a warp), unroll 8, 2 blocks/SM"),
      variant<V2U4>("v2u4", "2 vectors/lane, unroll 4, 3 blocks/SM"),
      variant<NoL1>("nol1", "default + row loads with L1::no_allocate"),
      variant<ForwardPolicy::Bags>("bags", "the library's bags kernel for every call (no plain kernels)"),
      warp<FwdConfig<128, 8, 8, 1, false>, 16>("warp-u8", "plain calls without bounds checks: the warp kernel at unroll 8 (4 for two vectors a lane)"),
      warp<ForwardPolicy::Warp, 8>("warp-8b", "plain calls without bounds checks: the warp kernel on 8-byte vectors (fp32 D = 34..64 a whole warp)"),
  };
  return all;
}

const CompiledVariant* find_compiled(const std::string& name) {
  for (const CompiledVariant& c : compiled())
    if (name == c.v.name) return &c;
  return nullptr;
}

}  // namespace

const std::vector<FwdVariant>& fwd_variants() {
  static const std::vector<FwdVariant> names = [] {
    std::vector<FwdVariant> v;
    for (const CompiledVariant& c : compiled()) v.push_back(c.v);
    return v;
  }();
  return names;
}

const FwdVariant* find_fwd_variant(const std::string& name) {
  const CompiledVariant* c = find_compiled(name);
  return c != nullptr ? &c->v : nullptr;
}

Status check_fwd_launch(const FwdLaunch& launch) {
  if (find_compiled(launch.variant) == nullptr) {
    std::string list;
    for (const FwdVariant& v : fwd_variants()) list += (list.empty() ? "" : ", ") + std::string(v.name);
    return invalid_argument("variant: unknown variant '" + launch.variant + "'; expected one of " + list);
  }
  if (launch.bags_per_group < 0 || launch.bags_per_group > 64)
    return invalid_argument("bags_per_group: " + std::to_string(launch.bags_per_group) +
                            "; expected 0 (the policy's rule) or 1..64");
  return Status::Ok();
}

Status variant_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args,
                       const FwdLaunch& launch) {
  EMBSCALE_RETURN_IF_ERROR(check_fwd_launch(launch));
  // The variants cover pooled fp32 -> fp32 with int64 indices; everything else runs the library's
  // kernels (with the requested bags per group).
  const bool covered = args.pooling != PoolingMode::kNone && args.weights.dtype == DType::kF32 &&
                       args.output.dtype == DType::kF32 && args.indices.dtype == DType::kI64;
  const CompiledVariant& c = covered ? *find_compiled(launch.variant) : compiled().front();
  cuda::tbe_fwd::CallShape shape;
  shape.block = c.block;
  shape.vecs = c.vecs;
  shape.bags_per_group = launch.bags_per_group;
  shape.plain = c.plain_kernels;
  cuda::tbe_fwd::ForwardLaunch l;
  EMBSCALE_RETURN_IF_ERROR(cuda::tbe_fwd::begin_forward(ctx, tbe, args, shape, &l));
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  if (c.launch == nullptr || !l.any_bags) {
    EMBSCALE_RETURN_IF_ERROR(cuda::tbe_fwd::launch_forward(l, args, stream));
  } else {
    EMBSCALE_RETURN_IF_ERROR(c.launch(l.p, l.grid, stream));
  }
  return cuda::tbe_fwd::end_forward(ctx, tbe, args, l);
}

Status set_l2_fetch_granularity(int bytes) {
  if (bytes < 0 || bytes > 128)
    return invalid_argument("l2 fetch granularity: " + std::to_string(bytes) + " bytes; expected 0..128");
  return cuda::cuda_status(cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, static_cast<size_t>(bytes)),
                           "cudaDeviceSetLimit (cudaLimitMaxL2FetchGranularity)");
}

}  // namespace dev
}  // namespace embscale
