// Compiled shapes of the TBE forward bags kernel for pooled fp32 weights and output with int64 indices
// (the benchmark's headline case), so that several can be compared in one run of one build. The set is
// closed and small to bound compile time; docs/tbe_forward_cuda.md lists what each tested and what it
// measured.
#include "tbe_forward_variants.h"

#include <cuda_runtime.h>

#include <type_traits>

#include "core/cuda/check.cuh"
#include "tbe/cuda/forward/tbe_forward_launch.cuh"

namespace embscale {
namespace dev {
namespace {

using cuda::tbe_fwd::FwdConfig;
using cuda::tbe_fwd::ForwardPolicy;
using cuda::tbe_fwd::ForwardShape;
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

// The plain pooled walk of one feature with cooperative index loads: the bag's lane group loads up to
// `group` indices at once, one per lane (one coalesced load), and broadcasts each with a shuffle, where
// the library's walk has every lane load every index (a request per lookup). 16-byte vectors, fp32
// weights and output, int64 indices; the same sums in the same order as tbe_forward_feature. On 32-bit
// positions and counters (lookups and items below 2^31; the launcher checks), to fit 32-40 registers: the
// rows' byte offsets are 32 x 32 -> 64-bit products.
template <int kBlock, int kU, int kC>
__device__ __forceinline__ void coop_feature(const TbeForwardParams& p, int f, const float* table,
                                               const cuda::tbe_fwd::RowPlan plan, int tile0, int tiles) {
  const auto* indices = static_cast<const int64_t*>(p.indices);
  const auto* offsets = static_cast<const int64_t*>(p.offsets);
  const int B = static_cast<int>(p.batch_size);
  const int N = static_cast<int>(p.num_indices);
  const uint32_t row_bytes = static_cast<uint32_t>(p.dims[f]) * 4u;
  const int group = plan.group;
  const int gi = static_cast<int>(threadIdx.x) / group;
  const int rank = static_cast<int>(threadIdx.x) - gi * group;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const unsigned gmask = group == 32 ? 0xffffffffu : ((1u << group) - 1u) << (lane - rank);
  const int bags_per_block = kBlock / group;
  for (int b = tile0 * bags_per_block + gi; b < B; b += tiles * bags_per_block) {
    const int item = f * B + b;
    int start = static_cast<int>(min(max(offsets[item], int64_t{0}), static_cast<int64_t>(N)));
    int end = static_cast<int>(min(max(offsets[item + 1], static_cast<int64_t>(start)), static_cast<int64_t>(N)));
    for (int u0 = 0; u0 < plan.units; u0 += group * kC) {
      float acc[kC][4];
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[c][k] = 0.0f;
      const char* col = reinterpret_cast<const char*>(table) + 16 * (u0 + rank < plan.units ? u0 + rank : 0);
      // The second vector's column, as a byte distance from the first (0 when it is idle: row 0's first).
      const int u1 = u0 + rank + group;
      const uint32_t second = kC == 2 && u1 < plan.units ? 16u * static_cast<uint32_t>(group) : 0u;
      const auto add = [&](const cuda::Words<16>& w, int c) {
        float x[4];
        cuda::words_to_floats<float, 16>(w, x);
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[c][k] = __fadd_rn(acc[c][k], x[k]);
      };
      for (int c0 = start; c0 < end; c0 += group) {
        const int n = min(end - c0, group);
        const uint32_t mine = rank < n ? static_cast<uint32_t>(__ldg(reinterpret_cast<const long long*>(indices) + c0 + rank)) : 0u;
        int j0 = 0;
        for (; j0 + kU <= n; j0 += kU) {
          cuda::Words<16> raw[kU][kC];
#pragma unroll
          for (int j = 0; j < kU; ++j) {
            const char* row = col + static_cast<uint64_t>(__shfl_sync(gmask, mine, j0 + j, group)) * row_bytes;
#pragma unroll
            for (int c = 0; c < kC; ++c)
              raw[j][c] = cuda::load_words<16, cuda::LoadHint::kReadOnly>(c == 0 ? row : (second ? row + second : col));
          }
#pragma unroll
          for (int j = 0; j < kU; ++j)
#pragma unroll
            for (int c = 0; c < kC; ++c) add(raw[j][c], c);
        }
        for (; j0 < n; ++j0) {
          const char* row = col + static_cast<uint64_t>(__shfl_sync(gmask, mine, j0, group)) * row_bytes;
#pragma unroll
          for (int c = 0; c < kC; ++c)
            add(cuda::load_words<16, cuda::LoadHint::kReadOnly>(c == 0 ? row : (second ? row + second : col)), c);
        }
      }
      float* o = static_cast<float*>(p.output) + static_cast<int64_t>(b) * p.out_row_stride + p.output_offsets[f];
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const int uc = u0 + rank + c * group;
        if (uc < plan.units) {
          if (p.pooling == cuda::tbe_fwd::kPoolMean && end > start) {
            const float cnt = static_cast<float>(end - start);
#pragma unroll
            for (int k = 0; k < 4; ++k) acc[c][k] = __fdiv_rn(acc[c][k], cnt);
          }
          cuda::tbe_fwd::store_out<float, 4>(o + static_cast<int64_t>(uc) * 4, acc[c]);
        }
      }
    }
  }
}

// Single-path kernels: one vector path of the plain form (pooled, no checks, no per-sample weights, tables
// of at most 2^32 rows) and nothing else, so that its registers alone set the occupancy. kWide: the
// two-vector walk of wide rows (kernel_plan's vecs == 2), else one 16-byte vector per lane. kCoop: the
// walk with cooperative index loads (coop_feature) instead of the library's.
template <typename C, bool kWide, bool kCoop>
__global__ void __launch_bounds__(C::kBlock, C::kMinBlocks) single_path_kernel(const TbeForwardParams p) {
  using K = std::conditional_t<kWide, FwdConfig<C::kBlock, C::kMinBlocks, C::kUnroll / 2, 2, false>, C>;
  for (int f = static_cast<int>(blockIdx.y); f < p.num_features; f += static_cast<int>(gridDim.y)) {
    const float* table = static_cast<const float*>(p.weights) + p.weight_offsets[f];
    const cuda::tbe_fwd::RowPlan plan =
        cuda::tbe_fwd::kernel_plan(p.dims[f], 4, reinterpret_cast<uintptr_t>(table), 1);
    if constexpr (kCoop) {
      coop_feature<K::kBlock, K::kUnroll, K::kVecs>(p, f, table, plan, static_cast<int>(blockIdx.x),
                                                     static_cast<int>(gridDim.x));
    } else {
      cuda::tbe_fwd::tbe_forward_feature<float, float, int64_t, 16, true, K, true>(p, f, table, plan, blockIdx.x,
                                                                                  gridDim.x);
    }
  }
}

// Launches the single-path kernel when the call is plain and every feature takes one path, else the
// library's general kernel.
template <typename C, bool kCoop>
Status launch_single_path(const TbeForwardParams& p, dim3 grid, cudaStream_t stream) {
  // The cooperative walk counts lookups and items in 32 bits.
  const bool fits = !kCoop || (p.num_indices < (int64_t{1} << 31) && p.batch_size * p.num_features < (int64_t{1} << 31));
  const bool plain = p.check == cuda::tbe_fwd::kCheckOff && p.per_sample_weights == nullptr &&
                     p.pooling != cuda::tbe_fwd::kPoolNone && p.feature_inner == 0 && fits;
  // 0: one vector, 1: wide, 2: mixed or not a 16-byte plain path.
  const int path = !plain ? 2 : p.uniform_plan == 16 * 4 + 1 ? 0 : p.uniform_plan == 16 * 4 + 2 ? 1 : 2;
  if (path == 0) {
    single_path_kernel<C, false, kCoop><<<grid, C::kBlock, 0, stream>>>(p);
  } else if (path == 1) {
    single_path_kernel<C, true, kCoop><<<grid, C::kBlock, 0, stream>>>(p);
  } else {
    using G = ForwardPolicy::Bags;
    cuda::tbe_fwd::tbe_forward_bags_kernel<float, float, int64_t, true, G><<<grid, G::kBlock, 0, stream>>>(p);
  }
  EMBSCALE_CHECK_LAUNCH("single_path_kernel");
  return Status::Ok();
}

// A variant with the shape it launches (launch null: the library's launchers).
struct CompiledVariant {
  FwdVariant v;
  int block;
  int vecs;
  Status (*launch)(const TbeForwardParams& p, dim3 grid, cudaStream_t stream);
};

template <typename C>
CompiledVariant variant(const char* name, const char* what) {
  return CompiledVariant{{name, what}, C::kBlock, C::kVecs, &launch_pooled_f32<C>};
}

template <typename C, bool kCoop = false>
CompiledVariant single_path(const char* name, const char* what) {
  return CompiledVariant{{name, what}, C::kBlock, C::kVecs, &launch_single_path<C, kCoop>};
}

const std::vector<CompiledVariant>& compiled() {
  static const std::vector<CompiledVariant> all = {
      {{"default", "the library's shape (ForwardPolicy::Bags): 128 threads, 8 blocks/SM, unroll 4, 1 vector/lane"},
       ForwardPolicy::Bags::kBlock,
       ForwardPolicy::Bags::kVecs,
       nullptr},
      variant<B256U8>("b256u8", "256 threads, 3 blocks/SM, unroll 8 (the first default)"),
      variant<U4>("u4", "256 threads, 4 blocks/SM, unroll 4 (64 registers)"),
      variant<U16>("u16", "unroll 16, 2 blocks/SM (128 registers)"),
      variant<B128>("b128", "128 threads, 6 blocks/SM, unroll 8"),
      variant<V2>("v2", "2 vectors/lane (D=128 fp32: 16 lanes a bag, 2 bags a warp), unroll 8, 2 blocks/SM"),
      variant<V2U4>("v2u4", "2 vectors/lane, unroll 4, 3 blocks/SM"),
      variant<NoL1>("nol1", "default + row loads with L1::no_allocate"),
      single_path<ForwardPolicy::Bags>("s32", "single-path plain kernels, 128 threads, 8 blocks/SM (32 warps), unroll 4"),
      single_path<ForwardPolicy::Bags, true>("s32c", "s32 with cooperative index loads (one per lane, broadcast by shuffles)"),
      single_path<FwdConfig<128, 12, 2, 1, false>, true>("s48u2", "s32c at 12 blocks/SM (48 warps, 40 registers), unroll 2"),
      single_path<FwdConfig<128, 16, 2, 1, false>, true>("s64u2", "s32c at 16 blocks/SM (64 warps, 32 registers), unroll 2"),
      single_path<FwdConfig<128, 12, 4, 1, false>, true>("s48u4", "s32c at 12 blocks/SM (48 warps, 40 registers), unroll 4"),
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
  // kernels (with the requested grid order and bags per group).
  const bool covered = args.pooling != PoolingMode::kNone && args.weights.dtype == DType::kF32 &&
                       args.output.dtype == DType::kF32 && args.indices.dtype == DType::kI64;
  const CompiledVariant& c = covered ? *find_compiled(launch.variant) : compiled().front();
  return cuda::tbe_fwd::tbe_forward_shaped(
      ctx, tbe, args, ForwardShape{c.block, c.vecs, launch.feature_inner, launch.bags_per_group, c.launch});
}

Status set_l2_fetch_granularity(int bytes) {
  if (bytes < 0 || bytes > 128)
    return invalid_argument("l2 fetch granularity: " + std::to_string(bytes) + " bytes; expected 0..128");
  return cuda::cuda_status(cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, static_cast<size_t>(bytes)),
                           "cudaDeviceSetLimit (cudaLimitMaxL2FetchGranularity)");
}

}  // namespace dev
}  // namespace embscale
