// Seeded inputs for table-batched embeddings (tbe.h), in host memory: lookups (indices, offsets,
// per-sample weights) with uniform or Zipf-distributed rows and fixed or variable bag sizes, and a
// weight initialiser. Used by the tests, `embscale check` and `embscale bench`.
//
// Everything is a pure function of the seed: the generator uses its own random number generator (not
// <random>'s distributions, whose output differs between standard libraries), and parallel work is
// split so the result does not depend on the number of threads.
#pragma once

#include <cstdint>
#include <vector>

#include "embscale/dtype.h"
#include "embscale/status.h"

namespace embscale {

struct TbeInputSpec {
  int64_t batch_size = 0;          // B >= 0
  int bag_size = 0;                // L >= 0
  bool variable_bag_size = false;  // false: every bag has L lookups; true: uniform in [0, 2L]
  std::vector<int64_t> num_rows;   // [T] rows E of each feature's table, each >= 1
  // 0: rows uniform in [0, E). > 0: row ranks follow Zipf(alpha), P(rank k) ~ k^-alpha for k = 1..E;
  // rank k is mapped to row ((k-1) * m + r_f) mod E with m an odd multiplier coprime to E and r_f a
  // per-feature rotation, so hot rows are spread over the table rather than adjacent.
  // Ranks 1..2^20 are sampled exactly (inverse CDF by binary search). Only for E > 2^20, the ranks
  // above 2^20 follow the continuous density x^-alpha over [k - 1/2, k + 1/2) instead of k^-alpha: a
  // relative change of O(1/k^2) < 1e-12 per rank there, which keeps memory at 8 MB per table size.
  double alpha = 0.0;
  DType index_dtype = DType::kI64;  // int32 or int64
  bool weighted = false;            // also draw per-sample weights, uniform in [0, 1)
  uint64_t seed = 0;
};

struct TbeInputs {
  DType index_dtype = DType::kI64;
  std::vector<int64_t> indices;             // [N] always filled (the values, whatever the dtype)
  std::vector<int64_t> offsets;             // [T*B+1] table-major: bag (f, b) is offsets[f*B + b]..
  std::vector<int32_t> indices32;           // [N] copy of indices when index_dtype is int32
  std::vector<int32_t> offsets32;           // [T*B+1] copy of offsets when index_dtype is int32
  std::vector<float> per_sample_weights;    // [N] when weighted, else empty

  int64_t num_indices() const { return static_cast<int64_t>(indices.size()); }
  // The buffers in index_dtype, ready to copy to a backend.
  const void* indices_data() const;
  const void* offsets_data() const;
  size_t indices_bytes() const;
  size_t offsets_bytes() const;
};

Status generate_tbe_inputs(const TbeInputSpec& spec, TbeInputs* out);

// Fills host_out with `count` elements of `dtype` (fp32, fp16 or bf16) uniform in [-a, a] (rounded to
// nearest even in the 16-bit formats). Element i of the conceptual buffer is a function of (seed, i)
// only, and host_out receives elements [first, first + count): a large table can be initialised
// chunk by chunk, on any number of threads, with the same result.
Status init_uniform_weights(DType dtype, float a, uint64_t seed, int64_t first, int64_t count, void* host_out);

}  // namespace embscale
