// Every compiled shape of the CUDA TBE forward (EMBSCALE_TBE_FWD_VARIANT), both grid orders and several
// bags per lane group, against the naive reference: the variants run for pooled fp32 -> fp32 with
// int64 indices, so the cases below are of that kind (other kinds check that the default still runs
// under a non-default tuning). The tuning is restored afterwards. CUDA only: a CPU-only build lists
// both tests as skipped.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tbe/tbe_tuning.h"
#include "tbe_case.h"

namespace embscale {
namespace {

#if EMBSCALE_WITH_CUDA
using testing_tbe::CaseOutcome;
using testing_tbe::TbeCase;
using testing_tbe::run_tbe_case;

std::vector<TbeCase> variant_cases() {
  std::vector<TbeCase> cases;
  TbeCase c;
  c.num_rows = {500, 37, 1000, 64};
  c.dims = {128, 1, 33, 320};
  c.feature_table = {0, 1, 2, 3, 0};
  c.batch_size = 45;
  c.bag_size = 21;
  c.variable_bag_size = true;
  for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean}) {
    for (BoundsCheckMode bc : {BoundsCheckMode::kError, BoundsCheckMode::kSkip, BoundsCheckMode::kOff}) {
      c.pooling = pool;
      c.bounds = bc;
      c.weighted = false;
      c.seed = 600 + cases.size();
      cases.push_back(c);
    }
  }
  c.pooling = PoolingMode::kSum;
  c.weighted = true;
  c.seed = 700;
  cases.push_back(c);
  // Long bags (several index chunks), every listed D, hot rows.
  TbeCase d;
  d.num_rows = {3000, 3000, 3000, 3000, 3000, 3000};
  d.dims = {128, 64, 256, 1024, 5, 2048};
  d.batch_size = 19;
  d.bag_size = 70;
  d.variable_bag_size = true;
  d.alpha = 1.15;
  d.seed = 701;
  cases.push_back(d);
  d.integer_values = true;
  d.weighted = true;
  d.seed = 702;
  cases.push_back(d);
  // Not covered by the variants: fp16 weights, int32 indices, sequence mode.
  TbeCase e = c;
  e.weights_dtype = DType::kF16;
  e.index_dtype = DType::kI32;
  e.seed = 703;
  cases.push_back(e);
  TbeCase q;
  q.num_rows = {100, 200};
  q.dims = {128, 128};
  q.batch_size = 7;
  q.bag_size = 9;
  q.pooling = PoolingMode::kNone;
  q.seed = 704;
  cases.push_back(q);
  return cases;
}

TEST(TbeForwardVariants, EveryVariantOrderAndBagsPerGroup) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "cuda backend not available";
  cuda::TbeForwardTuning saved;
  ASSERT_TRUE(cuda::tbe_forward_tuning(&saved).ok());
  const std::vector<std::string> names = cuda::tbe_forward_variant_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names[0], "default");
  const std::vector<TbeCase> cases = variant_cases();
  for (const std::string& name : names) {
    for (bool feature_inner : {false, true}) {
      for (int bags : {0, 1, 3}) {  // 0: automatic (2 for the cases' whole-warp rows)
        cuda::TbeForwardTuning t;
        t.variant = name;
        t.feature_inner = feature_inner;
        t.bags_per_group = bags;
        ASSERT_TRUE(cuda::set_tbe_forward_tuning(t).ok()) << name;
        for (const TbeCase& c : cases) {
          const CaseOutcome o = run_tbe_case(Backend::kCuda, c);
          EXPECT_TRUE(o.failure.empty()) << "variant " << name << (feature_inner ? ", feature order" : ", tile order")
                                         << ", " << bags << " bags per group: " << o.failure;
        }
      }
    }
  }
  ASSERT_TRUE(cuda::set_tbe_forward_tuning(saved).ok());
}

TEST(TbeForwardVariants, UnknownVariantIsRefused) {
  cuda::TbeForwardTuning t;
  t.variant = "no-such-variant";
  const Status st = cuda::set_tbe_forward_tuning(t);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("no-such-variant"), std::string::npos) << st.to_string();
  t.variant = "default";
  t.bags_per_group = -1;
  EXPECT_FALSE(cuda::set_tbe_forward_tuning(t).ok());
  t.bags_per_group = 65;
  EXPECT_FALSE(cuda::set_tbe_forward_tuning(t).ok());
}
#else
// The variants are kernels of the CUDA backend: in a CPU-only build the tests report themselves as
// skipped rather than vanishing from the list.
TEST(TbeForwardVariants, EveryVariantOrderAndBagsPerGroup) { GTEST_SKIP() << "built without the CUDA backend"; }
TEST(TbeForwardVariants, UnknownVariantIsRefused) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif

}  // namespace
}  // namespace embscale
