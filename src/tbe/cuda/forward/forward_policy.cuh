// Launch parameters of the CUDA TBE forward, one policy struct per architecture. Each value carries the
// reason it is what it is and the record that chose it: a file under bench/results/, or "tuning" below,
// the tables of the 2026-11-30 sweeps in docs/tuning.md (section "Tuning sweeps, NVIDIA H200, 2026-11-30",
// which holds the tables quoted by name below). The other kernel shapes, grid orders and bags per
// lane group those records compared are built in dev/, never in the library.
//
// Only sm_90 (H200) has been measured. Every other architecture runs the sm_90 values (ForwardPolicy
// below): no record says otherwise, and a port adds a struct here once it has one.
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
  // lane, L1 allocating. More resident warps with fewer loads each beat fewer warps with deeper unrolling
  // (tuning, "TBE forward: kernel shape": T=32 D=128 B=8192 L=20 fp32 655.8 us uniform against 779.1
  // for 256 threads x 3 blocks x unroll 8, Zipf 1.15 368.6 against 511.9; and "Forward shapes for mixed
  // D": fastest or within 1% of it for mixed D, D=40, 68, 100, 132).
  using Bags = FwdConfig<128, 8, 4, 1, false>;
  // Grid order: x the bag tile, y the feature (blocks of one feature are neighbours). Feature-inner
  // order was slower (tuning, "Forward shapes for mixed D": mixed D 752.2 against 745.9 us, D=68 458.3
  // against 449.2).
  static constexpr bool kFeatureInner = false;
  // Bags each lane group walks when the launch's widest lane group is a whole warp (rows of 17 or more
  // 16-byte vectors); narrower groups walk one. Two bags won where a warp owns a bag (tuning, "Bags per
  // lane group": D=128 Zipf 1.15 281.4 -> 248.8 us, mixed D 745.9 -> 731.5, D=68 449.0 -> 435.1; D=128
  // uniform 639.7 -> 643.2 and D=256 1281.5 -> 1287.8 within noise) and lost on narrow rows (D=8
  // 143.0 -> 152.4, D=32 176.1 -> 181.3).
  static constexpr int kBagsPerWarpGroup = 2;
  // The warp kernel of plain calls whose rows take a whole warp (tbe_forward_plain_kernels.cuh): the
  // bags kernel's shape, unroll 4 (two vectors a lane: 2). Against the bags kernel, fp32 T=32 B=8192
  // L=20, Zipf 1.15: D=128 247.5 -> 230.6 us, D=160 368.8 -> 315.7, D=192 376.4 -> 324.3, D=256 410.8 ->
  // 358.4 (two vectors a lane in one walk; in passes of 32, 394.4), uniform D=160 878.2 -> 836.5, D=128
  // and D=256 within 1%; unroll 8 slower at every D (D=160 Zipf 344.9)
  // (2026-12-02-nvidia-h200-fwd-plain.md).
  using Warp = FwdConfig<128, 8, 4, 1, false>;
  // Bags each warp of the warp kernel walks: 4 when every row is at most a warp's vectors (one a lane),
  // else 2. Under Zipf more bags a warp win, uniform rows lose a little; the rule keeps both ahead of
  // FBGEMM (2026-12-02-nvidia-h200-fwd-bags.jsonl, fp32 T=32 B=8192 L=20, us for 1 / 2 / 4 / 8 bags:
  // D=128 Zipf 1.15 244.1 / 225.2 / 219.3 / 223.1, uniform 635.6 / 639.8 / 650.9 / 663.3; D=256 Zipf
  // 370.4 / 354.7 / 362.9 / 387.6, uniform 1236.7 / 1249.6 / 1275.9 / 1309.1; D=160 Zipf 2 / 4 bags
  // 305.6 / 302.1).
  static constexpr int warp_bags_per_warp(bool long_rows) { return long_rows ? 2 : 4; }
  // Bags each lane group of the vector kernel walks, by the launch's widest group: 2 for groups of 8 or
  // more lanes, else 1 (same record: D=64 Zipf 150.3 / 139.7 / 134.8 / 134.8, uniform 334.5 / 337.8 /
  // 341.7 / 346.1; D=32 Zipf 88.6 / 84.3 / 82.6 / 82.5, uniform 185.5 / 187.0 / 188.7 / 190.0; fp16
  // D=128 Zipf 201.6 / 188.1 / 182.9 / 184.2; D=8 Zipf 57.2 / 62.2 / 66.2, uniform 158.0 / 159.9 / 161.1).
  static constexpr int vector_bags_per_group(int widest_group) { return widest_group >= 8 ? 2 : 1; }
};
// The launch grid is sized for the bags kernel's block; the plain kernels take the same.
static_assert(ForwardPolicySm90::Warp::kBlock == ForwardPolicySm90::Bags::kBlock, "one grid for every forward kernel");

// The policy every architecture runs (only sm_90 is measured; see above).
using ForwardPolicy = ForwardPolicySm90;

}  // namespace tbe_fwd
}  // namespace cuda
}  // namespace embscale
