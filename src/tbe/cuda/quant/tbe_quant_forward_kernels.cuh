// The CUDA quantized TBE forward's kernel (launch, grid and the bounds-check protocol: tbe_quant_forward.cu).
//
// Work mapping. As the training forward: blockIdx.y is the feature, blockIdx.x a tile of its bags, so every
// thread of a block reads one table of one weight type and one D. A bag is owned by a group of G lanes
// (tbe_quant_plan.h): on the vector path each lane owns `per_lane` chunks of the row's data (16 bytes; 8 for
// int2), loads each from the aligned chunk that holds its start plus, past a 4-byte header, the next aligned
// word, decodes them in registers and adds the values into fp32 sums it holds for those columns; on the
// scalar path (rows not aligned to a chunk) each lane reads its columns byte by byte. A lane issues
// kLoadsInFlight row loads (lookups x chunks) before its first add, the next step's indices load while a
// step's rows are in flight, and the group's lanes read the same index and header addresses (one
// transaction each).
//
// Instantiations. The weight type is a switch per feature inside the kernel (block-uniform, so no
// divergence), the output dtype a switch at each store, per-sample weights a branch per feature; the
// templates are the index dtype and pooled or sequence output: 4 kernels, each with 8 types x 2 paths x
// weighted or not.
//
// Numerics (the CPU forward's, term for term, so the two agree to the bit on the same bytes). An int value
// is float(q) * scale + bias with two roundings, computed as fma(2^23 + q, scale, -2^23 * scale) + bias
// (2^23 + q is the code's bits in the mantissa of 2^23, and the fma's exact sum is q * scale, so it rounds
// to float(q) * scale; a row with a non-finite scale or bias takes the plain product, whose inf/NaN differ), an
// fp8 value code * scale (the code decoded exactly through fp16), fp16, bf16 and fp32 values exact. Each
// output element is summed by one lane in the order of the bag's indices, acc = acc + w * value with
// separate roundings (unweighted: acc + value, the same bits as w = 1), MEAN divides by the count of
// valid lookups (a correctly rounded division), and the result is rounded once to the output dtype. No
// atomics touch the output: bit-identical across runs. (The one difference from the CPU: q = 0 with a
// negative scale gives +0 here where q * scale is -0, which shows only as a zero's sign in a sequence row
// whose bias is zero.)
//
// Bounds. Every bag is clamped into [0, N] in every mode, and an index outside [0, E) is dropped in every
// mode, off included (the CPU backend's rule for this op: no mode reads outside a table); invalid and absent
// lookups load row 0, which always exists, so no load depends on a predicate. Error and skip modes record
// what they find in the object's scratch words for tbe_bounds_finalize_kernel (tbe/cuda/bounds_check.cuh).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda/vec.cuh"
#include "core/numerics.h"
#include "tbe/cuda/bounds_check.cuh"
#include "tbe/cuda/quant/tbe_quant_plan.h"

