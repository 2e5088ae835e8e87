// How the CUDA quantized TBE forward reads rows (src/tbe/cuda/quant/tbe_quant_plan.h), on the host: the chunks
// of a row's data, the chunks a lane owns and the lanes of a bag, against the layout worked out by hand (a
// 4-byte header, then the data). No GPU needed: the plan is plain C++.
#include <gtest/gtest.h>

#include <cstdint>

#include "embscale/tbe_quant.h"
#include "tbe/cuda/quant/tbe_quant_plan.h"

namespace embscale {
namespace {

using cuda::tbe_quant_fwd::QuantRowPlan;
using cuda::tbe_quant_fwd::quant_row_plan;
using Q = QuantWeightType;

int64_t row_bytes(Q t, int dim, int align) {
  int64_t rb = 0;
  EXPECT_TRUE(quant_row_bytes(t, dim, align, &rb).ok());
  return rb;
}

TEST(TbeQuantPlan, FbgemmGpuRowsTakeDataChunks) {
  const struct { Q t; int dim; int slots, per_lane, group; } cases[] = {
      {Q::kInt8, 128, 8, 2, 4},     // 128 data bytes: 8 chunks of 16, two a lane (the header takes no lane)
      {Q::kInt8, 512, 32, 2, 16},   // 512 bytes: 32 chunks, 16 lanes x 2
      {Q::kInt8, 100, 7, 2, 4},     // 100 bytes: 7 chunks, the last one partly data
      {Q::kInt4, 128, 4, 1, 4},     // 64 bytes: 4 chunks of 32 values, one a lane
      {Q::kInt4, 512, 16, 1, 16},   // 256 bytes
      {Q::kInt2, 8, 1, 1, 1},       // 2 bytes: one 8-byte chunk
      {Q::kInt2, 256, 8, 1, 8},     // 64 bytes: 8 chunks of 8
      {Q::kFp8E4M3, 1, 1, 2, 1},    // 1 byte
      {Q::kFp16, 64, 8, 2, 4},      // 128 bytes, no header
      {Q::kFp32, 1000, 250, 2, 32}, // 4000 bytes: 4 passes of 64 chunks
      {Q::kBf16, 3, 1, 2, 1},       // 6 bytes in a 16-byte row
  };
  for (const auto& c : cases) {
    const QuantRowPlan p = quant_row_plan(c.t, c.dim, row_bytes(c.t, c.dim, 16), 4096);
    EXPECT_TRUE(p.vector) << quant_weight_type_name(c.t) << " D=" << c.dim;
    EXPECT_EQ(p.slots, c.slots) << quant_weight_type_name(c.t) << " D=" << c.dim;
    EXPECT_EQ(p.per_lane, c.per_lane) << quant_weight_type_name(c.t) << " D=" << c.dim;
    EXPECT_EQ(p.group, c.group) << quant_weight_type_name(c.t) << " D=" << c.dim;
  }
}

TEST(TbeQuantPlan, UnalignedRowsOrTablesReadColumns) {
  // FBGEMM's CPU layout (row_alignment 1): int8 D = 7 is 11 bytes a row; a 16-byte row in a table at an odd
  // address; int2 needs only 8-byte alignment.
  QuantRowPlan p = quant_row_plan(Q::kInt8, 7, row_bytes(Q::kInt8, 7, 1), 4096);
  EXPECT_FALSE(p.vector);
  EXPECT_EQ(p.slots, 7);
  EXPECT_EQ(p.group, 2);  // 4 columns a lane
  p = quant_row_plan(Q::kFp32, 4, 16, 4096 + 4);
  EXPECT_FALSE(p.vector);
  p = quant_row_plan(Q::kInt2, 16, 8, 4096 + 8);
  EXPECT_TRUE(p.vector);
  EXPECT_EQ(p.slots, 1);
  p = quant_row_plan(Q::kInt4, 100, row_bytes(Q::kInt4, 100, 8), 4096);  // 56-byte rows
  EXPECT_FALSE(p.vector);
  EXPECT_EQ(p.group, 32);  // 100 columns, 4 a lane
}

}  // namespace
}  // namespace embscale
