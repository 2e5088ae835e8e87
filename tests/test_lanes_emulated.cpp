// The warp-level algorithms of the GPU kernels (core/lanes.h) run on an emulated warp of 32 and of 64
// lanes (tests/lane_emulation.h), against float64 / exact references from seeded random inputs: the
// xor-tree sums of the backward (a whole warp's, and the lane groups' of short rows, which must give the
// same bits at both widths), the broadcast walk over a row's lookups, the lane groups' share of a batch's
// rows, a 32-lane unit's ballot inside a 64-lane wavefront (the row cache's sets) and the two-level block
// max / or of the amax. The 64-lane runs are the AMD CDNA paths, which no GPU here executes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/lanes.h"
#include "lane_emulation.h"

namespace embscale {
namespace {

using lane_emulation::HostLanes;

uint64_t case_seed(uint64_t salt) {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) ^ (salt * 0x9e3779b97f4a7c15ull);
}

template <typename T>
class LanesEmulated : public ::testing::Test {};
using Widths = ::testing::Types<HostLanes<32>, HostLanes<64>>;
TYPED_TEST_SUITE(LanesEmulated, Widths);

// lane_sum over every group width L: each lane of a group gets the group's sum, within the rounding of
// L - 1 fp32 adds of the float64 sum.
template <class Ln, int L>
void check_group_sums(const std::vector<float>& x, std::vector<float>* out) {
  Ln::run([&] {
    const int l = Ln::lane();
    (*out)[l] = lane_sum<Ln, L>(x[l], Ln::template group_mask<L>(l / L));
  });
  for (int g = 0; g < Ln::kCount / L; ++g) {
    double ref = 0.0, mag = 0.0;
    for (int i = g * L; i < (g + 1) * L; ++i) {
      ref += x[i];
      mag += std::fabs(x[i]);
    }
    ASSERT_NE(mag, 0.0);
    for (int i = g * L; i < (g + 1) * L; ++i) {
      EXPECT_EQ((*out)[i], (*out)[g * L]) << "L=" << L << " lane " << i << ": the group's lanes disagree";
      EXPECT_NEAR((*out)[i], ref, L * 6e-8 * mag) << "L=" << L << " group " << g;
    }
  }
}

template <class Ln, int L>
void check_all_group_sums(const std::vector<float>& x) {
  std::vector<float> out(Ln::kCount, std::nanf(""));
  check_group_sums<Ln, L>(x, &out);
  if constexpr (L > 1) check_all_group_sums<Ln, L / 2>(x);
}

TYPED_TEST(LanesEmulated, GroupSumsMatchFloat64) {
  using Ln = TypeParam;
  for (int c = 0; c < 4; ++c) {
    const uint64_t seed = case_seed(100 + c);
    SCOPED_TRACE("lanes=" + std::to_string(Ln::kCount) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(Ln::kCount);
    for (float& v : x) v = std::ldexp(u(rng), static_cast<int>(rng() % 16) - 8);
    check_all_group_sums<Ln, Ln::kCount>(x);
  }
}

// A lane group of L <= 32 lanes sums in the same xor tree whatever the warp it sits in: 32 and 64
// lanes give the same bits (what keeps the lane-group rows of the backward identical across vendors).
template <int L>
void check_width_independent(const std::vector<float>& x) {
  std::vector<float> s32(32), s64(64);
  HostLanes<32>::run([&] {
    const int l = HostLanes<32>::lane();
    s32[l] = lane_sum<HostLanes<32>, L>(x[l], HostLanes<32>::group_mask<L>(l / L));
  });
  HostLanes<64>::run([&] {
    const int l = HostLanes<64>::lane();
    s64[l] = lane_sum<HostLanes<64>, L>(x[l], HostLanes<64>::group_mask<L>(l / L));
  });
  for (int i = 0; i < 64; ++i) EXPECT_EQ(s64[i], s32[i % 32]) << "L=" << L << " lane " << i;
  if constexpr (L > 1) check_width_independent<L / 2>(x);
}

TEST(LanesEmulated, GroupSumsAreTheSameBitsAt32And64Lanes) {
  const uint64_t seed = case_seed(200);
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(64);
  for (int i = 0; i < 32; ++i) x[i] = x[i + 32] = std::ldexp(u(rng), static_cast<int>(rng() % 20) - 10);
  check_width_independent<32>(x);
}

// The backward's walk over a row's lookups (the warp and lane-group rows): the row's lookups are taken
// a lane each (gradient row offset and scale), broadcast by shuffles, and every lane adds the scaled
// gradient of its columns in lookup order (kVec columns a lane a pass); then the row's sum of squares
// by the xor tree. Rows of 0 to 3 warps' worth of lookups and 1 to 3 passes of columns.
TYPED_TEST(LanesEmulated, SegmentSumsMatchFloat64) {
  using Ln = TypeParam;
  constexpr int kVec = 4;
  constexpr int kPassCols = Ln::kCount * kVec;
  for (int c = 0; c < 6; ++c) {
    const uint64_t seed = case_seed(300 + c);
    std::mt19937_64 rng(seed);
    const int len = c == 0 ? 0 : c == 1 ? 1 : static_cast<int>(rng() % (3 * Ln::kCount)) + 1;
    const int D = c == 2 ? 1 : static_cast<int>(rng() % (3 * kPassCols)) + 1;
    const int bags = 7;
    SCOPED_TRACE("lanes=" + std::to_string(Ln::kCount) + " len=" + std::to_string(len) + " D=" +
                 std::to_string(D) + " seed=" + std::to_string(seed));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> grad(static_cast<size_t>(bags) * D);
    for (float& g : grad) g = u(rng);
    std::vector<int64_t> off(len);
    std::vector<float> scale(len);
    for (int i = 0; i < len; ++i) {
      off[i] = static_cast<int64_t>(rng() % bags) * D;  // repeated bags: duplicate lookups
      scale[i] = u(rng);
    }
    const int passes = (D + kPassCols - 1) / kPassCols;
    std::vector<float> sum(D, std::nanf(""));
    float sumsq = std::nanf("");
    Ln::run([&] {
      const int l = Ln::lane();
      float sq = 0.0f;
      for (int pass = 0; pass < passes; ++pass) {
        float acc[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int col = pass * kPassCols + l * kVec;
        for (int c0 = 0; c0 < len; c0 += Ln::kCount) {
          const int n = len - c0 < Ln::kCount ? len - c0 : Ln::kCount;
          const int64_t my_off = l < n ? off[c0 + l] : 0;
          const float my_scale = l < n ? scale[c0 + l] : 0.0f;
          for (int j = 0; j < n; ++j) {
            const int64_t o = Ln::shfl(my_off, j);
            const float s = Ln::shfl(my_scale, j);
            for (int k = 0; k < kVec; ++k)
              if (col + k < D) acc[k] = lane_add_rn(acc[k], s * grad[o + col + k]);
          }
        }
        for (int k = 0; k < kVec; ++k)
          if (col + k < D) {
            sum[col + k] = acc[k];
            sq = lane_add_rn(sq, acc[k] * acc[k]);
          }
      }
      const float total = lane_sum<Ln>(sq);
      if (l == 0) sumsq = total;
    });
    double ref_sq = 0.0, mag_sq = 0.0;
    for (int d = 0; d < D; ++d) {
      double ref = 0.0, mag = 0.0;
      for (int i = 0; i < len; ++i) {
        ref += static_cast<double>(scale[i]) * grad[off[i] + d];
        mag += std::fabs(static_cast<double>(scale[i]) * grad[off[i] + d]);
      }
      ASSERT_NEAR(sum[d], ref, (len + 1) * 1.2e-7 * mag) << "column " << d;
      ref_sq += static_cast<double>(sum[d]) * sum[d];
      mag_sq += static_cast<double>(sum[d]) * sum[d];
    }
    if (len > 0) {
      ASSERT_NE(mag_sq, 0.0);
    }
    EXPECT_NEAR(sumsq, ref_sq, (D + Ln::kCount) * 1.2e-7 * mag_sq);
  }
}

// The lane groups' share of a batch: the batch's rows are the lanes whose predicate holds (a ballot);
// each round group grp takes the grp-th remaining row (nth_lane) and R rows leave. Every row is taken
// once, the k-th by group k % R in round k / R, and no absent lane is ever taken.
TYPED_TEST(LanesEmulated, LaneGroupsTakeEachRowOnceInOrder) {
  using Ln = TypeParam;
  for (int R : {1, 2, 4, 8, 16}) {
    const uint64_t seed = case_seed(400 + R);
    SCOPED_TRACE("lanes=" + std::to_string(Ln::kCount) + " R=" + std::to_string(R) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int density = static_cast<int>(rng() % 101);  // percent of lanes holding a row
    std::vector<int> present(Ln::kCount);
    for (int& p : present) p = static_cast<int>(rng() % 100) < density;
    const int L = Ln::kCount / R;
    std::vector<int> taken_by(Ln::kCount, -1), taken_round(Ln::kCount, -1), takes(Ln::kCount, 0);
    Ln::run([&] {
      const int l = Ln::lane();
      const int grp = l / L;
      typename Ln::Mask rows = Ln::ballot(present[l] != 0);
      for (int round = 0; rows != 0; ++round) {
        const int j = Ln::nth_lane(rows, grp);
        for (int i = 0; i < R; ++i) rows &= rows - 1;
        if (j >= 0 && l % L == 0) {  // one lane a group records its row (each group writes its own rows)
          taken_by[j] = grp;
          taken_round[j] = round;
          ++takes[j];
        }
      }
    });
    int k = 0;
    for (int i = 0; i < Ln::kCount; ++i) {
      if (!present[i]) {
        EXPECT_EQ(takes[i], 0) << "lane " << i << " holds no row but was taken";
        continue;
      }
      EXPECT_EQ(takes[i], 1) << "row at lane " << i;
      EXPECT_EQ(taken_by[i], k % R) << "row at lane " << i;
      EXPECT_EQ(taken_round[i], k / R) << "row at lane " << i;
      ++k;
    }
  }
}

// A unit of 32 lanes (a row-cache set, a lane a way) asks which of its lanes holds a key: half a
// wavefront on 64 lanes, the whole warp on 32. The hit is the lowest matching way of the unit's own.
TYPED_TEST(LanesEmulated, UnitBallotFindsTheWayWithinItsUnit) {
  using Ln = TypeParam;
  constexpr int kWays = 32;
  using Unit = LaneShape<kWays>;
  for (int c = 0; c < 8; ++c) {
    const uint64_t seed = case_seed(500 + c);
    SCOPED_TRACE("lanes=" + std::to_string(Ln::kCount) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    std::vector<int> tag(Ln::kCount);
    for (int& t : tag) t = static_cast<int>(rng() % 40);
    std::vector<int> key(Ln::kCount / kWays);
    for (int& k : key) k = static_cast<int>(rng() % 40);
    std::vector<int> way(Ln::kCount, -2);
    Ln::run([&] {
      const int l = Ln::lane();
      const Unit::Mask hit = lane_group_ballot<Ln, kWays>(tag[l] == key[l / kWays]);
      way[l] = Unit::ffs(hit) - 1;
    });
    for (int l = 0; l < Ln::kCount; ++l) {
      const int unit = l / kWays;
      int expect = -1;
      for (int w = 0; w < kWays && expect < 0; ++w)
        if (tag[unit * kWays + w] == key[unit]) expect = w;
      EXPECT_EQ(way[l], expect) << "lane " << l;
    }
  }
}

// The amax's block reduction: each warp's max / or (Ln::reduce_max, reduce_or: the AMD backend's xor
// shuffles), written by lane 0, a block barrier, then lane_combine_warps. Every thread gets the block's
// exact max and or, for blocks of 1 to 16 warps (a 64-lane block of 1024 threads has 16).
TYPED_TEST(LanesEmulated, BlockMaxOrIsExact) {
  using Ln = TypeParam;
  for (int nwarps : {1, 3, 8, 16}) {
    const uint64_t seed = case_seed(600 + nwarps);
    SCOPED_TRACE("lanes=" + std::to_string(Ln::kCount) + " warps=" + std::to_string(nwarps) + " seed=" +
                 std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int threads = nwarps * Ln::kCount;
    std::vector<uint32_t> bits(threads), nf(threads);
    for (int t = 0; t < threads; ++t) {
      bits[t] = static_cast<uint32_t>(rng()) & 0x7fffffffu;
      nf[t] = rng() % 97 == 0 ? 1u : 0u;
    }
    uint32_t ref_max = 0, ref_or = 0;
    for (int t = 0; t < threads; ++t) {
      ref_max = bits[t] > ref_max ? bits[t] : ref_max;
      ref_or |= nf[t];
    }
    std::vector<uint32_t> s_bits(Ln::kCount, 0xdeadbeefu), s_nf(Ln::kCount, 0xdeadbeefu);  // poisoned
    std::vector<uint32_t> got_max(threads, 0), got_or(threads, 7);
    Ln::run_block(nwarps, [&] {
      const int l = Ln::lane(), w = Ln::warp();
      const int t = w * Ln::kCount + l;
      const uint32_t m = Ln::reduce_max(bits[t]);
      const uint32_t f = Ln::reduce_or(nf[t]);
      Ln::sync_threads();
      if (l == 0) {
        s_bits[w] = m;
        s_nf[w] = f;
      }
      Ln::sync_threads();
      const MaxOr<Ln> r = lane_combine_warps<Ln>(s_bits.data(), s_nf.data(), nwarps, l);
      got_max[t] = r.max;
      got_or[t] = r.any;
    });
    for (int t = 0; t < threads; ++t) {
      ASSERT_EQ(got_max[t], ref_max) << "thread " << t;
      ASSERT_EQ(got_or[t], ref_or) << "thread " << t;
    }
  }
}

// The lane masks: a group's mask covers exactly its L lanes, and ffs / popc / nth_lane read a 64-bit
// mask's upper half (a 32-bit mask would lose lanes 32..63).
TYPED_TEST(LanesEmulated, MasksCoverTheirLanes) {
  using Ln = TypeParam;
  using Mask = typename Ln::Mask;
  EXPECT_EQ(Ln::popc(Ln::kFull), Ln::kCount);
  EXPECT_EQ(Ln::template group_mask<Ln::kCount>(0), Ln::kFull);
  for (int g = 0; g < Ln::kCount / 8; ++g) {
    const Mask m = Ln::template group_mask<8>(g);
    EXPECT_EQ(Ln::popc(m), 8);
    EXPECT_EQ(Ln::ffs(m) - 1, 8 * g);
  }
  const Mask top = Mask{1} << (Ln::kCount - 1);
  EXPECT_EQ(Ln::ffs(top), Ln::kCount);
  EXPECT_EQ(Ln::nth_lane(top | Mask{1}, 1), Ln::kCount - 1);
  EXPECT_EQ(Ln::nth_lane(top, 1), -1);
  EXPECT_EQ(Ln::ffs(Mask{0}), 0);
}

}  // namespace
}  // namespace embscale
