// `embscale bench fp8`: times the FP8 current-scaling ops (fp8.h) and, on the GPU, the amax peers
// (peers_fp8.h) in the same run, on the same inputs and with the same timing.
//
// What makes the numbers comparable:
//  * inputs are seeded random values (never zeros), replicated into enough copies that the copies,
//    padding included, together reach three times the last-level cache (the GPU's L2); calls rotate
//    through the copies (outputs too), so a size that fits in the cache is still measured from memory
//    while the copies of any size stay within a few times the cache;
//  * sizes are checked before anything is allocated: every derived byte count with checked
//    arithmetic, and the run's peak memory against what the machine has (cli_args.h);
//  * microsecond-scale ops run many back-to-back calls per timed batch; the median batch is reported
//    per call;
//  * GB/s counts the bytes an op must move (docs/bench.md), and pct_of_copy relates it to the copy
//    bandwidth measured at the start of the same run (emitted as op "copy");
//  * every amax result is compared with the host's exact amax of the input, so a fast wrong kernel
//    (ours or a peer's) fails the run instead of topping the table.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cli_args.h"
#include "core/numerics.h"
#include "embscale/fp8.h"
#include "embscale/memory.h"
#include "registry.h"
#if EMBSCALE_WITH_CUDA
#include "peers_fp8.h"
#endif