namespace embscale {
namespace cuda {
namespace tbe_quant_fwd {

using namespace tbe_bounds;  // check modes, scratch words, record_min_position

enum PoolKind : int { kPoolSum = 0, kPoolMean = 1, kPoolNone = 2 };
enum OutKind : int { kOutF32 = 0, kOutF16 = 1, kOutBF16 = 2 };

// Plain parameters of one forward call (pointers are device memory).
struct QuantForwardParams {
  const uint8_t* weights;           // the packed tables
  const void* indices;              // [N] of I
  const void* offsets;              // [T*B+1] of I
  const float* per_sample_weights;  // [N] or null
  void* output;                     // pooled [B, total_dim] or sequence [N, D], of out_kind
  const int64_t* table_offsets;     // [T] bytes
  const int64_t* num_rows;          // [T]
  const int64_t* row_bytes;         // [T]
  const int32_t* dims;              // [T]
  const int32_t* types;             // [T] QuantWeightType
  const int32_t* output_offsets;    // [T+1]
  int64_t* scratch;                 // [8]
  int64_t batch_size;               // B
  int64_t num_indices;              // N
  int64_t out_row_stride;           // total_dim (pooled) or D (sequence), elements
  int num_features;                 // T
  int pooling;                      // PoolKind
  int check;                        // CheckKind
  int out_kind;                     // OutKind
};

// ---- decoding -----------------------------------------------------------------------------------------

// The header of a row: int rows' (scale, bias), fp8 rows' (scale, 0); float rows have none.
struct Header {
  float scale, bias;
  float shift;     // int rows: -2^23 * scale (exact for a finite scale)
  uint32_t two23;  // 2^23's bits, 0x4B000000 (two23_bits)
};

// 2^23's bits as a value the compiler cannot fold. With both this word and a byte_perm's selector constant,
// ptxas makes the word the immediate and keeps the selectors in registers, which it rebuilds before each
// use under register pressure: one more instruction a value. From a register, the selectors are immediates.
__device__ __forceinline__ uint32_t two23_bits(int num_features) {
  return 0x4B000000u | (static_cast<uint32_t>(num_features) >> 31);  // num_features >= 0
}
constexpr bool is_int(QuantWeightType t) { return value_bits(t) < 8 || t == QuantWeightType::kInt8; }
// kFinite: the header's scale and bias are finite (header_finite), and the hardware's conversion (exact for
// every finite fp16) replaces the software one, which keeps a NaN's payload as the CPU does.
template <QuantWeightType kType, bool kFinite>
__device__ __forceinline__ Header header_of(uint32_t word, uint32_t two23) {
  if constexpr (is_int(kType)) {
    float sb[2];  // scale (the low half), bias
    if constexpr (kFinite) {
      word_to_floats<fp16_t>(word, sb);
    } else {
      sb[0] = fp16_to_float(static_cast<uint16_t>(word & 0xffffu));
      sb[1] = fp16_to_float(static_cast<uint16_t>(word >> 16));
    }
    return Header{sb[0], sb[1], __fmul_rn(-8388608.0f, sb[0]), two23};
  } else if constexpr (kType == QuantWeightType::kFp8E4M3 || kType == QuantWeightType::kFp8E5M2) {
    return Header{__uint_as_float(word), 0.0f, 0.0f, two23};
  } else {
    return Header{1.0f, 0.0f, 0.0f, two23};
  }
}

// An int row's header word holds a finite scale and bias (neither fp16 exponent all ones).
__device__ __forceinline__ bool header_finite(uint32_t word) {
  return (word & 0x7c00u) != 0x7c00u && (word & 0x7c000000u) != 0x7c000000u;
}

// q * scale + bias for x = 2^23 + q, a code q < 2^23 in the mantissa of 2^23 (exact, with no int-to-float
// conversion, which runs at a quarter of the fp32 rate): the fma's exact result is q * scale, rounded once
// as the product would be. kFinite false (a non-finite scale or bias): the plain product of x - 2^23.
template <bool kFinite>
__device__ __forceinline__ float int_value(float x, const Header& h) {
  if constexpr (kFinite) return __fadd_rn(__fmaf_rn(x, h.scale, h.shift), h.bias);
  else return __fadd_rn(__fmul_rn(__fsub_rn(x, 8388608.0f), h.scale), h.bias);
}

// Two fp8 codes (the low 16 bits of `pair`, the lower column first) as fp32, exactly: e5m2 is the high byte
// of an fp16; e4m3 goes through the fp8x2 -> fp16x2 conversion (exact for every code, NaN to NaN).
// (The HIP build has no fp8x2 conversion: it decodes each e4m3 code in software, as exactly.)
template <QuantWeightType kType>
__device__ __forceinline__ float2 fp8_pair(uint32_t pair) {
#if defined(__HIP_PLATFORM_AMD__)
  if constexpr (kType == QuantWeightType::kFp8E4M3)
    return make_float2(e4m3_to_float(static_cast<uint8_t>(pair & 0xffu)),
                       e4m3_to_float(static_cast<uint8_t>((pair >> 8) & 0xffu)));
#endif
  __half2_raw h;
  if constexpr (kType == QuantWeightType::kFp8E5M2) {
    const uint32_t w = __byte_perm(pair, 0u, 0x1404u);  // bytes [0, b0, 0, b1]
    h.x = static_cast<unsigned short>(w & 0xffffu);
    h.y = static_cast<unsigned short>(w >> 16);
  } else {
#if !defined(__HIP_PLATFORM_AMD__)
    h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
#endif
  }
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// The chunk_values(kType) values of one chunk's data words, in column order (kFinite: int_value's).
template <QuantWeightType kType, int kWords, bool kFinite>
__device__ __forceinline__ void decode_chunk(const uint32_t* w, const Header& h, float* v) {
  if constexpr (kType == QuantWeightType::kFp32) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) v[i] = __uint_as_float(w[i]);
  } else if constexpr (kType == QuantWeightType::kFp16) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) word_to_floats<fp16_t>(w[i], v + 2 * i);
  } else if constexpr (kType == QuantWeightType::kBf16) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) word_to_floats<bf16_t>(w[i], v + 2 * i);
  } else if constexpr (is_int(kType)) {
    // Code c of byte k (the low bits hold the lower column) masked into byte k of m, then moved into the
    // mantissa of 2^23: bytes [m_k, 0, 0, 0x4B].
    constexpr int kBits = value_bits(kType);
    constexpr int kPerByte = 8 / kBits;
    constexpr uint32_t kMask = ((1u << kBits) - 1u) * 0x01010101u;
#pragma unroll
    for (int i = 0; i < kWords; ++i)
#pragma unroll
      for (int c = 0; c < kPerByte; ++c) {
        const uint32_t m = kBits == 8 ? w[i] : (w[i] >> (kBits * c)) & kMask;
#pragma unroll
        for (int k = 0; k < 4; ++k)
          v[4 * kPerByte * i + kPerByte * k + c] =
              int_value<kFinite>(__uint_as_float(__byte_perm(m, h.two23, 0x7440u | k)), h);
      }
  } else {  // fp8
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const float2 lo = fp8_pair<kType>(w[i]), hi = fp8_pair<kType>(w[i] >> 16);
      v[4 * i] = __fmul_rn(lo.x, h.scale);
      v[4 * i + 1] = __fmul_rn(lo.y, h.scale);
      v[4 * i + 2] = __fmul_rn(hi.x, h.scale);
      v[4 * i + 3] = __fmul_rn(hi.y, h.scale);
    }
  }
}

