// The CPU kernels' vector decoders (src/tbe/cpu/vec4.h) against the scalar conversions of core/numerics.h,
// bit for bit, over every fp16 and bf16 pattern (zeros, subnormals, infinities and NaNs included), at
// every lane position of the 4- and 8-wide loads and from unaligned addresses.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/numerics.h"
#include "tbe/cpu/vec4.h"

namespace embscale {
namespace cpu {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

template <typename H>
void check_every_pattern(float (*scalar)(uint16_t), const char* name) {
  // All 65536 patterns, one element of padding in front so that the loads are not 16-byte aligned.
  std::vector<H> all(65536 + 1);
  for (uint32_t h = 0; h < 65536; ++h) all[h + 1].bits = static_cast<uint16_t>(h);
  const H* p = all.data() + 1;
  int64_t mismatches = 0;
  for (uint32_t h = 0; h < 65536; h += 8) {
    f32x4 lo, hi;
    load8(p + h, &lo, &hi);
    const f32x4 a = load4(p + h), b = load4(p + h + 4);
    for (int k = 0; k < 8; ++k) {
      const uint32_t want = bits_of(scalar(static_cast<uint16_t>(h + k)));
      const float got8 = k < 4 ? lo[k] : hi[k - 4];
      const float got4 = k < 4 ? a[k] : b[k - 4];
      const float got1 = load1(p + h + k);
      if (bits_of(got8) != want || bits_of(got4) != want || bits_of(got1) != want) {
        if (mismatches++ < 5)
          ADD_FAILURE() << name << " pattern 0x" << std::hex << h + k << ": want 0x" << want << ", load8 0x"
                        << bits_of(got8) << ", load4 0x" << bits_of(got4) << ", load1 0x" << bits_of(got1);
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << name;
}

TEST(CpuVec4, Fp16DecodesEveryPatternExactly) { check_every_pattern<fp16_t>(fp16_to_float, "fp16"); }

TEST(CpuVec4, Bf16DecodesEveryPatternExactly) { check_every_pattern<bf16_t>(bf16_to_float, "bf16"); }

TEST(CpuVec4, Fp32LoadsAreExact) {
  const float v[9] = {0.0f, -0.0f, 1.5f, -3.25e-41f, 3.4e38f, -1.0f / 0.0f, 7.0f, 1e-30f, 2.0f};
  f32x4 lo, hi;
  load8(v + 1, &lo, &hi);  // unaligned
  const f32x4 a = load4(v + 1);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(bits_of(lo[k]), bits_of(v[1 + k]));
    EXPECT_EQ(bits_of(hi[k]), bits_of(v[5 + k]));
    EXPECT_EQ(bits_of(a[k]), bits_of(v[1 + k]));
    EXPECT_EQ(bits_of(load1(v + 1 + k)), bits_of(v[1 + k]));
  }
}

}  // namespace
}  // namespace cpu
}  // namespace embscale
