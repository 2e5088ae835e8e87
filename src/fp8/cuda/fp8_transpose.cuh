// cast_transpose: x [rows, cols] -> y = fp8(x * scale) as [rows, cols] and yt = y^T as [cols, rows], one
// read of x. Tiles are 64 rows x 128 columns; the grid has one block per tile (grid-stride beyond
// Fp8Policy::kTransposeMaxBlocksPerSm blocks per SM), so the scheduler overlaps one block's stores with
// the next blocks' loads.
//
// Full, aligned tiles (fast path): 128 threads; thread (tr, tc) loads a 4-row x 16-column patch (two
// 16-byte loads per row for 16-bit inputs, four for fp32, all issued before any is used), converts it,
// stores each row's 16 fp8 to y with one 16-byte store (a warp writes 128 contiguous bytes of 4 rows),
// then transposes 4x4 byte blocks in registers (byte permutes) into 16 words, each holding 4
// consecutive rows of one column, and stores them to shared memory. After one barrier each thread
// copies 16-byte chunks (16 rows of one column) from shared memory to yt, so every global store is 16
// bytes and each warp writes 64 contiguous bytes of 8 yt rows. The shared tile is [128 columns][16
// words]; the 4-word chunk index is XOR-swizzled with column bits 4..5, which bounds the transposing
// stores to 2-way bank conflicts while keeping the 16-byte chunks intact for the reads.
// Any other tile (edges, odd shapes, unaligned pointers) goes through a per-element path with a byte
// tile in shared memory: correct for every shape, including rows or cols of 1.
#pragma once

#include "fp8/cuda/fp8_common.cuh"
#include "fp8/cuda/fp8_policy.cuh"

namespace embscale {
namespace cuda {

constexpr int kTileRows = 64;
constexpr int kTileCols = 128;
constexpr int kPatchCols = 16;  // columns per thread in the fast path (one 16-byte fp8 store per row)
constexpr int kTransposeThreads = 128;
static_assert(kTransposeThreads == (kTileRows / 4) * (kTileCols / kPatchCols), "one 4 x 16 patch per thread");

struct CastTransposeParams {
  const void* x;  // [rows, cols]
  void* y;        // [rows, cols] fp8
  void* yt;       // [cols, rows] fp8
  int64_t rows;
  int64_t cols;
  const float* scale;
  const float* noop_flag;
  bool vec_ok;     // pointers and shape allow the fast path for full tiles
  bool in_aligned; // x is aligned to its element size
};

// Transposes a 4x4 byte block: r[i] holds row i (byte k = column k); returns c[k] with byte i = row i.
__device__ __forceinline__ void transpose_4x4_bytes(const uint32_t (&r)[4], uint32_t (&c)[4]) {
  const uint32_t t0 = __byte_perm(r[0], r[1], 0x5140);  // r0.b0 r1.b0 r0.b1 r1.b1
  const uint32_t t1 = __byte_perm(r[0], r[1], 0x7362);  // r0.b2 r1.b2 r0.b3 r1.b3
  const uint32_t t2 = __byte_perm(r[2], r[3], 0x5140);
  const uint32_t t3 = __byte_perm(r[2], r[3], 0x7362);
  c[0] = __byte_perm(t0, t2, 0x5410);
  c[1] = __byte_perm(t0, t2, 0x7632);
  c[2] = __byte_perm(t1, t3, 0x5410);
  c[3] = __byte_perm(t1, t3, 0x7632);
}

// Word `word` (rows 4 word .. 4 word + 3) of column `col` in the [kTileCols][16] shared tile.
__device__ __forceinline__ int swizzled_word(int col, int word) { return col * 16 + (word ^ (((col >> 4) & 3) << 2)); }

template <typename Tin, typename Tout>
__device__ __forceinline__ void cast_transpose_full_tile(const CastTransposeParams& p, float s, int64_t r0,
                                                         int64_t c0, uint32_t* tile) {
  const int tr = threadIdx.x / (kTileCols / kPatchCols);  // rows 4*tr .. 4*tr+3 of the tile
  const int tc = threadIdx.x % (kTileCols / kPatchCols);  // columns 16*tc .. 16*tc+15 of the tile
  constexpr int kPer = Vec16<Tin>::kN;
  constexpr int kLoads = kPatchCols / kPer;  // 16-byte loads per patch row
  Vec16<Tin> v[4][kLoads];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t off = (r0 + 4 * tr + i) * p.cols + c0 + kPatchCols * tc;  // element offset, multiple of 16
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const Tin*>(p.x) + off);
#pragma unroll
    for (int l = 0; l < kLoads; ++l) v[i][l] = load_vec<Tin>(src, l);
  }
  uint32_t w[4][4];  // w[i][j]: row i, fp8 of patch columns 4j .. 4j+3
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    OutPack<Tout, kPatchCols> o;
#pragma unroll
    for (int k = 0; k < kPatchCols; ++k) o.set(k, from_float<Tout>(load_float(v[i][k / kPer].elem(k % kPer)) * s));
#pragma unroll
    for (int j = 0; j < 4; ++j) w[i][j] = o.w[j];
    const int64_t off = (r0 + 4 * tr + i) * p.cols + c0 + kPatchCols * tc;
    *reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.y) + off) = make_uint4(o.w[0], o.w[1], o.w[2], o.w[3]);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t rows4[4] = {w[0][j], w[1][j], w[2][j], w[3][j]};
    uint32_t cols4[4];
    transpose_4x4_bytes(rows4, cols4);
