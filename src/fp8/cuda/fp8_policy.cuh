// Launch parameters of the FP8 kernels, one policy struct per architecture. Only sm_90 (H200) is measured;
// other NVIDIA architectures run its values, AMD GPUs run Fp8PolicyAmd (not measured).
// Evidence for each value: docs/tuning.md#why-each-policy-value-is-what-it-is
#pragma once

#include <cstdint>

namespace embscale {
namespace cuda {

struct Fp8PolicySm90 {
  // ---- amax (amax, quantize_current_scaling's amax pass, activation_amax) ----
  // Values marked "not swept" are the ones the kernels were written with; no record compares others.
  // Threads per block of the grid paths (not swept).
  static constexpr int kAmaxGridThreads = 512;
  // 16-byte loads in flight per thread of every amax kernel (not swept).
  static constexpr int kAmaxUnroll = 4;
  // Threads of the two-stage final block: one block reduces every slot of the largest grid.
  static constexpr int kAmaxReduceThreads = 1024;
  // Threads per block of the cluster paths (amax, activation_amax, quantize_current_scaling).
  static constexpr int kClusterThreads = 1024;
  // kAuto takes the single-cluster path up to this many input bytes, the atomic grid path above: the
  // cluster wins up to 1 MiB. docs/tuning.md#fp8-amax-cluster-limit
  static constexpr int64_t kAmaxClusterMaxBytes = int64_t(1) << 20;
  // Up to this many bytes (launch-bound) the atomic path zeroes with memsets and gives each thread
  // kAmaxMidVectorsPerThread vectors: TransformerEngine's shape, fastest at 1-4 MiB.
  // docs/tuning.md#fp8-amax-mid-sizes
  static constexpr int64_t kAmaxMidMaxBytes = int64_t(4) << 20;
  static constexpr int kAmaxMidVectorsPerThread = 2;
  // Larger inputs: one 16-byte vector per thread and the init kernel, whose programmatic-dependent launch
  // overlaps the grid's start. docs/tuning.md#fp8-amax-large-inputs
  static constexpr int kAmaxGridVectorsPerThread = 1;
  // kAuto above the cluster limit (or without clusters): the atomic grid path, the faster one; the
  // bit-identical two-stage path runs when asked for. docs/tuning.md#fp8-amax-atomic-grid-path-by-default
  static constexpr bool kAmaxAutoTwoStage = false;

  // ---- casts (quantize, dequantize, quantize_current_scaling) ----
  static constexpr int kCastThreads = 512;  // not swept
  // Resident blocks per SM of the capped cast grids (dequantize, the from-amax cast of
  // quantize_current_scaling): 4 beat 2. docs/tuning.md#fp8-casts-blocks-per-sm-of-the-capped-grids
  static constexpr int kCastBlocksPerSm = 4;
  // quantize's grid is not capped (one block per kCastThreads x kCastUnroll vectors, in waves): faster
  // than a capped grid looping over the input. docs/tuning.md#fp8-quantize-uncapped-grid
  static constexpr bool kQuantizeGridCapped = false;
  static constexpr int kCastUnroll = 4;     // 16-byte loads in flight per thread (not swept)
  static constexpr int kDequantUnroll = 2;  // 16 outputs per 16-byte fp8 vector already (not swept)
  // quantize_current_scaling's one-launch cluster path holds x in registers: at most this many
  // vectors per thread, and at most kQcsClusterMaxBytes of input (the amax cluster's limit).
  static constexpr int kQcsVecPerThread = 4;  // not swept
  static constexpr int64_t kQcsClusterMaxBytes = int64_t(1) << 20;
  // quantize_current_scaling's resident path (kAuto, x of kQcsResidentMinBytes up to kQcsResidentMaxBytes
  // where it fits): one cooperative grid of one block of kQcsResidentThreads per SM holds x in registers,
  // at most kQcsResidentVecs vectors a thread, so x is read from memory once.
  // docs/tuning.md#fp8-current-scaling-resident-grid
  static constexpr int kQcsResidentThreads = 1024;
  static constexpr int kQcsResidentVecs = 4;
  static constexpr int64_t kQcsResidentMinBytes = kQcsClusterMaxBytes;
  static constexpr int64_t kQcsResidentMaxBytes = int64_t(8) << 20;
  // Above the resident path, up to this many bytes of x, kAuto's amax and cast are amax_runs_kernel and
  // quantize_from_amax_runs_kernel: one grid of kQcsRunBlocksPerSm blocks of kQcsRunThreads an SM for
  // both, block b reading and then casting the b-th contiguous run of x, so each run is cast on the SM
  // that read it (from the L2 partition beside it). docs/tuning.md#fp8-current-scaling-per-sm-runs
  static constexpr int64_t kQcsRunsMaxBytes = int64_t(32) << 20;
  static constexpr int kQcsRunBlocksPerSm = 2;
  static constexpr int kQcsRunThreads = 512;
  // The from-amax cast's loads skip L1 and its stores are evict-first for x of at most this many bytes,
  // so y does not push x out of L2 before the cast reads it again.
  // docs/tuning.md#fp8-current-scaling-streaming-hints
  static constexpr int64_t kQcsStreamingMaxBytes = int64_t(64) << 20;
  // From this many bytes of x on the from-amax cast's grid is not capped (as quantize's); smaller inputs
  // keep the cap. docs/tuning.md#fp8-current-scaling-uncapped-cast-grid
  static constexpr int64_t kQcsUncappedMinBytes = int64_t(512) << 20;
  // The from-amax cast walks x last to first, starting on what the amax pass read last and may still
  // sit in L2. docs/tuning.md#fp8-current-scaling-reverse-cast
  static constexpr bool kQcsReverse = true;

  // ---- cast_transpose ----
  // Grid cap in blocks per SM; above it blocks loop over tiles (not swept; the tile geometry is the
  // kernel's own, fp8_transpose.cuh).
  static constexpr int kTransposeMaxBlocksPerSm = 256;
};

// AMD GPUs (HIP build), not measured here: the sm_90 values but for ROCm TransformerEngine's choices.
// docs/tuning.md#fp8-on-amd-gpus
struct Fp8PolicyAmd : Fp8PolicySm90 {
  // kAuto takes the two-stage amax, ROCm TransformerEngine's default (no clusters on AMD).
  static constexpr bool kAmaxAutoTwoStage = true;
};

// The policy of the architecture being compiled (NVIDIA: only sm_90 is measured; see above).
#if defined(__HIP_PLATFORM_AMD__)
using Fp8Policy = Fp8PolicyAmd;
#else
using Fp8Policy = Fp8PolicySm90;
#endif

}  // namespace cuda
}  // namespace embscale
