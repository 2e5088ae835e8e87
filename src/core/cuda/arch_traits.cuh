// Architecture facts used by the kernels, in one place: a wave64 port is a new traits entry, not a
// fork of each kernel.
#pragma once

namespace embscale {
namespace cuda {

struct ArchTraits {
  static constexpr int kWarpSize = 32;
  static constexpr int kVectorBytes = 16;        // widest single global load/store per thread
  static constexpr int kMaxThreadsPerBlock = 1024;
  static constexpr unsigned kFullMask = 0xffffffffu;
};

}  // namespace cuda
}  // namespace embscale