// ---- the two ways of reading a row: R::kSlots slots a lane, R::kValues values a slot -----------------

// Vector path: slot k is the row's data chunk k (data bytes [k * kChunk, (k + 1) * kChunk)). Without a
// header that is the aligned chunk k; behind the 4-byte header it is the last words of the aligned chunk k
// and the first word of chunk k + 1, loaded where it holds data (it then lies inside the row: rows are a
// whole number of chunks).
template <QuantWeightType kType>
struct VectorRows {
  static constexpr int kChunk = chunk_bytes(kType);
  static constexpr int kWords = kChunk / 4;
  static constexpr bool kHeader = header_size(kType) > 0;
  static_assert(header_size(kType) == 0 || header_size(kType) == 4, "the header is one word or none");
  static constexpr int kSlots = chunks_per_lane(kType);
  static constexpr int kValues = chunk_values(kType);
  struct Raw {
    uint32_t w[kWords + (kHeader ? 1 : 0)];  // the aligned chunk, then (behind a header) the next word
  };
  // The header word of an aligned row (kChunk >= 8 divides the row's address).
  static __device__ __forceinline__ uint32_t header_word(const uint8_t* row) {
    if constexpr (kHeader) return __ldg(reinterpret_cast<const unsigned int*>(row));
    return 0u;
  }
  // `used`: the row's header and data bytes; the next word is loaded where it holds data (0 otherwise).
  static __device__ __forceinline__ Raw load(const uint8_t* row, int slot, int used) {
    const uint8_t* at = row + slot * kChunk;
    const Words<kChunk> a = load_words<kChunk, LoadHint::kReadOnly>(at);
    Raw r;
#pragma unroll
    for (int i = 0; i < kWords; ++i) r.w[i] = a.w[i];
    if constexpr (kHeader)
      r.w[kWords] = (slot + 1) * kChunk < used ? __ldg(reinterpret_cast<const unsigned int*>(at + kChunk)) : 0u;
    return r;
  }
  template <bool kFinite>
  static __device__ __forceinline__ void decode(const Raw& r, const Header& h, float* v) {
    decode_chunk<kType, kWords, kFinite>(r.w + (kHeader ? 1 : 0), h, v);  // the data words
  }
  // The column of the slot's first value.
  static __device__ __forceinline__ int64_t first_column(int slot) { return static_cast<int64_t>(slot) * kValues; }
};