namespace embscale {
namespace tools {
namespace {

enum class Fp8Op { kAmax = 0, kQuantize, kQuantizeCurrentScaling, kDequantize, kActivationAmax, kCastTranspose };

struct OpInfo {
  Fp8Op op;
  const char* name;
  bool two_d;  // measured at --shape rather than at --sizes
};
constexpr OpInfo kOps[] = {
    {Fp8Op::kAmax, "amax", false},
    {Fp8Op::kQuantize, "quantize", false},
    {Fp8Op::kQuantizeCurrentScaling, "quantize_current_scaling", false},
    {Fp8Op::kDequantize, "dequantize", false},
    {Fp8Op::kActivationAmax, "activation_amax", true},
    {Fp8Op::kCastTranspose, "cast_transpose", true},
};

const OpInfo& op_info(Fp8Op op) { return kOps[static_cast<int>(op)]; }

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
};

std::string join_names() {
  std::string s;
  for (const auto& o : kOps) s += (s.empty() ? "" : ", ") + std::string(o.name);
  return s;
}

// Parses a positive element count: "65536", "2^16", "1<<16", or with a binary suffix "64K", "1M", "1G".
bool parse_count(const std::string& text, int64_t* out) {
  auto digits = [](const std::string& s, int64_t* v) {
    if (s.empty() || s.size() > 18) return false;
    int64_t r = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      r = r * 10 + (c - '0');
    }
    *v = r;
    return true;
  };
  int64_t a = 0, b = 0;
  for (const char* sep : {"^", "<<"}) {
    const auto pos = text.find(sep);
    if (pos == std::string::npos) continue;
    if (!digits(text.substr(0, pos), &a) || !digits(text.substr(pos + std::strlen(sep)), &b)) return false;
    const bool power = std::string(sep) == "^";
    if (power && a != 2) return false;  // only powers of two are spelled this way
    const int64_t base = power ? 1 : a;
    if (b > 62 || (base > 0 && (base > (int64_t{1} << (62 - b))))) return false;
    *out = base << b;
    return *out > 0;
  }
  int shift = 0;
  std::string body = text;
  if (!body.empty()) {
    const char last = body.back();
    if (last == 'k' || last == 'K') shift = 10;
    if (last == 'm' || last == 'M') shift = 20;
    if (last == 'g' || last == 'G') shift = 30;
    if (shift) body.pop_back();
  }
  if (!digits(body, &a) || a > (int64_t{1} << (62 - shift))) return false;
  *out = a << shift;
  return *out > 0;
}

// "RxC" with positive R and C (each accepting parse_count's forms) and at most 2^40 elements;
// "" or what is wrong.
std::string parse_shape(const std::string& text, int64_t* rows, int64_t* cols) {
  const auto pos = text.find_first_of("xX");
  if (pos == std::string::npos || !parse_count(text.substr(0, pos), rows) || !parse_count(text.substr(pos + 1), cols))
    return "'" + text + "' is not ROWSxCOLS with positive extents (e.g. 8192x8192)";
  if (*rows > (int64_t{1} << 40) / *cols) return "'" + text + "' has more than 2^40 elements";
  return "";
}

// ---- rotating copies and the memory they take ----------------------------------------------------

constexpr size_t kAlign = 256;
size_t round_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// How many rotating copies of a set whose one copy takes `stride` bytes (its padding included): enough
// that the copies together reach three times the cache, one when a single copy already does. So the
// copies of any size take less than 3 * cache + stride bytes (one element of one byte still takes a
// whole 256-byte stride per copy, which the count accounts for).
int copies_for(size_t stride, size_t cache_bytes) {
  const size_t target = 3 * cache_bytes;
  if (stride == 0 || stride >= target) return 1;
  return static_cast<int>(std::min<size_t>((target + stride - 1) / stride, INT_MAX));
}

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
MemoryNeed memory_need(const std::vector<Fp8Op>& ops, bool two_d, int64_t n, DType dtype, size_t cache) {
  MemoryNeed need;
  const CheckedSize elems(static_cast<uint64_t>(n)), es(dtype_size(dtype));
  const CheckedSize in_stride = (elems * es).round_up(kAlign), fp8_stride = elems.round_up(kAlign);
  const CheckedSize pair = in_stride + fp8_stride;  // dequantize: an fp8 input and its output per copy
  if (pair.overflow()) {
    need.phase(CheckedSize::overflowed(), 0);
    return need;
  }
  const CheckedSize copies(static_cast<uint64_t>(copies_for(in_stride.value(), cache)));
  const CheckedSize inputs = copies * in_stride;
  need.phase(inputs, elems * es);  // the seeded values staged on the host, then replicated
  for (const Fp8Op op : ops) {
    if (op_info(op).two_d != two_d) continue;
    switch (op) {
      case Fp8Op::kQuantize:
      case Fp8Op::kQuantizeCurrentScaling:
        need.phase(inputs + copies * fp8_stride, 0);
        break;
      case Fp8Op::kDequantize: {
        const CheckedSize q_copies(static_cast<uint64_t>(copies_for(pair.value(), cache)));
        need.phase(inputs + q_copies * fp8_stride, elems);  // its fp8 codes staged on the host
        need.phase(inputs + q_copies * pair, 0);
        break;
      }
      case Fp8Op::kActivationAmax:
        need.phase(inputs + copies * in_stride, 0);
        break;
      case Fp8Op::kCastTranspose:
        need.phase(inputs + copies * fp8_stride * 2, 0);
        break;
      default:  // amax: a small workspace
        break;
    }
  }
  return need;
}

// "" when the need fits the machine (usable_memory_bytes; a limit of 0 is unknown and not applied),
// else why not, for a message that starts with the flag.
std::string memory_refusal(const MemoryNeed& need, Backend b) {
  if (need.total.overflow()) return "the bytes it takes overflow a 64-bit count";
  const uint64_t host = host_memory_bytes();
  const uint64_t unknown = UINT64_MAX;
  if (b == Backend::kCpu) {
    if (!need.total.fits_in(host ? host : unknown))
      return "needs " + format_bytes(need.total) + " of memory at its peak; this machine has " + format_bytes(host);
    return "";
  }
  const uint64_t device = usable_memory_bytes(b);
  if (!need.device.fits_in(device ? device : unknown))
    return "needs " + format_bytes(need.device) + " of device memory at its peak; the device has " +
           format_bytes(device) + " free";
  if (!need.host.fits_in(host ? host : unknown))
    return "needs " + format_bytes(need.host) + " of host memory to stage its inputs; this machine has " +
           format_bytes(host);
  return "";
}

std::vector<std::string> default_sizes(Backend b) {
  if (b == Backend::kCuda) return {"2^16", "2^20", "2^24", "2^26", "2^28"};
  return {"2^16", "2^20", "2^24"};
}

Status make_plan(const Fp8BenchArgs& a, Plan* p) {
  p->backend = backend_available(Backend::kCuda) ? Backend::kCuda : Backend::kCpu;
  if (!a.backend.empty() && !parse_backend(a.backend, &p->backend))
    return invalid_argument("--backend: unknown backend '" + a.backend + "' (expected cpu or cuda)");
  if (!backend_available(p->backend))
    return unsupported(std::string("--backend: ") + backend_name(p->backend) +
                       " is not available in this build or on this machine");
  const bool gpu = p->backend == Backend::kCuda;

  p->ops.clear();
  if (a.ops.empty() || (a.ops.size() == 1 && a.ops[0] == "all")) {
    for (const auto& o : kOps) p->ops.push_back(o.op);
  } else {
    for (const auto& name : a.ops) {
      const auto it = std::find_if(std::begin(kOps), std::end(kOps), [&](const OpInfo& o) { return name == o.name; });
      if (it == std::end(kOps)) return invalid_argument("--ops: unknown op '" + name + "' (expected " + join_names() + " or all)");
      if (std::find(p->ops.begin(), p->ops.end(), it->op) == p->ops.end()) p->ops.push_back(it->op);
    }
  }

  p->sizes.clear();
  std::vector<std::string> size_texts;
  for (const auto& s : a.sizes.empty() ? default_sizes(p->backend) : a.sizes) {
    int64_t n = 0;
    if (!parse_count(s, &n))
      return invalid_argument("--sizes: '" + s + "' is not a positive element count (use e.g. 65536, 2^16, 64K)");
    if (std::find(p->sizes.begin(), p->sizes.end(), n) == p->sizes.end()) {
      p->sizes.push_back(n);
      size_texts.push_back(s);
    }
  }

  p->dtypes.clear();
  for (const auto& s : a.dtypes.empty() ? std::vector<std::string>{"fp32", "bf16"} : a.dtypes) {
    DType t;
    if (!parse_dtype(s, &t) || !is_float_dtype(t))
      return invalid_argument("--dtypes: unknown or unsupported dtype '" + s + "' (expected fp32, bf16 or fp16)");
    if (std::find(p->dtypes.begin(), p->dtypes.end(), t) == p->dtypes.end()) p->dtypes.push_back(t);
  }

  if (!parse_amax_algo(a.algo, &p->algo))
    return invalid_argument("--algo: unknown amax algorithm '" + a.algo + "' (expected auto, atomic or two_stage)");
  if (a.fp8 == "e4m3" || a.fp8 == "fp8e4m3")
    p->fp8 = DType::kF8E4M3;
  else if (a.fp8 == "e5m2" || a.fp8 == "fp8e5m2")
    p->fp8 = DType::kF8E5M2;
  else
    return invalid_argument("--fp8: unknown format '" + a.fp8 + "' (expected e4m3 or e5m2)");
  if (!parse_activation(a.activation, &p->act))
    return invalid_argument("--activation: unknown activation '" + a.activation + "' (expected relu, gelu_tanh or silu)");

  const std::string shape = a.shape.empty() ? (gpu ? "8192x8192" : "2048x2048") : a.shape;
  const std::string shape_error = parse_shape(shape, &p->rows, &p->cols);
  if (!shape_error.empty()) return invalid_argument("--shape: " + shape_error);

  // What each size takes at its peak, against what the machine has: refused here, before any
  // allocation, rather than failing (or being killed) half-way through the run.
  const size_t cache = last_level_cache_bytes(p->backend);
  bool any_1d = false, any_2d = false;
  for (const Fp8Op op : p->ops) (op_info(op).two_d ? any_2d : any_1d) = true;
  for (const DType dtype : p->dtypes) {
    for (size_t i = 0; any_1d && i < p->sizes.size(); ++i) {
      const std::string why = memory_refusal(memory_need(p->ops, false, p->sizes[i], dtype, cache), p->backend);
      if (!why.empty())
        return invalid_argument("--sizes: " + size_texts[i] + " (" + std::to_string(p->sizes[i]) + " elements) of " +
                                dtype_name(dtype) + ": " + why);
    }
    if (any_2d) {
      const std::string why = memory_refusal(memory_need(p->ops, true, p->rows * p->cols, dtype, cache), p->backend);
      if (!why.empty()) return invalid_argument("--shape: " + shape + " of " + dtype_name(dtype) + ": " + why);
    }
  }

  const int unset = Fp8BenchArgs::kUnset;
  if (a.warmup != unset && (a.warmup < 0 || a.warmup > kMaxBatches))
    return invalid_argument("--warmup: " + std::to_string(a.warmup) + "; expected 0.." + std::to_string(kMaxBatches));
  if (a.iters != unset && (a.iters < 1 || a.iters > kMaxBatches))
    return invalid_argument("--iters: " + std::to_string(a.iters) + "; expected 1.." + std::to_string(kMaxBatches));
  p->warmup = a.warmup != unset ? a.warmup : (gpu ? 3 : 1);
  p->iters = a.iters != unset ? a.iters : (gpu ? 30 : 7);
  p->json = a.json;
  p->peers = gpu && !a.no_peers;
  p->seed = a.seed;
  return Status::Ok();
}

// ---- inputs ---------------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Element i of the seeded input: roughly normal (a sum of three uniforms, standard deviation 1,
// range about +-5.2) so amax is a rare element and the fp8 cast sees a realistic spread of exponents.
// A counter-based hash makes the data independent of the thread count.
float input_value(uint64_t seed, int64_t i) {
  const uint64_t h = splitmix64(seed ^ (static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull));
  const float u0 = static_cast<float>(h & 0x1fffff) * (1.0f / 2097152.0f);
  const float u1 = static_cast<float>((h >> 21) & 0x1fffff) * (1.0f / 2097152.0f);
  const float u2 = static_cast<float>((h >> 42) & 0x1fffff) * (1.0f / 2097152.0f);
  return (u0 + u1 + u2 - 1.5f) * 2.0f;
}

// Stores v as dtype at dst; returns |v| as stored (the exact amax contribution).
float store_as(DType t, void* dst, float v) {
  switch (t) {
    case DType::kF16: {
      const uint16_t b = float_to_fp16(v);
      std::memcpy(dst, &b, 2);
      return std::fabs(fp16_to_float(b));
    }
    case DType::kBF16: {
      const uint16_t b = float_to_bf16(v);
      std::memcpy(dst, &b, 2);
      return std::fabs(bf16_to_float(b));
    }
    default:
      std::memcpy(dst, &v, 4);
      return std::fabs(v);
  }
}

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

// Copy 0 from the host, then the copies made so far doubled at each step (copies [0, k) to [k, 2k)),
// so even hundreds of thousands of small copies take a few dozen copy calls.
Status replicate(const Context& ctx, Buffer* buf, size_t stride, int copies, const std::vector<unsigned char>& host) {
  EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, buf->data(), host.data(), host.size()));
  if (copies > 1 && stride > host.size())  // the padding of copy 0 too, so every byte copied is defined
    EMBSCALE_RETURN_IF_ERROR(fill_bytes(ctx, buf->as<char>() + host.size(), 0, stride - host.size()));
  for (size_t done = 1; done < static_cast<size_t>(copies);) {
    const size_t step = std::min(done, static_cast<size_t>(copies) - done);
    EMBSCALE_RETURN_IF_ERROR(copy_within_backend(ctx, buf->as<char>() + done * stride, buf->data(), step * stride));
    done += step;
  }
  return synchronize(ctx);
}

