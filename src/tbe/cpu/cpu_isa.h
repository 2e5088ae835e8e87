// Which instruction set the CPU TBE hot loops run with, chosen once at run time.
//
// The library is built for x86-64-v2 so that one binary runs on any x86-64 machine of the last decade;
// the forward's bag sums and the backward's gradient sums are also compiled for x86-64-v3 (AVX2, FMA)
// and x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) and the widest level the CPU (and its operating system)
// supports is used. Every level computes the same fp32 operations in the same order (no FMA
// contraction: the TUs are built with -ffp-contract=off), so results are bit-identical across levels.
// Other architectures have the baseline only.
#pragma once

// EMBSCALE_CPU_WIDE_ISAS: whether the x86-64-v3 and v4 copies exist. Code between
// EMBSCALE_CPU_TARGET_V3_BEGIN (or _V4_BEGIN) and EMBSCALE_CPU_TARGET_END is compiled for that level;
// everything it uses must be declared before the BEGIN (headers included first), so that only the
// functions defined in between take the wider instructions.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EMBSCALE_CPU_WIDE_ISAS 1
#define EMBSCALE_CPU_ISA_V3 "avx,avx2,fma,bmi,bmi2,f16c,lzcnt,movbe"
#define EMBSCALE_CPU_ISA_V4 EMBSCALE_CPU_ISA_V3 ",avx512f,avx512bw,avx512cd,avx512dq,avx512vl"
#define EMBSCALE_CPU_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define EMBSCALE_CPU_TARGET_BEGIN(isa) \
  EMBSCALE_CPU_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define EMBSCALE_CPU_TARGET_END _Pragma("clang attribute pop")
#else
#define EMBSCALE_CPU_TARGET_BEGIN(isa) _Pragma("GCC push_options") EMBSCALE_CPU_PRAGMA(GCC target(isa))
#define EMBSCALE_CPU_TARGET_END _Pragma("GCC pop_options")
#endif
#define EMBSCALE_CPU_TARGET_V3_BEGIN EMBSCALE_CPU_TARGET_BEGIN(EMBSCALE_CPU_ISA_V3)
#define EMBSCALE_CPU_TARGET_V4_BEGIN EMBSCALE_CPU_TARGET_BEGIN(EMBSCALE_CPU_ISA_V4)
#else
#define EMBSCALE_CPU_WIDE_ISAS 0
#endif

namespace embscale {
namespace cpu {

enum class CpuIsa { kX86_64_v2 = 0, kX86_64_v3 = 1, kX86_64_v4 = 2 };

const char* cpu_isa_name(CpuIsa isa);

// Whether this CPU can run the code compiled for `isa` (always true for kX86_64_v2).
bool cpu_isa_supported(CpuIsa isa);

// The level the kernels use: the widest supported one, unless a test has chosen another.
CpuIsa active_cpu_isa();

// Test hook (not part of the API): run the kernels at `isa` from now on. Returns false, changing
// nothing, when the CPU does not support `isa`.
bool set_cpu_isa_for_testing(CpuIsa isa);

}  // namespace cpu
}  // namespace embscale
