// One TBE backward test case end to end, shared by the GoogleTest suite and `embscale check`: build
// the TableBatchedEmbedding, generate seeded lookups (random bag lengths, optional hot rows and
// out-of-range indices), weights, optimizer state and grad_output, run several backward steps on a
// backend (learning rate and step changed between steps) and compare weights, state,
// grad_per_sample_weights and dense-mode outputs with the naive reference (reference_tbe_backward.h).
//
// Outputs the backend writes but does not update in place (grad_per_sample_weights, the dense-mode
// outputs) are poisoned with all-ones bytes (NaN, -1) first.
// Tolerances, against the double reference:
//  * integer-valued data with SGD (power-of-two learning rates, small-integer weights and gradients):
//    exact, fp32 sums of such values are exact;
//  * summed gradients and dot products: the fp32 summation bound 1.2e-7 * n * sum|terms| (n terms);
//  * fp32 weights: SGD 1e-5, row-wise Adagrad 1e-4, Adam and partial row-wise Adam 1e-5 + 1e-4*|ref|;
//  * fp16/bf16 weights, against the fp32 reference (reference_tbe_backward_f32.h, the fp32 value the
//    library computes before rounding): kNearest must give exactly its round-to-nearest-even,
//    kStochastic exactly one of its two neighbours (itself when representable); rows no lookup updated
//    keep their bits. On the CPU the fp32 reference is the library's value bit for bit, so this holds
//    with no tolerance; on CUDA (its own row-sum order, FMA contraction) a value within the fp32
//    tolerance below of a rounding boundary may go either way. Also within one unit in the last place
//    plus the fp32 tolerance of the double reference. The references restart from the backend's rounded
//    weights and state at each step, since rounding choices compound;
//  * state: 1e-6 + 1e-4*|ref|.
#pragma once

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/numerics.h"
#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "reference_fp8.h"
#include "reference_tbe.h"
#include "reference_tbe_backward.h"
#include "reference_tbe_backward_f32.h"

namespace embscale {
namespace testing_tbe {

struct BwdCase {
  std::vector<int64_t> num_rows;
  std::vector<int> dims;
  std::vector<int> feature_table;  // empty = one feature per table
  int64_t batch_size = 4;
  int max_bag = 4;                 // bag lengths uniform in [0, max_bag]
  double hot_fraction = 0.0;       // probability that a lookup hits row 0 of its table
  double bad_fraction = 0.0;       // probability of an out-of-range index (use with kSkip)
  DType weights_dtype = DType::kF32;
  DType grad_dtype = DType::kF32;
  DType index_dtype = DType::kI64;
  PoolingMode pooling = PoolingMode::kSum;
  BoundsCheckMode bounds = BoundsCheckMode::kError;
  bool weighted = false;
  bool grad_psw = false;           // ask for grad_per_sample_weights (weighted only)
  bool integer_values = false;
  OptimizerParams opt;
  int steps = 1;
  WeightRounding rounding = WeightRounding::kNearest;
  int threads = 0;
  TbeBackwardTuning tuning;
  uint64_t seed = 1;
  // When set, each backward step is handed to it as `call` instead of running on the case's context
  // (the CUDA graph test captures it into a graph on its own stream); it returns call's Status.
  std::function<Status(const Context& ctx, const std::function<Status(const Context&)>& call)> runner;

