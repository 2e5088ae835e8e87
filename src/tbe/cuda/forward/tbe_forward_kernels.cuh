// CUDA table-batched embedding forward: the kernels (launch and dtype dispatch live in tbe_forward.cu).
//
// Work mapping. The grid is 2-D: blockIdx.y is the feature, blockIdx.x a tile of that feature's bags,
// so every thread of a block sees the same D and takes the same code path (no divergence on D, and
// mixed-D launches need no schedule in memory). A bag is owned by a group of G lanes (G a power of
// two, 1..32): a row of D elements is cut into `units` vectors of kBytes (16, 8, 4 or one element),
// G = min(32, next_pow2(units)), and each lane owns one vector column of the row. So D=128 fp32 is a
// warp per bag (32 x 16 B), D=32 fp32 four bags per warp, D=1 fp32 32 bags per warp. Rows wider than
// 32 vectors are covered in passes of 32 vectors, each pass walking the bag's lookups again (the
// indices are re-read from L1/L2; they are 1-2% of the bytes of such rows).
//
// Memory-level parallelism. Each lane walks its bag kUnroll lookups at a time: it loads the kUnroll
// indices (the group's lanes read the same address, one transaction), then issues kUnroll independent
// row loads, then accumulates. kUnroll 16-byte loads per lane keep 4 KB per warp in flight, which at
// 16+ resident warps per SM covers HBM latency at full bandwidth.
//
// Vector paths. The widest of 16/8/4 bytes that divides the row's bytes and the table's base address
// (so every row of the table is aligned) is used; otherwise one element per lane. The choice is made
// at runtime per feature (kernel_plan, shared with the host for the grid size), so the instantiated set
// stays weights x output x index dtypes.
//
// Numerics and determinism. Every output element is accumulated in fp32 by one lane, in the order of
// the bag's indices: acc = acc + w * x with separate correctly rounded multiply and add (no FMA
// contraction; unweighted lookups use w = 1, which is exact), MEAN divides by the count of valid
// lookups with a correctly rounded division, and the result is rounded once to the output dtype. No
// atomics touch the output, so results are bit-identical across runs and equal to a sequential fp32
// loop over the bag.
//
// Bounds checks (tbe.h). Every bag is clamped to an in-bounds range ([0, N], empty when its offsets
// decrease) in every mode, so no bag reads outside the indices. Off mode trusts the indices (see
// docs/tbe_forward_cuda.md for what a per-lookup clamp costs). In error and skip modes a decrease is also
// recorded, and an index outside [0, E) contributes nothing. Skip mode adds the bag's skipped count to a
// scratch counter with one atomic per bag that has any; error mode keeps the smallest invalid position with an atomic max
// of ~position. tbe_bounds_finalize_kernel (tbe/cuda/bounds_check.cuh) then checks offsets[0] and the
// last offset, turns the records into a report (or the skip count into *num_skipped) and clears them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/numerics.h"
#include "core/cuda/arch_traits.cuh"
#include "core/cuda/vec.cuh"
#include "tbe/cuda/bounds_check.cuh"
#include "tbe/cuda/forward/forward_plan.h"
#include "tbe/cuda/forward/forward_policy.cuh"

