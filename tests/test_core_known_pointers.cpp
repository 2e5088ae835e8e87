// core/known_pointers.h: the ring of pointers a handle's memory checks accepted. An entry is found only
// under its own address, device and check; the oldest goes first once the ring is full; calls from
// several threads at once are safe.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/known_pointers.h"

namespace embscale {
namespace {

using detail::KnownPointers;
using Kind = KnownPointers::Kind;

// Distinct addresses that are never dereferenced.
const void* address(int i) {
  static char bytes[4 * KnownPointers::kCapacity];
  return bytes + i;
}

TEST(KnownPointers, FindsWhatWasAddedUnderItsDeviceAndCheck) {
  KnownPointers known;
  const void* p = address(0);
  EXPECT_FALSE(known.contains(p, 0, Kind::kDevice));
  known.add(p, 0, Kind::kDevice);
  EXPECT_TRUE(known.contains(p, 0, Kind::kDevice));
  EXPECT_FALSE(known.contains(address(1), 0, Kind::kDevice)) << "another address";
  EXPECT_FALSE(known.contains(p, 1, Kind::kDevice)) << "checked while device 0 was current, asked under device 1";
  EXPECT_FALSE(known.contains(p, 0, Kind::kMappedHost)) << "accepted as device memory, not as mapped host memory";
  EXPECT_FALSE(known.contains(p, 0, Kind::kHostStore));
  known.add(p, 1, Kind::kDevice);
  EXPECT_TRUE(known.contains(p, 0, Kind::kDevice));
  EXPECT_TRUE(known.contains(p, 1, Kind::kDevice));
}

TEST(KnownPointers, OverwritesTheOldestOnceFull) {
  KnownPointers known;
  const int n = KnownPointers::kCapacity;
  for (int i = 0; i < n; ++i) known.add(address(i), 0, Kind::kDevice);
  for (int i = 0; i < n; ++i) EXPECT_TRUE(known.contains(address(i), 0, Kind::kDevice)) << i;
  known.add(address(n), 0, Kind::kDevice);
  EXPECT_FALSE(known.contains(address(0), 0, Kind::kDevice)) << "the oldest entry goes first";
  for (int i = 1; i <= n; ++i) EXPECT_TRUE(known.contains(address(i), 0, Kind::kDevice)) << i;
  known.add(address(n + 1), 0, Kind::kDevice);
  EXPECT_FALSE(known.contains(address(1), 0, Kind::kDevice));
  EXPECT_TRUE(known.contains(address(2), 0, Kind::kDevice));
  EXPECT_TRUE(known.contains(address(n + 1), 0, Kind::kDevice));
}

// Threads adding and looking up overlapping addresses at once: nothing crashes (ThreadSanitizer would
// report a race), and the ring works as before afterwards.
TEST(KnownPointers, ManyThreadsAtOnce) {
  KnownPointers known;
  constexpr int kThreads = 8, kRounds = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&known, t] {
      for (int r = 0; r < kRounds; ++r) {
        const void* p = address((t * 7 + r) % (4 * KnownPointers::kCapacity));
        if (r % 3 == 0) known.add(p, t % 2, Kind::kDevice);
        else (void)known.contains(p, t % 2, Kind::kDevice);
      }
    });
  for (std::thread& th : threads) th.join();
  known.add(address(5), 3, Kind::kHostStore);
  EXPECT_TRUE(known.contains(address(5), 3, Kind::kHostStore));
}

}  // namespace
}  // namespace embscale
