// `embscale check tbe_backward_<optimizer>`: the TBE backward fused with each optimizer (and the
// dense-gradient mode) on the chosen backend against the naive reference (tests/reference_tbe_backward.h)
// over seeded random configurations (mixed and odd D, shared tables, both index dtypes, every pooling
// mode, weighted and not, every weights/grad dtype, weight decay modes, clipping, max_norm, skipped
// indices, several steps), plus one row hit by more than 100,000 lookups on exact integer data.
#include <cstdio>
#include <string>

#include "registry.h"
#include "tbe_backward_case.h"

namespace embscale {
namespace tools {
namespace {

using testing_tbe::BwdCase;
using testing_tbe::BwdOutcome;

CheckResult run_check(const CheckArgs& args, OptimizerType opt) {
  CheckResult res;
  auto record = [&](const BwdOutcome& o, const BwdCase& c) { record_case(args, o, c, &res); };
  constexpr int kRandom = 60;
  for (int i = 0; i < kRandom; ++i) {
    const BwdCase c = testing_tbe::random_backward_case(args.seed * 1000003ull + static_cast<uint64_t>(i), opt);
    record(testing_tbe::run_backward_case(args.backend, c), c);
  }
  if (opt == OptimizerType::kSgd || opt == OptimizerType::kRowwiseAdagrad || opt == OptimizerType::kNone) {
    BwdCase c;
    c.num_rows = {1000, 50};
    c.dims = {64, 3};
    c.batch_size = 1000;
    c.max_bag = 240;
    c.hot_fraction = 0.95;
    c.integer_values = true;
    c.opt.type = opt;
    c.opt.learning_rate = 0.25f;
    c.opt.eps = 0.125f;
    c.seed = args.seed + 7;
    record(testing_tbe::run_backward_case(args.backend, c), c);
  }
  if (res.passed) res.detail = res.cases > kRandom ? "random configs, hot row" : "random configs";
  return res;
}

const RegisterCheck kSgd(CheckOp{"tbe_backward_sgd", "TBE backward + exact SGD vs the naive reference",
                                 [](const CheckArgs& a) { return run_check(a, OptimizerType::kSgd); }});
const RegisterCheck kAdagrad(CheckOp{"tbe_backward_rowwise_adagrad",
                                     "TBE backward + exact row-wise Adagrad vs the naive reference",
                                     [](const CheckArgs& a) { return run_check(a, OptimizerType::kRowwiseAdagrad); }});
const RegisterCheck kAdam(CheckOp{"tbe_backward_adam", "TBE backward + Adam vs the naive reference",
                                  [](const CheckArgs& a) { return run_check(a, OptimizerType::kAdam); }});
const RegisterCheck kPartial(CheckOp{"tbe_backward_partial_rowwise_adam",
                                     "TBE backward + partial row-wise Adam vs the naive reference",
                                     [](const CheckArgs& a) { return run_check(a, OptimizerType::kPartialRowwiseAdam); }});
const RegisterCheck kElementAdagrad(CheckOp{"tbe_backward_adagrad",
                                            "TBE backward + element-wise Adagrad vs the naive reference",
                                            [](const CheckArgs& a) { return run_check(a, OptimizerType::kAdagrad); }});
const RegisterCheck kLamb(CheckOp{"tbe_backward_lamb", "TBE backward + LAMB vs the naive reference",
                                  [](const CheckArgs& a) { return run_check(a, OptimizerType::kLamb); }});
const RegisterCheck kPartialLamb(CheckOp{"tbe_backward_partial_rowwise_lamb",
                                         "TBE backward + partial row-wise LAMB vs the naive reference",
                                         [](const CheckArgs& a) { return run_check(a, OptimizerType::kPartialRowwiseLamb); }});
const RegisterCheck kLars(CheckOp{"tbe_backward_lars_sgd", "TBE backward + LARS-SGD vs the naive reference",
                                  [](const CheckArgs& a) { return run_check(a, OptimizerType::kLarsSgd); }});
const RegisterCheck kDense(CheckOp{"tbe_backward_dense",
                                   "TBE backward, dense-gradient mode (unique rows and summed gradients) vs the reference",
                                   [](const CheckArgs& a) { return run_check(a, OptimizerType::kNone); }});

}  // namespace
}  // namespace tools
}  // namespace embscale