namespace embscale {
namespace cuda {
namespace tbe_fwd {

// The check modes, scratch words, report kinds and record_min_position (shared with the backward).
using namespace tbe_bounds;

enum PoolKind : int { kPoolSum = 0, kPoolMean = 1, kPoolNone = 2 };
// Plain parameters of one forward call (pointers are device memory).
struct TbeForwardParams {
  const void* weights;            // [num_weights] of W
  const void* indices;            // [N] of I
  const void* offsets;            // [T*B+1] of I
  const float* per_sample_weights;  // [N] or null
  void* output;                   // pooled [B, total_dim] or sequence [N, D], of O
  const int64_t* weight_offsets;  // [T] element offset of each feature's table
  const int64_t* num_rows;        // [T]
  const int32_t* dims;            // [T]
  const int32_t* output_offsets;  // [T+1]
  int64_t* scratch;               // [8]
  int64_t batch_size;             // B
  int64_t num_indices;            // N
  int64_t out_row_stride;         // total_dim (pooled) or D (sequence), elements
  int num_features;               // T
  int pooling;                    // PoolKind
  int check;                      // CheckKind
  int kernel;                     // FwdKernel: which kernel runs the call (chosen on the host)
};

// ---- loads and stores: core/cuda/vec.cuh. Weights are read-only for the kernel's lifetime: the
// non-coherent path (LDG.E.*.CONSTANT), without L1 allocation where the config says kNoAlloc (rows of
// a uniform lookup are rarely reused; L2 still caches). ----

template <class C>
constexpr LoadHint kRowLoad = C::kNoAlloc ? LoadHint::kReadOnlyNoL1 : LoadHint::kReadOnly;

// Output bits of one value: fp32 as is; fp16/bf16 rounded to nearest even by the shared routines.
template <typename O>
__device__ __forceinline__ uint32_t out_bits(float v);
template <>
__device__ __forceinline__ uint32_t out_bits<float>(float v) { return __float_as_uint(v); }
template <>
__device__ __forceinline__ uint32_t out_bits<fp16_t>(float v) { return float_to_fp16(v); }
template <>
__device__ __forceinline__ uint32_t out_bits<bf16_t>(float v) { return float_to_bf16(v); }

// Stores V values at dst. Output is written once and never re-read by the kernel: streaming stores
// (evict-first) keep L2 for the rows that are looked up again.
template <typename O, int V>
__device__ __forceinline__ void store_out(O* dst, const float* v) {
  constexpr int kBytes = V * static_cast<int>(sizeof(O));
  constexpr int kChunk = kBytes >= 16 ? 16 : kBytes;
  if constexpr (kChunk >= 4) {
    if ((reinterpret_cast<uintptr_t>(dst) & (kChunk - 1)) == 0) {
      uint32_t w[kBytes / 4];
#pragma unroll
      for (int i = 0; i < kBytes / 4; ++i) {
        if constexpr (sizeof(O) == 4) {
          w[i] = out_bits<O>(v[i]);
        } else {
          w[i] = out_bits<O>(v[2 * i]) | (out_bits<O>(v[2 * i + 1]) << 16);
        }
      }
      char* d = reinterpret_cast<char*>(dst);
#pragma unroll
      for (int c = 0; c < kBytes / kChunk; ++c)
        store_words<kChunk, StoreHint::kStreaming>(d + kChunk * c, w + c * (kChunk / 4));
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    if constexpr (sizeof(O) == 4) {
      __stcs(reinterpret_cast<unsigned int*>(dst + i), out_bits<O>(v[i]));
    } else {
      __stcs(reinterpret_cast<unsigned short*>(dst + i), static_cast<unsigned short>(out_bits<O>(v[i])));
    }
  }
}

template <typename I>
__device__ __forceinline__ int64_t load_index(const I* p) {
  if constexpr (sizeof(I) == 8) {
    return static_cast<int64_t>(__ldg(reinterpret_cast<const long long*>(p)));
  } else {
    return static_cast<int64_t>(__ldg(reinterpret_cast<const int*>(p)));
  }
}

// ---- one feature's bags, for one vector width and pooled or sequence output ----

// kPlain: no per-sample weights, a table of at most 2^32 rows and rows of fewer than 2^32 bytes (the
// caller tested all three), so a row's byte offset is a 32 x 32-bit product and it adds its row as is
// (w = 1 is exact: the same bits, without the multiply). Without kCheck (bounds checks off) every lookup
// of a full step is also present, so the step carries no per-lookup predicate; with kCheck (p.check skip
// or error) each index is tested against the table as in the general form. Under Zipf, where most rows
// come from L1/L2, the kernel is bound by issued instructions (docs/tbe_forward_cuda.md, History).
template <typename W, typename O, typename I, int kBytes, bool kPooled, typename C, bool kPlain, bool kCheck = false>
__device__ __forceinline__ void tbe_forward_feature(const TbeForwardParams& p, int f, const W* table,
                                                    const RowPlan plan, int64_t tile0, int64_t tiles) {
  constexpr int V = kBytes / static_cast<int>(sizeof(W));  // elements per lane per vector
  constexpr int kU = C::kUnroll;
  constexpr int kC = C::kVecs;
  static_assert((kU & (kU - 1)) == 0 && kU <= 32, "kUnroll: a power of two up to 32 (a chunk of a group is whole steps)");
  const I* indices = static_cast<const I*>(p.indices);
  const I* offsets = static_cast<const I*>(p.offsets);
  const float* psw = kPlain ? nullptr : p.per_sample_weights;
  O* out = static_cast<O*>(p.output);
  const int64_t B = p.batch_size;
  const int64_t N = p.num_indices;
  const int64_t D = p.dims[f];
  const int64_t E = p.num_rows[f];
  static_assert(kPlain || !kCheck, "kCheck selects the plain form's checked variant");
  const bool check = kPlain ? kCheck : p.check != kCheckOff;
  const uint32_t row_bytes = static_cast<uint32_t>(D) * static_cast<uint32_t>(sizeof(W));
  const int group = plan.group;
  const int pass = group * kC;  // vectors covered by one pass over the bag's lookups
  const int gi = static_cast<int>(threadIdx.x) / group;
  const int rank = static_cast<int>(threadIdx.x) - gi * group;
  const int bags_per_block = C::kBlock / group;
  const int64_t out_col = kPooled ? p.output_offsets[f] : 0;

  for (int64_t b = tile0 * bags_per_block + gi; b < B; b += tiles * bags_per_block) {
    const int64_t item = static_cast<int64_t>(f) * B + b;
    int64_t start = static_cast<int64_t>(offsets[item]);
    int64_t end = static_cast<int64_t>(offsets[item + 1]);
    if (check && end < start && rank == 0) record_min_position(p.scratch + kBadOffsetKey, item + 1);
    // Clamped in every mode, so broken offsets never make a bag read outside the indices (off mode
    // included); in error and skip modes the finalize kernel reports them.
    start = start < 0 ? 0 : (start > N ? N : start);
    end = end < start ? start : (end > N ? N : end);
    if (!kPooled && item == 0) {
      // Sequence rows before the first bag belong to no bag: zeros.
      const float zero[V] = {};
      for (int64_t q = 0; q < start; ++q)
        for (int u = rank; u < plan.units; u += group) store_out<O, V>(out + q * p.out_row_stride + u * V, zero);
    }

    int64_t valid = 0;
    for (int u0 = 0; u0 < plan.units; u0 += pass) {
      // Lane rank owns vectors u0 + rank + c * group, c < kC. Inactive ones (u >= units) read a column
      // of row 0 that exists, so loads need no predicate.
      int u[kC];
      bool active[kC];
      const W* col[kC];
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        u[c] = u0 + rank + c * group;
        active[c] = u[c] < plan.units;
        col[c] = table + static_cast<int64_t>(active[c] ? u[c] : 0) * V;
      }
      const bool first_pass = u0 == 0;
      float acc[kC][V];
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[c][k] = 0.0f;
      valid = 0;

      int64_t idx[kU];  // the step's indices, filled before each step
      // One step of kU lookups from s with their indices idx. The checks, then all row loads, then
      // the adds in index order: kU x kC rows in flight per lane. Full steps carry no predicates at all
      // (ptxas then issues every row load before the first add); only the bag's last, partial step
      // tests s + j < end. An invalid index loads a column of row 0 (always present) and is dropped,
      // so no load depends on a predicate computed from the indices.
      const auto step = [&](int64_t s, auto full) {
        constexpr bool kFull = decltype(full)::value;
        unsigned present = 0;  // bit j: lookup s+j exists and its index is valid
        unsigned invalid = 0;  // bit j: lookup s+j exists and its index is outside [0, E)
#pragma unroll
        for (int j = 0; j < kU; ++j) {
          const bool in = kFull || s + j < end;
          const bool ok = !check || static_cast<uint64_t>(idx[j]) < static_cast<uint64_t>(E);
          present |= static_cast<unsigned>(in && ok) << j;
          invalid |= static_cast<unsigned>(in && !ok) << j;
        }
        if ((!kPlain || kCheck) && invalid != 0 && p.check == kCheckError && first_pass && rank == 0)
          record_min_position(p.scratch + kBadIndexKey, s + __ffs(invalid) - 1);
        Words<kBytes> raw[kU][kC];
#pragma unroll
        for (int j = 0; j < kU; ++j) {
          if constexpr (kPlain) {
            // Valid indices below 2^32 (the caller's condition): a 32 x 32 -> 64-bit byte offset, one
            // multiply-add per row instead of a 64-bit multiply and a scaled add.
            const bool load = kCheck ? (present >> j & 1u) != 0 : (kFull || s + j < end);
            const uint64_t off = load ? static_cast<uint64_t>(static_cast<uint32_t>(idx[j])) * row_bytes : 0;
#pragma unroll
            for (int c = 0; c < kC; ++c)
              raw[j][c] = load_words<kBytes, kRowLoad<C>>(reinterpret_cast<const char*>(col[c]) + off);
          } else {
            const int64_t row = (present >> j & 1u) ? idx[j] * D : 0;
#pragma unroll
            for (int c = 0; c < kC; ++c)
              raw[j][c] = (kFull || s + j < end) ? load_words<kBytes, kRowLoad<C>>(col[c] + row) : zero_words<kBytes>();
          }
        }
        float sw[kU];
#pragma unroll
        for (int j = 0; j < kU; ++j)
          sw[j] = (!kPlain && psw != nullptr && (kFull || s + j < end)) ? __ldg(psw + s + j) : 1.0f;
        valid += __popc(present);
#pragma unroll
        for (int j = 0; j < kU; ++j) {
          const bool ok = (present >> j & 1u) != 0;
#pragma unroll
          for (int c = 0; c < kC; ++c) {
            float x[V];
            words_to_floats<W, kBytes>(raw[j][c], x);
            if constexpr (kPooled) {
              if (ok) {
#pragma unroll
                for (int k = 0; k < V; ++k)
                  acc[c][k] = __fadd_rn(acc[c][k], kPlain ? x[k] : __fmul_rn(sw[j], x[k]));
              }
            } else {
              // Sequence: row q is the (weighted) looked-up row, zeros for an invalid index.
              const int64_t q = s + j;
              if ((kFull || q < end) && active[c]) {
#pragma unroll
                for (int k = 0; k < V; ++k) x[k] = ok ? (kPlain ? x[k] : __fmul_rn(sw[j], x[k])) : 0.0f;
                store_out<O, V>(out + q * p.out_row_stride + static_cast<int64_t>(u[c]) * V, x);
              }
            }
          }
        }
      };

      int64_t s = start;
      for (; s + kU <= end; s += kU) {
        // The group's lanes read the same address: one transaction per index.
#pragma unroll
        for (int j = 0; j < kU; ++j) idx[j] = load_index(indices + s + j);
        step(s, std::true_type{});
      }
      if (s < end) {
#pragma unroll
        for (int j = 0; j < kU; ++j) idx[j] = s + j < end ? load_index(indices + s + j) : 0;
        step(s, std::false_type{});
      }

      if constexpr (kPooled) {
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          if (active[c]) {
            if (p.pooling == kPoolMean && valid > 0) {
              const float n = static_cast<float>(valid);
#pragma unroll
              for (int k = 0; k < V; ++k) acc[c][k] = __fdiv_rn(acc[c][k], n);
            }
            store_out<O, V>(out + b * p.out_row_stride + out_col + static_cast<int64_t>(u[c]) * V, acc[c]);
          }
        }
      }
    }
    if (p.check == kCheckSkip && rank == 0 && end > start + valid) {
      atomicAdd(reinterpret_cast<unsigned long long*>(p.scratch + kSkipCount),
                static_cast<unsigned long long>(end - start - valid));
    }
  }
}

// grid = (bag tiles, features); block = C::kBlock (C: a FwdConfig, forward_policy.cuh).
// Pooled and sequence outputs are separate kernels: the sequence loop keeps more values live (a store
// per lookup) and would otherwise set the register budget, and so the occupancy, of the pooled kernel.
template <typename W, typename O, typename I, bool kPooled, typename C = ForwardPolicy::Bags>
__global__ void __launch_bounds__(C::kBlock, kPooled ? C::kMinBlocks : C::kMinBlocksSequence)
    tbe_forward_bags_kernel(const TbeForwardParams p) {
  const int64_t tile0 = blockIdx.x;
  const int64_t tiles = gridDim.x;
  for (int f = static_cast<int>(blockIdx.y); f < p.num_features; f += static_cast<int>(gridDim.y)) {
    const W* table = static_cast<const W*>(p.weights) + p.weight_offsets[f];
    const RowPlan plan =
        kernel_plan(p.dims[f], static_cast<int>(sizeof(W)), reinterpret_cast<uintptr_t>(table), C::kVecs);
    // The plain form (no checks, no per-sample weights) for the vector paths; the narrow paths
    // (rows not a multiple of 8 bytes) keep one general form.
    // (Row byte offsets are 32 x 32-bit products: tables of at most 2^32 rows of fewer than 2^32 bytes.)
    const bool plain = p.check == kCheckOff && p.per_sample_weights == nullptr &&
                       p.num_rows[f] <= (int64_t{1} << 32) &&
                       static_cast<int64_t>(p.dims[f]) * static_cast<int64_t>(sizeof(W)) < (int64_t{1} << 32);
    switch (plan.vec_bytes) {
      case 16:
        if (C::kVecs == 1 && plan.vecs == 2) {
          using Wide = FwdConfig<C::kBlock, C::kMinBlocks, (C::kUnroll > 1 ? C::kUnroll / 2 : 1), 2, C::kNoAlloc>;
          if (plain) tbe_forward_feature<W, O, I, 16, kPooled, Wide, true>(p, f, table, plan, tile0, tiles);
          else tbe_forward_feature<W, O, I, 16, kPooled, Wide, false>(p, f, table, plan, tile0, tiles);
        } else if (plain) {
          tbe_forward_feature<W, O, I, 16, kPooled, C, true>(p, f, table, plan, tile0, tiles);
        } else {
          tbe_forward_feature<W, O, I, 16, kPooled, C, false>(p, f, table, plan, tile0, tiles);
        }
        break;
      case 8:
        if (plain) tbe_forward_feature<W, O, I, 8, kPooled, C, true>(p, f, table, plan, tile0, tiles);
        else tbe_forward_feature<W, O, I, 8, kPooled, C, false>(p, f, table, plan, tile0, tiles);
        break;
      case 4:
        if constexpr (sizeof(W) < 4) {
          tbe_forward_feature<W, O, I, 4, kPooled, C, false>(p, f, table, plan, tile0, tiles);
          break;
        }
        [[fallthrough]];
      default:
        tbe_forward_feature<W, O, I, static_cast<int>(sizeof(W)), kPooled, C, false>(p, f, table, plan, tile0, tiles);
        break;
    }
  }
}

}  // namespace tbe_fwd
}  // namespace cuda
}  // namespace embscale
