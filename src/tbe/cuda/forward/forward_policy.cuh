// Launch parameters of the CUDA TBE forward, one policy struct per architecture. Only sm_90 (H200) is
// measured; every other architecture runs its values.
// Evidence for each value: docs/tuning.md#why-each-policy-value-is-what-it-is
#pragma once

namespace embscale {
namespace cuda {
namespace tbe_fwd {

// Compile-time shape of the bags kernel (tbe_forward_kernels.cuh):
//  kBlock, kMinBlocks: block size and the occupancy floor given to the register allocator;
//  kUnroll:            lookups per step (row loads in flight per lane per vector);
//  kVecs:              vectors per lane per pass (2: D=128 fp32 is 16 lanes per bag, two bags a warp);
//  kNoAlloc:           row loads bypass L1 (ld.global.nc.L1::no_allocate; rows are rarely reused).
template <int kBlock_, int kMinBlocks_, int kUnroll_, int kVecs_, bool kNoAlloc_>
struct FwdConfig {
  static constexpr int kBlock = kBlock_;
  static constexpr int kMinBlocks = kMinBlocks_;
  // Sequence kernels keep more values live (a store per lookup): two thirds of the pooled floor.
  static constexpr int kMinBlocksSequence = kMinBlocks_ * 2 / 3 > 0 ? kMinBlocks_ * 2 / 3 : 1;
  static constexpr int kUnroll = kUnroll_;
  static constexpr int kVecs = kVecs_;
  static constexpr bool kNoAlloc = kNoAlloc_;
};

struct ForwardPolicySm90 {
  // The bags kernel of every dtype combination: 128 threads, 8 blocks per SM, unroll 4, one vector per
  // lane, L1 allocating. More resident warps with fewer loads each beat fewer warps with deeper unrolling.
  // docs/tuning.md#tbe-forward-bags-kernel-shape
  using Bags = FwdConfig<128, 8, 4, 1, false>;
  // Bags each lane group walks when the launch's widest lane group is a whole warp (rows of 17 or more
  // 16-byte vectors); narrower groups walk one. Two bags won where a warp owns a bag, lost on narrow rows.
  // docs/tuning.md#tbe-forward-bags-per-whole-warp-lane-group
  static constexpr int kBagsPerWarpGroup = 2;
  // The warp kernel of plain calls whose rows take a whole warp (tbe_forward_plain_kernels.cuh): the
  // bags kernel's shape, unroll 4 (two vectors a lane: 2); unroll 8 was slower at every D.
  // docs/tuning.md#tbe-forward-warp-kernel-shape
  using Warp = FwdConfig<128, 8, 4, 1, false>;
  // Bags each warp of the warp kernel walks: 4 when every row is at most a warp's vectors (one a lane),
  // else 2; more bags win under Zipf and cost uniform rows a little.
  // docs/tuning.md#tbe-forward-bags-per-warp-of-the-warp-kernel
  static constexpr int warp_bags_per_warp(bool long_rows) { return long_rows ? 2 : 4; }
  // Bags each lane group of the vector kernel walks, by the launch's widest group: 2 for groups of 8 or
  // more lanes, else 1 (narrower groups lose with more bags).
  // docs/tuning.md#tbe-forward-bags-per-lane-group-of-the-vector-kernel
  static constexpr int vector_bags_per_group(int widest_group) { return widest_group >= 8 ? 2 : 1; }
};
// The launch grid is sized for the bags kernel's block; the plain kernels take the same.
static_assert(ForwardPolicySm90::Warp::kBlock == ForwardPolicySm90::Bags::kBlock, "one grid for every forward kernel");

// The policy every architecture runs (only sm_90 is measured; see above).
using ForwardPolicy = ForwardPolicySm90;

}  // namespace tbe_fwd
}  // namespace cuda
}  // namespace embscale
