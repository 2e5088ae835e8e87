// The row cache's names (tbe_cache.h): every placement and cache algorithm parses from its own name and from
// FBGEMM's (EmbeddingLocation.DEVICE / MANAGED / MANAGED_CACHING, CacheAlgorithm.LRU / LFU), names round-trip,
// and anything else is refused.
#include <gtest/gtest.h>

#include "embscale/tbe_cache.h"

namespace embscale {
namespace {

TEST(TbeCacheNames, PlacementsParseFromTheirNamesAndFbgemms) {
  for (int v = 0; v < kNumTablePlacements; ++v) {
    const auto p = static_cast<TablePlacement>(v);
    TablePlacement got = TablePlacement::kDevice;
    EXPECT_TRUE(parse_table_placement(table_placement_name(p), &got)) << table_placement_name(p);
    EXPECT_EQ(got, p);
  }
  const struct { const char* fbgemm; TablePlacement p; } fbgemm[] = {
      {"DEVICE", TablePlacement::kDevice}, {"MANAGED", TablePlacement::kHost},
      {"MANAGED_CACHING", TablePlacement::kCached}};
  for (const auto& f : fbgemm) {
    TablePlacement got = TablePlacement::kDevice;
    EXPECT_TRUE(parse_table_placement(f.fbgemm, &got)) << f.fbgemm;
    EXPECT_EQ(got, f.p) << f.fbgemm;
  }
  for (const char* bad : {"", "uvm", "Managed", "HOST", "cache"}) EXPECT_FALSE(parse_table_placement(bad, nullptr)) << bad;
}

TEST(TbeCacheNames, CacheAlgorithmsParseFromTheirNamesAndFbgemms) {
  for (int v = 0; v < kNumCacheAlgorithms; ++v) {
    const auto a = static_cast<CacheAlgorithm>(v);
    CacheAlgorithm got = CacheAlgorithm::kLfu;
    EXPECT_TRUE(parse_cache_algorithm(cache_algorithm_name(a), &got));
    EXPECT_EQ(got, a);
  }
  CacheAlgorithm got = CacheAlgorithm::kLru;
  EXPECT_TRUE(parse_cache_algorithm("LFU", &got));
  EXPECT_EQ(got, CacheAlgorithm::kLfu);
  for (const char* bad : {"", "fifo", "Lru"}) EXPECT_FALSE(parse_cache_algorithm(bad, nullptr)) << bad;
}

}  // namespace
}  // namespace embscale
