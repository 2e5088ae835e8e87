// The quantized TBE's row quantizer on CUDA (quantize_rows with a CUDA context, embscale/tbe_quant.h): the
// same bytes as the host quantizer, because both run the rules written once in tbe/quant_rows.h
// (int_row_scale, int_code_of), core/scaling.h (the fp8 scale) and core/numerics.h (the casts), one
// correctly rounded operation at a time.
//
// One warp a row, two kernels (the entry point, tbe/tbe_quant.cpp, reads the first one's verdict back
// before it enqueues the second, so a refused call writes nothing):
//   * check: the row's first non-finite column, else (int rows) whether its min or scale overflows fp16,
//     as a key r * (D + 1) + c recorded with an atomic max of ~key (the smallest key wins: the host check's
//     first refused row and column);
//   * write: the header by lane 0, then each data byte by one lane (an int byte packs its 2, 4 or 8
//     columns), into rows the entry point has zeroed.
// The row's min is the first occurrence of the smallest value, as the host's strict-less scan finds it: the
// sign of a zero minimum is the bias's sign bit. Bytes are stored one at a time: rows have any alignment,
// and this runs once per table load.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/cuda/lanes.cuh"
#include "core/numerics.h"
#include "core/scaling.h"
#include "tbe/cuda/bounds_check.cuh"
#include "tbe/quant_rows.h"
#include "tbe/tbe_quant_backend.h"

namespace embscale {
namespace cuda {
namespace {

constexpr int kBlock = 128;  // 4 rows a block of 32-lane warps, 2 of 64-lane ones
constexpr int kWarp = ArchTraits::kWarpSize;
constexpr int64_t kMaxBlocks = 65535;

// What one warp learns of a row: the first non-finite column (D if none), the first smallest value, the
// largest value and the largest magnitude.
struct RowStats {
  int64_t bad;
  float mn, mx, amax;
};

__device__ RowStats row_stats(const float* row, int64_t D, int lane) {
  RowStats s{D, FLT_MAX, -FLT_MAX, 0.0f};
  int64_t mn_at = D;  // where this lane's minimum first occurs
  for (int64_t c = lane; c < D; c += kWarp) {
    const float v = __ldg(row + c);
    if (!is_finite_f(v)) {
      if (c < s.bad) s.bad = c;
      continue;
    }
    if (v < s.mn || mn_at == D) {
      s.mn = v;
      mn_at = c;
    }
    s.mx = fmaxf(s.mx, v);
    s.amax = fmaxf(s.amax, fabsf(v));
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const int64_t bad = Warp::shfl_xor(s.bad, o);
    const float mn = Warp::shfl_xor(s.mn, o);
    const int64_t at = Warp::shfl_xor(mn_at, o);
    const float mx = Warp::shfl_xor(s.mx, o);
    const float amax = Warp::shfl_xor(s.amax, o);
    s.bad = bad < s.bad ? bad : s.bad;
    // The smaller value; between equal ones (+0 and -0 included) the earlier column.
    if (at < D && (mn_at == D || mn < s.mn || (mn == s.mn && at < mn_at))) {
      s.mn = mn;
      mn_at = at;
    }
    s.mx = fmaxf(s.mx, mx);
    s.amax = fmaxf(s.amax, amax);
  }
  return s;
}

__global__ void __launch_bounds__(kBlock) quantize_rows_check_kernel(const float* x, int64_t E, int64_t D, int bits,
                                                                   int64_t* verdict) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kBlock / kWarp);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (kBlock / kWarp) + threadIdx.x / kWarp; r < E; r += warps) {
    const RowStats s = row_stats(x + r * D, D, lane);
    if (lane != 0) continue;
    int64_t col = -1;
    if (s.bad < D) col = s.bad;
    else if (bits > 0 && !tbe_quant::int_row_scale(s.mn, s.mx, bits).fits) col = D;
    if (col >= 0) tbe_bounds::record_min_position(verdict, r * (D + 1) + col);
  }
}

