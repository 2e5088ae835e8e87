// `embscale check` ops for FP8 current scaling: amax, compute_scale, quantize, dequantize,
// quantize_current_scaling, activation_amax and cast_transpose, each run on the chosen backend
// against the scalar oracle (tests/reference_fp8.h) on seeded random inputs, over every input dtype,
// both fp8 formats, edge sizes (0, 1, odd, beyond a million) and both amax algorithms. Comparisons
// are exact except activation outputs: 1 ulp of fp16/bf16, and for fp32 the fp32-evaluation bound
// (relative 2^-14, absolute 1e-40) the tests justify.
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "embscale/fp8.h"
#include "embscale/memory.h"
#include "reference_fp8.h"
#include "registry.h"

namespace embscale {
namespace tools {
namespace {

using ref::HostTensor;

const int64_t kSizes[] = {0, 1, 2, 3, 7, 31, 1000, 4097, 65537, (1 << 20) + 3};
const DType kFloat[] = {DType::kF32, DType::kF16, DType::kBF16};
const DType kFp8[] = {DType::kF8E4M3, DType::kF8E5M2};
const AmaxAlgo kAlgos[] = {AmaxAlgo::kAtomic, AmaxAlgo::kTwoStage};

Context context_for(Backend b) { return b == Backend::kCuda ? Context::cuda() : Context::cpu(); }

// Collects cases; keeps the first failure.
struct Recorder {
  const CheckArgs& args;
  CheckResult res;
  void add(const std::string& what, const std::string& failure) {
    ++res.cases;
    if (args.verbose) std::printf("  %s %s%s%s\n", failure.empty() ? "ok  " : "FAIL", what.c_str(),
                                  failure.empty() ? "" : ": ", failure.c_str());
    if (!failure.empty() && res.passed) {
      res.passed = false;
      res.detail = what + ": " + failure;
    }
  }
  CheckResult finish() {
    if (res.passed) res.detail = "all cases match the reference";
    return res;
  }
};

// Backend memory for one tensor or scalar, poisoned on creation.
struct Dev {
  Context ctx;
  Buffer buf;
  Dev(const Context& c, size_t bytes) : ctx(c), buf(c.backend, bytes) {
    if (buf.valid()) (void)fill_bytes(ctx, buf.data(), 0xA5, bytes);
  }
  Status upload(const void* src, size_t bytes) const { return copy_to_backend(ctx, buf.data(), src, bytes); }
  Status download(void* dst, size_t bytes) const { return copy_to_host(ctx, dst, buf.data(), bytes); }
  float* f() const { return buf.as<float>(); }
};

Status upload(const Dev& d, const HostTensor& h) { return d.upload(h.bytes.data(), h.bytes.size()); }
Status download(const Dev& d, HostTensor* h) { return d.download(h->bytes.data(), h->bytes.size()); }
float scalar(const Dev& d) {
  float v = NAN;
  (void)d.download(&v, 4);
  return v;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

HostTensor random_tensor(DType dt, int64_t n, uint64_t seed, double sigma = 3.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, sigma);
  HostTensor x(dt, n);
  for (int64_t i = 0; i < n; ++i) x.set(i, nd(rng));
  return x;
}

std::string case_name(const char* op, DType in, DType out, int64_t n, const char* extra = "") {
  return std::string(op) + " " + dtype_name(in) + "->" + dtype_name(out) + " n=" + std::to_string(n) + extra;
}

// First differing code (NaN == NaN), described, or "".
std::string compare_codes(const HostTensor& got, const HostTensor& want, const HostTensor* x) {
  const ref::Format f = ref::format_of(want.dtype);
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (ref::same_code(got.code(i), want.code(i), f)) continue;
    char buf[200];
    std::snprintf(buf, sizeof(buf), "index %lld%s%.9g: got 0x%x (%g), want 0x%x (%g)", static_cast<long long>(i),
                  x ? " x=" : "", x ? x->get(i) : 0.0, got.code(i), got.get(i), want.code(i), want.get(i));
    return buf;
  }
  return "";
}

std::string scalar_mismatch(const char* name, float got, float want) {
  if (bits(got) == bits(want)) return "";
  char buf[120];
  std::snprintf(buf, sizeof(buf), "%s = %.9g (0x%08x), want %.9g (0x%08x)", name, got, bits(got), want, bits(want));
  return buf;
}

uint64_t case_seed(const CheckArgs& a, uint64_t k) { return a.seed * 1000003ull + k; }

// ---- ops ----

CheckResult check_amax(const CheckArgs& args) {
  Recorder rec{args, {}};
  const Context ctx = context_for(args.backend);
  uint64_t k = 0;
  for (DType dt : kFloat) {
    for (int64_t n : kSizes) {
      HostTensor x = random_tensor(dt, n, case_seed(args, ++k));
      if (n > 100 && k % 2) x.set(n / 3, NAN);  // skipped by amax, reported by the flag
      const ref::AmaxResult want = ref::amax(x);
      for (AmaxAlgo algo : kAlgos) {
        const std::string what = case_name("amax", dt, DType::kF32, n, algo == AmaxAlgo::kAtomic ? " atomic" : " two_stage");
        Dev dx(ctx, x.bytes.size()), out(ctx, 4), flag(ctx, 4);
        AmaxOptions o;
        o.algo = algo;
        o.nonfinite_flag = static_cast<int32_t*>(flag.buf.data());
        size_t ws_bytes = 0;
        Status st = upload(dx, x);
        if (st.ok()) st = amax_workspace_size(ctx, TensorView::vec(dx.buf.data(), dt, n), o, &ws_bytes);
        Buffer ws(args.backend, ws_bytes);
        if (st.ok()) st = amax(ctx, TensorView::vec(dx.buf.data(), dt, n), out.f(), o, ws.data(), ws_bytes);
        if (st.ok()) st = synchronize(ctx);
        if (!st.ok()) {
          rec.add(what, st.to_string());
          continue;
        }
        int32_t f = -1;
        (void)flag.download(&f, 4);
        std::string fail = scalar_mismatch("amax", scalar(out), want.amax);
        if (fail.empty() && f != (want.nonfinite ? 1 : 0)) fail = "nonfinite flag " + std::to_string(f);
        rec.add(what, fail);
      }
    }
  }
  return rec.finish();
}

CheckResult check_compute_scale(const CheckArgs& args) {
  Recorder rec{args, {}};
  const Context ctx = context_for(args.backend);
  std::mt19937_64 rng(case_seed(args, 0));
  std::vector<float> amaxes = {0.0f, NAN, INFINITY, 1e-8f, 123.456f, 448.0f, 57344.0f, 1e-40f, FLT_MAX};
  for (int i = 0; i < 40; ++i) amaxes.push_back(static_cast<float>(std::ldexp(std::uniform_real_distribution<double>(0.5, 1.0)(rng),
                                                                          std::uniform_int_distribution<int>(-140, 127)(rng))));
  Dev a(ctx, 4), s(ctx, 4), si(ctx, 4);
  for (DType fp8 : kFp8) {
    for (float am : amaxes) {
      for (float eps : {0.0f, 1e-3f, 100.0f}) {
        for (bool p2 : {false, true}) {
          char what[120];
          std::snprintf(what, sizeof(what), "compute_scale %s amax=%g eps=%g pow2=%d", dtype_name(fp8), am, eps, p2);
          ScaleOptions o;
          o.eps = eps;
          o.power_of_2 = p2;
          Status st = a.upload(&am, 4);
          if (st.ok()) st = compute_scale(ctx, a.f(), fp8, o, s.f(), si.f());
          if (st.ok()) st = synchronize(ctx);
          if (!st.ok()) {
            rec.add(what, st.to_string());
            continue;
          }
          const float want = ref::scale(am, fp8_max(fp8), eps, p2);
          std::string fail = scalar_mismatch("scale", scalar(s), want);
          if (fail.empty()) fail = scalar_mismatch("scale_inv", scalar(si), ref::scale_inv(want));
          rec.add(what, fail);
        }
      }
    }
  }
  return rec.finish();
}

CheckResult check_quantize(const CheckArgs& args) {
  Recorder rec{args, {}};
  const Context ctx = context_for(args.backend);
  uint64_t k = 100;
  for (DType dt : kFloat) {
    for (DType fp8 : kFp8) {
      for (int64_t n : kSizes) {
        const HostTensor x = random_tensor(dt, n, case_seed(args, ++k));
        const float s = ref::scale(ref::amax(x).amax, fp8_max(fp8), 0.0f, false);
        HostTensor want(fp8, n), got(fp8, n);
        ref::quantize(x, s, &want);
        Dev dx(ctx, x.bytes.size()), dy(ctx, static_cast<size_t>(n)), ds(ctx, 4);
        Status st = upload(dx, x);
        if (st.ok()) st = ds.upload(&s, 4);
        if (st.ok()) st = quantize(ctx, TensorView::vec(dx.buf.data(), dt, n), ds.f(), TensorView::vec(dy.buf.data(), fp8, n));
        if (st.ok()) st = synchronize(ctx);
        if (st.ok()) st = download(dy, &got);
        rec.add(case_name("quantize", dt, fp8, n), st.ok() ? compare_codes(got, want, &x) : st.to_string());
      }
    }
  }
  return rec.finish();
}

CheckResult check_dequantize(const CheckArgs& args) {
  Recorder rec{args, {}};
  const Context ctx = context_for(args.backend);
  uint64_t k = 200;
  for (DType fp8 : kFp8) {
    for (DType dt : kFloat) {
      for (int64_t n : kSizes) {
        std::mt19937_64 rng(case_seed(args, ++k));
        HostTensor y(fp8, n), want(dt, n), got(dt, n);
        for (int64_t i = 0; i < n; ++i) y.set_code(i, static_cast<uint32_t>(rng() & 0xff));  // every code, NaN too
        const float s_inv = static_cast<float>(std::ldexp(std::uniform_real_distribution<double>(0.5, 1.0)(rng),
                                                          std::uniform_int_distribution<int>(-20, 4)(rng)));
        ref::dequantize(y, s_inv, &want);
        Dev dy(ctx, static_cast<size_t>(n)), dx(ctx, want.bytes.size()), ds(ctx, 4);
        Status st = upload(dy, y);
        if (st.ok()) st = ds.upload(&s_inv, 4);
        if (st.ok()) st = dequantize(ctx, TensorView::vec(dy.buf.data(), fp8, n), ds.f(), TensorView::vec(dx.buf.data(), dt, n));
        if (st.ok()) st = synchronize(ctx);
        if (st.ok()) st = download(dx, &got);
        rec.add(case_name("dequantize", fp8, dt, n), st.ok() ? compare_codes(got, want, &y) : st.to_string());
      }
    }
  }
  return rec.finish();
}

CheckResult check_current_scaling(const CheckArgs& args) {
  Recorder rec{args, {}};
  const Context ctx = context_for(args.backend);
  uint64_t k = 300;
  for (DType dt : kFloat) {
    for (DType fp8 : kFp8) {
      for (int64_t n : kSizes) {
        for (AmaxAlgo algo : kAlgos) {
          ++k;
          const HostTensor x = random_tensor(dt, n, case_seed(args, k), 0.7);
          CurrentScalingOptions o;
          o.amax.algo = algo;
          o.scale.power_of_2 = k % 3 == 0;
          o.scale.eps = k % 4 == 0 ? 1e-3f : 0.0f;
          const ref::AmaxResult ra = ref::amax(x);
          const float rs = ref::scale(ra.amax, fp8_max(fp8), o.scale.eps, o.scale.power_of_2);
          HostTensor want(fp8, n), got(fp8, n);
          ref::quantize(x, rs, &want);
          Dev dx(ctx, x.bytes.size()), dy(ctx, static_cast<size_t>(n)), a(ctx, 4), s(ctx, 4), si(ctx, 4);
          size_t ws_bytes = 0;
          const TensorView xv = TensorView::vec(dx.buf.data(), dt, n);
          Status st = upload(dx, x);
          if (st.ok()) st = quantize_current_scaling_workspace_size(ctx, xv, o, &ws_bytes);
          Buffer ws(args.backend, ws_bytes);
          if (st.ok())
            st = quantize_current_scaling(ctx, xv, TensorView::vec(dy.buf.data(), fp8, n), a.f(), s.f(), si.f(), o,
                                          ws.data(), ws_bytes);
          if (st.ok()) st = synchronize(ctx);
          if (st.ok()) st = download(dy, &got);
          const std::string what =
              case_name("quantize_current_scaling", dt, fp8, n, algo == AmaxAlgo::kAtomic ? " atomic" : " two_stage");
          if (!st.ok()) {
            rec.add(what, st.to_string());
            continue;
          }
          std::string fail = scalar_mismatch("amax", scalar(a), ra.amax);
          if (fail.empty()) fail = scalar_mismatch("scale", scalar(s), rs);
          if (fail.empty()) fail = scalar_mismatch("scale_inv", scalar(si), ref::scale_inv(rs));
          if (fail.empty()) fail = compare_codes(got, want, &x);
          rec.add(what, fail);
        }
      }
    }
  }
  return rec.finish();
}

std::string compare_activation(Activation act, const HostTensor& x, const HostTensor& y) {
  const ref::Format f = ref::format_of(y.dtype);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double r = ref::activation(act, x.get(i));
    bool ok;
    if (std::isnan(r)) {
      ok = std::isnan(y.get(i));
    } else if (act == Activation::kRelu || y.dtype != DType::kF32) {
      const int64_t d = ref::ordinal(y.code(i), f) - ref::ordinal(ref::encode(r, f, false), f);
      ok = act == Activation::kRelu ? d == 0 : (d >= -1 && d <= 1);
    } else {
      ok = std::fabs(y.get(i) - r) <= 0x1p-14 * std::fabs(r) + 1e-40;
    }
    if (!ok) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "index %lld: x=%.9g y=%.9g, reference %.9g", static_cast<long long>(i), x.get(i),
                    y.get(i), r);
      return buf;
    }
  }
  return "";
}

