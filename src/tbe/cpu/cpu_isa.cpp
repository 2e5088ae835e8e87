// Run-time choice of the CPU TBE kernels' instruction set (cpu_isa.h).
#include "tbe/cpu/cpu_isa.h"

#include <atomic>

namespace embscale {
namespace cpu {
namespace {

CpuIsa detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // __builtin_cpu_supports also checks that the operating system saves the AVX / AVX-512 registers.
  __builtin_cpu_init();
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c");
  const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  return v4 ? CpuIsa::kX86_64_v4 : v3 ? CpuIsa::kX86_64_v3 : CpuIsa::kX86_64_v2;
#else
  return CpuIsa::kX86_64_v2;
#endif
}

CpuIsa detected() {
  static const CpuIsa isa = detect();
  return isa;
}

std::atomic<int> chosen{-1};  // -1: the detected level

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kX86_64_v2: return "x86-64-v2";
    case CpuIsa::kX86_64_v3: return "x86-64-v3";
    case CpuIsa::kX86_64_v4: return "x86-64-v4";
  }
  return "?";
}

bool cpu_isa_supported(CpuIsa isa) { return static_cast<int>(isa) <= static_cast<int>(detected()); }

CpuIsa active_cpu_isa() {
  const int c = chosen.load(std::memory_order_relaxed);
  return c < 0 ? detected() : static_cast<CpuIsa>(c);
}

bool set_cpu_isa_for_testing(CpuIsa isa) {
  if (!cpu_isa_supported(isa)) return false;
  chosen.store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

}  // namespace cpu
}  // namespace embscale