__device__ __forceinline__ void store_le(uint8_t* p, uint32_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

__global__ void __launch_bounds__(kBlock) quantize_rows_write_kernel(const float* x, int64_t E, int64_t D, int type,
                                                                   int64_t row_bytes, uint8_t* out) {
  const QuantWeightType t = static_cast<QuantWeightType>(type);
  const int bits = tbe_quant::int_bits(t);
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kBlock / kWarp);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (kBlock / kWarp) + threadIdx.x / kWarp; r < E; r += warps) {
    const float* row = x + r * D;
    uint8_t* dst = out + r * row_bytes;
    if (bits > 0) {
      const RowStats s = row_stats(row, D, lane);
      const tbe_quant::IntRowScale q = tbe_quant::int_row_scale(s.mn, s.mx, bits);
      if (lane == 0) store_le(dst, q.scale_h | (static_cast<uint32_t>(q.bias_h) << 16), 4);
      const int per_byte = 8 / bits;
      const int64_t bytes = (D + per_byte - 1) / per_byte;
      for (int64_t i = lane; i < bytes; i += kWarp) {
        uint32_t byte = 0;
        for (int k = 0; k < per_byte && i * per_byte + k < D; ++k)
          byte |= tbe_quant::int_code_of(__ldg(row + i * per_byte + k), q, bits) << (k * bits);
        dst[4 + i] = static_cast<uint8_t>(byte);
      }
    } else if (tbe_quant::is_fp8(t)) {
      const bool e4m3 = t == QuantWeightType::kFp8E4M3;
      const RowStats s = row_stats(row, D, lane);
      const float scale = scale_from_amax_rule(s.amax, e4m3 ? kFp8E4M3Max : kFp8E5M2Max, 0.0f, false);
      if (lane == 0) store_le(dst, __float_as_uint(scale_inv_from_scale(scale)), 4);
      for (int64_t c = lane; c < D; c += kWarp) {
        const float v = __fmul_rn(__ldg(row + c), scale);
        dst[4 + c] = e4m3 ? float_to_e4m3(v) : float_to_e5m2(v);
      }
    } else {
      for (int64_t c = lane; c < D; c += kWarp) {
        const float v = __ldg(row + c);
        if (t == QuantWeightType::kFp32) store_le(dst + 4 * c, __float_as_uint(v), 4);
        else store_le(dst + 2 * c, t == QuantWeightType::kFp16 ? float_to_fp16(v) : float_to_bf16(v), 2);
      }
    }
  }
}

unsigned blocks_for(int64_t E) {
  const int64_t rows_per_block = kBlock / kWarp;
  return static_cast<unsigned>(std::min<int64_t>((E + rows_per_block - 1) / rows_per_block, kMaxBlocks));
}

}  // namespace

Status quantize_rows_check(const Context& ctx, QuantWeightType type, const TensorView& rows, int64_t* verdict) {
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing"));
  if (capture != cudaStreamCaptureStatusNone)
    return invalid_argument("ctx.stream: quantize_rows reads its check back and synchronises the stream, which "
                            "cannot happen inside a CUDA graph capture");
  const int64_t E = rows.shape[0], D = rows.shape[1];
  quantize_rows_check_kernel<<<blocks_for(E), kBlock, 0, stream>>>(static_cast<const float*>(rows.data), E, D,
                                                                   tbe_quant::int_bits(type), verdict);
  EMBSCALE_CHECK_LAUNCH("quantize_rows_check_kernel");
  return Status::Ok();
}

Status quantize_rows_write(const Context& ctx, QuantWeightType type, const TensorView& rows, int64_t row_bytes,
                           void* out) {
  const int64_t E = rows.shape[0], D = rows.shape[1];
  quantize_rows_write_kernel<<<blocks_for(E), kBlock, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
      static_cast<const float*>(rows.data), E, D, static_cast<int>(type), row_bytes, static_cast<uint8_t*>(out));
  EMBSCALE_CHECK_LAUNCH("quantize_rows_write_kernel");
  return Status::Ok();
}

}  // namespace cuda
}  // namespace embscale
