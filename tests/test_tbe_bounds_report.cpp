// The bounds-check wording every backend shares (tbe/bounds_report.h): each kind of violation, with
// the feature, bag and position worked out by hand from B and the feature -> table map.
#include <gtest/gtest.h>

#include <memory>

#include "embscale/tbe.h"
#include "tbe/bounds_report.h"

namespace embscale {
namespace {

using tbe_bounds::BoundsViolation;
using tbe_bounds::ViolationKind;

// 3 features over 2 tables (50 and 7 rows), B = 4: item f * 4 + b.
std::unique_ptr<TableBatchedEmbedding> module() {
  TbeConfig cfg;
  cfg.tables = {TableSpec{50, 6}, TableSpec{7, 3}};
  cfg.feature_table_map = {0, 1, 0};
  std::unique_ptr<TableBatchedEmbedding> tbe;
  EXPECT_TRUE(TableBatchedEmbedding::create(Context::cpu(), cfg, &tbe).ok());
  return tbe;
}

void expect_error(const Status& st, const char* message) {
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  EXPECT_EQ(st.message(), message);
}

TEST(TbeBoundsReport, EachViolationIsWordedOnce) {
  const auto tbe = module();
  BoundsViolation v;
  v.kind = ViolationKind::kNegativeFirstOffset;
  v.value = -3;
  expect_error(tbe_bounds::violation_error(*tbe, 4, 30, v), "offsets: position 0 (feature 0, bag 0): value -3 is negative");

  v = BoundsViolation();
  v.kind = ViolationKind::kDecreasingOffset;
  v.position = 7;  // offsets[7] ends item 6: feature 1, bag 2
  v.value = 9;
  v.previous = 11;
  expect_error(tbe_bounds::violation_error(*tbe, 4, 30, v),
               "offsets: position 7 (end of feature 1, bag 2): value 9 is less than the previous value 11");

  v = BoundsViolation();
  v.kind = ViolationKind::kLastOffsetMismatch;
  v.value = 29;
  expect_error(tbe_bounds::violation_error(*tbe, 4, 30, v),
               "offsets: the last value 29 differs from the number of indices 30");

  v = BoundsViolation();
  v.kind = ViolationKind::kBadIndex;
  v.item = 5;        // feature 1 (table 1), bag 1
  v.bag_start = 12;  // its bag starts at indices[12]
  v.position = 14;
  v.value = 7;
  expect_error(tbe_bounds::violation_error(*tbe, 4, 30, v),
               "indices: feature 1, bag 1, position 2 (indices[14]): index 7 is outside table 1 (7 rows)");

  v.item = 9;  // feature 2 reads table 0
  v.value = -1;
  expect_error(tbe_bounds::violation_error(*tbe, 4, 30, v),
               "indices: feature 2, bag 1, position 2 (indices[14]): index -1 is outside table 0 (50 rows)");
}

}  // namespace
}  // namespace embscale
