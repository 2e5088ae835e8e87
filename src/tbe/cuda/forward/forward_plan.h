// How a CUDA TBE forward call is laid out, in plain C++ (the kernels and the host share it, and the
// tests check the host's choices without a GPU): each feature's row plan (vector width, vectors, lanes
// per bag), which kernel runs the call, the bags each lane group walks and the grid's bag tiles.
#pragma once

#include <cstdint>

#include "core/cuda/arch_traits.cuh"
#include "core/hd.h"
#include "tbe/cuda/forward/forward_policy.cuh"

namespace embscale {
namespace cuda {
namespace tbe_fwd {

// How one feature's rows are read: vector bytes per lane, vectors per row, lanes per bag.
struct RowPlan {
  int vec_bytes;
  int units;
  int group;
  int vecs = 1;  // vectors per lane (kernel_plan)
};

// vecs: vectors per lane per pass (FwdConfig::kVecs); the group is the power of two of lanes that
// covers the row with vecs vectors each, at most a warp.
EMBSCALE_HD RowPlan plan_row(int dim, int elem_bytes, uintptr_t table_addr, int vecs = 1) {
  const int64_t row_bytes = static_cast<int64_t>(dim) * elem_bytes;
  int vb = elem_bytes;
  for (int cand = ArchTraits::kVectorBytes; cand > elem_bytes; cand /= 2) {
    if (row_bytes % cand == 0 && table_addr % cand == 0) {
      vb = cand;
      break;
    }
  }
  RowPlan plan;
  plan.vec_bytes = vb;
  plan.units = static_cast<int>(row_bytes / vb);
  const int lanes = (plan.units + vecs - 1) / vecs;
  int g = 1;
  while (g < lanes && g < ArchTraits::kWarpSize) g *= 2;
  plan.group = g;
  return plan;
}

// Rows of 33..63 16-byte vectors (fp32 D = 132..252) take two vectors per lane at half the unroll (as
// many loads in flight), one walk over the bag. In passes of 32 vectors the second pass would re-walk
// the bag for what is left of the row, as little as one vector, a separate far access per lookup. The
// same for 9..31 vectors on half as many lanes was slower (docs/tbe_forward_cuda.md, History).
EMBSCALE_HD bool wide_row(int units) {
  return units > ArchTraits::kWarpSize && units < 2 * ArchTraits::kWarpSize;
}

// The plan the bags kernel runs for a row of a kernel shape with `vecs` vectors per lane: plan_row, or
// for a wide_row under a one-vector shape, two vectors per lane (vecs = 2 in the result). The host sizes
// the grid with it.
EMBSCALE_HD RowPlan kernel_plan(int dim, int elem_bytes, uintptr_t table_addr, int vecs) {
  RowPlan plan = plan_row(dim, elem_bytes, table_addr, vecs);
  plan.vecs = vecs;
  if (vecs == 1 && plan.vec_bytes == 16 && wide_row(plan.units)) {
    plan = plan_row(dim, elem_bytes, table_addr, 2);
    plan.vecs = 2;
  }
  return plan;
}

// The kernels a forward call can run (tbe_forward_kernels.cuh, tbe_forward_plain_kernels.cuh).
enum FwdKernel : int {
  kKernelBags = 0,    // tbe_forward_bags_kernel: every call
  kKernelWarp = 1,    // tbe_forward_warp_kernel: plain, every feature a whole warp of 16-byte vectors
  kKernelVector = 2,  // tbe_forward_vector_kernel: plain, every feature 16-byte vectors, one a lane a pass
};

// A feature's table as the launch plan sees it.
struct FeatureRows {
  int dim;
  int64_t num_rows;
  uintptr_t table_addr;  // the address of the table's first element
};

// The call as the launch plan sees it.
struct CallShape {
  int elem_bytes = 4;         // bytes of one weight
  int64_t batch_size = 0;     // B
  // Pooled, no per-sample weights, fewer than 2^31 lookups and bags: a call whose rows the plain kernels
  // may walk (they count positions and items in 32 bits), with bounds checks or not. False also for a
  // launch that runs only the bags kernel (dev/'s shapes), which then keeps the bags kernel's grid rule.
  bool plain = false;
  int block = ForwardPolicy::Bags::kBlock;  // threads per block
  int vecs = ForwardPolicy::Bags::kVecs;    // the bags kernel shape's vectors per lane
  int bags_per_group = 0;                   // 1..64; 0: the policy's rule
};

struct LaunchPlan {
  int kernel = kKernelBags;  // FwdKernel
  int bags_per_group = 1;
  int64_t tiles = 1;         // bag tiles of the grid (before folding)
};

// The kernel, bags per lane group and tiles of a call of T >= 1 features, B >= 1; feature_at(f) gives
// feature f's FeatureRows. The warp kernel runs a plain call whose every row is at least 17 16-byte
// vectors (a whole warp), the vector kernel one whose every row is read one 16-byte vector a lane a pass;
// both need tables of at most 2^32 rows and rows of fewer than 2^32 bytes (32-bit row offsets), and
// either runs with bounds checks or without (its checked or unchecked form). Bags per
// lane group: ForwardPolicy's rule for the kernel that runs. Tiles: enough for the feature whose plan packs
// the fewest bags per block (at least one tile).
template <class FeatureAt>
LaunchPlan plan_launch(const CallShape& c, int T, FeatureAt feature_at) {
  bool all_warp = c.plain && c.vecs == 1;
  bool all_vector = all_warp;
  bool long_rows = false;  // a row of more than a warp's vectors (two a lane, or passes)
  int max_group = 1;
  for (int f = 0; f < T; ++f) {
    const FeatureRows r = feature_at(f);
    const RowPlan plan = kernel_plan(r.dim, c.elem_bytes, r.table_addr, c.vecs);
    max_group = max_group > plan.group ? max_group : plan.group;
    const bool offsets_32 =
        r.num_rows <= (int64_t{1} << 32) && static_cast<int64_t>(r.dim) * c.elem_bytes < (int64_t{1} << 32);
    all_warp = all_warp && offsets_32 && plan.vec_bytes == 16 && plan.group == ArchTraits::kWarpSize;
    all_vector = all_vector && offsets_32 && plan.vec_bytes == 16 && plan.vecs == 1;
    long_rows = long_rows || plan.units > ArchTraits::kWarpSize;
  }
  LaunchPlan out;
  out.kernel = all_warp ? kKernelWarp : all_vector ? kKernelVector : kKernelBags;
  out.bags_per_group = c.bags_per_group > 0                 ? c.bags_per_group
                       : out.kernel == kKernelWarp          ? ForwardPolicy::warp_bags_per_warp(long_rows)
                       : out.kernel == kKernelVector        ? ForwardPolicy::vector_bags_per_group(max_group)
                       : max_group == ArchTraits::kWarpSize ? ForwardPolicy::kBagsPerWarpGroup
                                                            : 1;
  // The widest group packs the fewest bags per block (groups are powers of two up to a warp).
  const int64_t bags_per_block = static_cast<int64_t>(c.block / max_group) * out.bags_per_group;
  out.tiles = (c.batch_size + bags_per_block - 1) / bags_per_block;
  return out;
}

}  // namespace tbe_fwd
}  // namespace cuda
}  // namespace embscale
