// Compiled shapes of the TBE forward bags kernel for pooled fp32 weights and output with int64
// indices (the benchmark's headline case), so that several can be compared in one run of one build:
// EMBSCALE_TBE_FWD_VARIANT=<name> (tbe_forward.cu). Other dtype combinations always use the default.
// The set is closed and small to bound compile time; docs/tbe_forward_cuda.md lists what each tests.
#include "tbe/cuda/forward/tbe_forward_instances.cuh"

namespace embscale {
namespace cuda {
namespace tbe_fwd {
namespace {

template <typename C>
Status launch_pooled_f32(const TbeForwardParams& p, dim3 grid, cudaStream_t stream) {
  tbe_forward_bags_kernel<float, float, int64_t, true, C><<<grid, C::kBlock, 0, stream>>>(p);
  EMBSCALE_CHECK_LAUNCH("tbe_forward_bags_kernel");
  return Status::Ok();
}

Status launch_default(const TbeForwardParams& p, dim3 grid, cudaStream_t stream) {
  return launch_tbe_forward<float, float, int64_t>(p, grid, stream);
}

//                     block floor unroll vecs no-L1
using B256U8 = FwdConfig<256, 3, 8, 1, false>;
using U4 = FwdConfig<256, 4, 4, 1, false>;
using U16 = FwdConfig<256, 2, 16, 1, false>;
using B128 = FwdConfig<128, 6, 8, 1, false>;
using V2 = FwdConfig<256, 2, 8, 2, false>;
using V2U4 = FwdConfig<256, 3, 4, 2, false>;
using NoL1 = FwdConfig<128, 8, 4, 1, true>;

template <typename C>
constexpr FwdVariant variant(const char* name, const char* what) {
  return FwdVariant{name, what, C::kBlock, C::kVecs, &launch_pooled_f32<C>};
}

const FwdVariant kVariants[] = {
    {"default", "128 threads, 8 blocks/SM, unroll 4, 1 vector/lane", DefaultFwdConfig::kBlock,
     DefaultFwdConfig::kVecs, &launch_default},
    variant<B256U8>("b256u8", "256 threads, 3 blocks/SM, unroll 8 (the first default)"),
    variant<U4>("u4", "256 threads, 4 blocks/SM, unroll 4 (64 registers)"),
    variant<U16>("u16", "unroll 16, 2 blocks/SM (128 registers)"),
    variant<B128>("b128", "128 threads, 6 blocks/SM, unroll 8"),
    variant<V2>("v2", "2 vectors/lane (D=128 fp32: 16 lanes a bag, 2 bags a warp), unroll 8, 2 blocks/SM"),
    variant<V2U4>("v2u4", "2 vectors/lane, unroll 4, 3 blocks/SM"),
    variant<NoL1>("nol1", "default + row loads with L1::no_allocate"),
};

}  // namespace

int num_fwd_variants() { return static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0])); }
const FwdVariant& fwd_variant(int i) { return kVariants[i]; }

}  // namespace tbe_fwd
}  // namespace cuda
}  // namespace embscale
