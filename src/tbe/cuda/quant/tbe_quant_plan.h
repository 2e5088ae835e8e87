// How the CUDA quantized TBE forward reads one feature's rows, in plain C++ (the kernel and the host's grid
// sizing share it, and tests check it without a GPU), and the launch policy.
//
// A row is [header][data][padding] (embscale/tbe_quant.h). The vector path cuts the row's data into chunks
// of 16 bytes (8 for int2, so that a lane decodes at most 32 values a chunk) and gives each lane of a
// power-of-two group `per_lane` of them, so no lane is spent on the header; behind the 4-byte header a lane
// reads its data chunk as the aligned chunk that holds its start and the next aligned word. It needs the
// table's base and the row's size to be multiples of the chunk (FBGEMM's GPU layout, row_alignment 16,
// always is). Other rows (row_alignment 1 to 8 with odd sizes) take the scalar path: byte loads, one column
// per slot.
#pragma once

#include <cstdint>

#include "embscale/tbe_quant.h"

namespace embscale {
namespace cuda {
namespace tbe_quant_fwd {

// Launch parameters, one struct per architecture; only sm_90 exists so far, chosen by reasoning, not yet
// by measurement (docs/tbe_quant.md, "The CUDA kernel").
struct QuantForwardPolicySm90 {
  static constexpr int kBlock = 128;          // the training forward's block: 4 warps
  static constexpr int kMinBlocks = 4;        // register cap 128: up to 32 fp32 sums and 4 chunks in flight
  static constexpr int kLoadsInFlight = 4;    // row loads a lane issues before its first add (unroll x slots)
  static constexpr int kScalarColumns = 4;    // columns a lane owns per pass on the scalar path
  static constexpr int kWarpSize = 32;
};
using QuantForwardPolicy = QuantForwardPolicySm90;

constexpr int value_bits(QuantWeightType t) {
  switch (t) {
    case QuantWeightType::kFp32: return 32;
    case QuantWeightType::kFp16:
    case QuantWeightType::kBf16: return 16;
    case QuantWeightType::kInt4: return 4;
    case QuantWeightType::kInt2: return 2;
    default: return 8;  // int8, fp8
  }
}
constexpr int header_size(QuantWeightType t) { return value_bits(t) < 16 ? 4 : 0; }
// Bytes of a row's data (its D values, after the header).
constexpr int64_t data_bytes(QuantWeightType t, int64_t dim) { return (dim * value_bits(t) + 7) / 8; }
// Bytes a lane loads at once on the vector path.
constexpr int chunk_bytes(QuantWeightType t) { return t == QuantWeightType::kInt2 ? 8 : 16; }
// Values in one chunk (columns, header positions included).
constexpr int chunk_values(QuantWeightType t) { return chunk_bytes(t) * 8 / value_bits(t); }
// Chunks a lane owns per pass: two where a chunk holds at most 16 values (at most 32 sums a lane).
constexpr int chunks_per_lane(QuantWeightType t) { return chunk_values(t) <= 16 ? 2 : 1; }
// Lookups a lane loads per step: kLoadsInFlight chunks in flight whatever the chunks a lane owns.
constexpr int lookups_per_step(int slots_per_lane) {
  return QuantForwardPolicy::kLoadsInFlight / slots_per_lane > 0 ? QuantForwardPolicy::kLoadsInFlight / slots_per_lane
                                                                  : 1;
}

// One feature's rows: the vector or the scalar path; `slots` per row (chunks, or columns), `per_lane` of
// them a lane, `group` lanes a bag (a power of two, at most a warp); rows wider than group * per_lane slots
// take several passes over the bag.
struct QuantRowPlan {
  bool vector = false;
  int slots = 0;  // the vector path's data chunks, or the scalar path's columns
  int per_lane = 1;
  int group = 1;
};

constexpr QuantRowPlan quant_row_plan(QuantWeightType t, int64_t dim, int64_t row_bytes, uint64_t table_address) {
  QuantRowPlan p;
  const int cb = chunk_bytes(t);
  p.vector = row_bytes % cb == 0 && table_address % cb == 0;
  if (p.vector) {
    p.slots = static_cast<int>((data_bytes(t, dim) + cb - 1) / cb);
    p.per_lane = chunks_per_lane(t);
  } else {
    p.slots = static_cast<int>(dim);
    p.per_lane = QuantForwardPolicy::kScalarColumns;
  }
  const int64_t lanes = (static_cast<int64_t>(p.slots) + p.per_lane - 1) / p.per_lane;
  while (p.group < lanes && p.group < QuantForwardPolicy::kWarpSize) p.group *= 2;
  return p;
}

}  // namespace tbe_quant_fwd
}  // namespace cuda
}  // namespace embscale