CheckResult check_activation_amax(const CheckArgs& args) {
  Recorder rec{args, {}};
  const Context ctx = context_for(args.backend);
  uint64_t k = 400;
  for (Activation act : {Activation::kRelu, Activation::kGeluTanh, Activation::kSilu}) {
    for (DType dt : kFloat) {
      for (DType out : kFloat) {
        for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4097}, int64_t{65537}}) {
          ++k;
          const HostTensor x = random_tensor(dt, n, case_seed(args, k), 4.0);
          HostTensor y(out, n);
          Dev dx(ctx, x.bytes.size()), dy(ctx, y.bytes.size()), a(ctx, 4);
          AmaxOptions o;
          o.algo = kAlgos[k % 2];
          size_t ws_bytes = 0;
          const TensorView xv = TensorView::vec(dx.buf.data(), dt, n);
          Status st = upload(dx, x);
          if (st.ok()) st = activation_amax_workspace_size(ctx, xv, o, &ws_bytes);
          Buffer ws(args.backend, ws_bytes);
          if (st.ok())
            st = activation_amax(ctx, act, xv, TensorView::vec(dy.buf.data(), out, n), a.f(), o, ws.data(), ws_bytes);
          if (st.ok()) st = synchronize(ctx);
          if (st.ok()) st = download(dy, &y);
          const std::string what = std::string("activation_amax ") + activation_name(act) + " " + dtype_name(dt) + "->" +
                                   dtype_name(out) + " n=" + std::to_string(n);
          if (!st.ok()) {
            rec.add(what, st.to_string());
            continue;
          }
          std::string fail = compare_activation(act, x, y);
          if (fail.empty()) fail = scalar_mismatch("amax (of y as stored)", scalar(a), ref::amax(y).amax);
          rec.add(what, fail);
        }
      }
    }
  }
  return rec.finish();
}

