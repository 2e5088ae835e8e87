// The plan of `embscale bench fp8` (bench_fp8.h): parsing of sizes and shapes, the memory a run takes
// at its peak, and the checks of every flag, all before anything is allocated.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bench_fp8.h"

namespace embscale {
namespace tools {
namespace fp8_bench {

std::string join_names() {
  std::string s;
  for (const auto& o : kOps) s += (s.empty() ? "" : ", ") + std::string(o.name);
  return s;
}

namespace {

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

}  // namespace

int copies_for(size_t stride, size_t cache_bytes) {
  const size_t target = 3 * cache_bytes;
  if (stride == 0 || stride >= target) return 1;
  return static_cast<int>(std::min<size_t>((target + stride - 1) / stride, INT_MAX));
}

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
  p->threads = static_cast<int>(a.threads);
  return Status::Ok();
}

}  // namespace fp8_bench
}  // namespace tools
}  // namespace embscale
