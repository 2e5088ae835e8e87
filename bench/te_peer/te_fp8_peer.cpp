// TransformerEngine's FP8 ops as a same-run peer of embscale's: both on identical device buffers, timed
// the same way in one process (impl "te" and "embscale", op names as `embscale bench fp8` writes them).
//
//   amax                      embscale::amax                  | nvte_compute_amax_with_config (with its memset)
//   quantize                  embscale::quantize (given scale) | nvte_quantize_v2, output without an amax
//   quantize_current_scaling  embscale::quantize_current_scaling | TE's PyTorch quantizer's sequence:
//                             nvte_compute_amax_with_config -> nvte_compute_scale_from_amax ->
//                             nvte_quantize_v2 with an output whose amax pointer is unset (no second amax)
//   cast_transpose            embscale::cast_transpose         | nvte_cast_transpose (row-wise and column-wise
//                                                                 data, amax unset)
// Inputs fp32 and bf16 (seeded, roughly normal), output e4m3. Before timing, each op's results must be
// bit-identical between the two (FP8 codes, and amax and scale_inv where the op writes them) and the
// amax equal to the host's exact one; a case that differs is reported and not timed (exit status 1).
//
// Timing (as `embscale bench fp8`): inputs (and outputs) replicated into copies that together exceed
// three times the L2, calls rotating through them; batches of back-to-back calls sized by a probe to
// about 300 us, the two impls alternating batch by batch; CUDA events; median batch / calls = median_us.
// A device-to-device copy of 1 GiB first gives the ceiling (op "copy", pct_of_copy of the others).
//
// Build with bench/te_peer/build.sh; run: te_fp8_peer [--ops a,b] [--sizes 2^16,...] [--dtypes fp32,bf16]
//   [--shapes 8192x8192,...] [--iters N] [--warmup N] [--seed N] [--out FILE]. JSON lines go to stdout and
// (appended) to --out; progress and errors to stderr.
#include <cuda_runtime.h>
#include <transformer_engine/cast.h>
#include <transformer_engine/recipe.h>
#include <transformer_engine/transformer_engine.h>
#include <transformer_engine/transpose.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "embscale/context.h"
#include "embscale/dtype.h"
#include "embscale/fp8.h"
#include "embscale/status.h"
#include "embscale/tensor.h"

#ifndef TE_PEER_VERSION
#define TE_PEER_VERSION "unknown"
#endif

namespace {

namespace te = transformer_engine;
using embscale::DType;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void es_check(const embscale::Status& st, const char* what) {
  if (!st.ok()) throw std::runtime_error(std::string(what) + ": " + st.to_string());
}

// ---- arguments ------------------------------------------------------------------------------------
struct Args {
  std::vector<std::string> ops{"amax", "quantize", "quantize_current_scaling", "cast_transpose"};
  std::vector<int64_t> sizes{int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24, int64_t{1} << 26, int64_t{1} << 28};
  std::vector<DType> dtypes{DType::kF32, DType::kBF16};
  std::vector<std::pair<int64_t, int64_t>> shapes{{4096, 4096}, {8192, 8192}, {16384, 16384}};
  int iters = 30;
  int warmup = 3;
  uint64_t seed = 20261130;
  std::string out;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "te_fp8_peer: %s\n", msg.c_str());
  std::exit(2);
}

