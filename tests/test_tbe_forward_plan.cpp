// The CUDA TBE forward's launch plan (src/tbe/cuda/forward/forward_plan.h), on the host: which kernel a
// call runs, the bags each lane group walks and the grid's tiles, against the rule written out here from
// docs/tbe_forward_cuda.md ("Plain kernels") and ForwardPolicy. No GPU needed: the plan is plain C++.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tbe/cuda/forward/forward_plan.h"

namespace embscale {
namespace {

using cuda::tbe_fwd::CallShape;
using cuda::tbe_fwd::FeatureRows;
using cuda::tbe_fwd::LaunchPlan;
using cuda::tbe_fwd::kKernelBags;
using cuda::tbe_fwd::kKernelVector;
using cuda::tbe_fwd::kKernelWarp;

constexpr uintptr_t kBase = 0x10000;  // 16-byte aligned

// The plan of a plain call (unless `plain` is false) over tables of `dims` laid out one after another from
// kBase (each table `rows` rows), with `elem` bytes a weight.
LaunchPlan plan(const std::vector<int>& dims, int elem = 4, int64_t B = 8192, bool plain = true,
                int64_t rows = 1000, uintptr_t base = kBase, int bags = 0) {
  std::vector<FeatureRows> f;
  uintptr_t addr = base;
  for (int d : dims) {
    f.push_back(FeatureRows{d, rows, addr});
    addr += static_cast<uintptr_t>(rows) * static_cast<uintptr_t>(d) * static_cast<uintptr_t>(elem);
  }
  CallShape c;
  c.elem_bytes = elem;
  c.batch_size = B;
  c.plain = plain;
  c.bags_per_group = bags;
  return cuda::tbe_fwd::plan_launch(c, static_cast<int>(f.size()), [&](int i) { return f[static_cast<size_t>(i)]; });
}

TEST(TbeForwardPlan, WholeWarpRowsRunTheWarpKernel) {
  // fp32 rows of 17..32 16-byte vectors (D = 68..128): 4 bags a warp; 33..64 and longer: 2.
  for (int d : {68, 100, 128}) {
    const LaunchPlan p = plan({d});
    EXPECT_EQ(p.kernel, kKernelWarp) << "D=" << d;
    EXPECT_EQ(p.bags_per_group, 4) << "D=" << d;
    EXPECT_EQ(p.tiles, 8192 / (4 * 4)) << "D=" << d;  // 128 threads: 4 warps, 4 bags each
  }
  for (int d : {132, 160, 192, 252, 256, 260, 512, 1024}) {
    const LaunchPlan p = plan({d});
    EXPECT_EQ(p.kernel, kKernelWarp) << "D=" << d;
    EXPECT_EQ(p.bags_per_group, 2) << "D=" << d;
    EXPECT_EQ(p.tiles, 8192 / (4 * 2)) << "D=" << d;
  }
  // Mixed whole-warp widths: one long row sets 2 bags.
  EXPECT_EQ(plan({128, 256}).kernel, kKernelWarp);
  EXPECT_EQ(plan({128, 256}).bags_per_group, 2);
  EXPECT_EQ(plan({128, 100}).bags_per_group, 4);
  // 16-bit weights: 8 elements a vector, so D = 136.. is a whole warp, D = 128 is not.
  EXPECT_EQ(plan({136}, 2).kernel, kKernelWarp);
  EXPECT_EQ(plan({136}, 2).bags_per_group, 4);
  EXPECT_EQ(plan({512}, 2).kernel, kKernelWarp);
  EXPECT_EQ(plan({512}, 2).bags_per_group, 2);
}

TEST(TbeForwardPlan, RowsOfOneVectorALaneRunTheVectorKernel) {
  // Widest group of 8 or more lanes: 2 bags a group; narrower: 1.
  struct Case {
    std::vector<int> dims;
    int elem;
    int bags;
    int group;  // the widest group, which sizes the tiles
  };
  const std::vector<Case> cases = {
      {{32}, 4, 2, 8},  {{64}, 4, 2, 16}, {{128}, 2, 2, 16}, {{64, 128}, 4, 2, 32},
      {{4}, 4, 1, 1},   {{8}, 4, 1, 2},   {{16}, 4, 1, 4},   {{8, 16}, 2, 1, 2},
      {{4, 512}, 4, 2, 32},  // 128 vectors in passes of 32, with a narrow row
  };
  for (const Case& c : cases) {
    const LaunchPlan p = plan(c.dims, c.elem);
    EXPECT_EQ(p.kernel, kKernelVector) << "D=" << c.dims[0] << " elem " << c.elem;
    EXPECT_EQ(p.bags_per_group, c.bags) << "D=" << c.dims[0] << " elem " << c.elem;
    EXPECT_EQ(p.tiles, (8192 + 128 / c.group * c.bags - 1) / (128 / c.group * c.bags)) << "D=" << c.dims[0];
  }
}

TEST(TbeForwardPlan, EverythingElseRunsTheBagsKernel) {
  // Rows not a multiple of 16 bytes; two vectors a lane next to narrower rows; not plain.
  for (const std::vector<int>& dims : {std::vector<int>{6}, std::vector<int>{128, 6}, std::vector<int>{2},
                                       std::vector<int>{160, 64}, std::vector<int>{132, 32}}) {
    const LaunchPlan p = plan(dims);
    EXPECT_EQ(p.kernel, kKernelBags) << "D=" << dims[0] << "," << (dims.size() > 1 ? dims[1] : 0);
  }
  EXPECT_EQ(plan({128}, 4, 8192, /*plain=*/false).kernel, kKernelBags);
  EXPECT_EQ(plan({64}, 4, 8192, /*plain=*/false).kernel, kKernelBags);
  // The bags kernel's own rule: 2 bags when the widest group is a whole warp, else 1.
  EXPECT_EQ(plan({128}, 4, 8192, false).bags_per_group, 2);
  EXPECT_EQ(plan({64}, 4, 8192, false).bags_per_group, 1);
  EXPECT_EQ(plan({160, 64}).bags_per_group, 2);
  // A table whose base is not 16-byte aligned reads narrower vectors.
  EXPECT_EQ(plan({128}, 4, 8192, true, 1000, kBase + 8).kernel, kKernelBags);
  EXPECT_EQ(plan({128}, 4, 8192, true, 1000, kBase + 4).kernel, kKernelBags);
  // Tables of more than 2^32 rows, or rows of 2^32 bytes and more: row offsets do not fit 32 bits.
  EXPECT_EQ(plan({128}, 4, 8192, true, (int64_t{1} << 32) + 1).kernel, kKernelBags);
  EXPECT_EQ(plan({128}, 4, 8192, true, int64_t{1} << 32).kernel, kKernelWarp);
  EXPECT_EQ(plan({1 << 30}, 4, 8192, true, 1).kernel, kKernelBags);
  EXPECT_EQ(plan({(1 << 30) - 4}, 4, 8192, true, 1).kernel, kKernelWarp);
}

TEST(TbeForwardPlan, GivenBagsPerGroupAndTiles) {
  // An explicit bags per group (dev/) replaces the rule; tiles cover B for the narrowest packing.
  const LaunchPlan p = plan({128}, 4, 1000, true, 1000, kBase, 3);
  EXPECT_EQ(p.kernel, kKernelWarp);
  EXPECT_EQ(p.bags_per_group, 3);
  EXPECT_EQ(p.tiles, (1000 + 11) / 12);
  EXPECT_EQ(plan({128}, 4, 1).tiles, 1);
  // Mixed groups: the whole-warp feature packs the fewest bags per block and sizes the grid.
  EXPECT_EQ(plan({64, 128}, 4, 8192).tiles, 8192 / (4 * 2));
}

TEST(TbeForwardPlan, BagsKernelShapesKeepTheirGrid) {
  // A launch that runs only the bags kernel (dev/'s shapes) gets kKernelBags and the bags kernel's rule.
  CallShape c;
  c.batch_size = 8192;
  c.plain = false;
  const FeatureRows f{128, 1000, kBase};
  const LaunchPlan p = cuda::tbe_fwd::plan_launch(c, 1, [&](int) { return f; });
  EXPECT_EQ(p.kernel, kKernelBags);
  EXPECT_EQ(p.bags_per_group, 2);
  // So does a two-vectors-a-lane bags shape, also where its groups are whole warps.
  c.plain = true;
  c.vecs = 2;
  EXPECT_EQ(cuda::tbe_fwd::plan_launch(c, 1, [&](int) { return f; }).kernel, kKernelBags);
  for (int d : {256, 512}) {
    const FeatureRows wide{d, 1000, kBase};
    EXPECT_EQ(cuda::tbe_fwd::plan_launch(c, 1, [&](int) { return wide; }).kernel, kKernelBags) << "D=" << d;
  }
}

}  // namespace
}  // namespace embscale
