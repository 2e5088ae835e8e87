// Every compiled shape of the CUDA TBE forward (dev/tbe_forward_variants.cu), both grid orders and
// several bags per lane group, against the naive reference: the variants run for pooled fp32 -> fp32
// with int64 indices, so the cases below are of that kind (other kinds check that the library's kernels
// still run under another grid order and bags per group). Part of the dev tests (built with
// EMBSCALE_BUILD_DEV, which needs the CUDA backend); without a GPU they report themselves skipped.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
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
  // Plain calls whose features all take one walk (the plain kernels' cases), without and with bounds
  // checks: one 16-byte vector per lane (D=128, 64: the vector kernel; the warp variants run it on the warp
  // walk), whole-warp rows of two vectors a lane (D=160, 192; D=256's 64 vectors) and of passes (D=512).
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
    // The same rows with bounds checks: the library's checked plain kernels (the warp variants leave
    // checked calls to them).
    s.bounds = BoundsCheckMode::kWarn;
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

TEST(TbeForwardVariants, EveryVariantAndBagsPerGroup) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "cuda backend not available";
  const std::vector<dev::FwdVariant>& variants = dev::fwd_variants();
  ASSERT_FALSE(variants.empty());
  EXPECT_STREQ(variants[0].name, "default");
  const std::vector<TbeCase> cases = variant_cases();
  for (const dev::FwdVariant& v : variants) {
    for (int bags : {0, 1, 3}) {  // 0: the policy's rule (forward_plan.h)
      dev::FwdLaunch launch;
      launch.variant = v.name;
      launch.bags_per_group = bags;
      const testing_tbe::ForwardCall forward = [&launch](const Context& ctx, const TableBatchedEmbedding& tbe,
                                                         const TbeForwardArgs& args) {
        return dev::variant_forward(ctx, tbe, args, launch);
      };
      for (const TbeCase& c : cases) {
        const CaseOutcome o = run_tbe_case(Backend::kCuda, c, forward);
        EXPECT_TRUE(o.failure.empty()) << "variant " << v.name << ", " << bags << " bags per group: " << o.failure;
      }
    }
  }
}

// Tables of 3000 rows of `dims` with fp32 weights uniform in [-1, 1], and Zipf 1.15 inputs of B = 29 bags
// of 0..2L lookups for them, from `seed`.
struct ZipfProblem {
  std::unique_ptr<TableBatchedEmbedding> tbe;
  TbeInputSpec spec;
  TbeInputs in;
  std::vector<float> weights;
};

void make_zipf_problem(const Context& ctx, const std::vector<int>& dims, int bag_size, uint64_t seed, ZipfProblem* z) {
  TbeConfig cfg;
  for (int d : dims) cfg.tables.push_back(TableSpec{3000, d});
  ASSERT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &z->tbe).ok());
  z->spec.batch_size = 29;
  z->spec.bag_size = bag_size;
  z->spec.variable_bag_size = true;
  z->spec.num_rows.assign(dims.size(), 3000);
  z->spec.alpha = 1.15;
  z->spec.seed = seed;
  ASSERT_TRUE(generate_tbe_inputs(z->spec, &z->in).ok());
  z->weights.resize(static_cast<size_t>(z->tbe->num_weights()));
  ASSERT_TRUE(init_uniform_weights(DType::kF32, 1.0f, seed, 0, z->tbe->num_weights(), z->weights.data()).ok());
}