Status make_input(const Context& ctx, DType dtype, int64_t n, int copies, uint64_t seed, InputSet* in) {
  const size_t es = dtype_size(dtype);
  std::vector<unsigned char> host(static_cast<size_t>(n) * es);
  float amax = 0;
#pragma omp parallel for reduction(max : amax) schedule(static)
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, store_as(dtype, host.data() + i * es, input_value(seed, i)));
  in->stride = round_up(host.size());
  in->copies = copies;
  in->n = n;
  in->dtype = dtype;
  in->amax = amax;
  in->data = Buffer(ctx.backend, in->stride * copies);
  if (!in->data.valid())
    return Status(StatusCode::kBackendError, "input: allocation of " + std::to_string(in->stride * copies) + " bytes failed");
  return replicate(ctx, &in->data, in->stride, copies, host);
}

// Seeded fp8 codes for dequantize's input, NaN codes excluded (e4m3: S.1111.111; e5m2: exponent 31).
Status make_fp8_input(const Context& ctx, DType fp8, int64_t n, int copies, uint64_t seed, InputSet* in) {
  std::vector<unsigned char> host(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint8_t b = static_cast<uint8_t>(splitmix64(seed ^ (static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull)) >> 56);
    if (fp8 == DType::kF8E4M3 && (b & 0x7f) == 0x7f) b ^= 0x01;
    if (fp8 == DType::kF8E5M2 && (b & 0x7c) == 0x7c) b ^= 0x40;
    host[i] = b;
  }
  in->stride = round_up(host.size());
  in->copies = copies;
  in->n = n;
  in->dtype = fp8;
  in->data = Buffer(ctx.backend, in->stride * copies);
  if (!in->data.valid())
    return Status(StatusCode::kBackendError, "input: allocation of " + std::to_string(in->stride * copies) + " bytes failed");
  return replicate(ctx, &in->data, in->stride, copies, host);
}