  std::vector<int> features() const {
    if (!feature_table.empty()) return feature_table;
    std::vector<int> f(num_rows.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<int>(i);
    return f;
  }
  std::string describe() const {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "seed=%" PRIu64 " opt=%s T=%zu tables=%zu D0=%d B=%" PRId64 " L<=%d hot=%g bad=%g w=%s g=%s idx=%s "
                  "pool=%s%s%s%s steps=%d wd=%d clip=%g maxnorm=%g rounding=%d",
                  seed, optimizer_name(opt.type), features().size(), num_rows.size(), dims.empty() ? 0 : dims[0],
                  batch_size, max_bag, hot_fraction, bad_fraction, dtype_name(weights_dtype), dtype_name(grad_dtype),
                  dtype_name(index_dtype), pooling_mode_name(pooling), weighted ? " weighted" : "",
                  grad_psw ? " gpsw" : "", integer_values ? " integer" : "", steps,
                  static_cast<int>(opt.weight_decay_mode), opt.gradient_clipping, opt.max_norm,
                  static_cast<int>(rounding));
    return buf;
  }
};

struct BwdOutcome {
  std::string failure;              // empty when everything matched
  bool reference_nonzero = false;   // some reference gradient was non-zero
  std::vector<unsigned char> weights, m1, m2;  // the backend's final buffers, for determinism checks
};

inline void encode(DType t, double v, unsigned char* dst, int64_t i) {
  switch (t) {
    case DType::kF32: reinterpret_cast<float*>(dst)[i] = static_cast<float>(v); break;
    case DType::kF16: reinterpret_cast<uint16_t*>(dst)[i] = float_to_fp16(static_cast<float>(v)); break;
    case DType::kBF16: reinterpret_cast<uint16_t*>(dst)[i] = float_to_bf16(static_cast<float>(v)); break;
    default: break;
  }
}

// One unit in the last place of `t` at |x| (fp32: 0, the fp32 tolerance covers it).
inline double dtype_ulp(DType t, double x) {
  if (t == DType::kF32) return 0.0;
  const int man = t == DType::kF16 ? 10 : 7;
  const int min_exp = t == DType::kF16 ? -14 : -126;
  int e = 0;
  std::frexp(std::fabs(x), &e);
  return std::ldexp(1.0, std::max(e - 1, min_exp) - man);
}

// The value of the code next to `code` on the number line, below (dir = -1) or above (+1).
inline uint32_t code_step(uint32_t code, const ref::Format& f, int dir) {
  const int64_t o = ref::ordinal(code, f) + dir;
  return o >= 0 ? static_cast<uint32_t>(o) : (ref::sign_bit(f) | static_cast<uint32_t>(-o));
}
// The largest value of the format <= v and the smallest >= v (equal when v is representable).
inline double grid_floor(double v, const ref::Format& f) {
  const uint32_t c = ref::encode(v, f, false);
  return ref::decode(c, f) > v ? ref::decode(code_step(c, f, -1), f) : ref::decode(c, f);
}
inline double grid_ceil(double v, const ref::Format& f) {
  const uint32_t c = ref::encode(v, f, false);
  return ref::decode(c, f) < v ? ref::decode(code_step(c, f, +1), f) : ref::decode(c, f);
}

// 16-bit weights after a step against the fp32 reference `f32` (see the tolerances above); empty when
// every weight is right. w_before/w_after: the backend's weights buffer before and after the step.
inline std::string check_rounded_weights(Backend backend, const BwdCase& c, const ref::F32Update& f32,
                                         const std::vector<unsigned char>& w_before,
                                         const std::vector<unsigned char>& w_after, double fp32_atol,
                                         double fp32_rtol) {
  const ref::Format fmt = ref::format_of(c.weights_dtype);
  const bool bit_exact = backend == Backend::kCpu;
  auto code_at = [](const std::vector<unsigned char>& w, size_t i) {
    uint16_t u;
    std::memcpy(&u, w.data() + 2 * i, 2);
    return static_cast<uint32_t>(u);
  };
  char msg[320];
  for (size_t i = 0; i < f32.w.size(); ++i) {
    const uint32_t got = code_at(w_after, i);
    if (!f32.updated[i]) {
      if (got != code_at(w_before, i)) {
        std::snprintf(msg, sizeof msg, "weights[%zu] changed (0x%04x -> 0x%04x) though no lookup updated its row", i,
                      code_at(w_before, i), got);
        return msg;
      }
      continue;
    }
    const double v = f32.w[i];
    const double band = bit_exact ? 0.0 : fp32_atol + fp32_rtol * std::fabs(v);
    const double g = ref::decode(got, fmt);
    bool ok;
    if (c.rounding == WeightRounding::kNearest) {
      ok = got == ref::encode(v, fmt, false) ||
           (band > 0.0 && (got == ref::encode(v - band, fmt, false) || got == ref::encode(v + band, fmt, false)));
    } else {
      // One of the two neighbours of v (v itself when representable); on CUDA of a value within the band.
      const double lo = grid_floor(v - band, fmt), hi = grid_ceil(v + band, fmt);
      ok = (g == lo || g == hi || (band > 0.0 && g > lo && g < hi)) && !std::isnan(g);
    }
    if (!ok) {
      std::snprintf(msg, sizeof msg,
                    "weights[%zu] = %.9g (0x%04x); %s rounding of the fp32 update %.9g expects %.9g (0x%04x)%s", i, g,
                    got, c.rounding == WeightRounding::kNearest ? "nearest" : "stochastic", v,
                    ref::decode(ref::encode(v, fmt, false), fmt), ref::encode(v, fmt, false),
                    c.rounding == WeightRounding::kNearest ? "" : " or its other neighbour");
      return msg;
    }
  }
  return "";
}

inline BwdOutcome run_backward_case(Backend backend, const BwdCase& c) {
  BwdOutcome res;
  auto fail = [&](const std::string& m) {
    res.failure = c.describe() + ": " + m;
    return res;
  };
  const Context ctx = backend == Backend::kCuda ? Context::cuda() : Context::cpu(c.threads);
  TbeConfig cfg;
  for (size_t t = 0; t < c.num_rows.size(); ++t) cfg.tables.push_back(TableSpec{c.num_rows[t], c.dims[t]});
  cfg.feature_table_map = c.feature_table;
  cfg.weights_dtype = c.weights_dtype;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  Status st = TableBatchedEmbedding::create(ctx, cfg, &tbe);
  if (!st.ok()) return fail("create: " + st.to_string());
  const std::vector<int> ft = c.features();
  const int64_t T = static_cast<int64_t>(ft.size()), B = c.batch_size;
  std::mt19937_64 rng(c.seed);
  auto uni = [&](double lo, double hi) { return lo + (hi - lo) * static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  auto small_int = [&](int k) { return static_cast<double>(static_cast<int>(rng() % (2 * k + 1)) - k); };

  // Lookups.
  ref::BwdInput in;
  in.batch_size = B;
  in.pooling = c.pooling;
  in.offsets.push_back(0);
  for (int64_t f = 0; f < T; ++f) {
    const int64_t E = c.num_rows[ft[f]];
    for (int64_t b = 0; b < B; ++b) {
      const int64_t L = static_cast<int64_t>(rng() % (c.max_bag + 1));
      for (int64_t l = 0; l < L; ++l) {
        int64_t idx = static_cast<int64_t>(rng() % E);
        if (uni(0, 1) < c.hot_fraction) idx = 0;
        if (uni(0, 1) < c.bad_fraction) idx = (rng() & 1) ? -1 - static_cast<int64_t>(rng() % 3) : E + static_cast<int64_t>(rng() % 3);
        in.indices.push_back(idx);
      }
      in.offsets.push_back(static_cast<int64_t>(in.indices.size()));
    }
  }
  const int64_t N = static_cast<int64_t>(in.indices.size());
  if (c.weighted) {
    static const float kVals[] = {-1.0f, 0.5f, 1.0f, 2.0f};
    in.psw.resize(N);
    for (auto& w : in.psw) w = c.integer_values ? kVals[rng() % 4] : static_cast<float>(uni(-1, 1));
  }
  const bool seq = c.pooling == PoolingMode::kNone;
  const int64_t go_rows = seq ? N : B, go_cols = seq ? (T > 0 ? tbe->feature_dim(0) : 0) : tbe->total_dim();

  // Weights and state, host copies in their storage dtypes.
  const int64_t NW = tbe->num_weights(), R = tbe->total_rows();
  const size_t wsz = dtype_size(c.weights_dtype);
  std::vector<unsigned char> w_host(static_cast<size_t>(NW) * wsz);
  for (int64_t i = 0; i < NW; ++i) encode(c.weights_dtype, c.integer_values ? small_int(8) : uni(-1, 1), w_host.data(), i);
  const OptimizerType ot = c.opt.type;
  // The state each optimizer keeps (tbe.h): momentum1 row-wise (R floats) or element-wise (NW), momentum2 the same.
  const bool has_m1 = ot != OptimizerType::kNone && ot != OptimizerType::kSgd;
  const int64_t n1 = !has_m1 ? 0 : ot == OptimizerType::kRowwiseAdagrad ? R : NW;
  const bool has_m2 = ot == OptimizerType::kAdam || ot == OptimizerType::kPartialRowwiseAdam ||
                      ot == OptimizerType::kLamb || ot == OptimizerType::kPartialRowwiseLamb;
  const int64_t n2 = !has_m2 ? 0
                     : (ot == OptimizerType::kPartialRowwiseAdam || ot == OptimizerType::kPartialRowwiseLamb) ? R
                                                                                                              : NW;
  std::vector<float> m1_host(n1), m2_host(n2);
  // Sums of squares (Adagrad's) start >= 0; moments and velocities either sign.
  const bool m1_sum = ot == OptimizerType::kRowwiseAdagrad || ot == OptimizerType::kAdagrad;
  for (auto& v : m1_host) v = static_cast<float>(m1_sum ? uni(0, 1) : uni(-0.1, 0.1));
  for (auto& v : m2_host) v = static_cast<float>(uni(0, 0.1));

  const size_t idx_sz = dtype_size(c.index_dtype);
  std::vector<unsigned char> idx_host(static_cast<size_t>(N) * idx_sz), off_host(in.offsets.size() * idx_sz);
  for (int64_t i = 0; i < N; ++i) {
    if (c.index_dtype == DType::kI32) reinterpret_cast<int32_t*>(idx_host.data())[i] = static_cast<int32_t>(in.indices[i]);
    else reinterpret_cast<int64_t*>(idx_host.data())[i] = in.indices[i];
  }
  for (size_t i = 0; i < in.offsets.size(); ++i) {
    if (c.index_dtype == DType::kI32) reinterpret_cast<int32_t*>(off_host.data())[i] = static_cast<int32_t>(in.offsets[i]);
    else reinterpret_cast<int64_t*>(off_host.data())[i] = in.offsets[i];
  }

  const size_t go_bytes = static_cast<size_t>(go_rows * go_cols) * dtype_size(c.grad_dtype);
  const bool dense = ot == OptimizerType::kNone;
  const int64_t maxd = tbe->max_dim();
  Buffer d_w(backend, w_host.size()), d_idx(backend, idx_host.size()), d_off(backend, off_host.size()),
      d_psw(backend, in.psw.size() * 4), d_go(backend, go_bytes), d_m1(backend, m1_host.size() * 4),
      d_m2(backend, m2_host.size() * 4), d_gpsw(backend, c.grad_psw ? N * 4 : 0), d_rows(backend, dense ? N * 8 : 0),
      d_nu(backend, 8), d_ug(backend, dense ? N * maxd * 4 : 0), d_skip(backend, 8);
  if (!(st = copy_to_backend(ctx, d_w.data(), w_host.data(), w_host.size())).ok() ||
      !(st = copy_to_backend(ctx, d_idx.data(), idx_host.data(), idx_host.size())).ok() ||
      !(st = copy_to_backend(ctx, d_off.data(), off_host.data(), off_host.size())).ok() ||
      !(st = copy_to_backend(ctx, d_psw.data(), in.psw.data(), in.psw.size() * 4)).ok() ||
      !(st = copy_to_backend(ctx, d_m1.data(), m1_host.data(), m1_host.size() * 4)).ok() ||
      !(st = copy_to_backend(ctx, d_m2.data(), m2_host.data(), m2_host.size() * 4)).ok())
    return fail("upload: " + st.to_string());

  ref::BwdConfig rc{c.num_rows, c.dims, ft};
  ref::BwdState rs;
  auto load_ref_state = [&]() {
    rs.w.resize(NW);
    for (int64_t i = 0; i < NW; ++i) rs.w[i] = ref::decode(w_host.data(), c.weights_dtype, i);
    rs.m1.assign(m1_host.begin(), m1_host.end());
    rs.m2.assign(m2_host.begin(), m2_host.end());
  };
  load_ref_state();

  const double fp32_atol = (c.integer_values && ot == OptimizerType::kSgd) ? 0.0
                           : ot == OptimizerType::kSgd ? 1e-5
                           : ot == OptimizerType::kRowwiseAdagrad ? 1e-4
                           : 1e-5;
  const double fp32_rtol = (ot == OptimizerType::kSgd || ot == OptimizerType::kRowwiseAdagrad) ? 0.0 : 1e-4;

  std::vector<unsigned char> go_host(go_bytes);
  for (int k = 0; k < c.steps; ++k) {
    // A new gradient, learning rate and step each time.
    for (int64_t i = 0; i < go_rows * go_cols; ++i)
      encode(c.grad_dtype, c.integer_values ? small_int(4) : uni(-1, 1), go_host.data(), i);
    in.grad_output.resize(go_rows * go_cols);
    for (int64_t i = 0; i < go_rows * go_cols; ++i) in.grad_output[i] = ref::decode(go_host.data(), c.grad_dtype, i);
    OptimizerParams op = c.opt;
    op.learning_rate = c.opt.learning_rate * ((k % 2) ? 0.5f : 1.0f);
    op.step = c.opt.step + k;
    if (!(st = copy_to_backend(ctx, d_go.data(), go_host.data(), go_bytes)).ok() ||
        !(st = fill_bytes(ctx, d_gpsw.data(), 0xff, d_gpsw.bytes())).ok() ||
        !(st = fill_bytes(ctx, d_rows.data(), 0xff, d_rows.bytes())).ok() ||
        !(st = fill_bytes(ctx, d_ug.data(), 0xff, d_ug.bytes())).ok() || !(st = fill_bytes(ctx, d_nu.data(), 0xff, 8)).ok())
      return fail("upload: " + st.to_string());

    TbeBackwardArgs a;
    a.weights = TensorView::vec(d_w.data(), c.weights_dtype, NW);
    a.indices = TensorView::vec(d_idx.data(), c.index_dtype, N);
    a.offsets = TensorView::vec(d_off.data(), c.index_dtype, static_cast<int64_t>(in.offsets.size()));
    if (c.weighted) a.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, N);
    a.batch_size = B;
    a.pooling = c.pooling;
    a.bounds_check = c.bounds;
    a.grad_output = TensorView::mat(d_go.data(), c.grad_dtype, go_rows, go_cols);
    a.optimizer = op;
    if (has_m1) a.momentum1 = TensorView::vec(d_m1.data(), DType::kF32, static_cast<int64_t>(m1_host.size()));
    if (has_m2) a.momentum2 = TensorView::vec(d_m2.data(), DType::kF32, static_cast<int64_t>(m2_host.size()));
    if (c.grad_psw) a.grad_per_sample_weights = TensorView::vec(d_gpsw.data(), DType::kF32, N);
    if (dense) {
      a.unique_rows = TensorView::vec(d_rows.data(), DType::kI64, N);
      a.num_unique = d_nu.as<int64_t>();
      a.unique_grads = TensorView::vec(d_ug.data(), DType::kF32, N * maxd);
    }
    a.rounding = c.rounding;
    a.seed = c.seed;
    a.tuning = c.tuning;
    const bool counts = c.bounds == BoundsCheckMode::kSkip || c.bounds == BoundsCheckMode::kWarn;
    a.num_skipped = counts ? d_skip.as<int64_t>() : nullptr;
    size_t ws_bytes = 0;
    if (!(st = tbe->backward_workspace_size(ctx, a, &ws_bytes)).ok()) return fail("workspace size: " + st.to_string());
    Buffer ws(backend, ws_bytes);
    if (!ws.valid()) return fail("workspace allocation failed");
    const auto call = [&](const Context& x) { return tbe->backward(x, a, ws.data(), ws_bytes); };
    st = c.runner ? c.runner(ctx, call) : call(ctx);
    if (st.ok()) st = synchronize(ctx);
    if (!st.ok()) return fail("step " + std::to_string(k) + ": backward: " + st.to_string());

    // The fp32 values the library rounds 16-bit weights from, from the weights and state before the step.
    ref::F32Update f32;
    std::vector<unsigned char> w_before;
    if (c.weights_dtype != DType::kF32) {
      std::vector<float> wf(NW), m1f(m1_host), m2f(m2_host);
      for (int64_t i = 0; i < NW; ++i) wf[i] = static_cast<float>(ref::decode(w_host.data(), c.weights_dtype, i));
      f32 = ref::tbe_backward_f32(rc, in, op, wf, &m1f, &m2f);
      w_before = w_host;
    }
    const ref::BwdOutput ro = ref::tbe_backward(rc, in, op, &rs);
    for (const auto& kv : ro.row_grad)
      for (double x : kv.second) res.reference_nonzero = res.reference_nonzero || x != 0.0;

    if (!(st = copy_to_host(ctx, w_host.data(), d_w.data(), w_host.size())).ok() ||
        !(st = copy_to_host(ctx, m1_host.data(), d_m1.data(), m1_host.size() * 4)).ok() ||
        !(st = copy_to_host(ctx, m2_host.data(), d_m2.data(), m2_host.size() * 4)).ok())
      return fail("download: " + st.to_string());
    char msg[320];
    const std::string at = "step " + std::to_string(k) + ": ";

    if (c.bounds == BoundsCheckMode::kSkip || c.bounds == BoundsCheckMode::kWarn) {
      int64_t skipped = -1;
      if (!(st = copy_to_host(ctx, &skipped, d_skip.data(), 8)).ok()) return fail("download: " + st.to_string());
      if (skipped != ro.skipped)
        return fail(at + "num_skipped " + std::to_string(skipped) + ", expected " + std::to_string(ro.skipped));
    }
    if (c.grad_psw) {
      std::vector<float> gp(N);
      if (!(st = copy_to_host(ctx, gp.data(), d_gpsw.data(), N * 4)).ok()) return fail("download: " + st.to_string());
      for (int64_t i = 0; i < N; ++i) {
        const double D = static_cast<double>(go_cols > 0 ? (seq ? go_cols : maxd) : 1);
        const double tol = c.integer_values ? 0.0 : 1.2e-7 * D * D * 4.0;  // the fp32 dot bound for |w|, |grad| <= 1, x4
        if (!(std::fabs(gp[i] - ro.gpsw[i]) <= tol)) {
          std::snprintf(msg, sizeof msg, "grad_per_sample_weights[%" PRId64 "] = %.9g, expected %.9g", i, gp[i],
                        ro.gpsw[i]);
          return fail(at + msg);
        }
      }
    }
    if (dense) {
      int64_t nu = -1;
      if (!(st = copy_to_host(ctx, &nu, d_nu.data(), 8)).ok()) return fail("download: " + st.to_string());
      if (nu != static_cast<int64_t>(ro.row_grad.size()))
        return fail(at + "num_unique " + std::to_string(nu) + ", expected " + std::to_string(ro.row_grad.size()));
      std::vector<int64_t> rows(N);
      std::vector<float> ug(static_cast<size_t>(N * maxd));
      if (!(st = copy_to_host(ctx, rows.data(), d_rows.data(), N * 8)).ok() ||
          !(st = copy_to_host(ctx, ug.data(), d_ug.data(), ug.size() * 4)).ok())
        return fail("download: " + st.to_string());
      int64_t u = 0;
      for (const auto& kv : ro.row_grad) {
        if (rows[u] != kv.first)
          return fail(at + "unique_rows[" + std::to_string(u) + "] = " + std::to_string(rows[u]) + ", expected " +
                      std::to_string(kv.first));
        const std::vector<double>& ab = ro.row_abs.at(kv.first);
        const double n = static_cast<double>(ro.row_count.at(kv.first));
        for (int64_t d = 0; d < maxd; ++d) {
          const float got = ug[u * maxd + d];
          const double want = d < static_cast<int64_t>(kv.second.size()) ? kv.second[d] : 0.0;
          const double tol = d < static_cast<int64_t>(kv.second.size()) ? 1.2e-7 * (n + 1) * ab[d] : 0.0;
          if (!(std::fabs(got - want) <= tol)) {
            std::snprintf(msg, sizeof msg, "unique_grads[%" PRId64 ", %" PRId64 "] (row %" PRId64 ") = %.9g, expected %.9g",
                          u, d, kv.first, got, want);
            return fail(at + msg);
          }
        }
        ++u;
      }
    }

    // Weights and state.
    for (int64_t i = 0; i < NW; ++i) {
      const double got = ref::decode(w_host.data(), c.weights_dtype, i);
      const double want = rs.w[i];
      const double tol = fp32_atol + fp32_rtol * std::fabs(want) + dtype_ulp(c.weights_dtype, want);
      if (!(std::fabs(got - want) <= tol)) {
        std::snprintf(msg, sizeof msg, "weights[%" PRId64 "] = %.9g, expected %.9g (tolerance %.3g)", i, got, want, tol);
        return fail(at + msg);
      }
    }
    if (c.weights_dtype != DType::kF32) {
      const std::string why = check_rounded_weights(backend, c, f32, w_before, w_host, fp32_atol, fp32_rtol);
      if (!why.empty()) return fail(at + why);
    }
    for (int m = 0; m < 2; ++m) {
      const std::vector<float>& got = m == 0 ? m1_host : m2_host;
      const std::vector<double>& want = m == 0 ? rs.m1 : rs.m2;
      for (size_t i = 0; i < got.size(); ++i) {
        const double tol = 1e-6 + 1e-4 * std::fabs(want[i]);
        if (!(std::fabs(got[i] - want[i]) <= tol)) {
          std::snprintf(msg, sizeof msg, "momentum%d[%zu] = %.9g, expected %.9g", m + 1, i, got[i], want[i]);
          return fail(at + msg);
        }
      }
    }
    // 16-bit weights: the next step starts from the backend's rounded values.
    if (c.weights_dtype != DType::kF32) load_ref_state();
  }
  res.weights = w_host;
  res.m1.assign(reinterpret_cast<unsigned char*>(m1_host.data()), reinterpret_cast<unsigned char*>(m1_host.data()) + m1_host.size() * 4);
  res.m2.assign(reinterpret_cast<unsigned char*>(m2_host.data()), reinterpret_cast<unsigned char*>(m2_host.data()) + m2_host.size() * 4);
  return res;
}

// A seeded random configuration for `opt`: mixed D (odd ones and 1 included), shared tables, both index
// dtypes, every pooling mode, weighted and not, every weights/grad dtype, weight decay modes, clipping,
// the short-key sort on and off.
inline BwdCase random_backward_case(uint64_t seed, OptimizerType opt) {
  std::mt19937_64 rng(seed);
  BwdCase c;
  c.seed = seed;
  c.opt.type = opt;
  const int tables = 1 + static_cast<int>(rng() % 5);
  static const int kDims[] = {1, 2, 3, 4, 7, 8, 16, 33, 64, 100, 128, 129};
  const int pool = static_cast<int>(rng() % 3);
  c.pooling = pool == 0 ? PoolingMode::kSum : pool == 1 ? PoolingMode::kMean : PoolingMode::kNone;
  const int seq_dim = kDims[rng() % 12];
  for (int t = 0; t < tables; ++t) {
    c.num_rows.push_back(1 + static_cast<int64_t>(rng() % 200));
    c.dims.push_back(c.pooling == PoolingMode::kNone ? seq_dim : kDims[rng() % 12]);
  }
  if (rng() % 3 == 0) {
    const int T = 1 + static_cast<int>(rng() % 6);
    for (int f = 0; f < T; ++f) c.feature_table.push_back(static_cast<int>(rng() % tables));
  }
  c.batch_size = static_cast<int64_t>(rng() % 9);
  c.max_bag = static_cast<int>(rng() % 8);
  c.hot_fraction = (rng() % 3 == 0) ? 0.5 : 0.0;
  static const DType kF[] = {DType::kF32, DType::kF16, DType::kBF16};
  c.weights_dtype = (rng() % 2) ? DType::kF32 : kF[rng() % 3];
  c.grad_dtype = kF[rng() % 3];
  c.index_dtype = (rng() % 2) ? DType::kI32 : DType::kI64;
  c.weighted = c.pooling != PoolingMode::kMean && (rng() % 2);
  c.grad_psw = c.weighted && (rng() % 2);
  c.steps = 1 + static_cast<int>(rng() % 3);
  c.rounding = (rng() % 2) ? WeightRounding::kNearest : WeightRounding::kStochastic;
  if (rng() % 4 == 0) {
    c.bounds = BoundsCheckMode::kSkip;
    c.bad_fraction = 0.1;
  }
  OptimizerParams& p = c.opt;
  p.learning_rate = opt == OptimizerType::kSgd ? 0.0625f : 0.01f;
  p.eps = opt == OptimizerType::kRowwiseAdagrad ? 0.1f : 1e-3f;
  p.step = 1 + static_cast<int64_t>(rng() % 20);
  if (opt == OptimizerType::kLarsSgd) {
    p.eta = rng() % 2 ? 0.5f : 0.05f;
    p.momentum = (rng() % 3) * 0.45f;  // 0, 0.45, 0.9
  }
  if (opt != OptimizerType::kSgd && opt != OptimizerType::kNone && opt != OptimizerType::kAdagrad) {
    const int wd = static_cast<int>(rng() % 3);
    p.weight_decay_mode = wd == 0 ? WeightDecayMode::kNone : wd == 1 ? WeightDecayMode::kL2 : WeightDecayMode::kDecoupled;
    p.weight_decay = wd == 0 ? 0.0f : 0.05f;
  }
  if (opt != OptimizerType::kNone && rng() % 3 == 0) p.gradient_clipping = 0.5f;
  if (opt == OptimizerType::kRowwiseAdagrad && rng() % 3 == 0) p.max_norm = 2.0f;
  return c;
}

}  // namespace testing_tbe
}  // namespace embscale
