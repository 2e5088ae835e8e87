// One status code per kind of failure across the capabilities: a dtype an op does not take is
// kInvalidArgument in FP8 and in TBE alike, and a CUDA context in a build without CUDA is kUnsupported in
// both; the shared dispatcher refuses a dtype outside its family with the same code and wording.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dispatch.h"
#include "embscale/fp8.h"
#include "embscale/tbe.h"

namespace embscale {
namespace {

Status tbe_create_with(DType weights_dtype, const Context& ctx) {
  TbeConfig cfg;
  cfg.tables = {TableSpec{4, 2}};
  cfg.weights_dtype = weights_dtype;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  return TableBatchedEmbedding::create(ctx, cfg, &tbe);
}

// One fp32 table of 4 rows x 2 columns, B = 1, lookups {1, 3} of the given index dtype.
Status tbe_forward_with(DType index_dtype, DType output_dtype) {
  TbeConfig cfg;
  cfg.tables = {TableSpec{4, 2}};
  std::unique_ptr<TableBatchedEmbedding> tbe;
  EXPECT_TRUE(TableBatchedEmbedding::create(Context::cpu(), cfg, &tbe).ok());
  std::vector<float> weights(8, 1.0f), out(2, 0.0f);
  std::vector<int64_t> indices = {1, 3}, offsets = {0, 2};
  TbeForwardArgs a;
  a.weights = TensorView::vec(weights.data(), DType::kF32, 8);
  a.indices = TensorView::vec(indices.data(), index_dtype, 2);
  a.offsets = TensorView::vec(offsets.data(), index_dtype, 2);
  a.batch_size = 1;
  a.output = TensorView::mat(out.data(), output_dtype, 1, 2);
  return tbe->forward(Context::cpu(), a);
}

Status amax_of(DType dtype, const Context& ctx) {
  std::vector<float> x(4, 1.0f);
  float out = 0.0f;
  return amax(ctx, TensorView::vec(x.data(), dtype, 4), &out, {}, nullptr, 0);
}

TEST(StatusCodes, AnUnsupportedDtypeIsInvalidArgumentInEveryCapability) {
  const Status fp8 = amax_of(DType::kI32, Context::cpu());
  EXPECT_EQ(fp8.code(), StatusCode::kInvalidArgument) << fp8.to_string();
  EXPECT_EQ(fp8.message().rfind("x: dtype int32 is not supported", 0), 0u) << fp8.message();
  const Status weights = tbe_create_with(DType::kI32, Context::cpu());
  EXPECT_EQ(weights.code(), StatusCode::kInvalidArgument) << weights.to_string();
  EXPECT_EQ(weights.message().rfind("cfg.weights_dtype: int32 is not supported", 0), 0u) << weights.message();
  const Status indices = tbe_forward_with(DType::kF32, DType::kF32);
  EXPECT_EQ(indices.code(), StatusCode::kInvalidArgument) << indices.to_string();
  EXPECT_EQ(indices.message().rfind("indices: dtype fp32 is not supported", 0), 0u) << indices.message();
  const Status output = tbe_forward_with(DType::kI64, DType::kF8E4M3);
  EXPECT_EQ(output.code(), StatusCode::kInvalidArgument) << output.to_string();
  EXPECT_EQ(output.message().rfind("output: dtype fp8e4m3 is not supported", 0), 0u) << output.message();
}

TEST(StatusCodes, ACudaContextWithoutCudaIsUnsupportedInEveryCapability) {
  if (backend_compiled(Backend::kCuda)) GTEST_SKIP() << "CUDA is compiled in";
  EXPECT_EQ(amax_of(DType::kF32, Context::cuda()).code(), StatusCode::kUnsupported);
  EXPECT_EQ(tbe_create_with(DType::kF32, Context::cuda()).code(), StatusCode::kUnsupported);
}

TEST(StatusCodes, TheDispatcherRefusesADtypeOutsideItsFamily) {
  int calls = 0;
  const auto count = [&](auto) { ++calls; };
  EXPECT_TRUE(dispatch_float(DType::kBF16, "x", count).ok());
  EXPECT_TRUE(dispatch_fp8(DType::kF8E5M2, "y", count).ok());
  EXPECT_TRUE(dispatch_index(DType::kI32, "indices", count).ok());
  EXPECT_EQ(calls, 3);
  const Status f = dispatch_float(DType::kI64, "x", count);
  EXPECT_EQ(f.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.message(), "x: dtype int64 is not supported; expected fp32, fp16 or bf16");
  const Status q = dispatch_fp8(DType::kF32, "y", count);
  EXPECT_EQ(q.message(), "y: dtype fp32 is not supported; expected fp8e4m3 or fp8e5m2");
  const Status i = dispatch_index(DType::kF16, "indices", count);
  EXPECT_EQ(i.message(), "indices: dtype fp16 is not supported; expected int32 or int64");
  EXPECT_EQ(calls, 3);
  // The callable's own Status comes back unchanged.
  const Status own = dispatch_float(DType::kF32, "x", [](auto) { return out_of_range("x: from the callable"); });
  EXPECT_EQ(own.code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace embscale