CheckResult check_cast_transpose(const CheckArgs& args) {
  Recorder rec{args, {}};
  const Context ctx = context_for(args.backend);
  const int64_t shapes[][2] = {{0, 3}, {3, 0}, {1, 1}, {1, 37}, {45, 1}, {33, 65}, {128, 256}, {255, 1023}};
  uint64_t k = 500;
  for (DType dt : kFloat) {
    for (DType fp8 : kFp8) {
      for (const auto& sh : shapes) {
        const int64_t rows = sh[0], cols = sh[1], n = rows * cols;
        const HostTensor x = random_tensor(dt, n, case_seed(args, ++k));
        const float s = ref::scale(ref::amax(x).amax, fp8_max(fp8), 0.0f, false);
        HostTensor want(fp8, n), want_t(fp8, n), got(fp8, n), got_t(fp8, n);
        ref::quantize(x, s, &want);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) want_t.set_code(c * rows + r, want.code(r * cols + c));
        Dev dx(ctx, x.bytes.size()), dy(ctx, static_cast<size_t>(n)), dyt(ctx, static_cast<size_t>(n)), ds(ctx, 4);
        Status st = upload(dx, x);
        if (st.ok()) st = ds.upload(&s, 4);
        if (st.ok())
          st = cast_transpose(ctx, TensorView::mat(dx.buf.data(), dt, rows, cols), ds.f(),
                              TensorView::mat(dy.buf.data(), fp8, rows, cols), TensorView::mat(dyt.buf.data(), fp8, cols, rows));
        if (st.ok()) st = synchronize(ctx);
        if (st.ok()) st = download(dy, &got);
        if (st.ok()) st = download(dyt, &got_t);
        const std::string what = std::string("cast_transpose ") + dtype_name(dt) + "->" + dtype_name(fp8) + " " +
                                 std::to_string(rows) + "x" + std::to_string(cols);
        if (!st.ok()) {
          rec.add(what, st.to_string());
          continue;
        }
        std::string fail = compare_codes(got, want, &x);
        if (!fail.empty()) fail = "y " + fail;
        if (fail.empty()) {
          fail = compare_codes(got_t, want_t, nullptr);
          if (!fail.empty()) fail = "yt " + fail;
        }
        rec.add(what, fail);
      }
    }
  }
  return rec.finish();
}

const RegisterCheck kAmax({"amax", "max |x| (fp32/fp16/bf16, both algorithms, non-finite flag) vs the oracle", check_amax});
const RegisterCheck kScale({"compute_scale", "scale and scale_inv from amax (eps, power of 2, edge amaxes)", check_compute_scale});
const RegisterCheck kQuantize({"quantize", "x * scale -> fp8 e4m3/e5m2 codes, exact", check_quantize});
const RegisterCheck kDequantize({"dequantize", "fp8 codes * scale_inv -> fp32/fp16/bf16, exact", check_dequantize});
const RegisterCheck kCurrent({"quantize_current_scaling", "amax -> scale -> fp8 in one call, exact", check_current_scaling});
const RegisterCheck kActivation({"activation_amax", "relu/gelu_tanh/silu + amax of the stored output", check_activation_amax});
const RegisterCheck kCastTranspose({"cast_transpose", "fp8 cast and transposed copy, exact", check_cast_transpose});

}  // namespace
}  // namespace tools
}  // namespace embscale