// Rotating outputs, like the inputs.
struct OutputSet {
  Buffer data;
  size_t stride = 0;
  int copies = 0;
  void* copy(int call) const { return data.as<char>() + static_cast<size_t>(call % copies) * stride; }
};

Status make_output(Backend b, size_t bytes, int copies, OutputSet* out) {
  out->stride = round_up(bytes);
  out->copies = copies;
  out->data = Buffer(b, out->stride * copies);
  if (!out->data.valid())
    return Status(StatusCode::kBackendError, "output: allocation of " + std::to_string(out->stride * copies) + " bytes failed");
  // Touch every page once, so timed calls do not pay first-touch page faults (host) or lazy mapping.
  Context ctx;
  ctx.backend = b;
  EMBSCALE_RETURN_IF_ERROR(fill_bytes(ctx, out->data.data(), 0x5a, out->stride * copies));
  return synchronize(ctx);
}

// ---- measuring ------------------------------------------------------------------------------------

struct Runner {
  const Plan& plan;
  Context ctx;
  double copy_gbps = 0;
  size_t cache_bytes = 0;
  int failures = 0;
  Buffer scalars;  // [kScalars] fp32 in backend memory: amax, scale, scale_inv, ...
  static constexpr int kScalars = 16;
  float* amax_ptr() const { return scalars.as<float>(); }
  float* scale_ptr() const { return scalars.as<float>() + 1; }
  float* scale_inv_ptr() const { return scalars.as<float>() + 2; }

  explicit Runner(const Plan& p) : plan(p) {
    ctx.backend = p.backend;
    ctx.stream = nullptr;
    cache_bytes = last_level_cache_bytes(p.backend);
    scalars = Buffer(p.backend, kScalars * sizeof(float));
  }

  void fail(const std::string& what, const Status& st) {
    ++failures;
    std::fprintf(stderr, "error: %s: %s\n", what.c_str(), st.to_string().c_str());
    std::fflush(stderr);
  }

  // Back-to-back calls per timed batch: enough for about 300 us of GPU work (2 ms on the CPU), so
  // launch gaps and timer resolution vanish into the median; at most 200. A short probe measures the
  // call first: an estimate from the byte count alone would be far off for an op far from the ceiling.
  Status measure(const std::function<Status(int)>& op, Timing* t, int* calls) {
    TimingConfig probe;
    probe.warmup = 1;
    probe.repeats = 3;
    Timing pt;
    EMBSCALE_RETURN_IF_ERROR(time_op(ctx, probe, op, &pt));
    const double target_us = plan.backend == Backend::kCuda ? 300.0 : 2000.0;
    TimingConfig cfg;
    cfg.calls_per_batch = static_cast<int>(std::max(1.0, std::min(200.0, std::ceil(target_us / std::max(pt.median_us, 0.5)))));
    cfg.warmup = std::max(1, plan.warmup * cfg.calls_per_batch);
    cfg.repeats = plan.iters;
    *calls = cfg.calls_per_batch;
    return time_op(ctx, cfg, op, t);
  }

