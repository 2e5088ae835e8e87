// Which instruction set the CPU TBE hot loops run with, chosen once at run time.
//
// The library is built for x86-64-v2 so that one binary runs on any x86-64 machine of the last decade;
// the forward's bag sums and the backward's gradient sums are also compiled for x86-64-v3 (AVX2, FMA)
// and x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) and the widest level the CPU (and its operating system)
// supports is used. Every level computes the same fp32 operations in the same order (no FMA
// contraction: the TUs are built with -ffp-contract=off), so results are bit-identical across levels.
// Other architectures have the baseline only.
#pragma once

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
