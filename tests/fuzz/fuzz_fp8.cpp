// C API fuzzer: the FP8 functions (amax, compute_scale, quantize, dequantize, current scaling,
// activation + amax, cast + transpose, and their workspace size queries).

#include "fuzz_capi.h"

namespace fuzz {

const std::set<std::string> kFp8Vocab = {"ctx", "backend", "num_threads", "x", "y", "yt", "amax", "scale",
                                          "scale_inv", "algo", "opts", "eps", "fp8_dtype", "activation", "act",
                                          "workspace", "workspace_bytes", "bytes", "nonfinite_flag",
                                          "power_of_2"};

struct Scalar {
  float* p = nullptr;
  Buf* buf = nullptr;
};
Scalar make_scalar(Case& c, const std::string& name, Role role, float value, bool required) {
  Scalar s;
  s.buf = c.alloc(name, 4, role);
  std::memcpy(s.buf->p(), &value, 4);
  s.p = reinterpret_cast<float*>(s.buf->p());
  if (c.rng.chance(0.04)) {
    s.p = nullptr;
    if (required) c.mut(name + "=NULL", Expect::kFail, kInvalidArgument);
    else c.mut(name + "=NULL(optional)");
  }
  return s;
}

float random_scale_value(Case& c) {
  switch (c.rng.below(8)) {
    case 0: return 0.0f;
    case 1: return INFINITY;
    case 2: return NAN;
    case 3: return -3.5f;
    case 4: return 3e38f;
    default: return static_cast<float>(c.rng.range(1, 100000)) * 1e-2f;
  }
}

// The amax algorithm, valid or not.
int32_t make_algo(Case& c) {
  int32_t algo = static_cast<int32_t>(c.rng.range(0, 2));
  if (c.rng.chance(0.04)) {
    algo = bad_enum(c, 3);
    c.mut(fmt("algo=%d", algo), Expect::kFail, kInvalidArgument);
  }
  return algo;
}

// x of a float dtype (an input) with a random valid shape.
Tensor make_x(Case& c, int64_t max_numel, Role role = Role::kInput) {
  Tensor x;
  x.d.dtype = c.rng.pick<int32_t>({kF32, kF16, kBF16});
  random_shape(c, &x.d, max_numel);
  materialise(c, &x, "x", role);
  return x;
}
// An output tensor of dtype dt with `like`'s shape (before its mutations).
Tensor make_like(Case& c, const Tensor& like, int dt, const std::string& name, Role role) {
  Tensor y;
  y.d.dtype = dt;
  y.d.ndim = like.d.ndim;
  for (int i = 0; i < 4; ++i) y.d.shape[i] = like.d.shape[i];
  materialise(c, &y, name, role, role == Role::kInput);
  return y;
}

// Two arguments whose element counts must match (both valid counts, after their mutations).
void partner_lengths(Case& c, const Tensor& a, const Tensor& b, const std::string& b_name) {
  if (a.numel() >= 0 && b.numel() >= 0 && a.numel() != b.numel())
    c.mut(b_name + ": element count differs from its partner's", Expect::kFail, kInvalidArgument);
}

// Valid-argument size of the workspace of op `which` for x and algo (0 when the query refuses).
size_t query_ws(int which, const embscale_tensor& x, int32_t algo) {
  embscale_context ctx{};
  size_t bytes = 0;
  int rc = 0;
  if (which == 0) rc = embscale_amax_workspace_size(&ctx, &x, algo, &bytes);
  else if (which == 1) rc = embscale_quantize_current_scaling_workspace_size(&ctx, &x, algo, &bytes);
  else rc = embscale_activation_amax_workspace_size(&ctx, &x, algo, &bytes);
  return rc == 0 ? bytes : 0;
}

void case_fp8_workspace_size(Case& c, bool cuda, int which) {
  static const char* kNames[] = {"embscale_amax_workspace_size", "embscale_quantize_current_scaling_workspace_size",
                                 "embscale_activation_amax_workspace_size"};
  c.op = kNames[which];
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Tensor x = make_x(c, 5000);
  // The size query needs no data: a NULL data pointer is fine there.
  if (c.rng.chance(0.3)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kUnchecked, true, Data::kIgnored);
  const int32_t algo = make_algo(c);
  size_t storage = 12345;
  size_t* bytes = size_out(c, &storage);
  if (ctx.c.backend == 1 && cuda) return;  // host memory on a CUDA context: not a call we can make
  c.snapshot();
  int rc;
  if (which == 0) rc = embscale_amax_workspace_size(ctx.ptr(), x.ptr(), algo, bytes);
  else if (which == 1) rc = embscale_quantize_current_scaling_workspace_size(ctx.ptr(), x.ptr(), algo, bytes);
  else rc = embscale_activation_amax_workspace_size(ctx.ptr(), x.ptr(), algo, bytes);
  check_call(c, c.op.c_str(), rc);
  if (rc == kOk && storage > (size_t{1} << 40)) c.fail(fmt("%s: %zu bytes", c.op.c_str(), storage));
}

// amax of the values as the library defines it (NaN skipped, -0 -> +0), for a valid call's check.
float reference_amax(const Tensor& x) {
  float a = 0.0f;
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = load_float(x.d.data, x.d.dtype, i);
    if (!std::isnan(v) && std::fabs(v) > a) a = std::fabs(v);
  }
  return a;
}

