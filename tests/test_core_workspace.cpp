// core/workspace.h (the one workspace layout) and core/dispatch.h's combined float x fp8 dispatch.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "core/workspace.h"
#include "embscale/context.h"

namespace embscale {
namespace {

constexpr size_t kA = WorkspaceLayout::kAlign;

size_t round_up(size_t v) { return (v + kA - 1) / kA * kA; }

// Random slice sizes (seeded, printed): each slice starts at the previous slice's end rounded up to
// kAlign, and the size is the last end rounded up, plus kAlign of slack for an aligned base.
TEST(WorkspaceLayout, SlicesAndSizeFollowTheAlignmentRule) {
  const unsigned seed = 20261201;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 8);
    std::vector<size_t> sizes(n);
    for (size_t& s : sizes) s = rng() % 4 == 0 ? 0 : rng() % 5000;
    for (const auto base : {WorkspaceLayout::Base::kAsGiven, WorkspaceLayout::Base::kAligned}) {
      WorkspaceLayout layout(base);
      size_t end = 0;
      for (size_t bytes : sizes) {
        const WorkspaceSlice s = layout.add(bytes);
        EXPECT_EQ(s.offset, end) << "trial " << trial;
        EXPECT_EQ(s.bytes, bytes);
        EXPECT_EQ(s.offset % kA, 0u);
        end = round_up(end + bytes);
      }
      const size_t want = end == 0 ? 0 : end + (base == WorkspaceLayout::Base::kAligned ? kA : 0);
      EXPECT_EQ(layout.size(), want) << "trial " << trial;
    }
  }
}

TEST(WorkspaceLayout, EmptyLayoutNeedsNoBuffer) {
  WorkspaceLayout layout(WorkspaceLayout::Base::kAligned);
  layout.add(0);
  layout.add(0);
  EXPECT_EQ(layout.size(), 0u);
  EXPECT_TRUE(layout.check(Context::cpu(), nullptr, 0, "size_query()").ok());
}

// With an aligned base every slice lies at a kAlign boundary inside the buffer, whatever the buffer's
// own alignment, and the last slice ends within size() bytes of the buffer's start.
TEST(WorkspaceLayout, AlignedBaseCarvesInsideAnyBuffer) {
  WorkspaceLayout layout(WorkspaceLayout::Base::kAligned);
  const WorkspaceSlice a = layout.add(100);
  const WorkspaceSlice b = layout.add(3 * kA + 1);
  std::vector<unsigned char> storage(layout.size() + kA);
  for (size_t shift = 0; shift < kA; shift += 7) {
    unsigned char* buf = storage.data() + shift;
    unsigned char* pa = layout.at<unsigned char>(buf, a);
    unsigned char* pb = layout.at<unsigned char>(buf, b);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pa) % kA, 0u) << "shift " << shift;
    EXPECT_EQ(pb - pa, static_cast<std::ptrdiff_t>(b.offset));
    EXPECT_GE(pa, buf);
    EXPECT_LE(pb + b.bytes, buf + layout.size()) << "shift " << shift;
  }
  WorkspaceLayout as_given(WorkspaceLayout::Base::kAsGiven);
  const WorkspaceSlice c = as_given.add(10);
  const WorkspaceSlice d = as_given.add(10);
  unsigned char* buf = storage.data() + 3;
  EXPECT_EQ(as_given.at<unsigned char>(buf, c), buf);
  EXPECT_EQ(as_given.at<unsigned char>(buf, d), buf + kA);
}

TEST(WorkspaceLayout, CheckRefusesShortAndNullBuffers) {
  WorkspaceLayout layout(WorkspaceLayout::Base::kAsGiven);
  layout.add(1000);
  const size_t need = layout.size();
  std::vector<unsigned char> buf(need);
  const Context ctx = Context::cpu();
  EXPECT_TRUE(layout.check(ctx, buf.data(), need, "q()").ok());
  const Status small = layout.check(ctx, buf.data(), need - 1, "backward_workspace_size()");
  EXPECT_EQ(small.code(), StatusCode::kWorkspaceTooSmall);
  EXPECT_NE(small.message().find("workspace_bytes: " + std::to_string(need - 1)), std::string::npos) << small.message();
  EXPECT_NE(small.message().find("backward_workspace_size() asks for " + std::to_string(need)), std::string::npos);
  const Status null = layout.check(ctx, nullptr, need, "q()");
  EXPECT_EQ(null.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(null.message().find("workspace: null"), std::string::npos) << null.message();
}

// dispatch_float_fp8 reaches f with the float dtype's type first and the fp8 dtype's second, and
// names the argument whose dtype is outside its family.
TEST(Dispatch, FloatFp8PairsTheTypes) {
  const DType floats[] = {DType::kF32, DType::kF16, DType::kBF16};
  const DType fp8s[] = {DType::kF8E4M3, DType::kF8E5M2};
  for (DType f : floats) {
    for (DType e : fp8s) {
      DType got_f = DType::kI32, got_e = DType::kI32;
      const Status st = dispatch_float_fp8(f, "x", e, "y", [&](auto tf, auto te) {
        using F = typename decltype(tf)::type;
        using E = typename decltype(te)::type;
        got_f = std::is_same_v<F, float> ? DType::kF32 : std::is_same_v<F, fp16_t> ? DType::kF16 : DType::kBF16;
        got_e = std::is_same_v<E, fp8e4m3_t> ? DType::kF8E4M3 : DType::kF8E5M2;
      });
      EXPECT_TRUE(st.ok());
      EXPECT_EQ(got_f, f);
      EXPECT_EQ(got_e, e);
    }
  }
  int calls = 0;
  const Status bad_float = dispatch_float_fp8(DType::kF8E4M3, "x", DType::kF8E4M3, "y", [&](auto, auto) { ++calls; });
  EXPECT_EQ(bad_float.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_float.message().rfind("x: dtype", 0), 0u) << bad_float.message();
  const Status bad_fp8 = dispatch_float_fp8(DType::kF32, "x", DType::kF16, "y", [&](auto, auto) { ++calls; });
  EXPECT_EQ(bad_fp8.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_fp8.message().rfind("y: dtype", 0), 0u) << bad_fp8.message();
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace embscale