// Scalar path (rows at any byte alignment): slot c is column c, read byte by byte.
template <QuantWeightType kType>
struct ScalarRows {
  static constexpr int kSlots = QuantForwardPolicy::kScalarColumns;
  static constexpr int kValues = 1;
  struct Raw {
    uint32_t bits;  // the column's code or element, in the low bits
  };
  static __device__ __forceinline__ uint32_t bytes_le(const uint8_t* p, int n) {
    uint32_t x = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (i < n) x |= static_cast<uint32_t>(__ldg(p + i)) << (8 * i);
    return x;
  }
  static __device__ __forceinline__ uint32_t header_word(const uint8_t* row) {
    if constexpr (header_size(kType) > 0) return bytes_le(row, 4);
    return 0u;
  }
  static __device__ __forceinline__ Raw load(const uint8_t* row, int c, int /*used*/) {
    constexpr int kBits = value_bits(kType);
    const uint8_t* data = row + header_size(kType);
    if constexpr (kBits < 8) {
      constexpr int kPerByte = 8 / kBits;
      return Raw{(static_cast<uint32_t>(__ldg(data + c / kPerByte)) >> ((c % kPerByte) * kBits)) & ((1u << kBits) - 1u)};
    } else {
      return Raw{bytes_le(data + static_cast<int64_t>(c) * (kBits / 8), kBits / 8)};
    }
  }
  template <bool kFinite>
  static __device__ __forceinline__ void decode(const Raw& r, const Header& h, float* v) {
    if constexpr (is_int(kType)) {
      v[0] = int_value<kFinite>(__uint_as_float(h.two23 | r.bits), h);
    } else if constexpr (kType == QuantWeightType::kFp8E4M3 || kType == QuantWeightType::kFp8E5M2) {
      v[0] = __fmul_rn(fp8_pair<kType>(r.bits).x, h.scale);
    } else if constexpr (kType == QuantWeightType::kFp32) {
      v[0] = __uint_as_float(r.bits);
    } else {
      v[0] = half_word_to_float<std::conditional_t<kType == QuantWeightType::kFp16, fp16_t, bf16_t>>(r.bits);
    }
  }
  static __device__ __forceinline__ int64_t first_column(int slot) { return slot; }
};

// ---- stores -------------------------------------------------------------------------------------------

template <int kOut>
__device__ __forceinline__ uint32_t out_bits(float v) {
  if constexpr (kOut == kOutF32) return __float_as_uint(v);
  else if constexpr (kOut == kOutF16) return float_to_fp16(v);
  else return float_to_bf16(v);
}

// Values v[0, n) of a slot whose value 0 is output element `at` (output written once: streaming stores).
// A whole slot of 4+ values whose destination is 16-byte aligned goes out in 16-byte stores.
template <int kOut, int kV>
__device__ __forceinline__ void store_slot_as(void* out, int64_t at, const float* v, int n) {
  constexpr int kSize = kOut == kOutF32 ? 4 : 2;
  char* dst = static_cast<char*>(out) + at * kSize;
  constexpr int kBytes = kV * kSize;
  if constexpr (kBytes % 16 == 0) {
    if (n == kV && (reinterpret_cast<uintptr_t>(dst) & 15u) == 0) {
      uint32_t w[kBytes / 4];
#pragma unroll
      for (int i = 0; i < kBytes / 4; ++i)
        w[i] = kSize == 4 ? out_bits<kOut>(v[i]) : (out_bits<kOut>(v[2 * i]) | (out_bits<kOut>(v[2 * i + 1]) << 16));
#pragma unroll
      for (int c = 0; c < kBytes / 16; ++c) store_words<16, StoreHint::kStreaming>(dst + 16 * c, w + 4 * c);
      return;
    }
  }
  // Each store predicated on a bit of a mask (a bound on i let the compiler fold the unrolled stores back into
  // a loop over v with a variable index, which put v in local memory).
  const uint32_t keep = n >= kV ? ~0u : (1u << n) - 1u;
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    if ((keep >> i & 1u) == 0) continue;
    if constexpr (kSize == 4) {
      __stcs(reinterpret_cast<unsigned int*>(dst) + i, out_bits<kOut>(v[i]));
    } else {
      __stcs(reinterpret_cast<unsigned short*>(dst) + i, static_cast<unsigned short>(out_bits<kOut>(v[i])));
    }
  }
}