  void emit_record(const std::string& op, const std::string& impl, DType dtype, int64_t n, bool two_d, double bytes,
                   const Timing& t, int calls, int copies, bool has_algo, const std::string& check) {
    nlohmann::json r = base_record(plan.backend);
    r["op"] = op;
    r["impl"] = impl;
    r["dtype"] = dtype_name(dtype);
    r["n"] = n;
    if (two_d) {
      r["rows"] = plan.rows;
      r["cols"] = plan.cols;
    }
    const double gbps = bytes / (t.median_us * 1e-6) / 1e9;
    r["median_us"] = t.median_us;
    r["min_us"] = t.min_us;
    r["max_us"] = t.max_us;
    r["bytes"] = bytes;
    r["GBps"] = gbps;
    r["pct_of_copy"] = 100.0 * gbps / copy_gbps;
    if (has_algo) r["algo"] = amax_algo_name(plan.algo);
    const Fp8Op o = std::find_if(std::begin(kOps), std::end(kOps), [&](const OpInfo& i) { return op == i.name; })->op;
    if (o != Fp8Op::kAmax && o != Fp8Op::kActivationAmax) r["fp8"] = dtype_name(plan.fp8);
    if (o == Fp8Op::kActivationAmax) r["activation"] = activation_name(plan.act);
    r["calls_per_batch"] = calls;
    r["repeats"] = plan.iters;
    r["copies"] = copies;
    if (!check.empty()) r["check"] = check;
    char line[320];
    const std::string size = two_d ? std::to_string(plan.rows) + "x" + std::to_string(plan.cols) : "n=" + std::to_string(n);
    std::snprintf(line, sizeof line, "%-24s %-13s %-5s %-13s %10.2f us %9.1f GB/s %6.1f%% of copy%s%s%s%s",
                  op.c_str(), impl.c_str(), dtype_name(dtype), size.c_str(), t.median_us, gbps, 100.0 * gbps / copy_gbps,
                  has_algo ? "  algo=" : "", has_algo ? amax_algo_name(plan.algo) : "",
                  check.empty() ? "" : "  check=", check.c_str());
    emit(r, plan.json, line);
  }

  void emit_copy(size_t bytes, const Timing& t) {
    nlohmann::json r = base_record(plan.backend);
    r["op"] = "copy";
    r["impl"] = plan.backend == Backend::kCuda ? "cudaMemcpyAsync" : "memcpy";
    r["dtype"] = "u8";
    r["n"] = bytes;
    r["bytes"] = 2.0 * static_cast<double>(bytes);
    r["median_us"] = t.median_us;
    r["min_us"] = t.min_us;
    r["max_us"] = t.max_us;
    r["GBps"] = copy_gbps;
    r["pct_of_copy"] = 100.0;
    char line[200];
    std::snprintf(line, sizeof line, "%-24s %-13s %-5s %-13s %10.2f us %9.1f GB/s (read + write; the ceiling)", "copy",
                  r["impl"].get<std::string>().c_str(), "u8", ("n=" + std::to_string(bytes)).c_str(), t.median_us,
                  copy_gbps);
    emit(r, plan.json, line);
  }

  // "ok" when the amax in backend memory equals `expect` bit for bit, else a description.
  std::string check_amax(float expect) {
    float got = -1;
    Status st = synchronize(ctx);
    if (st.ok()) st = copy_to_host(ctx, &got, amax_ptr(), sizeof got);
    if (!st.ok()) return "unreadable";
    if (std::memcmp(&got, &expect, sizeof got) == 0) return "ok";
    char buf[96];
    std::snprintf(buf, sizeof buf, "mismatch (got %.9g, expected %.9g)", got, expect);
    return buf;
  }

  void note_check(const std::string& what, const std::string& check) {
    if (check == "ok" || check.empty()) return;
    ++failures;
    std::fprintf(stderr, "error: %s: amax %s\n", what.c_str(), check.c_str());
  }

  Status run_one_d(Fp8Op op, const InputSet& in);
  Status run_two_d(Fp8Op op, const InputSet& in);
  Status run_amax_peers(const InputSet& in);
};

