// The CPU TBE's thread fan-out policy (src/tbe/cpu/thread_policy.h): one thread per
// kRowBytesPerThread bytes of rows gathered, at least one, at most the caller's limit; and a call large
// enough to fan out gives the same output bit for bit at every thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "embscale/tbe.h"
#include "embscale/tbe_generator.h"
#include "tbe/cpu/thread_policy.h"

namespace embscale {
namespace {

TEST(TbeCpuThreads, OneThreadPerShareOfRowBytesWithinTheLimit) {
  using cpu::kRowBytesPerThread;
  using cpu::threads_for_row_bytes;
  EXPECT_EQ(threads_for_row_bytes(0, 8), 1);
  EXPECT_EQ(threads_for_row_bytes(kRowBytesPerThread - 1, 8), 1);
  EXPECT_EQ(threads_for_row_bytes(2 * kRowBytesPerThread - 1, 8), 1);
  EXPECT_EQ(threads_for_row_bytes(2 * kRowBytesPerThread, 8), 2);
  EXPECT_EQ(threads_for_row_bytes(5 * kRowBytesPerThread, 8), 5);
  EXPECT_EQ(threads_for_row_bytes(100 * kRowBytesPerThread, 8), 8);  // the limit bounds it
  EXPECT_EQ(threads_for_row_bytes(100 * kRowBytesPerThread, 1), 1);
  EXPECT_EQ(threads_for_row_bytes(100 * kRowBytesPerThread, 0), 1);  // never below one
}

TEST(TbeCpuThreads, LargeForwardIsBitIdenticalForAnyThreadCount) {
  // Rows gathered: 2 features x 2048 bags x 12 lookups x 128 floats = 24 MiB, three threads' worth.
  TbeConfig cfg;
  cfg.tables = {TableSpec{5000, 128}, TableSpec{700, 128}};
  std::unique_ptr<TableBatchedEmbedding> tbe;
  ASSERT_TRUE(TableBatchedEmbedding::create(Context::cpu(), cfg, &tbe).ok());
  TbeInputSpec s;
  s.batch_size = 2048;
  s.bag_size = 12;
  s.num_rows = {5000, 700};
  s.seed = 91;
  std::printf("seed %llu\n", static_cast<unsigned long long>(s.seed));
  TbeInputs in;
  ASSERT_TRUE(generate_tbe_inputs(s, &in).ok());
  ASSERT_GE(in.num_indices() * 128 * 4, 3 * cpu::kRowBytesPerThread);
  std::vector<float> w(static_cast<size_t>(tbe->num_weights()));
  ASSERT_TRUE(init_uniform_weights(DType::kF32, 1.0f, 13, 0, tbe->num_weights(), w.data()).ok());
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 3}) {
    std::vector<float> out(static_cast<size_t>(2048 * tbe->total_dim()), NAN);
    TbeForwardArgs a;
    a.weights = TensorView::vec(w.data(), DType::kF32, tbe->num_weights());
    a.indices = TensorView::vec(in.indices.data(), DType::kI64, in.num_indices());
    a.offsets = TensorView::vec(in.offsets.data(), DType::kI64, static_cast<int64_t>(in.offsets.size()));
    a.batch_size = 2048;
    a.output = TensorView::mat(out.data(), DType::kF32, 2048, tbe->total_dim());
    ASSERT_TRUE(tbe->forward(Context::cpu(threads), a).ok());
    outs.push_back(out);
  }
  for (size_t i = 1; i < outs.size(); ++i)
    EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[i].data(), outs[0].size() * sizeof(float))) << "thread count " << i + 1;
}

}  // namespace
}  // namespace embscale