template <int kV>
__device__ __forceinline__ void store_slot(const QuantForwardParams& p, int64_t at, const float* v, int n) {
  switch (p.out_kind) {
    case kOutF16: return store_slot_as<kOutF16, kV>(p.output, at, v, n);
    case kOutBF16: return store_slot_as<kOutBF16, kV>(p.output, at, v, n);
    default: return store_slot_as<kOutF32, kV>(p.output, at, v, n);
  }
}

// An index as an unsigned word of its width: a negative index is then past every table's rows.
template <typename I>
using IndexWord = std::conditional_t<sizeof(I) == 8, uint64_t, uint32_t>;

// The indices at p[0, n) into idx[0, kU) (0 past n).
template <int kU, typename I>
__device__ __forceinline__ void load_step_indices(const I* p, int64_t n, IndexWord<I>* idx) {
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    if constexpr (sizeof(I) == 8) {
      idx[j] = j < n ? static_cast<uint64_t>(__ldg(reinterpret_cast<const long long*>(p + j))) : 0u;
    } else {
      idx[j] = j < n ? static_cast<uint32_t>(__ldg(reinterpret_cast<const int*>(p + j))) : 0u;
    }
  }
}

// ---- one feature's bags -------------------------------------------------------------------------------

template <class R, QuantWeightType kType, typename I, bool kPooled, bool kWeighted>
__device__ __forceinline__ void quant_forward_feature(const QuantForwardParams& p, int f, const uint8_t* table,
                                                      const QuantRowPlan plan) {
  constexpr int kS = R::kSlots;
  constexpr int kV = R::kValues;
  constexpr int kU = lookups_per_step(kS);
  using Raw = typename R::Raw;
  const I* indices = static_cast<const I*>(p.indices);
  const I* offsets = static_cast<const I*>(p.offsets);
  const float* psw = p.per_sample_weights;
  const int64_t B = p.batch_size, N = p.num_indices;
  const int64_t D = p.dims[f], E = p.num_rows[f];
  const uint64_t row_bytes = static_cast<uint64_t>(p.row_bytes[f]);
  // Rows an index may name, in its word (int32 indices stop below 2^31).
  const IndexWord<I> rows = sizeof(I) == 8 || E < (int64_t{1} << 31) ? static_cast<IndexWord<I>>(E)
                                                                     : static_cast<IndexWord<I>>(uint32_t{1} << 31);
  const int used = static_cast<int>(header_size(kType) + data_bytes(kType, D));
  const bool records = p.check != kCheckOff;
  const uint32_t two23 = two23_bits(p.num_features);
  const int group = plan.group;
  const int pass = group * kS;  // slots one pass over the bag covers
  const int gi = static_cast<int>(threadIdx.x) / group;
  const int rank = static_cast<int>(threadIdx.x) - gi * group;
  const int bags_per_block = QuantForwardPolicy::kBlock / group;
  const int64_t out_col = kPooled ? p.output_offsets[f] : 0;

  for (int64_t b = static_cast<int64_t>(blockIdx.x) * bags_per_block + gi; b < B;
       b += static_cast<int64_t>(gridDim.x) * bags_per_block) {
    const int64_t item = static_cast<int64_t>(f) * B + b;
    int64_t start = static_cast<int64_t>(offsets[item]);
    int64_t end = static_cast<int64_t>(offsets[item + 1]);
    if (records && end < start && rank == 0) record_min_position(p.scratch + kBadOffsetKey, item + 1);
    start = start < 0 ? 0 : (start > N ? N : start);
    end = end < start ? start : (end > N ? N : end);
    if (!kPooled && item == 0) {
      // Sequence rows before the first bag belong to no bag: zeros.
      const float zero[1] = {0.0f};
      for (int64_t q = 0; q < start; ++q)
        for (int64_t c = rank; c < D; c += group) store_slot<1>(p, q * p.out_row_stride + c, zero, 1);
    }

    int64_t valid = 0;
    for (int u0 = 0; u0 < plan.slots; u0 += pass) {
      int slot[kS];
      bool active[kS];
#pragma unroll
      for (int c = 0; c < kS; ++c) {
        const int k = u0 + rank + c * group;
        active[c] = k < plan.slots;
        slot[c] = active[c] ? k : 0;  // an inactive slot reads slot 0 of the row, which exists
      }
      const bool first_pass = u0 == 0;
      float acc[kS][kV];
#pragma unroll
      for (int c = 0; c < kS; ++c)
#pragma unroll
        for (int k = 0; k < kV; ++k) acc[c][k] = 0.0f;
      valid = 0;

      IndexWord<I> next[kU];
      load_step_indices<kU>(indices + start, end - start, next);
      for (int64_t s = start; s < end; s += kU) {
        const int n = end - s < kU ? static_cast<int>(end - s) : kU;  // the step's lookups
        IndexWord<I> idx[kU];
        unsigned present = 0;  // bit j: lookup s + j exists and its index is in the table
        unsigned invalid = 0;  // bit j: lookup s + j exists and its index is outside [0, E)
#pragma unroll
        for (int j = 0; j < kU; ++j) {
          idx[j] = next[j];
          const bool in = j < n;
          const bool ok = idx[j] < rows;
          present |= static_cast<unsigned>(in && ok) << j;
          invalid |= static_cast<unsigned>(in && !ok) << j;
        }
        if (invalid != 0 && p.check == kCheckError && first_pass && rank == 0)
          record_min_position(p.scratch + kBadIndexKey, s + __ffs(invalid) - 1);
        uint32_t hw[kU];
        Raw raw[kU][kS];
#pragma unroll
        for (int j = 0; j < kU; ++j) {
          const uint8_t* row = table + ((present >> j & 1u) ? static_cast<uint64_t>(idx[j]) * row_bytes : 0u);
          hw[j] = R::header_word(row);
#pragma unroll
          for (int c = 0; c < kS; ++c) raw[j][c] = R::load(row, slot[c], used);
        }
        // The next step's indices load while this step's rows are in flight.
        load_step_indices<kU>(indices + s + kU, end - s - kU, next);
        float sw[kU];
#pragma unroll
        for (int j = 0; j < kU; ++j) sw[j] = (kWeighted && j < n) ? __ldg(psw + s + j) : 1.0f;
        valid += __popc(present);
        // Decode and add the step's rows; int rows with a non-finite scale or bias (no quantizer writes one,
        // but loaded bytes may hold it) take the plain product and the software header decode, for the whole
        // step: one branch a step.
        const auto add_step = [&](auto finite_tag) {
          constexpr bool kFinite = decltype(finite_tag)::value;
#pragma unroll
          for (int j = 0; j < kU; ++j) {
            const bool ok = (present >> j & 1u) != 0;
            const Header h = header_of<kType, kFinite>(hw[j], two23);
#pragma unroll
            for (int c = 0; c < kS; ++c) {
              float v[kV];
              R::template decode<kFinite>(raw[j][c], h, v);
              if constexpr (kPooled) {
                if (ok && active[c]) {
#pragma unroll
                  for (int k = 0; k < kV; ++k)
                    acc[c][k] = __fadd_rn(acc[c][k], kWeighted ? __fmul_rn(sw[j], v[k]) : v[k]);
                }
              } else if (j < n && active[c]) {
                // Sequence: row q is the (weighted) looked-up row, zeros for an invalid index.
#pragma unroll
                for (int k = 0; k < kV; ++k) v[k] = ok ? (kWeighted ? __fmul_rn(sw[j], v[k]) : v[k]) : 0.0f;
                const int64_t c0 = R::first_column(slot[c]);
                store_slot<kV>(p, (s + j) * p.out_row_stride + c0, v, static_cast<int>(D - c0 < kV ? D - c0 : kV));
              }
            }
          }
        };
        bool finite = true;
        if constexpr (is_int(kType)) {
#pragma unroll
          for (int j = 0; j < kU; ++j) finite = finite && header_finite(hw[j]);
        }
        if (finite) add_step(std::true_type{});
        else add_step(std::false_type{});
      }

      if constexpr (kPooled) {
#pragma unroll
        for (int c = 0; c < kS; ++c) {
          if (!active[c]) continue;
          if (p.pooling == kPoolMean && valid > 0) {
            const float n = static_cast<float>(valid);
#pragma unroll
            for (int k = 0; k < kV; ++k) acc[c][k] = __fdiv_rn(acc[c][k], n);
          }
          const int64_t c0 = R::first_column(slot[c]);
          store_slot<kV>(p, b * p.out_row_stride + out_col + c0, acc[c], static_cast<int>(D - c0 < kV ? D - c0 : kV));
        }
      }
    }
    if (p.check == kCheckSkip && rank == 0 && end > start + valid)
      atomicAdd(reinterpret_cast<unsigned long long*>(p.scratch + kSkipCount),
                static_cast<unsigned long long>(end - start - valid));
  }
}