Status Runner::run_one_d(Fp8Op op, const InputSet& in) {
  const int64_t n = in.n;
  const size_t es = dtype_size(in.dtype);
  const std::string what = std::string(op_info(op).name) + " " + dtype_name(in.dtype) + " n=" + std::to_string(n);
  AmaxOptions aopts;
  aopts.algo = plan.algo;
  Timing t;
  int calls = 0;
  std::string check;
  if (op == Fp8Op::kAmax) {
    size_t ws_bytes = 0;
    EMBSCALE_RETURN_IF_ERROR(amax_workspace_size(ctx, TensorView::vec(in.copy(0), in.dtype, n), aopts, &ws_bytes));
    Buffer ws(plan.backend, ws_bytes);
    const double bytes = static_cast<double>(n) * es;
    EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
      return amax(ctx, TensorView::vec(in.copy(c), in.dtype, n), amax_ptr(), aopts, ws.data(), ws_bytes);
    }, &t, &calls));
    check = check_amax(in.amax);
    note_check(what, check);
    emit_record("amax", "embscale", in.dtype, n, false, bytes, t, calls, in.copies, true, check);
    return Status::Ok();
  }
  if (op == Fp8Op::kDequantize) {
    InputSet q;
    EMBSCALE_RETURN_IF_ERROR(
        make_fp8_input(ctx, plan.fp8, n, copies_for(round_up(n) + round_up(n * es), cache_bytes), plan.seed + 1, &q));
    OutputSet out;
    EMBSCALE_RETURN_IF_ERROR(make_output(plan.backend, n * es, q.copies, &out));
    const float scale_inv = 1.0f / 16.0f;
    EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, scale_inv_ptr(), &scale_inv, sizeof scale_inv));
    const double bytes = static_cast<double>(n) * (1 + es);
    EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
      return dequantize(ctx, TensorView::vec(q.copy(c), plan.fp8, n), scale_inv_ptr(),
                        TensorView::vec(out.copy(c), in.dtype, n));
    }, &t, &calls));
    emit_record("dequantize", "embscale", in.dtype, n, false, bytes, t, calls, q.copies, false, "");
    return Status::Ok();
  }
  OutputSet out;
  EMBSCALE_RETURN_IF_ERROR(make_output(plan.backend, n, in.copies, &out));
  if (op == Fp8Op::kQuantize) {
    // The scale a current-scaling step would use for this input.
    const float scale = fp8_max(plan.fp8) / in.amax;
    EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, scale_ptr(), &scale, sizeof scale));
    const double bytes = static_cast<double>(n) * (es + 1);
    EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
      return quantize(ctx, TensorView::vec(in.copy(c), in.dtype, n), scale_ptr(), TensorView::vec(out.copy(c), plan.fp8, n));
    }, &t, &calls));
    emit_record("quantize", "embscale", in.dtype, n, false, bytes, t, calls, in.copies, false, "");
    return Status::Ok();
  }
  // Current scaling: the two-pass floor (read x for amax, read it again for the cast, write fp8).
  CurrentScalingOptions copts;
  copts.amax = aopts;
  size_t ws_bytes = 0;
  EMBSCALE_RETURN_IF_ERROR(
      quantize_current_scaling_workspace_size(ctx, TensorView::vec(in.copy(0), in.dtype, n), copts, &ws_bytes));
  Buffer ws(plan.backend, ws_bytes);
  const double bytes = static_cast<double>(n) * (2 * es + 1);
  EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
    return quantize_current_scaling(ctx, TensorView::vec(in.copy(c), in.dtype, n), TensorView::vec(out.copy(c), plan.fp8, n),
                                    amax_ptr(), scale_ptr(), scale_inv_ptr(), copts, ws.data(), ws_bytes);
  }, &t, &calls));
  check = check_amax(in.amax);
  note_check(what, check);
  emit_record("quantize_current_scaling", "embscale", in.dtype, n, false, bytes, t, calls, in.copies, true, check);
  return Status::Ok();
}

Status Runner::run_two_d(Fp8Op op, const InputSet& in) {
  const int64_t rows = plan.rows, cols = plan.cols, n = rows * cols;
  const size_t es = dtype_size(in.dtype);
  const TensorView x0 = TensorView::mat(in.copy(0), in.dtype, rows, cols);
  Timing t;
  int calls = 0;
  if (op == Fp8Op::kActivationAmax) {
    AmaxOptions aopts;
    aopts.algo = plan.algo;
    size_t ws_bytes = 0;
    EMBSCALE_RETURN_IF_ERROR(activation_amax_workspace_size(ctx, x0, aopts, &ws_bytes));
    Buffer ws(plan.backend, ws_bytes);
    OutputSet out;
    EMBSCALE_RETURN_IF_ERROR(make_output(plan.backend, n * es, in.copies, &out));
    const double bytes = static_cast<double>(n) * 2 * es;
    EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
      return activation_amax(ctx, plan.act, TensorView::mat(in.copy(c), in.dtype, rows, cols),
                             TensorView::mat(out.copy(c), in.dtype, rows, cols), amax_ptr(), aopts, ws.data(), ws_bytes);
    }, &t, &calls));
    emit_record("activation_amax", "embscale", in.dtype, n, true, bytes, t, calls, in.copies, true, "");
    return Status::Ok();
  }
  const float scale = fp8_max(plan.fp8) / in.amax;
  EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, scale_ptr(), &scale, sizeof scale));
  OutputSet y, yt;
  EMBSCALE_RETURN_IF_ERROR(make_output(plan.backend, n, in.copies, &y));
  EMBSCALE_RETURN_IF_ERROR(make_output(plan.backend, n, in.copies, &yt));
  const double bytes = static_cast<double>(n) * (es + 2);
  EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
    return cast_transpose(ctx, TensorView::mat(in.copy(c), in.dtype, rows, cols), scale_ptr(),
                          TensorView::mat(y.copy(c), plan.fp8, rows, cols), TensorView::mat(yt.copy(c), plan.fp8, cols, rows));
  }, &t, &calls));
  emit_record("cast_transpose", "embscale", in.dtype, n, true, bytes, t, calls, in.copies, false, "");
  return Status::Ok();
}