// The library's plain kernels (the `default` launch of a plain call) and the bags kernel alone (`bags`) sum
// the same values in the same order: real-valued rows, outputs compared bit for bit.
TEST(TbeForwardVariants, PlainKernelsMatchTheBagsKernelBitForBit) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "cuda backend not available";
  const Context ctx = Context::cuda();
  const uint64_t seed = 720;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  int n = 0;
  // The warp kernel (one and two vectors a lane, passes) and the vector kernel (narrow and whole-warp rows).
  for (const std::vector<int>& dims : {std::vector<int>{128, 256, 160, 516}, std::vector<int>{64, 32, 128}}) {
    for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean}) {
      ZipfProblem z;
      make_zipf_problem(ctx, dims, 70, seed + n++, &z);
      if (HasFatalFailure()) return;
      const TableBatchedEmbedding* tbe = z.tbe.get();
      const TbeInputSpec& spec = z.spec;
      const TbeInputs& in = z.in;
      const std::vector<float>& w = z.weights;
      const size_t out_bytes = static_cast<size_t>(spec.batch_size * tbe->total_dim()) * 4;
      Buffer d_w(Backend::kCuda, w.size() * 4), d_idx(Backend::kCuda, in.indices_bytes()),
          d_off(Backend::kCuda, in.offsets_bytes()), d_out(Backend::kCuda, out_bytes);
      ASSERT_TRUE(copy_to_backend(ctx, d_w.data(), w.data(), w.size() * 4).ok());
      ASSERT_TRUE(copy_to_backend(ctx, d_idx.data(), in.indices_data(), in.indices_bytes()).ok());
      ASSERT_TRUE(copy_to_backend(ctx, d_off.data(), in.offsets_data(), in.offsets_bytes()).ok());
      TbeForwardArgs a;
      a.weights = TensorView::vec(d_w.data(), DType::kF32, tbe->num_weights());
      a.indices = TensorView::vec(d_idx.data(), DType::kI64, in.num_indices());
      a.offsets = TensorView::vec(d_off.data(), DType::kI64, static_cast<int64_t>(in.offsets.size()));
      a.batch_size = spec.batch_size;
      a.pooling = pool;
      a.bounds_check = BoundsCheckMode::kOff;
      a.output = TensorView::mat(d_out.data(), DType::kF32, spec.batch_size, tbe->total_dim());
      std::vector<std::vector<unsigned char>> got;
      for (const char* variant : {"default", "bags"}) {
        ASSERT_TRUE(fill_bytes(ctx, d_out.data(), 0xff, out_bytes).ok());
        dev::FwdLaunch launch;
        launch.variant = variant;
        Status st = dev::variant_forward(ctx, *tbe, a, launch);
        if (st.ok()) st = synchronize(ctx);
        ASSERT_TRUE(st.ok()) << variant << ": " << st.to_string();
        got.emplace_back(out_bytes);
        ASSERT_TRUE(copy_to_host(ctx, got.back().data(), d_out.data(), out_bytes).ok());
      }
      // Every element written (none left as the all-ones poison), and not all zeros.
      bool poisoned = false, nonzero = false;
      for (size_t i = 0; i < out_bytes; i += 4) {
        uint32_t bits;
        std::memcpy(&bits, got[0].data() + i, 4);
        poisoned = poisoned || bits == 0xffffffffu;
        nonzero = nonzero || (bits & 0x7fffffffu) != 0;
      }
      EXPECT_FALSE(poisoned) << "D=" << dims[0] << ": an output element was not written";
      EXPECT_TRUE(nonzero) << "D=" << dims[0] << ": all-zero output";
      EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), out_bytes))
          << "D=" << dims[0] << ", " << pooling_mode_name(pool) << ": the plain kernels and the bags kernel differ";
    }
  }
}

