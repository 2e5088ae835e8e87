// Basics: dtype names and sizes, status formatting, backend parsing, host memory helpers.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "embscale/context.h"
#include "embscale/dtype.h"
#include "embscale/memory.h"
#include "embscale/status.h"

namespace embscale {
namespace {

TEST(DType, SizesAndNamesRoundTrip) {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2, DType::kI32, DType::kI64};
  const size_t sizes[] = {4, 2, 2, 1, 1, 4, 8};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(dtype_size(all[i]), sizes[i]);
    DType parsed;
    ASSERT_TRUE(parse_dtype(dtype_name(all[i]), &parsed)) << dtype_name(all[i]);
    EXPECT_EQ(parsed, all[i]);
  }
  DType t;
  EXPECT_TRUE(parse_dtype("BFloat16", &t));
  EXPECT_EQ(t, DType::kBF16);
  EXPECT_FALSE(parse_dtype("fp12", &t));
  EXPECT_FALSE(parse_dtype("", &t));
}

TEST(Status, FormatsCodeAndMessage) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().to_string(), "ok");
  const Status s = invalid_argument("x: must not be null");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.to_string(), "invalid_argument: x: must not be null");
}

TEST(Backend, ParseAndAvailability) {
  Backend b;
  EXPECT_TRUE(parse_backend("cpu", &b));
  EXPECT_EQ(b, Backend::kCpu);
  EXPECT_TRUE(parse_backend("CUDA", &b));
  EXPECT_EQ(b, Backend::kCuda);
  EXPECT_FALSE(parse_backend("tpu", &b));
  EXPECT_TRUE(backend_available(Backend::kCpu));
  if (!backend_compiled(Backend::kCuda)) EXPECT_FALSE(backend_available(Backend::kCuda));
}

TEST(Memory, HostBufferRoundTrip) {
  const Context ctx = Context::cpu();
  Buffer buf(Backend::kCpu, 1000);
  ASSERT_TRUE(buf.valid());
  std::vector<unsigned char> src(1000), dst(1000, 0);
  for (int i = 0; i < 1000; ++i) src[i] = static_cast<unsigned char>(i * 7);
  ASSERT_TRUE(copy_to_backend(ctx, buf.data(), src.data(), 1000).ok());
  ASSERT_TRUE(copy_to_host(ctx, dst.data(), buf.data(), 1000).ok());
  EXPECT_EQ(src, dst);
  void* p = reinterpret_cast<void*>(1);
  EXPECT_TRUE(backend_malloc(Backend::kCpu, 0, &p).ok());
  EXPECT_EQ(p, nullptr);
  EXPECT_FALSE(backend_malloc(Backend::kCpu, 10, nullptr).ok());
  // A size whose rounding up to the alignment would wrap around is refused, not allocated small.
  for (size_t bytes : {SIZE_MAX, SIZE_MAX - 10, SIZE_MAX - (size_t{2} << 20) + 1}) {
    p = reinterpret_cast<void*>(1);
    const Status s = backend_malloc(Backend::kCpu, bytes, &p);
    EXPECT_FALSE(s.ok()) << bytes;
    EXPECT_EQ(p, nullptr);
    EXPECT_NE(s.message().find("bytes"), std::string::npos) << s.message();
  }
}

#if defined(__linux__)
// The VmFlags of the mapping holding p in /proc/self/smaps ("" when none holds it).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 && line.find(' ') > line.find('-')) {
      inside = lo <= addr && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}
#endif

// Host buffers from 2 MiB up are 2 MiB-aligned and advised for huge pages (the mapping's VmFlags say "hg");
// smaller ones are 64-byte aligned and not advised.
TEST(Memory, LargeHostBuffersAreAdvisedForHugePages) {
  const size_t large = (size_t{2} << 20) + 4096, small = (size_t{2} << 20) - 64;
  Buffer big(Backend::kCpu, large), little(Backend::kCpu, small);
  ASSERT_TRUE(big.valid() && little.valid());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % (size_t{2} << 20), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(little.data()) % 64, 0u);
  std::memset(big.data(), 1, large);  // writable over the whole size asked for
#if defined(__linux__)
  const std::string flags = vm_flags_of(big.data());
  ASSERT_NE(flags, "") << "no mapping holds the buffer";
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
#endif
}

}  // namespace
}  // namespace embscale
