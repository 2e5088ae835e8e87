// Launch defaults of the TBE backward (the zeros of TbeBackwardTuning), one policy struct per
// architecture: the warp / block thresholds on a row's segment length and the block path's threads.
// Host only. NVIDIA runs BackwardPolicySm90 (measured on the H200); AMD runs BackwardPolicyAmd (not
// measured). Evidence for each value: docs/tuning.md#why-each-policy-value-is-what-it-is
#pragma once

#include "embscale/tbe.h"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

struct BackwardPolicySm90 {
  // Warp per row up to 32 lookups, 128 when the lane groups take the rows (widest row at most
  // lane_group_cols columns). docs/tuning.md#tbe-backward-segment-thresholds-and-block-threads
  static constexpr int kMaxWarpSegment = 32;
  static constexpr int kMaxWarpSegmentLaneGroups = 128;
  // Threads of the block path's blocks: 128 and 512 were slower in the same sweeps (same link).
  static constexpr int kBlockThreads = 256;
  static int max_warp_segment(int max_dim, int lane_group_cols) {
    return max_dim <= lane_group_cols ? kMaxWarpSegmentLaneGroups : kMaxWarpSegment;
  }
  static int max_block_segment(int /*max_dim*/) { return TbeBackwardTuning::kDefaultMaxBlockSegment; }
};

// The MI350 design's values (FBGEMM's TBE backward on ROCm), not measured here.
// Sources: docs/tuning.md#tbe-backward-on-amd-gpus
struct BackwardPolicyAmd {
  // Warp per row up to 64 lookups: one lookup a lane of a 64-lane wavefront.
  static constexpr int kMaxWarpSegment = 64;
  // Rows of the dimensions the ROCm warp kernel is specialised for take every segment up to 16384
  // lookups on a warp: the block (CTA) path is all but unused there.
  static constexpr int kMaxWarpSegmentSpecialised = 16384;
  // The specialised dimensions: the D that FBGEMM's hip_warp backward kernel takes.
  static constexpr int kSpecialisedDims[] = {64, 128, 160, 192, 256, 320};
  // Threads of the block path's blocks: the MI350 work cut the CTA to 256 threads (4 wavefronts).
  static constexpr int kBlockThreads = 256;
  static constexpr bool specialised(int d) {
    for (int s : kSpecialisedDims)
      if (d == s) return true;
    return false;
  }
  static int max_warp_segment(int max_dim, int /*lane_group_cols*/) {
    return specialised(max_dim) ? kMaxWarpSegmentSpecialised : kMaxWarpSegment;
  }
  // Never below the warp limit (the block path takes the segments between the two).
  static int max_block_segment(int max_dim) {
    return specialised(max_dim) ? kMaxWarpSegmentSpecialised : TbeBackwardTuning::kDefaultMaxBlockSegment;
  }
};

#if defined(__HIP_PLATFORM_AMD__)
using BackwardPolicy = BackwardPolicyAmd;
#else
using BackwardPolicy = BackwardPolicySm90;
#endif

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
