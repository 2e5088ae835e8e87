// The warp-level algorithms of the GPU kernels, written once against a lane backend whose lane count is a
// compile-time constant: 32 on NVIDIA and on AMD RDNA, 64 on AMD CDNA (a "wavefront"). A backend `Ln`
// provides the primitives and these functions build the rest from them:
//   Ln::kCount, Ln::Mask (one bit a lane: 32 or 64 bits), Ln::kFull,
//   Ln::shfl(v, src, width, mask), Ln::shfl_xor(v, offset, width, mask), Ln::ballot(pred, mask),
//   Ln::reduce_max(u32), Ln::reduce_or(u32) (the warp's max / or, in every lane), Ln::lane().
// The device backend is core/cuda/lanes.cuh (CUDA or HIP intrinsics); the host backend of the tests runs
// each lane as a thread (tests/lane_emulation.h), so the same source is checked at 32 and 64 lanes on
// the CPU.
//
// Numerics: lane_sum adds in a fixed xor tree, so a group of L lanes gives the same bits whatever the
// width of the warp it sits in; the tests compare 32 against 64 lanes bit for bit.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace embscale {

template <int kLanes>
struct LaneMaskOf;
template <>
struct LaneMaskOf<32> { using type = unsigned; };
template <>
struct LaneMaskOf<64> { using type = unsigned long long; };

// The facts of a warp of kLanes lanes that need no intrinsic: its mask type and the layout of its lane
// groups (L lanes each, L a power of two dividing kLanes: group lane / L, lane lane % L).
template <int kLanes>
struct LaneShape {
  static_assert(kLanes == 32 || kLanes == 64, "a warp has 32 or 64 lanes");
  using Mask = typename LaneMaskOf<kLanes>::type;
  static constexpr int kCount = kLanes;
  static constexpr Mask kFull = ~Mask{0};

  // The lanes of group grp of L lanes.
  template <int L>
  static EMBSCALE_HD Mask group_mask(int grp) {
    static_assert(L >= 1 && L <= kLanes && kLanes % L == 0, "a lane group divides the warp");
    if constexpr (L >= kLanes) {
      return kFull;
    } else {
      return ((Mask{1} << L) - Mask{1}) << (grp * L);
    }
  }

  // 1 + the lowest set lane of m, 0 when m is empty (__ffs of the mask's width).
  static EMBSCALE_HD int ffs(Mask m) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    if constexpr (kLanes == 32) return __ffs(static_cast<int>(m));
    else return __ffsll(static_cast<long long>(m));
#else
    if constexpr (kLanes == 32) return __builtin_ffs(static_cast<int>(m));
    else return __builtin_ffsll(static_cast<long long>(m));
#endif
  }
  static EMBSCALE_HD int popc(Mask m) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    if constexpr (kLanes == 32) return __popc(m);
    else return __popcll(m);
#else
    if constexpr (kLanes == 32) return __builtin_popcount(m);
    else return __builtin_popcountll(m);
#endif
  }
  // The n-th (from 0) lowest set lane of m, -1 when m has n or fewer: how lane group n takes its row
  // of a batch whose rows are the set lanes of m. The warp-rows kernel writes these three lines out
  // in place (a call, even inlined, changes nvcc's schedule of the kernel: docs/building.md).
  static EMBSCALE_HD int nth_lane(const Mask& m, const int& n) {
    Mask t = m;
    for (int i = 0; i < n; ++i) t &= t - 1;
    return t != 0 ? ffs(t) - 1 : -1;
  }
};

// a + b rounded to nearest, never contracted into an FMA.
EMBSCALE_HD float lane_add_rn(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Sum over each group of L lanes (all kCount when L is the warp) in the xor tree L/2, L/4, .., 1; every
// lane of the group gets the group's sum. m: the group's lanes (a group mask or Ln::kFull).
template <class Ln, int L = Ln::kCount>
EMBSCALE_HD float lane_sum(float v, typename Ln::Mask m = Ln::kFull) {
#if defined(__CUDACC__) || defined(__HIPCC__)
#pragma unroll
#endif
  for (int o = L / 2; o > 0; o /= 2) v = lane_add_rn(v, Ln::shfl_xor(v, o, L, m));
  return v;
}

// The ballot of the group of L lanes holding this lane, as the low L bits (the whole ballot when L is
// the warp): how a unit of 32 lanes (a cache set, one lane a way) asks on a 64-lane wavefront.
template <class Ln, int L>
EMBSCALE_HD typename LaneMaskOf<(L > 32 ? 64 : 32)>::type lane_group_ballot(bool p) {
  using Out = typename LaneMaskOf<(L > 32 ? 64 : 32)>::type;
  if constexpr (L == Ln::kCount) {
    return Ln::ballot(p, Ln::kFull);
  } else {
    return static_cast<Out>((Ln::ballot(p, Ln::kFull) >> (Ln::lane() / L * L)) & Ln::template group_mask<L>(0));
  }
}

// Max and or over the whole warp by xor shuffles: the backends' reduce_max / reduce_or where the
// hardware has no single reduction instruction.
template <class Ln>
EMBSCALE_HD uint32_t lane_max_by_shuffles(uint32_t v) {
  for (int o = Ln::kCount / 2; o > 0; o >>= 1) {
    const uint32_t u = Ln::shfl_xor(v, o, Ln::kCount, Ln::kFull);
    v = v > u ? v : u;
  }
  return v;
}
template <class Ln>
EMBSCALE_HD uint32_t lane_or_by_shuffles(uint32_t v) {
  for (int o = Ln::kCount / 2; o > 0; o >>= 1) v |= Ln::shfl_xor(v, o, Ln::kCount, Ln::kFull);
  return v;
}

// The second level of a block's max/or reduction: warp w's maxima are bits[w] and nf[w] (nwarps of them,
// nwarps <= kCount); each lane reads one and the warp reduces them. The caller's first level is
// Ln::reduce_max / reduce_or within each warp, with a block barrier between the levels.
template <class Ln>
struct MaxOr {
  uint32_t max;
  uint32_t any;
};
template <class Ln>
EMBSCALE_HD MaxOr<Ln> lane_combine_warps(const uint32_t* bits, const uint32_t* nf, int nwarps, int lane) {
  const uint32_t b = lane < nwarps ? bits[lane] : 0u;
  const uint32_t f = lane < nwarps ? nf[lane] : 0u;
  return MaxOr<Ln>{Ln::reduce_max(b), Ln::reduce_or(f)};
}

}  // namespace embscale
