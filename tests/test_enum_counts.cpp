// The enumerations' counts (kNumDTypes, ..., num_optimizers()), from which the C API takes the range of
// every value it checks: each agrees with its enum's names, so an enumerator added without its count
// (or a count that runs past the last enumerator) fails here. A named value v is known when its name
// is not "unknown": every value below the count has a name, and the count itself has none.
#include <gtest/gtest.h>

#include <string>

#include "embscale/context.h"
#include "embscale/dtype.h"
#include "embscale/fp8.h"
#include "embscale/tbe.h"

namespace embscale {
namespace {

template <typename E, typename Name>
void expect_count_matches_names(int count, Name name, const char* what) {
  ASSERT_GT(count, 0) << what;
  for (int v = 0; v < count; ++v) EXPECT_NE(std::string(name(static_cast<E>(v))), "unknown") << what << " " << v;
  EXPECT_EQ(std::string(name(static_cast<E>(count))), "unknown") << what << ": the count " << count
                                                                  << " stops before the last value";
  EXPECT_EQ(std::string(name(static_cast<E>(-1))), "unknown") << what;
}

TEST(EnumCounts, EveryCountMatchesItsNames) {
  expect_count_matches_names<DType>(kNumDTypes, dtype_name, "DType");
  expect_count_matches_names<Backend>(kNumBackends, backend_name, "Backend");
  expect_count_matches_names<AmaxAlgo>(kNumAmaxAlgos, amax_algo_name, "AmaxAlgo");
  expect_count_matches_names<Activation>(kNumActivations, activation_name, "Activation");
  expect_count_matches_names<PoolingMode>(kNumPoolingModes, pooling_mode_name, "PoolingMode");
  expect_count_matches_names<BoundsCheckMode>(kNumBoundsCheckModes, bounds_check_mode_name, "BoundsCheckMode");
  expect_count_matches_names<OptimizerType>(num_optimizers(), optimizer_name, "OptimizerType");
}

// The two without names: their last enumerator is the last value.
TEST(EnumCounts, UnnamedEnumsEndAtTheirLastEnumerator) {
  EXPECT_EQ(kNumWeightDecayModes, 3);
  EXPECT_EQ(static_cast<int>(WeightDecayMode::kDecoupled), kNumWeightDecayModes - 1);
  EXPECT_EQ(kNumWeightRoundings, 2);
  EXPECT_EQ(static_cast<int>(WeightRounding::kStochastic), kNumWeightRoundings - 1);
}

}  // namespace
}  // namespace embscale