// One problem of CheckedPlainKernelsMatchTheBagsKernel (below).
void checked_plain_kernels_match_the_bags_kernel(const Context& ctx, const std::vector<int>& dims, uint64_t seed) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  ZipfProblem z;
  make_zipf_problem(ctx, dims, 40, seed, &z);
  if (::testing::Test::HasFatalFailure()) return;
  const TableBatchedEmbedding* tbe = z.tbe.get();
  const TbeInputSpec& spec = z.spec;
  const TbeInputs& clean = z.in;
  ASSERT_GT(clean.num_indices(), 200);
  const std::vector<float>& w = z.weights;
  const size_t out_bytes = static_cast<size_t>(spec.batch_size * tbe->total_dim()) * 4;
  Buffer d_w(Backend::kCuda, w.size() * 4), d_out(Backend::kCuda, out_bytes), d_skipped(Backend::kCuda, 8);
  ASSERT_TRUE(copy_to_backend(ctx, d_w.data(), w.data(), w.size() * 4).ok());
  // Inputs: valid; bad indices spread over bags and chunks; and a decreasing offset as well.
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<int64_t> idx = clean.indices, off = clean.offsets;
    if (kind >= 1) {
      const int64_t bad[] = {-1, 3000, int64_t{1} << 40, -(int64_t{1} << 33)};
      for (size_t i = 7, k = 0; i < idx.size(); i += 37, ++k) idx[i] = bad[k % 4];
    }
    if (kind == 2) off[5] = off[4] - 1;
    Buffer d_idx(Backend::kCuda, idx.size() * 8), d_off(Backend::kCuda, off.size() * 8);
    ASSERT_TRUE(copy_to_backend(ctx, d_idx.data(), idx.data(), idx.size() * 8).ok());
    ASSERT_TRUE(copy_to_backend(ctx, d_off.data(), off.data(), off.size() * 8).ok());
    for (BoundsCheckMode mode : {BoundsCheckMode::kSkip, BoundsCheckMode::kWarn, BoundsCheckMode::kError}) {
      for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean}) {
        TbeForwardArgs a;
        a.weights = TensorView::vec(d_w.data(), DType::kF32, tbe->num_weights());
        a.indices = TensorView::vec(d_idx.data(), DType::kI64, static_cast<int64_t>(idx.size()));
        a.offsets = TensorView::vec(d_off.data(), DType::kI64, static_cast<int64_t>(off.size()));
        a.batch_size = spec.batch_size;
        a.pooling = pool;
        a.bounds_check = mode;
        a.num_skipped = d_skipped.as<int64_t>();
        a.output = TensorView::mat(d_out.data(), DType::kF32, spec.batch_size, tbe->total_dim());
        const std::string at = "inputs " + std::to_string(kind) + ", " + bounds_check_mode_name(mode) + ", " +
                               pooling_mode_name(pool);
        std::vector<std::vector<unsigned char>> got;
        std::vector<Status> status;
        std::vector<int64_t> skipped;
        for (const char* variant : {"bags", "default"}) {
          ASSERT_TRUE(fill_bytes(ctx, d_out.data(), 0xff, out_bytes).ok());
          ASSERT_TRUE(fill_bytes(ctx, d_skipped.data(), 0x5a, 8).ok());
          dev::FwdLaunch launch;
          launch.variant = variant;
          Status st = dev::variant_forward(ctx, *tbe, a, launch);
          const Status sync = synchronize(ctx);
          status.push_back(st.ok() ? sync : st);
          got.emplace_back(out_bytes);
          ASSERT_TRUE(copy_to_host(ctx, got.back().data(), d_out.data(), out_bytes).ok());
          int64_t n = 0;
          ASSERT_TRUE(copy_to_host(ctx, &n, d_skipped.data(), 8).ok());
          skipped.push_back(n);
        }
        EXPECT_EQ(status[0].code(), status[1].code()) << at << ": " << status[1].to_string();
        EXPECT_EQ(status[0].message(), status[1].message()) << at;
        EXPECT_EQ(skipped[0], skipped[1]) << at;
        if (kind == 1 && mode == BoundsCheckMode::kSkip) EXPECT_GT(skipped[1], 0) << at;
        if (status[0].ok()) EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), out_bytes)) << at;
      }
    }
  }
}

// The plain kernels' checked forms (the `default` launch of a checked plain call: the warp kernel for
// whole-warp rows, the vector kernel for the rest) against the bags kernel's general form (`bags`):
// invalid indices (negative, = E, far above) and broken offsets in skip, warn and error modes, SUM and
// MEAN: the same output bits, skip count and Status.
TEST(TbeForwardVariants, CheckedPlainKernelsMatchTheBagsKernel) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "cuda backend not available";
  const Context ctx = Context::cuda();
  const uint64_t seed = 730;
  for (const std::vector<int>& dims : {std::vector<int>{128, 256, 160, 516}, std::vector<int>{64, 32, 128}}) {
    SCOPED_TRACE("dims " + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + ", ...");
    checked_plain_kernels_match_the_bags_kernel(ctx, dims, seed + static_cast<uint64_t>(dims[0]));
    if (HasFatalFailure()) return;
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