Status Runner::run_amax_peers(const InputSet& in) {
#if EMBSCALE_WITH_CUDA
  const double bytes = static_cast<double>(in.n) * dtype_size(in.dtype);
  for (const peers::AmaxPeer p : peers::all_amax_peers()) {
    const std::string what = std::string("amax ") + peers::amax_peer_name(p) + " " + dtype_name(in.dtype) +
                             " n=" + std::to_string(in.n);
    size_t ws_bytes = 0;
    Status st = peers::amax_peer_workspace_size(p, in.dtype, in.n, &ws_bytes);
    if (st.code() == StatusCode::kUnsupported) {  // e.g. cub's 32-bit item count: not a failure of ours
      std::fprintf(stderr, "note: %s skipped: %s\n", what.c_str(), st.message().c_str());
      continue;
    }
    if (!st.ok()) {
      fail(what, st);
      continue;
    }
    Buffer ws(plan.backend, ws_bytes);
    Timing t;
    int calls = 0;
    st = measure([&](int c) {
      return peers::amax_peer(p, in.copy(c), in.dtype, in.n, amax_ptr(), ws.data(), ws_bytes, ctx.stream);
    }, &t, &calls);
    if (!st.ok()) {
      fail(what, st);
      continue;
    }
    const std::string check = check_amax(in.amax);
    note_check(what, check);
    emit_record("amax", peers::amax_peer_name(p), in.dtype, in.n, false, bytes, t, calls, in.copies, false, check);
  }
#else
  (void)in;
#endif
  return Status::Ok();
}

int run_fp8_bench(const Plan& plan) {
  Runner r(plan);
  if (!r.scalars.valid()) {
    std::fprintf(stderr, "error: could not allocate scalars on %s\n", backend_name(plan.backend));
    return 1;
  }
  // The ceiling: one copy of a buffer well beyond the cache.
  const size_t copy_bytes = std::max<size_t>(plan.backend == Backend::kCuda ? size_t{512} << 20 : size_t{128} << 20,
                                             4 * r.cache_bytes);
  Timing ct;
  const Status cst = copy_bandwidth(r.ctx, copy_bytes, &ct, &r.copy_gbps);
  if (!cst.ok() || !(r.copy_gbps > 0)) {
    r.fail("copy bandwidth", cst.ok() ? Status(StatusCode::kBackendError, "no bandwidth measured") : cst);
    return 1;
  }
  if (!plan.json)
    std::printf("embscale bench fp8: backend %s (%s), fp8 %s, algo %s, %d timed batches after %d warm-up\n",
                backend_name(plan.backend), device_name(plan.backend).c_str(), dtype_name(plan.fp8),
                amax_algo_name(plan.algo), plan.iters, plan.warmup);
  r.emit_copy(copy_bytes, ct);

  bool any_1d = false, any_2d = false;
  for (const Fp8Op op : plan.ops) (op_info(op).two_d ? any_2d : any_1d) = true;
  for (const DType dtype : plan.dtypes) {
    const size_t es = dtype_size(dtype);
    for (const int64_t n : any_1d ? plan.sizes : std::vector<int64_t>{}) {
      InputSet in;
      // Copies sized by the input alone (padding included); every op's outputs rotate with them.
      Status st = make_input(r.ctx, dtype, n, copies_for(round_up(static_cast<size_t>(n) * es), r.cache_bytes), plan.seed, &in);
      if (!st.ok()) {
        r.fail(std::string("input ") + dtype_name(dtype) + " n=" + std::to_string(n), st);
        continue;
      }
      for (const Fp8Op op : plan.ops) {
        if (op_info(op).two_d) continue;
        st = r.run_one_d(op, in);
        if (!st.ok()) r.fail(std::string(op_info(op).name) + " " + dtype_name(dtype) + " n=" + std::to_string(n), st);
        if (op == Fp8Op::kAmax && plan.peers) (void)r.run_amax_peers(in);
      }
    }
    if (any_2d) {
      const int64_t n = plan.rows * plan.cols;
      InputSet in;
      Status st = make_input(r.ctx, dtype, n, copies_for(round_up(static_cast<size_t>(n) * es), r.cache_bytes), plan.seed, &in);
      if (!st.ok()) {
        r.fail(std::string("input ") + dtype_name(dtype) + " " + std::to_string(plan.rows) + "x" + std::to_string(plan.cols), st);
        continue;
      }
      for (const Fp8Op op : plan.ops) {
        if (!op_info(op).two_d) continue;
        st = r.run_two_d(op, in);
        if (!st.ok())
          r.fail(std::string(op_info(op).name) + " " + dtype_name(dtype) + " " + std::to_string(plan.rows) + "x" +
                     std::to_string(plan.cols), st);
      }
    }
  }
  if (r.failures) std::fprintf(stderr, "embscale bench fp8: %d measurement(s) failed\n", r.failures);
  return r.failures ? 1 : 0;
}

