// The distributions embscale/tbe_generator.h promises, checked against their definitions:
//  * variable bag sizes are uniform in [0, 2L]: every length occurs, 2L included, with frequencies and
//    a mean within 5 standard errors of the uniform distribution's;
//  * Zipf ranks map to rows by ((k-1) * m + r) mod E with m coprime to E, a bijection: with enough
//    lookups every row of the table appears (table sizes chosen so that the hashing constant shares a
//    factor with E, where a multiplier not made coprime would reach only part of the table).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

#include "embscale/tbe_generator.h"

namespace embscale {
namespace {

TEST(TbeGeneratorDistribution, VariableBagSizesAreUniformOnZeroTo2L) {
  for (int L : {1, 3, 9}) {
    TbeInputSpec s;
    s.batch_size = 20000;
    s.bag_size = L;
    s.variable_bag_size = true;
    s.num_rows = {50, 7};
    s.seed = 1000 + L;
    std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(s.seed));
    TbeInputs in;
    ASSERT_TRUE(generate_tbe_inputs(s, &in).ok());
    const int K = 2 * L + 1;  // lengths 0..2L
    std::vector<int64_t> count(K + 1, 0);
    double sum = 0;
    const int64_t bags = static_cast<int64_t>(in.offsets.size()) - 1;
    for (int64_t i = 0; i < bags; ++i) {
      const int64_t len = in.offsets[i + 1] - in.offsets[i];
      ASSERT_GE(len, 0);
      ASSERT_LE(len, 2 * L) << "a bag longer than 2L";
      ++count[len];
      sum += static_cast<double>(len);
    }
    const double n = static_cast<double>(bags), p = 1.0 / K;
    for (int len = 0; len < K; ++len)
      EXPECT_NEAR(count[len] / n, p, 5 * std::sqrt(p * (1 - p) / n)) << "L=" << L << ": length " << len;
    const double var = (static_cast<double>(K) * K - 1) / 12.0;  // of the discrete uniform on 0..2L
    EXPECT_NEAR(sum / n, static_cast<double>(L), 5 * std::sqrt(var / n)) << "L=" << L << ": mean bag size";
  }
}

TEST(TbeGeneratorDistribution, ZipfRowsCoverTheWholeTable) {
  for (int64_t E : {int64_t{4}, int64_t{10}, int64_t{46}, int64_t{92}, int64_t{1000}}) {
    TbeInputSpec s;
    s.batch_size = 4000;
    s.bag_size = 50;
    s.num_rows = {E};
    s.alpha = 0.5;  // rank 1000 still has ~100 expected hits among 200,000 lookups
    s.seed = 77 + E;
    std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(s.seed));
    TbeInputs in;
    ASSERT_TRUE(generate_tbe_inputs(s, &in).ok());
    std::set<int64_t> rows(in.indices.begin(), in.indices.end());
    EXPECT_EQ(static_cast<int64_t>(rows.size()), E) << "rank -> row must be a bijection of the table";
    EXPECT_EQ(*rows.begin(), 0);
    EXPECT_EQ(*rows.rbegin(), E - 1);
  }
}

}  // namespace
}  // namespace embscale