#pragma unroll
    for (int k = 0; k < 4; ++k) tile[swizzled_word(kPatchCols * tc + 4 * j + k, tr)] = cols4[k];
  }
  __syncthreads();
  // kTileCols columns x 4 chunks of 16 rows; thread t takes chunks t, t + 128, ...
#pragma unroll
  for (int rep = 0; rep < kTileCols * 4 / kTransposeThreads; ++rep) {
    const int id = threadIdx.x + rep * kTransposeThreads;
    const int col = id / 4;
    const int q = id % 4;
    const uint4 chunk = *reinterpret_cast<const uint4*>(&tile[swizzled_word(col, 4 * q)]);
    const int64_t off = (c0 + col) * p.rows + r0 + 16 * q;
    *reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.yt) + off) = chunk;
  }
  __syncthreads();
}

template <typename Tin, typename Tout>
__device__ __forceinline__ void cast_transpose_any_tile(const CastTransposeParams& p, float s, int64_t r0,
                                                        int64_t c0, uint8_t (*tile)[kTileCols + 1]) {
  const int64_t nr = min(static_cast<int64_t>(kTileRows), p.rows - r0);
  const int64_t nc = min(static_cast<int64_t>(kTileCols), p.cols - c0);
  for (int e = threadIdx.x; e < kTileRows * kTileCols; e += blockDim.x) {
    const int r = e / kTileCols;
    const int c = e % kTileCols;
    if (r < nr && c < nc) {
      const int64_t off = (r0 + r) * p.cols + c0 + c;
      const Tout q = from_float<Tout>(load_float(load_elem<Tin>(p.x, off, p.in_aligned)) * s);
      const uint8_t b = static_cast<uint8_t>(elem_bits(q));
      static_cast<uint8_t*>(p.y)[off] = b;
      tile[r][c] = b;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kTileRows * kTileCols; e += blockDim.x) {
    const int c = e / kTileRows;
    const int r = e % kTileRows;
    if (r < nr && c < nc) static_cast<uint8_t*>(p.yt)[(c0 + c) * p.rows + r0 + r] = tile[r][c];
  }
  __syncthreads();
}

template <typename Tin, typename Tout>
__global__ void __launch_bounds__(kTransposeThreads) cast_transpose_tiled_kernel(CastTransposeParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;  // waits for the previous grid before any load
  __shared__ __align__(16) uint32_t tile_words[kTileCols * 16];  // fast path: [kTileCols][16 words]
  __shared__ uint8_t tile_bytes[kTileRows][kTileCols + 1];
  const float s = *p.scale;
  const int64_t tiles_r = (p.rows + kTileRows - 1) / kTileRows;
  const int64_t tiles_c = (p.cols + kTileCols - 1) / kTileCols;
  const int64_t ntiles = tiles_r * tiles_c;
  for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
    const int64_t r0 = (t / tiles_c) * kTileRows;
    const int64_t c0 = (t % tiles_c) * kTileCols;
    if (p.vec_ok && r0 + kTileRows <= p.rows && c0 + kTileCols <= p.cols) {
      cast_transpose_full_tile<Tin, Tout>(p, s, r0, c0, tile_words);
    } else {
      cast_transpose_any_tile<Tin, Tout>(p, s, r0, c0, tile_bytes);
    }
  }
}

}  // namespace cuda
}  // namespace embscale
