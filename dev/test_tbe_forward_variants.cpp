// Every compiled shape of the CUDA TBE forward (dev/tbe_forward_variants.cu), both grid orders and
// several bags per lane group, against the naive reference: the variants run for pooled fp32 -> fp32
// with int64 indices, so the cases below are of that kind (other kinds check that the library's kernels
// still run under another grid order and bags per group). Part of the dev tests (built with
// EMBSCALE_BUILD_DEV, which needs the CUDA backend); without a GPU they report themselves skipped.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tbe_case.h"
#include "tbe_forward_variants.h"

namespace embscale {
namespace {

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
    for (BoundsCheckMode bc :
         {BoundsCheckMode::kError, BoundsCheckMode::kSkip, BoundsCheckMode::kOff, BoundsCheckMode::kWarn}) {
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
  // Plain calls whose features all take one walk (the plain kernels' cases): one 16-byte vector per lane
  // (D=128, 64: the vector kernel; the warp variants run it on the warp walk), whole-warp rows of two
  // vectors a lane (D=160, 192; D=256's 64 vectors) and of passes (D=512).
  for (const std::vector<int>& dims :
       {std::vector<int>{128, 64, 128}, std::vector<int>{160, 192, 160}, std::vector<int>{256, 128, 512}}) {
    TbeCase s;
    s.num_rows = {700, 300, 50};
    s.dims = dims;
    s.batch_size = 37;
    s.bag_size = 23;
    s.variable_bag_size = true;
    s.alpha = 1.15;
    s.bounds = BoundsCheckMode::kOff;
    s.seed = 710 + cases.size();
    cases.push_back(s);
  }
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
  const std::vector<dev::FwdVariant>& variants = dev::fwd_variants();
  ASSERT_FALSE(variants.empty());
  EXPECT_STREQ(variants[0].name, "default");
  const std::vector<TbeCase> cases = variant_cases();
  for (const dev::FwdVariant& v : variants) {
    for (bool feature_inner : {false, true}) {
      for (int bags : {0, 1, 3}) {  // 0: the policy's rule (2 for the cases' whole-warp rows)
        dev::FwdLaunch launch;
        launch.variant = v.name;
        launch.feature_inner = feature_inner;
        launch.bags_per_group = bags;
        const testing_tbe::ForwardCall forward = [&launch](const Context& ctx, const TableBatchedEmbedding& tbe,
                                                           const TbeForwardArgs& args) {
          return dev::variant_forward(ctx, tbe, args, launch);
        };
        for (const TbeCase& c : cases) {
          const CaseOutcome o = run_tbe_case(Backend::kCuda, c, forward);
          EXPECT_TRUE(o.failure.empty()) << "variant " << v.name << (feature_inner ? ", feature order" : ", tile order")
                                         << ", " << bags << " bags per group: " << o.failure;
        }
      }
    }
  }
}

TEST(TbeForwardVariants, UnknownVariantAndBadBagsAreRefused) {
  dev::FwdLaunch launch;
  launch.variant = "no-such-variant";
  Status st = dev::check_fwd_launch(launch);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("variant: unknown variant 'no-such-variant'"), std::string::npos) << st.message();
  launch.variant = "default";
  for (int bad : {-1, 65}) {
    launch.bags_per_group = bad;
    st = dev::check_fwd_launch(launch);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("bags_per_group: " + std::to_string(bad)), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace embscale
