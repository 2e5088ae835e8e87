// Four fp32 lanes as a GCC/Clang vector type, and loads of four stored weights (fp32, fp16, bf16)
// decoded into one. The CPU TBE kernels sum a chunk of a bag's rows in an array of these, which the
// compiler keeps in vector registers (SSE2 on any x86-64, NEON on Arm, wider where the build allows);
// summing into a D-float buffer in memory instead made every step a load, an add and a store and was
// bound by those, not by memory. Lane-wise arithmetic is exact fp32, so results do not depend on the
// vector width.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/numerics.h"

namespace embscale {
namespace cpu {

typedef float f32x4 __attribute__((vector_size(16)));
typedef uint32_t u32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));
typedef uint16_t u16x4 __attribute__((vector_size(8)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));

inline f32x4 as_f32x4(u32x4 u) {
  f32x4 f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline u32x4 as_u32x4(f32x4 f) {
  u32x4 u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Four 16-bit patterns widened to 32-bit lanes (unaligned loads are fine: memcpy).
inline u32x4 load_u16x4(const void* p) {
  u16x4 h;
  std::memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, u32x4);
}

inline f32x4 load4(const float* p) {
  f32x4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline f32x4 load4(const bf16_t* p) { return as_f32x4(load_u16x4(p) << 16); }

// fp16 -> fp32 exactly, branch-free, from 32-bit lanes holding the half in their upper 16 bits: the
// exponent/mantissa field moved into fp32 position and scaled by 2^112 (a power of two, so exact for
// normal and subnormal halves alike); exponent 31 (inf/NaN) scales to exponent 143, and OR-ing in the
// all-ones exponent turns that into inf/NaN with the payload kept.
inline f32x4 fp16_high_to_f32(u32x4 x) {
  const u32x4 em = (x & 0x7fff0000u) >> 3;
  const u32x4 scaled = as_u32x4(as_f32x4(em) * 5.192296858534828e33f);  // 2^112
  // em < 2^31, so a signed comparison is exact (and one instruction on SSE2); true lanes are all ones.
  const u32x4 special = (u32x4)((i32x4)em >= 0x0f800000);
  return as_f32x4(scaled | (special & 0x7f800000u) | (x & 0x80000000u));
}

inline f32x4 load4(const fp16_t* p) { return fp16_high_to_f32(load_u16x4(p) << 16); }

// Eight stored weights as two vectors: lo = elements 0..3, hi = 4..7. For 16-bit formats one 16-byte
// load, each half interleaved with zeros so the bits land in the upper half of 32-bit lanes (which is
// already the fp32 value for bf16).
inline void load8(const float* p, f32x4* lo, f32x4* hi) {
  *lo = load4(p);
  *hi = load4(p + 4);
}

inline void load8_high(const void* p, u32x4* lo, u32x4* hi) {
  u16x8 v;
  std::memcpy(&v, p, sizeof(v));
  const u16x8 z = {};
  const u16x8 l = __builtin_shufflevector(z, v, 0, 8, 1, 9, 2, 10, 3, 11);
  const u16x8 h = __builtin_shufflevector(z, v, 4, 12, 5, 13, 6, 14, 7, 15);
  std::memcpy(lo, &l, sizeof(l));
  std::memcpy(hi, &h, sizeof(h));
}

inline void load8(const bf16_t* p, f32x4* lo, f32x4* hi) {
  u32x4 l, h;
  load8_high(p, &l, &h);
  *lo = as_f32x4(l);
  *hi = as_f32x4(h);
}

inline void load8(const fp16_t* p, f32x4* lo, f32x4* hi) {
  u32x4 l, h;
  load8_high(p, &l, &h);
  *lo = fp16_high_to_f32(l);
  *hi = fp16_high_to_f32(h);
}

// One stored weight as fp32 (the same decode, for the columns past the last multiple of 4).
inline float load1(const float* p) { return *p; }
inline float load1(const bf16_t* p) { return bf16_to_float(p->bits); }
inline float load1(const fp16_t* p) { return fp16_to_float(p->bits); }

}  // namespace cpu
}  // namespace embscale