void case_amax(Case& c, bool cuda) {
  c.op = "embscale_amax";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Tensor x = make_x(c, 5000);
  const embscale_tensor valid_x = x.d;
  if (c.rng.chance(0.3)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kUnchecked, true);
  const int32_t algo = make_algo(c);
  const size_t need = query_ws(0, valid_x, algo >= 0 && algo <= 2 ? algo : 0);
  Workspace ws = make_workspace(c, need, true);
  Scalar amax = make_scalar(c, "amax", Role::kOutput, -1.0f, true);
  int32_t flag_storage = -7;
  int32_t* flag = c.rng.chance(0.5) ? &flag_storage : nullptr;
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = embscale_amax(ctx.ptr(), x.ptr(), amax.p, algo, flag, ws.p, ws.bytes, nullptr);
  check_call(c, c.op.c_str(), rc);
  if (rc == kOk && !c.must_fail && c.unknown == 0) {
    const float want = reference_amax(x);
    if (std::memcmp(amax.p, &want, 4) != 0) c.fail(fmt("amax %g, expected %g", *amax.p, want));
    if (flag && flag_storage != 0 && flag_storage != 1) c.fail(fmt("nonfinite_flag %d", flag_storage));
  }
}

void case_compute_scale(Case& c, bool cuda) {
  c.op = "embscale_compute_scale";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Scalar amax = make_scalar(c, "amax", Role::kInput, random_scale_value(c), true);
  int32_t fp8 = c.rng.pick<int32_t>({kE4M3, kE5M2});
  if (c.rng.chance(0.08)) {
    fp8 = c.rng.chance(0.5) ? c.rng.pick<int32_t>({kF32, kF16, kBF16, kI32, kI64}) : bad_enum(c, kNumDtypes);
    c.mut(fmt("fp8_dtype=%d", fp8), Expect::kFail, kInvalidArgument);
  }
  float eps = c.rng.chance(0.5) ? 0.0f : static_cast<float>(c.rng.range(0, 1000)) * 1e-3f;
  if (c.rng.chance(0.08)) {
    eps = c.rng.pick<float>({NAN, INFINITY, -INFINITY, -1.0f, -1e-30f});
    c.mut(fmt("eps=%g", eps), Expect::kFail, kInvalidArgument);
  }
  const int32_t pow2 = c.rng.pick<int32_t>({0, 1, -1, 2, INT32_MIN});
  Scalar scale = make_scalar(c, "scale", Role::kOutput, -1.0f, true);
  Scalar scale_inv = make_scalar(c, "scale_inv", Role::kOutput, -1.0f, true);
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = embscale_compute_scale(ctx.ptr(), amax.p, fp8, eps, pow2, scale.p, scale_inv.p, nullptr);
  check_call(c, c.op.c_str(), rc);
  if (rc == kOk && !c.must_fail && c.unknown == 0 && !(*scale.p > 0.0f && std::isfinite(*scale.p)))
    c.fail(fmt("scale %g is not a finite positive value", *scale.p));
}

void case_quantize(Case& c, bool cuda, bool dequant) {
  c.op = dequant ? "embscale_dequantize" : "embscale_quantize";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  // quantize: x (float) -> y (fp8); dequantize: y (fp8) -> x (float).
  Tensor in, out;
  if (!dequant) {
    in = make_x(c, 5000);
    out = make_like(c, in, c.rng.pick<int32_t>({kE4M3, kE5M2}), "y", Role::kOutput);
  } else {
    in.d.dtype = c.rng.pick<int32_t>({kE4M3, kE5M2});
    random_shape(c, &in.d, 5000);
    materialise(c, &in, "y", Role::kInput);
    out = make_like(c, in, c.rng.pick<int32_t>({kF32, kF16, kBF16}), "x", Role::kOutput);
  }
  const char* in_name = dequant ? "y" : "x";
  const char* out_name = dequant ? "x" : "y";
  auto in_ok = dequant ? fp8_ok : float_ok;
  auto out_ok = dequant ? float_ok : fp8_ok;
  if (c.rng.chance(0.25)) mutate_tensor(c, &in, in_name, Role::kInput, in_ok, Len::kPartner, true);
  if (c.rng.chance(0.25)) mutate_tensor(c, &out, out_name, Role::kOutput, out_ok, Len::kPartner, true);
  partner_lengths(c, in, out, out_name);
  Scalar s = make_scalar(c, dequant ? "scale_inv" : "scale", Role::kInput, random_scale_value(c), true);
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = dequant ? embscale_dequantize(ctx.ptr(), in.ptr(), s.p, out.ptr(), nullptr)
                          : embscale_quantize(ctx.ptr(), in.ptr(), s.p, out.ptr(), nullptr);
  check_call(c, c.op.c_str(), rc);
}

