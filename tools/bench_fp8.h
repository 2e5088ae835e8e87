// `embscale bench fp8` in three parts: the plan (what the command line asks for, checked against the
// machine before anything is allocated; bench_fp8_plan.cpp), the seeded rotating inputs and outputs
// (bench_fp8_inputs.cpp) and the measuring with the command's registration (bench_fp8.cpp).
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cli_args.h"
#include "embscale/fp8.h"
#include "embscale/memory.h"

namespace embscale {
namespace tools {
namespace fp8_bench {

enum class Fp8Op { kAmax = 0, kQuantize, kQuantizeCurrentScaling, kDequantize, kActivationAmax, kCastTranspose };

struct OpInfo {
  Fp8Op op;
  const char* name;
  bool two_d;  // measured at --shape rather than at --sizes
};
inline constexpr OpInfo kOps[] = {
    {Fp8Op::kAmax, "amax", false},
    {Fp8Op::kQuantize, "quantize", false},
    {Fp8Op::kQuantizeCurrentScaling, "quantize_current_scaling", false},
    {Fp8Op::kDequantize, "dequantize", false},
    {Fp8Op::kActivationAmax, "activation_amax", true},
    {Fp8Op::kCastTranspose, "cast_transpose", true},
};

inline const OpInfo& op_info(Fp8Op op) { return kOps[static_cast<int>(op)]; }

// At most this many warm-up or timed batches (each batch is up to 200 calls).
constexpr int kMaxBatches = 1000000;

// What the command line says, as text; turned into a Plan (or a message) by make_plan.
struct Fp8BenchArgs {
  std::string backend;
  std::vector<std::string> ops, sizes, dtypes;
  std::string algo = "auto", fp8 = "e4m3", activation = "gelu_tanh", shape;
  static constexpr int kUnset = INT_MIN;
  int warmup = kUnset, iters = kUnset;  // kUnset: the backend's default
  bool json = false;
  bool no_peers = false;
  bool dry_run = false;
  uint64_t seed = 20261130;
  int64_t threads = 0;  // Context::num_threads (0: OpenMP's default)
};

struct Plan {
  Backend backend = Backend::kCpu;
  std::vector<Fp8Op> ops;
  std::vector<int64_t> sizes;
  std::vector<DType> dtypes;
  AmaxAlgo algo = AmaxAlgo::kAuto;
  DType fp8 = DType::kF8E4M3;
  Activation act = Activation::kGeluTanh;
  int64_t rows = 0, cols = 0;
  int warmup = 0, iters = 0;  // untimed batches, timed batches
  bool json = false;
  bool peers = true;
  uint64_t seed = 0;
  int threads = 0;  // Context::num_threads
};

// The ops' names, comma-separated (for help and messages).
std::string join_names();

// Checks and resolves the command line; an invalid_argument (or unsupported) naming the flag.
Status make_plan(const Fp8BenchArgs& a, Plan* p);

// ---- rotating copies and the memory they take ----------------------------------------------------

constexpr size_t kAlign = 256;
inline size_t round_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// How many rotating copies of a set whose one copy takes `stride` bytes (its padding included): enough
// that the copies together reach three times the cache, one when a single copy already does. So the
// copies of any size take less than 3 * cache + stride bytes (one element of one byte still takes a
// whole 256-byte stride per copy, which the count accounts for).
int copies_for(size_t stride, size_t cache_bytes);

// Peak memory of measuring one size: the phases of the run (building an input set, each op with its
// outputs), each as backend memory plus host memory alive at the same time. On the CPU both are the
// same memory.
struct MemoryNeed {
  CheckedSize device, host;  // the largest over the phases, of each kind
  CheckedSize total;         // the largest over the phases of device + host
  void phase(CheckedSize d, CheckedSize h) {
    device = max(device, d);
    host = max(host, h);
    total = max(total, d + h);
  }
};

// The phases of a 1-D size n of `dtype` (rotating inputs, then each selected op), or of the 2-D ops at
// n = rows * cols elements, exactly as run_fp8_bench allocates them.
MemoryNeed memory_need(const std::vector<Fp8Op>& ops, bool two_d, int64_t n, DType dtype, size_t cache);

// ---- inputs and outputs ---------------------------------------------------------------------------

// `copies` identical copies of n seeded elements, each starting on a 256-byte boundary. Identical
// copies suffice to defeat the cache (it is keyed by address) and make every call's amax the same.
struct InputSet {
  Buffer data;
  size_t stride = 0;  // bytes between copies
  int copies = 0;
  int64_t n = 0;
  DType dtype = DType::kF32;
  float amax = 0;  // exact max |x| of the stored values
  const void* copy(int call) const { return data.as<char>() + static_cast<size_t>(call % copies) * stride; }
};

// n seeded elements of a float dtype, in `copies` copies (the exact amax of the stored values kept).
Status make_input(const Context& ctx, DType dtype, int64_t n, int copies, uint64_t seed, InputSet* in);
// Seeded fp8 codes for dequantize's input, NaN codes excluded (e4m3: S.1111.111; e5m2: exponent 31).
Status make_fp8_input(const Context& ctx, DType fp8, int64_t n, int copies, uint64_t seed, InputSet* in);

// Rotating outputs, like the inputs.
struct OutputSet {
  Buffer data;
  size_t stride = 0;
  int copies = 0;
  void* copy(int call) const { return data.as<char>() + static_cast<size_t>(call % copies) * stride; }
};

// `copies` rotating outputs of `bytes` each, every page touched once.
Status make_output(Backend b, size_t bytes, int copies, OutputSet* out);

}  // namespace fp8_bench
}  // namespace tools
}  // namespace embscale