// --dry-run: what each size would take (rotating copies, peak memory), as records with op "plan",
// without allocating or measuring anything.
int print_plan(const Plan& plan) {
  const size_t cache = last_level_cache_bytes(plan.backend);
  bool any_1d = false, any_2d = false;
  for (const Fp8Op op : plan.ops) (op_info(op).two_d ? any_2d : any_1d) = true;
  auto one = [&](DType dtype, int64_t n, bool two_d) {
    const size_t stride = round_up(static_cast<size_t>(n) * dtype_size(dtype));
    const MemoryNeed need = memory_need(plan.ops, two_d, n, dtype, cache);
    nlohmann::json r = base_record(plan.backend);
    r["op"] = "plan";
    r["dtype"] = dtype_name(dtype);
    r["n"] = n;
    if (two_d) {
      r["rows"] = plan.rows;
      r["cols"] = plan.cols;
    }
    r["copies"] = copies_for(stride, cache);
    r["stride_bytes"] = stride;
    r["cache_bytes"] = cache;
    r["peak_bytes"] = need.total.value();  // backend and host memory together (the same memory on the CPU)
    r["peak_device_bytes"] = need.device.value();
    r["peak_host_bytes"] = need.host.value();
    r["memory_bytes"] = usable_memory_bytes(plan.backend);
    const std::string size = two_d ? std::to_string(plan.rows) + "x" + std::to_string(plan.cols) : "n=" + std::to_string(n);
    emit(r, plan.json,
         "plan " + std::string(dtype_name(dtype)) + " " + size + ": " + std::to_string(copies_for(stride, cache)) +
             " rotating copies of " + format_bytes(stride) + ", peak " + format_bytes(need.total) + " (cache " +
             format_bytes(cache) + ")");
  };
  for (const DType dtype : plan.dtypes) {
    for (const int64_t n : any_1d ? plan.sizes : std::vector<int64_t>{}) one(dtype, n, false);
    if (any_2d) one(dtype, plan.rows * plan.cols, true);
  }
  return 0;
}

int run_from_args(const Fp8BenchArgs& args) {
  Plan plan;
  const Status st = make_plan(args, &plan);
  if (!st.ok()) return refuse(st.message());
  return args.dry_run ? print_plan(plan) : run_fp8_bench(plan);
}

void add_fp8_bench(CLI::App& bench) {
  auto args = std::make_shared<Fp8BenchArgs>();
  auto* sub = bench.add_subcommand("fp8", "FP8 current-scaling ops (and, on the GPU, the amax peers)");
  add_text_option(sub, "--backend", &args->backend, "cpu or cuda (default: cuda when a GPU is present)");
  sub->add_option("--ops", args->ops, "ops to time, comma-separated: " + join_names() + " (default: all)")
      ->delimiter(',');
  sub->add_option("--sizes", args->sizes,
                  "element counts for the 1-D ops, e.g. 2^16,2^20,65536,64K (default: 2^16..2^28 on cuda, "
                  "2^16..2^24 on cpu)")
      ->delimiter(',');
  sub->add_option("--dtypes", args->dtypes, "input dtypes: fp32, bf16, fp16 (default: fp32,bf16)")->delimiter(',');
  sub->add_option("--algo", args->algo, "amax algorithm: auto, atomic or two_stage")->capture_default_str();
  sub->add_option("--fp8", args->fp8, "fp8 format: e4m3 or e5m2")->capture_default_str();
  sub->add_option("--activation", args->activation, "activation_amax's activation: relu, gelu_tanh or silu")
      ->capture_default_str();
  add_text_option(sub, "--shape", &args->shape, "ROWSxCOLS for the 2-D ops (default: 8192x8192 on cuda, 2048x2048 on cpu)");
  add_integer_option(sub, "--warmup", &args->warmup, 0, kMaxBatches,
                     "untimed batches before timing (default: 3 on cuda, 1 on cpu)");
  add_integer_option(sub, "--iters", &args->iters, 1, kMaxBatches,
                     "timed batches; the median is reported (default: 30 on cuda, 7 on cpu)");
  add_unsigned_option(sub, "--seed", &args->seed, "input seed (0..2^64-1)");
  sub->add_flag("--json", args->json, "print one JSON record per measurement instead of text lines");
  sub->add_flag("--no-peers", args->no_peers, "skip the amax peers (te_atomic, te_two_stage, cub)");
  sub->add_flag("--dry-run", args->dry_run,
                "check the arguments and print each size's plan (rotating copies, peak memory) without running");
  sub->callback([args] { std::exit(run_from_args(*args)); });
}

int run_fp8_defaults(Backend backend) {
  Fp8BenchArgs args;
  args.backend = backend_name(backend);
  return run_from_args(args);
}

const RegisterBench kRegisterFp8Bench({"fp8", add_fp8_bench, run_fp8_defaults});

}  // namespace
}  // namespace tools
}  // namespace embscale