int64_t parse_count(const std::string& arg, const std::string& s) {
  char* end = nullptr;
  if (s.rfind("2^", 0) == 0) {
    const long e = std::strtol(s.c_str() + 2, &end, 10);
    if (*end || e < 0 || e > 40) usage_error(arg + ": '" + s + "' is not 2^k with k in 0..40");
    return int64_t{1} << e;
  }
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end || v <= 0) usage_error(arg + ": '" + s + "' is not a positive integer or 2^k");
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage_error(k + ": a value is needed (or an unknown argument)");
    const std::string v = argv[++i];
    if (k == "--ops") {
      a.ops = split(v);
      for (const auto& o : a.ops)
        if (o != "amax" && o != "quantize" && o != "quantize_current_scaling" && o != "cast_transpose")
          usage_error("--ops: unknown op '" + o + "' (amax, quantize, quantize_current_scaling, cast_transpose)");
    } else if (k == "--sizes") {
      a.sizes.clear();
      for (const auto& s : split(v)) a.sizes.push_back(parse_count(k, s));
    } else if (k == "--dtypes") {
      a.dtypes.clear();
      for (const auto& s : split(v)) {
        if (s == "fp32") a.dtypes.push_back(DType::kF32);
        else if (s == "bf16") a.dtypes.push_back(DType::kBF16);
        else usage_error("--dtypes: '" + s + "' is not fp32 or bf16");
      }
    } else if (k == "--shapes") {
      a.shapes.clear();
      for (const auto& s : split(v)) {
        const size_t x = s.find('x');
        if (x == std::string::npos) usage_error("--shapes: '" + s + "' is not ROWSxCOLS");
        a.shapes.emplace_back(parse_count(k, s.substr(0, x)), parse_count(k, s.substr(x + 1)));
      }
    } else if (k == "--iters") {
      a.iters = static_cast<int>(parse_count(k, v));
    } else if (k == "--warmup") {
      a.warmup = v == "0" ? 0 : static_cast<int>(parse_count(k, v));
    } else if (k == "--seed") {
      char* end = nullptr;
      a.seed = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end) usage_error("--seed: '" + v + "' is not an unsigned integer");
    } else if (k == "--out") {
      a.out = v;
    } else {
      usage_error("unknown argument '" + k + "'");
    }
  }
  if (a.ops.empty() || a.dtypes.empty()) usage_error("--ops and --dtypes need at least one entry");
  return a;
}