void case_quantize_current_scaling(Case& c, bool cuda) {
  c.op = "embscale_quantize_current_scaling";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Tensor x = make_x(c, 5000);
  const embscale_tensor valid_x = x.d;
  Tensor y = make_like(c, x, c.rng.pick<int32_t>({kE4M3, kE5M2}), "y", Role::kOutput);
  if (c.rng.chance(0.25)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kPartner, true);
  if (c.rng.chance(0.25)) mutate_tensor(c, &y, "y", Role::kOutput, fp8_ok, Len::kPartner, true);
  partner_lengths(c, x, y, "y");
  const int32_t algo = make_algo(c);
  const size_t need = query_ws(1, valid_x, algo >= 0 && algo <= 2 ? algo : 0);
  Workspace ws = make_workspace(c, need, true);
  Scalar amax = make_scalar(c, "amax", Role::kOutput, -1.0f, true);
  Scalar scale = make_scalar(c, "scale", Role::kOutput, -1.0f, true);
  Scalar scale_inv = make_scalar(c, "scale_inv", Role::kOutput, -1.0f, true);
  float eps = c.rng.chance(0.5) ? 0.0f : 1e-3f;
  if (c.rng.chance(0.06)) {
    eps = c.rng.pick<float>({NAN, INFINITY, -1.0f});
    c.mut(fmt("eps=%g", eps), Expect::kFail, kInvalidArgument);
  }
  int32_t flag_storage = -7;
  int32_t* flag = c.rng.chance(0.5) ? &flag_storage : nullptr;
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = embscale_quantize_current_scaling(ctx.ptr(), x.ptr(), y.ptr(), amax.p, scale.p, scale_inv.p, algo, eps,
                                                   c.rng.pick<int32_t>({0, 1, 5}), flag, ws.p, ws.bytes, nullptr);
  check_call(c, c.op.c_str(), rc);
}

void case_activation_amax(Case& c, bool cuda) {
  c.op = "embscale_activation_amax";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Tensor x = make_x(c, 5000);
  const embscale_tensor valid_x = x.d;
  Tensor y = make_like(c, x, c.rng.pick<int32_t>({kF32, kF16, kBF16}), "y", Role::kOutput);
  if (c.rng.chance(0.25)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kPartner, true);
  if (c.rng.chance(0.25)) mutate_tensor(c, &y, "y", Role::kOutput, float_ok, Len::kPartner, true);
  partner_lengths(c, x, y, "y");
  int32_t act = static_cast<int32_t>(c.rng.range(0, 2));
  if (c.rng.chance(0.05)) {
    act = bad_enum(c, 3);
    c.mut(fmt("activation=%d", act), Expect::kFail, kInvalidArgument);
  }
  const int32_t algo = make_algo(c);
  const size_t need = query_ws(2, valid_x, algo >= 0 && algo <= 2 ? algo : 0);
  Workspace ws = make_workspace(c, need, true);
  Scalar amax = make_scalar(c, "amax", Role::kOutput, -1.0f, true);
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = embscale_activation_amax(ctx.ptr(), act, x.ptr(), y.ptr(), amax.p, algo, ws.p, ws.bytes, nullptr);
  check_call(c, c.op.c_str(), rc);
}

void case_cast_transpose(Case& c, bool cuda) {
  c.op = "embscale_cast_transpose";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Tensor x;
  x.d.dtype = c.rng.pick<int32_t>({kF32, kF16, kBF16});
  set_shape(&x.d, {c.rng.range(0, 70), c.rng.range(0, 70)});
  materialise(c, &x, "x", Role::kInput);
  const int fp8 = c.rng.pick<int32_t>({kE4M3, kE5M2});
  Tensor y = make_like(c, x, fp8, "y", Role::kOutput);
  Tensor yt;
  yt.d.dtype = fp8;
  set_shape(&yt.d, {x.d.shape[1], x.d.shape[0]});
  materialise(c, &yt, "yt", Role::kOutput, false);
  // Every shape change of x, y or yt breaks the [rows, cols] / [cols, rows] contract.
  if (c.rng.chance(0.2)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kFixed, false);
  if (c.rng.chance(0.2)) mutate_tensor(c, &y, "y", Role::kOutput, fp8_ok, Len::kFixed, false);
  if (c.rng.chance(0.2)) mutate_tensor(c, &yt, "yt", Role::kOutput, fp8_ok, Len::kFixed, false);
  if (c.rng.chance(0.05)) {
    yt.d.dtype = fp8 == kE4M3 ? kE5M2 : kE4M3;
    c.mut("yt.dtype differs from y's", Expect::kFail, kInvalidArgument);
  }
  if (c.rng.chance(0.05) && x.d.shape[0] != x.d.shape[1] && x.numel() > 0) {  // y given yt's shape
    std::swap(y.d.shape[0], y.d.shape[1]);
    c.mut("y has the transposed shape", Expect::kFail, kInvalidArgument);
  }
  Scalar s = make_scalar(c, "scale", Role::kInput, random_scale_value(c), true);
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = embscale_cast_transpose(ctx.ptr(), x.ptr(), s.p, y.ptr(), yt.ptr(), nullptr);
  check_call(c, c.op.c_str(), rc);
}

}  // namespace fuzz