template <QuantWeightType kType, typename I, bool kPooled>
__device__ __forceinline__ void quant_forward_type(const QuantForwardParams& p, int f, const uint8_t* table,
                                                   const QuantRowPlan plan) {
  const bool weighted = p.per_sample_weights != nullptr;
  if (plan.vector) {
    if (weighted) quant_forward_feature<VectorRows<kType>, kType, I, kPooled, true>(p, f, table, plan);
    else quant_forward_feature<VectorRows<kType>, kType, I, kPooled, false>(p, f, table, plan);
  } else {
    if (weighted) quant_forward_feature<ScalarRows<kType>, kType, I, kPooled, true>(p, f, table, plan);
    else quant_forward_feature<ScalarRows<kType>, kType, I, kPooled, false>(p, f, table, plan);
  }
}

// grid = (bag tiles, features folded past 65535), block = QuantForwardPolicy::kBlock.
template <typename I, bool kPooled>
__global__ void __launch_bounds__(QuantForwardPolicy::kBlock, QuantForwardPolicy::kMinBlocks)
    tbe_quant_forward_kernel(const QuantForwardParams p) {
  using Q = QuantWeightType;
  for (int f = static_cast<int>(blockIdx.y); f < p.num_features; f += static_cast<int>(gridDim.y)) {
    const uint8_t* table = p.weights + p.table_offsets[f];
    const Q type = static_cast<Q>(p.types[f]);
    const QuantRowPlan plan =
        quant_row_plan(type, p.dims[f], p.row_bytes[f], static_cast<uint64_t>(reinterpret_cast<uintptr_t>(table)));
    switch (type) {
      case Q::kFp32: quant_forward_type<Q::kFp32, I, kPooled>(p, f, table, plan); break;
      case Q::kFp16: quant_forward_type<Q::kFp16, I, kPooled>(p, f, table, plan); break;
      case Q::kBf16: quant_forward_type<Q::kBf16, I, kPooled>(p, f, table, plan); break;
      case Q::kInt8: quant_forward_type<Q::kInt8, I, kPooled>(p, f, table, plan); break;
      case Q::kInt4: quant_forward_type<Q::kInt4, I, kPooled>(p, f, table, plan); break;
      case Q::kInt2: quant_forward_type<Q::kInt2, I, kPooled>(p, f, table, plan); break;
      case Q::kFp8E4M3: quant_forward_type<Q::kFp8E4M3, I, kPooled>(p, f, table, plan); break;
      case Q::kFp8E5M2: quant_forward_type<Q::kFp8E5M2, I, kPooled>(p, f, table, plan); break;
    }
  }
}

}  // namespace tbe_quant_fwd
}  // namespace cuda
}  // namespace embscale
