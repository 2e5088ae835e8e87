// Launch parameters of the FP8 kernels, one policy struct per architecture. Each value carries the
// reason it is what it is and the record that chose it: a file under bench/results/, or "tuning" below,
// the tables of the 2026-11-30 sweeps in docs/tuning.md (section "Tuning sweeps, NVIDIA H200, 2026-11-30":
// "amax: single-cluster path vs grid path by size" and "FP8: A/B of the CUDA tunables", whose columns the
// A/B references below name). The variants those records compared are built in dev/, never in the library.
//
// Only sm_90 (H200) has been measured. Every other NVIDIA architecture runs the sm_90 values (Fp8Policy
// below): no record says otherwise, and a port adds a struct here once it has one. AMD GPUs run
// Fp8PolicyAmd: the sm_90 values but for the choices ROCm's TransformerEngine makes, none measured here.
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
  // cluster wins up to 1 MiB (tuning, "amax: single-cluster path vs grid path by size", and the A/B
  // column vpt2c1m).
  static constexpr int64_t kAmaxClusterMaxBytes = int64_t(1) << 20;
  // Above the cluster limit and up to this many bytes the grid amax is launch-bound: the atomic path
  // zeroes its outputs with memsets and gives each thread kAmaxMidVectorsPerThread vectors (fewer
  // blocks, fewer atomics), TransformerEngine's shape, fastest at 1-4 MiB (tuning, A/B columns te and
  // vpt2c1m: bf16 2^20 4.7 us against 5.9 for the cluster).
  static constexpr int64_t kAmaxMidMaxBytes = int64_t(4) << 20;
  static constexpr int kAmaxMidVectorsPerThread = 2;
  // Larger inputs: one 16-byte vector per thread (up to one resident wave) and the init kernel, whose
  // programmatic-dependent launch overlaps the grid's start (tuning, A/B columns vpt2 and memset: fp32
  // 2^22 6.7 us against 8.3).
  static constexpr int kAmaxGridVectorsPerThread = 1;
  // kAuto above the cluster limit (or without clusters): the atomic grid path (tuning, A/B columns te and
  // vpt2c1m); the two-stage path is bit-identical and taken when asked for.
  static constexpr bool kAmaxAutoTwoStage = false;

  // ---- casts (quantize, dequantize, quantize_current_scaling) ----
  static constexpr int kCastThreads = 512;  // not swept
  // Resident blocks per SM the capped cast grids (dequantize, the from-amax cast of
  // quantize_current_scaling) are capped at: 4 beat 2 (tuning, A/B column cb4: quantize_current_scaling
  // bf16 2^28 316 against 351 us).
  static constexpr int kCastBlocksPerSm = 4;
  // quantize's grid is not capped: one block per kCastThreads x kCastUnroll vectors, each thread casting
  // its kCastUnroll vectors once, the blocks running in waves. Against the capped grid looping over the
  // input (2026-12-02-nvidia-h200-fp8-grids.md, same run): bf16 2^28 201.4 -> 188.2 us, fp32 2^28 323 ->
  // 310, 2^24..2^26 1-2% faster. The from-amax cast keeps the cap: uncapped, its fp32 2^24 and 2^26 were
  // 2% slower (2^28 2% faster).
  static constexpr bool kQuantizeGridCapped = false;
  // quantize's blocks each cast one contiguous run of kCastThreads x kCastUnroll vectors (true), so the
  // resident blocks stream one stretch of x, instead of their vectors lying a grid apart (false):
  // fp32 2^28 310.5 -> 308.1 us, fp32 2^26 79.4 -> 78.6, bf16 2^28 188.4 -> 187.7, bf16 2^24 13.8 -> 14.0
  // (2026-12-02-nvidia-h200-quantize-blocks.md).
  static constexpr bool kQuantizeBlockContiguous = true;
  static constexpr int kCastUnroll = 4;     // 16-byte loads in flight per thread (not swept)
  static constexpr int kDequantUnroll = 2;  // 16 outputs per 16-byte fp8 vector already (not swept)
  // quantize_current_scaling's one-launch cluster path holds x in registers: at most this many
  // vectors per thread, and at most kQcsClusterMaxBytes of input (the amax cluster's limit).
  static constexpr int kQcsVecPerThread = 4;  // not swept
  static constexpr int64_t kQcsClusterMaxBytes = int64_t(1) << 20;
  // quantize_current_scaling's resident path (kAuto, above the cluster path): one cooperative grid of one
  // block of kQcsResidentThreads per SM holds x in registers, at most kQcsResidentVecs vectors a thread
  // (8.6 MB on a 132-SM H200), so x is read from memory once and the grid synchronises once between amax
  // and cast. Used from kQcsResidentMinBytes up to kQcsResidentMaxBytes of x, where it fits the device:
  // against amax + cast (2026-12-03-nvidia-h200-qcs-resident-ab.md, medians of 3 rounds) bf16 2^20 12.0 ->
  // 7.1 us, bf16 2^22 13.6 -> 9.7, fp32 2^21 13.6 -> 8.6. Past 8 MiB, with shared memory holding the rest
  // of x, it lost (bf16 2^23 13.3 -> 14.8, bf16 2^24 21.9 -> 24.1).
  static constexpr int kQcsResidentThreads = 1024;
  static constexpr int kQcsResidentVecs = 4;
  static constexpr int64_t kQcsResidentMinBytes = kQcsClusterMaxBytes;
  static constexpr int64_t kQcsResidentMaxBytes = int64_t(8) << 20;
  // Above the resident path (and wherever it does not run) up to this many bytes of x, kAuto's amax and
  // cast are amax_runs_kernel and quantize_from_amax_runs_kernel: one grid of kQcsRunBlocksPerSm blocks
  // of kQcsRunThreads an SM for both, block b reading and then casting the b-th contiguous run of x, so
  // each run is cast on the SM that read it for the amax and comes from the L2 partition beside it; the
  // grid-stride pair maps x to SMs differently in its two kernels. A/B of the library's two builds
  // (2026-12-04-nvidia-h200-qcs-sm-runs.md, medians of 3 rounds): bf16 2^24 (32 MiB) 21.9 -> 21.2 us,
  // fp32 2^23 19.4 -> 18.8, bf16 2^23 13.7 -> 13.5; at 64 MiB level or 1% slower (bf16 2^25 43.7 -> 44.1),
  // so the limit is 32 MiB. 2 blocks of 512 an SM beat 1 of 1024, 1 of 512 and 4 of 512 in the
  // standalone comparison of the same record (dev/qcs_sm_affinity.cu). The amax pass hands its blocks'
  // partials to the cast through the workspace instead of atomics on a zeroed amax, one launch fewer:
  // bf16 2^24 21.2 -> 20.9 us, fp32 2^23 18.8 -> 18.5, bf16 2^23 13.6 -> 13.4
  // (2026-12-04-nvidia-h200-qcs-runs-partials.md, which also shows why the kernels stay at 32 registers:
  // above it the cast's blocks no longer fit beside the amax's and lose their SM).
  static constexpr int64_t kQcsRunsMaxBytes = int64_t(32) << 20;
  static constexpr int kQcsRunBlocksPerSm = 2;
  static constexpr int kQcsRunThreads = 512;
  // The from-amax cast's loads skip L1 and its stores are evict-first for x of at most this many bytes,
  // so y does not push x out of L2 before the cast reads it again (2026-12-02-nvidia-h200-fp8-grids.md,
  // column nl1: bf16 2^24 (32 MiB) 23.4 -> 21.9 us, fp32 2^24 (64 MiB) 38.8 -> 37.4; 2^26 3-6% slower).
  static constexpr int64_t kQcsStreamingMaxBytes = int64_t(64) << 20;
  // From this many bytes of x on the from-amax cast's grid is not capped (one block per kCastThreads x
  // kCastUnroll vectors, as quantize's): same record, column one: bf16 2^28 (512 MiB) 318 -> 313 us,
  // fp32 2^28 559 -> 549; at 2^26 (128 and 256 MiB) level or 1% slower, so those keep the cap.
  static constexpr int64_t kQcsUncappedMinBytes = int64_t(512) << 20;
  // The from-amax cast walks x last to first, starting on what the amax pass read last and may still
  // sit in L2 (tuning, A/B column norev: bf16 2^28 351 against 365 us forwards).
  static constexpr bool kQcsReverse = true;

  // ---- cast_transpose ----
  // Grid cap in blocks per SM; above it blocks loop over tiles (not swept; the tile geometry is the
  // kernel's own, fp8_transpose.cuh).
  static constexpr int kTransposeMaxBlocksPerSm = 256;
};

// AMD GPUs (HIP build): not measured here, no AMD GPU being available. What differs from sm_90 is what
// ROCm's TransformerEngine chose for its current scaling on MI300/MI350:
//  - kAuto takes the two-stage amax (block maxima into slots, then one block), ROCm TransformerEngine's
//    default since its PR 369 (2025-11: "two-stage HIP amax kernel", atomic only under
//    NVTE_USE_ATOMIC_AMAX=1); there are no clusters on AMD, so the small-input path is the grid's too.
//  - warp reductions over 64 lanes by xor shuffles (32, 16, .., 1), every lane holding the result, as
//    its wave64 reductions do (PR 609); that is core/cuda/lanes.cuh's Warp on CDNA, not a value here.
// Block sizes stay sm_90's: 512- and 1024-thread blocks are 8 and 16 wavefronts of 64 (the block
// reduction's shared arrays hold kMaxThreadsPerBlock / kWarpSize entries at either width).
struct Fp8PolicyAmd : Fp8PolicySm90 {
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