// ---- buffers --------------------------------------------------------------------------------------
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { cuda_check(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T> T* as() const { return static_cast<T*>(ptr); }
};

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Copies of `stride` bytes that together reach three times the L2 (at least one).
int copies_for(size_t stride, size_t l2) { return static_cast<int>(std::max<size_t>(1, (3 * l2 + stride - 1) / stride)); }

// `copies` rotating copies, each `stride` bytes apart.
struct Rotating {
  size_t stride;
  int copies;
  DeviceBuffer buf;
  Rotating(size_t bytes, int n) : stride(round_up(bytes)), copies(n), buf(stride * n) {}
  void* copy(int c) const { return static_cast<char*>(buf.ptr) + stride * static_cast<size_t>(c % copies); }
};

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint16_t bf16_bits(float f) {  // round to nearest even (inputs are finite)
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

float bf16_value(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// One input: `copies` copies of seeded values (sum of four uniforms, roughly normal, scaled by 3), and
// its exact amax as stored.
struct Input {
  DType dtype;
  int64_t n;
  float amax = 0;
  Rotating data;
  Input(DType dt, int64_t count, size_t l2, uint64_t seed)
      : dtype(dt), n(count), data(count * embscale::dtype_size(dt), copies_for(round_up(count * embscale::dtype_size(dt)), l2)) {
    const size_t es = embscale::dtype_size(dt);
    std::vector<unsigned char> host(static_cast<size_t>(n) * es);
    uint64_t s = seed ^ (static_cast<uint64_t>(n) * 0x100000001B3ull) ^ (dt == DType::kBF16 ? 0xB16u : 0xF32u);
    for (int64_t i = 0; i < n; ++i) {
      float v = 0;
      for (int k = 0; k < 4; ++k) v += static_cast<float>(splitmix(s) >> 40) * (1.0f / 16777216.0f) - 0.5f;
      v *= 3.0f;
      if (dt == DType::kBF16) {
        const uint16_t h = bf16_bits(v);
        std::memcpy(&host[static_cast<size_t>(i) * 2], &h, 2);
        v = bf16_value(h);
      } else {
        std::memcpy(&host[static_cast<size_t>(i) * 4], &v, 4);
      }
      amax = std::max(amax, std::fabs(v));
    }
    cuda_check(cudaMemcpy(data.copy(0), host.data(), host.size(), cudaMemcpyHostToDevice), "input upload");
    for (int c = 1; c < data.copies; ++c)
      cuda_check(cudaMemcpy(data.copy(c), data.copy(0), host.size(), cudaMemcpyDeviceToDevice), "input copies");
  }
  void* copy(int c) const { return data.copy(c); }
};

te::DType te_dtype(DType d) { return d == DType::kBF16 ? te::DType::kBFloat16 : te::DType::kFloat32; }

// Per-tensor scalars of one impl: amax, scale, scale_inv (fp32 each, on the device).
struct Scalars {
  DeviceBuffer buf{3 * sizeof(float)};
  float* amax() const { return buf.as<float>(); }
  float* scale() const { return buf.as<float>() + 1; }
  float* scale_inv() const { return buf.as<float>() + 2; }
  void set(float amax_v, float scale_v, float scale_inv_v) {
    const float h[3] = {amax_v, scale_v, scale_inv_v};
    cuda_check(cudaMemcpy(buf.ptr, h, sizeof h, cudaMemcpyHostToDevice), "scalars upload");
  }
  void get(float h[3]) const { cuda_check(cudaMemcpy(h, buf.ptr, 3 * sizeof(float), cudaMemcpyDeviceToHost), "scalars read"); }
};

// A TE tensor over an unquantized input.
te::TensorWrapper te_input(void* data, DType dt, const std::vector<size_t>& shape) {
  te::TensorWrapper t(NVTE_DELAYED_TENSOR_SCALING);
  t.set_rowwise_data(data, te_dtype(dt), shape);
  return t;
}

// A TE e4m3 tensor with per-tensor scaling: row-wise data, scale and scale_inv, and the amax when given.
te::TensorWrapper te_fp8(void* data, const std::vector<size_t>& shape, const Scalars& s, bool with_amax) {
  te::TensorWrapper t(NVTE_DELAYED_TENSOR_SCALING);
  const std::vector<size_t> one{1};
  t.set_rowwise_data(data, te::DType::kFloat8E4M3, shape);
  t.set_scale(s.scale(), te::DType::kFloat32, one);
  t.set_rowwise_scale_inv(s.scale_inv(), te::DType::kFloat32, one);
  if (with_amax) t.set_amax(s.amax(), te::DType::kFloat32, one);
  return t;
}

// ---- timing ---------------------------------------------------------------------------------------
struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
};

// Microseconds of `calls` back-to-back calls of op (rotating from *next), between two CUDA events.
double time_batch(const std::function<void(int)>& op, int calls, int* next, cudaEvent_t a, cudaEvent_t b) {
  cuda_check(cudaEventRecord(a, nullptr), "cudaEventRecord");
  for (int k = 0; k < calls; ++k) op((*next)++);
  cuda_check(cudaEventRecord(b, nullptr), "cudaEventRecord");
  cuda_check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  return 1000.0 * ms;
}

// Times two ops in alternating batches (the first one changes every batch): their per-call median
// (min, max) times and the calls per batch.
void time_pair(const std::function<void(int)>& e, const std::function<void(int)>& t, const Args& args, Timing* e_out,
               Timing* t_out, int* calls_out) {
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "cudaEventCreate");
  cuda_check(cudaEventCreate(&b), "cudaEventCreate");
  int next_e = 0, next_t = 0;
  // Probe: one call each, then three single-call batches; the faster op sizes the batch.
  time_batch(e, 1, &next_e, a, b);
  time_batch(t, 1, &next_t, a, b);
  std::vector<double> pe, pt;
  for (int i = 0; i < 3; ++i) {
    pe.push_back(time_batch(e, 1, &next_e, a, b));
    pt.push_back(time_batch(t, 1, &next_t, a, b));
  }
  std::sort(pe.begin(), pe.end());
  std::sort(pt.begin(), pt.end());
  const double est = std::max(0.5, std::min(pe[1], pt[1]));
  const int calls = static_cast<int>(std::max(1.0, std::min(200.0, std::ceil(300.0 / est))));
  for (int i = 0; i < args.warmup; ++i) {
    time_batch(e, calls, &next_e, a, b);
    time_batch(t, calls, &next_t, a, b);
  }
  std::vector<double> ve, vt;
  for (int i = 0; i < args.iters; ++i) {
    if (i % 2 == 0) {
      ve.push_back(time_batch(e, calls, &next_e, a, b) / calls);
      vt.push_back(time_batch(t, calls, &next_t, a, b) / calls);
    } else {
      vt.push_back(time_batch(t, calls, &next_t, a, b) / calls);
      ve.push_back(time_batch(e, calls, &next_e, a, b) / calls);
    }
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  auto summarise = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t m = v.size();
    Timing r;
    r.median_us = m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
    r.min_us = v.front();
    r.max_us = v.back();
    return r;
  };
  *e_out = summarise(ve);
  *t_out = summarise(vt);
  *calls_out = calls;
}

// ---- records --------------------------------------------------------------------------------------
struct Recorder {
  FILE* out = nullptr;
  std::string date, device;
  double copy_gbps = 0;
  int repeats = 0;

  void line(const std::string& json) {
    std::printf("%s\n", json.c_str());
    std::fflush(stdout);
    if (out) {
      std::fprintf(out, "%s\n", json.c_str());
      std::fflush(out);
    }
  }

  void record(const std::string& op, const std::string& impl, DType dt, int64_t n, int64_t rows, int64_t cols,
              double bytes, const Timing& t, int calls, int copies) {
    const double gbps = bytes / (t.median_us * 1e-6) / 1e9;
    char buf[1024];
    std::string shape;
    if (rows > 0) shape = ", \"rows\": " + std::to_string(rows) + ", \"cols\": " + std::to_string(cols);
    std::snprintf(buf, sizeof buf,
                  "{\"date\": \"%s\", \"device\": \"%s\", \"backend\": \"cuda\", \"harness\": \"te_fp8_peer\", "
                  "\"op\": \"%s\", \"impl\": \"%s\", \"dtype\": \"%s\", \"n\": %lld%s%s, \"median_us\": %.6g, "
                  "\"min_us\": %.6g, \"max_us\": %.6g, \"bytes\": %.17g, \"GBps\": %.6g, \"pct_of_copy\": %.6g, "
                  "\"calls_per_batch\": %d, \"repeats\": %d, \"copies\": %d, \"check\": \"ok\", "
                  "\"transformer_engine\": \"%s\"}",
                  date.c_str(), device.c_str(), op.c_str(), impl.c_str(), embscale::dtype_name(dt),
                  static_cast<long long>(n), shape.c_str(), op == "amax" ? "" : ", \"fp8\": \"fp8e4m3\"", t.median_us,
                  t.min_us, t.max_us, bytes, gbps, 100.0 * gbps / copy_gbps, calls, repeats, copies, TE_PEER_VERSION);
    line(buf);
  }
};

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

// ---- cases ----------------------------------------------------------------------------------------
// Bytes of FP8 codes that differ between two device buffers (both n bytes), and the first index.
int64_t count_diff(const void* a, const void* b, size_t n, int64_t* first) {
  std::vector<unsigned char> ha(n), hb(n);
  cuda_check(cudaMemcpy(ha.data(), a, n, cudaMemcpyDeviceToHost), "read codes");
  cuda_check(cudaMemcpy(hb.data(), b, n, cudaMemcpyDeviceToHost), "read codes");
  int64_t count = 0;
  *first = -1;
  for (size_t i = 0; i < n; ++i)
    if (ha[i] != hb[i]) {
      if (*first < 0) *first = static_cast<int64_t>(i);
      ++count;
    }
  return count;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

struct Runner {
  const Args& args;
  Recorder& rec;
  size_t l2;
  int failures = 0;
  embscale::Context ctx = embscale::Context::cuda();
  te::QuantizationConfigWrapper config;  // defaults: no power-of-2 scales, amax epsilon 0, no noop tensor

  // Compares the two impls' results; true when bit-identical (else reports why).
  bool check(const std::string& what, const void* es_codes, const void* te_codes, size_t bytes, const Scalars* es,
             const Scalars* tes, bool amax_written, float exact_amax) {
    cuda_check(cudaDeviceSynchronize(), "synchronize");
    bool ok = true;
    if (bytes) {
      int64_t first = -1;
      const int64_t diff = count_diff(es_codes, te_codes, bytes, &first);
      if (diff) {
        std::fprintf(stderr, "error: %s: %lld FP8 codes differ (first at byte %lld)\n", what.c_str(),
                     static_cast<long long>(diff), static_cast<long long>(first));
        ok = false;
      }
    }
    if (es && tes) {
      float e[3], t[3];
      es->get(e);
      tes->get(t);
      if (amax_written && !(same_bits(e[0], t[0]) && same_bits(e[0], exact_amax))) {
        std::fprintf(stderr, "error: %s: amax embscale %.9g, te %.9g, exact %.9g\n", what.c_str(), e[0], t[0], exact_amax);
        ok = false;
      }
      if (!same_bits(e[2], t[2])) {
        std::fprintf(stderr, "error: %s: scale_inv embscale %.9g, te %.9g\n", what.c_str(), e[2], t[2]);
        ok = false;
      }
    }
    if (!ok) ++failures;
    return ok;
  }

  void time_and_record(const std::string& op, DType dt, int64_t n, int64_t rows, int64_t cols, double bytes, int copies,
                       const std::function<void(int)>& es_op, const std::function<void(int)>& te_op) {
    Timing es_t, te_t;
    int calls = 0;
    time_pair(es_op, te_op, args, &es_t, &te_t, &calls);
    rec.record(op, "embscale", dt, n, rows, cols, bytes, es_t, calls, copies);
    rec.record(op, "te", dt, n, rows, cols, bytes, te_t, calls, copies);
    std::fprintf(stderr, "%-24s %-4s %-11s embscale %9.2f us  te %9.2f us  te/embscale %.3f\n", op.c_str(),
                 embscale::dtype_name(dt),
                 rows > 0 ? (std::to_string(rows) + "x" + std::to_string(cols)).c_str() : ("n=" + std::to_string(n)).c_str(),
                 es_t.median_us, te_t.median_us, te_t.median_us / es_t.median_us);
  }

  void run_one_d(const std::string& op, const Input& in) {
    const int64_t n = in.n;
    const DType dt = in.dtype;
    const size_t es = embscale::dtype_size(dt);
    const std::vector<size_t> shape{static_cast<size_t>(n)};
    const std::string what = op + " " + embscale::dtype_name(dt) + " n=" + std::to_string(n);
    const int copies = in.data.copies;
    Scalars s_es, s_te;
    const float fp8_max = embscale::fp8_max(DType::kF8E4M3);
    if (op == "amax") {
      size_t ws_bytes = 0;
      embscale::AmaxOptions aopts;
      es_check(embscale::amax_workspace_size(ctx, embscale::TensorView::vec(in.copy(0), dt, n), aopts, &ws_bytes),
               "amax_workspace_size");
      DeviceBuffer ws(ws_bytes), dummy(1);
      auto es_op = [&](int c) {
        es_check(embscale::amax(ctx, embscale::TensorView::vec(in.copy(c), dt, n), s_es.amax(), aopts, ws.ptr, ws_bytes),
                 "embscale amax");
      };
      // TE writes the amax into an FP8 tensor's amax field; its data is never touched by this op.
      auto te_op = [&](int c) {
        te::TensorWrapper x = te_input(in.copy(c), dt, shape);
        te::TensorWrapper y = te_fp8(dummy.ptr, shape, s_te, true);
        nvte_compute_amax_with_config(x.data(), y.data(), config, nullptr);
      };
      s_es.set(-1, 1, 1);
      s_te.set(-1, 1, 1);
      es_op(0);
      te_op(0);
      if (!check(what, nullptr, nullptr, 0, &s_es, &s_te, true, in.amax)) return;
      time_and_record(op, dt, n, 0, 0, static_cast<double>(n) * es, copies, es_op, te_op);
      return;
    }
    Rotating y_es(n, copies), y_te(n, copies);
    if (op == "quantize") {
      const float scale = fp8_max / in.amax;
      s_es.set(0, scale, 1.0f / scale);
      s_te.set(0, scale, 1.0f / scale);
      auto es_op = [&](int c) {
        es_check(embscale::quantize(ctx, embscale::TensorView::vec(in.copy(c), dt, n), s_es.scale(),
                                    embscale::TensorView::vec(y_es.copy(c), DType::kF8E4M3, n)),
                 "embscale quantize");
      };
      auto te_op = [&](int c) {
        te::TensorWrapper x = te_input(in.copy(c), dt, shape);
        te::TensorWrapper y = te_fp8(y_te.copy(c), shape, s_te, false);
        nvte_quantize_v2(x.data(), y.data(), config, nullptr);
      };
      es_op(0);
      te_op(0);
      if (!check(what, y_es.copy(0), y_te.copy(0), n, nullptr, nullptr, false, in.amax)) return;
      time_and_record(op, dt, n, 0, 0, static_cast<double>(n) * (es + 1), copies, es_op, te_op);
      return;
    }
    // quantize_current_scaling
    embscale::CurrentScalingOptions copts;
    size_t ws_bytes = 0;
    es_check(embscale::quantize_current_scaling_workspace_size(ctx, embscale::TensorView::vec(in.copy(0), dt, n), copts,
                                                               &ws_bytes),
             "quantize_current_scaling_workspace_size");
    DeviceBuffer ws(ws_bytes);
    auto es_op = [&](int c) {
      es_check(embscale::quantize_current_scaling(ctx, embscale::TensorView::vec(in.copy(c), dt, n),
                                                  embscale::TensorView::vec(y_es.copy(c), DType::kF8E4M3, n), s_es.amax(),
                                                  s_es.scale(), s_es.scale_inv(), copts, ws.ptr, ws_bytes),
               "embscale quantize_current_scaling");
    };
    auto te_op = [&](int c) {
      te::TensorWrapper x = te_input(in.copy(c), dt, shape);
      te::TensorWrapper with_amax = te_fp8(y_te.copy(c), shape, s_te, true);
      te::TensorWrapper without_amax = te_fp8(y_te.copy(c), shape, s_te, false);
      nvte_compute_amax_with_config(x.data(), with_amax.data(), config, nullptr);
      nvte_compute_scale_from_amax(with_amax.data(), config, nullptr);
      nvte_quantize_v2(x.data(), without_amax.data(), config, nullptr);
    };
    s_es.set(-1, -1, -1);
    s_te.set(-1, -1, -1);
    es_op(0);
    te_op(0);
    if (!check(what, y_es.copy(0), y_te.copy(0), n, &s_es, &s_te, true, in.amax)) return;
    time_and_record(op, dt, n, 0, 0, static_cast<double>(n) * (2 * es + 1), copies, es_op, te_op);
  }

  void run_cast_transpose(const Input& in, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols;
    const DType dt = in.dtype;
    const size_t es = embscale::dtype_size(dt);
    const std::string what = "cast_transpose " + std::string(embscale::dtype_name(dt)) + " " + std::to_string(rows) +
                             "x" + std::to_string(cols);
    const int copies = in.data.copies;
    Scalars s_es, s_te;
    const float scale = embscale::fp8_max(DType::kF8E4M3) / in.amax;
    s_es.set(0, scale, 1.0f / scale);
    s_te.set(0, scale, 1.0f / scale);
    Rotating y_es(n, copies), yt_es(n, copies), y_te(n, copies), yt_te(n, copies);
    const std::vector<size_t> shape{static_cast<size_t>(rows), static_cast<size_t>(cols)};
    const std::vector<size_t> tshape{static_cast<size_t>(cols), static_cast<size_t>(rows)};
    const std::vector<size_t> one{1};
    auto es_op = [&](int c) {
      es_check(embscale::cast_transpose(ctx, embscale::TensorView::mat(in.copy(c), dt, rows, cols), s_es.scale(),
                                        embscale::TensorView::mat(y_es.copy(c), DType::kF8E4M3, rows, cols),
                                        embscale::TensorView::mat(yt_es.copy(c), DType::kF8E4M3, cols, rows)),
               "embscale cast_transpose");
    };
    auto te_op = [&](int c) {
      te::TensorWrapper x = te_input(in.copy(c), dt, shape);
      te::TensorWrapper y = te_fp8(y_te.copy(c), shape, s_te, false);
      y.set_columnwise_data(yt_te.copy(c), te::DType::kFloat8E4M3, tshape);
      y.set_columnwise_scale_inv(s_te.scale_inv(), te::DType::kFloat32, one);
      nvte_cast_transpose(x.data(), y.data(), nullptr);
    };
    es_op(0);
    te_op(0);
    if (!check(what + " (rows)", y_es.copy(0), y_te.copy(0), n, nullptr, nullptr, false, in.amax) ||
        !check(what + " (transpose)", yt_es.copy(0), yt_te.copy(0), n, nullptr, nullptr, false, in.amax))
      return;
    time_and_record("cast_transpose", dt, n, rows, cols, static_cast<double>(n) * (es + 2), copies, es_op, te_op);
  }

  // Runs one case, reporting (not propagating) its errors, so the other cases still run.
  void guarded(const std::string& what, const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s: %s\n", what.c_str(), e.what());
      ++failures;
      cudaGetLastError();  // a sticky error would fail every later case anyway; a plain one is cleared
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  Recorder rec;
  rec.repeats = args.iters;
  rec.date = utc_date();
  try {
    int dev = 0, l2 = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    rec.device = prop.name;
    cuda_check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "L2 size");
    if (!args.out.empty()) {
      rec.out = std::fopen(args.out.c_str(), "a");
      if (!rec.out) usage_error("--out: cannot open '" + args.out + "' for appending");
    }
    std::fprintf(stderr, "te_fp8_peer: %s, L2 %d MB, TransformerEngine %s, seed %llu, %d timed batches after %d\n",
                 prop.name, l2 >> 20, TE_PEER_VERSION, static_cast<unsigned long long>(args.seed), args.iters, args.warmup);

    // The ceiling: a device-to-device copy of 1 GiB.
    {
      const size_t bytes = size_t{1} << 30;
      DeviceBuffer a(bytes), b(bytes);
      cuda_check(cudaMemset(a.ptr, 1, bytes), "cudaMemset");
      auto copy = [&](int c) {
        cuda_check(cudaMemcpyAsync(c % 2 ? a.ptr : b.ptr, c % 2 ? b.ptr : a.ptr, bytes, cudaMemcpyDeviceToDevice, nullptr),
                   "cudaMemcpyAsync");
      };
      Timing t, again;
      int calls = 0;
      time_pair(copy, copy, args, &t, &again, &calls);
      rec.copy_gbps = 2.0 * bytes / (t.median_us * 1e-6) / 1e9;
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "{\"date\": \"%s\", \"device\": \"%s\", \"backend\": \"cuda\", \"harness\": \"te_fp8_peer\", "
                    "\"op\": \"copy\", \"impl\": \"cudaMemcpyAsync\", \"dtype\": \"u8\", \"n\": %zu, \"bytes\": %.17g, "
                    "\"median_us\": %.6g, \"min_us\": %.6g, \"max_us\": %.6g, \"GBps\": %.6g, \"pct_of_copy\": 100}",
                    rec.date.c_str(), rec.device.c_str(), bytes, 2.0 * bytes, t.median_us, t.min_us, t.max_us,
                    rec.copy_gbps);
      rec.line(buf);
    }

    Runner r{args, rec, static_cast<size_t>(l2)};
    const bool want_ct = std::find(args.ops.begin(), args.ops.end(), "cast_transpose") != args.ops.end();
    for (const DType dt : args.dtypes) {
      for (const int64_t n : args.sizes) {
        bool any = false;
        for (const auto& op : args.ops) any |= op != "cast_transpose";
        if (!any) break;
        const std::string what = std::string(embscale::dtype_name(dt)) + " n=" + std::to_string(n);
        r.guarded("input " + what, [&] {
          const Input in(dt, n, r.l2, args.seed);
          for (const auto& op : args.ops)
            if (op != "cast_transpose") r.guarded(op + " " + what, [&] { r.run_one_d(op, in); });
        });
      }
      for (const auto& [rows, cols] : want_ct ? args.shapes : std::vector<std::pair<int64_t, int64_t>>{}) {
        const std::string what = "cast_transpose " + std::string(embscale::dtype_name(dt)) + " " +
                                 std::to_string(rows) + "x" + std::to_string(cols);
        r.guarded(what, [&] {
          const Input in(dt, rows * cols, r.l2, args.seed);
          r.run_cast_transpose(in, rows, cols);
        });
      }
    }
    if (rec.out) std::fclose(rec.out);
    if (r.failures) std::fprintf(stderr, "te_fp8_peer: %d case(s) failed\n", r.failures);
    return r.failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "te_fp8_peer: %s\n", e.what());
    return 1;
  }
}
