// C API fuzzer: embscale_tbe_backward_workspace_size and embscale_tbe_backward.

#include "fuzz_capi.h"
#include "fuzz_tbe.h"

namespace fuzz {

// The optimizers (embscale_c.h): 0 none, 1 sgd, 2 rowwise_adagrad, 3 adam, 4 partial_rowwise_adam, 5 adagrad,
// 6 lamb, 7 partial_rowwise_lamb, 8 lars_sgd.
constexpr int32_t kOptimizers = 9;
bool reads_eps(int32_t t) { return t >= 2 && t <= 7; }
bool reads_betas(int32_t t) { return t == 3 || t == 4 || t == 6 || t == 7; }
bool applies_decay(int32_t t) { return t == 2 || t == 3 || t == 4 || t >= 6; }

embscale_optimizer make_optimizer(Case& c, int32_t type) {
  embscale_optimizer p{};
  p.type = type;
  p.learning_rate = c.rng.chance(0.1) ? 0.0f : static_cast<float>(c.rng.range(1, 1000)) * 1e-3f;
  p.eps = c.rng.pick<float>({1e-8f, 1e-6f, 1e-3f, 0.1f});
  p.beta1 = c.rng.pick<float>({0.0f, 0.5f, 0.9f, 0.99f});
  p.beta2 = c.rng.pick<float>({0.0f, 0.9f, 0.999f});
  const bool decays = applies_decay(type);
  p.weight_decay_mode = decays ? static_cast<int32_t>(c.rng.range(0, 2)) : 0;
  p.weight_decay = decays && c.rng.chance(0.5) ? 0.01f : 0.0f;
  p.max_norm = type == 2 && c.rng.chance(0.3) ? 1.0f : 0.0f;
  p.gradient_clipping = type != 0 && c.rng.chance(0.3) ? 0.5f : 0.0f;
  p.step = c.rng.chance(0.2) ? 1 : c.rng.range(1, 100000);
  p.eta = c.rng.pick<float>({0.0f, 0.001f, 0.5f});
  p.momentum = c.rng.pick<float>({0.0f, 0.5f, 0.9f});
  return p;
}

void mutate_optimizer(Case& c, embscale_optimizer* p) {
  if (!touch(c, "optimizer")) return;
  const bool adagrad = p->type == 2, eps = reads_eps(p->type), betas = reads_betas(p->type), lars = p->type == 8;
  switch (c.rng.below(12)) {
    case 0:
      p->type = bad_enum(c, kOptimizers);
      c.mut(fmt("optimizer.type=%d", p->type), Expect::kFail, kInvalidArgument);
      break;
    case 1:
      p->learning_rate = c.rng.pick<float>({NAN, INFINITY, -INFINITY, -0.5f});
      c.mut(fmt("optimizer.learning_rate=%g", p->learning_rate), Expect::kFail, kInvalidArgument);
      break;
    case 2:
      p->step = c.rng.pick<int64_t>({0, -1, INT64_MIN});
      c.mut(fmt("optimizer.step=%" PRId64, p->step), Expect::kFail, kInvalidArgument);
      break;
    case 3:
      p->eps = c.rng.pick<float>({NAN, INFINITY, 0.0f, -1e-8f});
      c.mut(fmt("optimizer.eps=%g", p->eps), eps ? Expect::kFail : Expect::kAny, kInvalidArgument);
      break;
    case 4:
      if (c.rng.chance(0.5)) p->beta1 = c.rng.pick<float>({NAN, 1.0f, -0.1f, 2.0f});
      else p->beta2 = c.rng.pick<float>({NAN, 1.0f, -0.1f, INFINITY});
      c.mut(fmt("optimizer.beta1=%g beta2=%g", p->beta1, p->beta2), betas ? Expect::kFail : Expect::kAny, kInvalidArgument);
      break;
    case 5:
      p->weight_decay = c.rng.pick<float>({NAN, INFINITY});
      c.mut(fmt("optimizer.weight_decay=%g", p->weight_decay), Expect::kFail, kInvalidArgument);
      break;
    case 6:
      p->weight_decay_mode = bad_enum(c, 3);
      c.mut(fmt("optimizer.weight_decay_mode=%d", p->weight_decay_mode), Expect::kFail, kInvalidArgument);
      break;
    case 7:
      p->max_norm = c.rng.pick<float>({NAN, -1.0f, INFINITY, 2.0f});
      c.mut(fmt("optimizer.max_norm=%g", p->max_norm), p->max_norm == 2.0f && adagrad ? Expect::kOk : Expect::kFail,
            kInvalidArgument);
      break;
    case 8:
      p->gradient_clipping = c.rng.pick<float>({NAN, -1.0f, INFINITY, 1.0f});
      c.mut(fmt("optimizer.gradient_clipping=%g", p->gradient_clipping),
            p->gradient_clipping == 1.0f && p->type != 0 ? Expect::kOk : Expect::kFail, kInvalidArgument);
      break;
    case 9:
      if (!applies_decay(p->type)) {
        p->weight_decay = 0.01f;
        p->weight_decay_mode = static_cast<int32_t>(c.rng.range(1, 2));
        c.mut("weight decay with an optimizer that applies none", Expect::kFail, kInvalidArgument);
      }
      break;
    case 10:
      if (c.rng.chance(0.5)) p->eta = c.rng.pick<float>({NAN, -0.1f, INFINITY});
      else p->momentum = c.rng.pick<float>({NAN, 1.0f, -0.1f, INFINITY});
      c.mut(fmt("optimizer.eta=%g momentum=%g", p->eta, p->momentum), lars ? Expect::kFail : Expect::kAny,
            kInvalidArgument);
      break;
    default:
      p->step = INT64_MAX;
      p->learning_rate = c.rng.chance(0.5) ? 1e30f : p->learning_rate;
      c.mut(fmt("optimizer.step=INT64_MAX, learning_rate=%g", p->learning_rate), Expect::kOk);
      break;
  }
}

// embscale_optimizer_check: the backward's check of its optimizer argument on its own, with the
// backward's optimizer mutations (what each implies is about that argument alone), or a null pointer.
void case_optimizer_check(Case& c) {
  c.op = "embscale_optimizer_check";
  c.vocab = kTbeVocab;
  embscale_optimizer opt = make_optimizer(c, static_cast<int32_t>(c.rng.range(0, kOptimizers - 1)));
  if (c.rng.chance(0.05)) {
    c.mut("optimizer=NULL", Expect::kFail, kInvalidArgument);
    c.snapshot();
    check_call(c, "embscale_optimizer_check", embscale_optimizer_check(nullptr));
    return;
  }
  if (c.rng.chance(0.7)) mutate_optimizer(c, &opt);
  c.snapshot();
  check_call(c, "embscale_optimizer_check", embscale_optimizer_check(&opt));
}

// Whether the optimizer keeps momentum 1 / 2, and whether they are row-wise.
void state_shape(int type, bool* m1, bool* m1_rows, bool* m2, bool* m2_rows) {
  *m1 = type >= 2;
  *m1_rows = type == 2;
  *m2 = type == 3 || type == 4 || type == 6 || type == 7;
  *m2_rows = type == 4 || type == 7;
}

// One backward case: op 0 = embscale_tbe_backward_workspace_size, 1 = embscale_tbe_backward.
void case_tbe_backward(Case& c, bool cuda, int op) {
  c.op = op == 0 ? "embscale_tbe_backward_workspace_size" : "embscale_tbe_backward";
  c.vocab = kTbeVocab;
  const int32_t pooling = static_cast<int32_t>(c.rng.range(0, 2));
  TbeObj o;
  if (!make_tbe(c, &o, pooling == 2)) return;
  Ctx ctx;
  make_ctx(c, &ctx, cuda, 0.05, true);
  const int32_t type = static_cast<int32_t>(c.rng.range(0, kOptimizers - 1));
  const bool dense = type == 0;
  const Role wrole = dense ? Role::kInput : Role::kTable;  // dense-gradient mode never writes the weights
  const bool specials = c.rng.chance(0.15);
  Lookup l;
  make_lookup(c, o, &l, pooling, wrole, specials);
  Tensor go;
  go.embedded = true;
  go.d.dtype = c.rng.pick<int32_t>({kF32, kF32, kF16, kBF16});
  if (pooling == 2) set_shape(&go.d, {l.N, o.D(0)});
  else set_shape(&go.d, {l.B, o.lay.total_dim});
  materialise(c, &go, "grad_output", Role::kInput, false);
  fill_values(c, go.buf->p(), go.d.dtype, go.numel(), specials);
  embscale_optimizer opt = make_optimizer(c, type);
  bool m1, m1_rows, m2, m2_rows;
  state_shape(type, &m1, &m1_rows, &m2, &m2_rows);
  Tensor mom1, mom2, gpsw, urows, ugrads;
  for (Tensor* t : {&mom1, &mom2, &gpsw, &urows, &ugrads}) t->embedded = true;
  for (auto& m : {std::make_tuple(&mom1, m1, m1_rows, "momentum1"), std::make_tuple(&mom2, m2, m2_rows, "momentum2")}) {
    Tensor* t = std::get<0>(m);
    t->d.dtype = kF32;
    set_shape(&t->d, {std::get<2>(m) ? o.lay.total_rows : o.lay.num_weights});
    if (std::get<1>(m)) {
      materialise(c, t, std::get<3>(m), Role::kState, false);
      for (int64_t i = 0; i < t->numel(); ++i) {  // state as an optimizer leaves it: >= 0 sums and squares
        const float v = static_cast<float>(c.rng.range(0, 1000)) * 1e-3f;
        std::memcpy(t->buf->p() + 4 * i, &v, 4);
      }
    }
  }
  gpsw.d.dtype = kF32;
  set_shape(&gpsw.d, {l.N});
  if (l.psw.d.data != nullptr && c.rng.chance(0.5)) materialise(c, &gpsw, "grad_per_sample_weights", Role::kOutput, false);
  urows.d.dtype = kI64;
  set_shape(&urows.d, {l.N});
  ugrads.d.dtype = kF32;
  set_shape(&ugrads.d, {l.N * o.lay.max_dim});
  if (c.rng.chance(0.3)) set_shape(&ugrads.d, {l.N, o.lay.max_dim});
  int64_t* num_unique = nullptr;
  if (dense) {
    materialise(c, &urows, "unique_rows", Role::kOutput, false);
    materialise(c, &ugrads, "unique_grads", Role::kOutput, false);
    num_unique = reinterpret_cast<int64_t*>(c.alloc("num_unique", 8, Role::kOutput)->p());
  }
  embscale_tbe_backward_args a{};
  auto put = [&]() {
    put_lookup(l, &a);
    a.grad_output = go.d;
    a.optimizer = opt;
    a.momentum1 = mom1.d;
    a.momentum2 = mom2.d;
    a.grad_per_sample_weights = gpsw.d;
    a.unique_rows = urows.d;
    a.num_unique = num_unique;
    a.unique_grads = ugrads.d;
  };
  a.rounding = static_cast<int32_t>(c.rng.range(0, 1));
  a.seed = c.rng.next();
  if (c.rng.chance(0.3)) {
    a.max_warp_segment = static_cast<int32_t>(c.rng.range(0, 200));
    a.max_block_segment = static_cast<int32_t>(c.rng.range(0, 2000));
    a.block_threads = c.rng.pick<int32_t>({0, 32, 64, 256, 1024});
  }
  // The workspace the valid arguments need.
  put();
  size_t need = 0;
  {
    embscale_context vctx{};
    const int rc = embscale_tbe_backward_workspace_size(o.h, &vctx, &a, &need);
    if (rc != kOk) {
      c.fail(fmt("embscale_tbe_backward_workspace_size refused valid arguments: %s", embscale_last_error()));
      return;
    }
  }
  bool tbe_null = false, args_null = false;
  const int nmut = c.rng.chance(0.7) ? static_cast<int>(c.rng.range(1, 2)) : 0;
  for (int m = 0; m < nmut; ++m) {
    const uint64_t k = c.rng.below(19);
    if (k < 9) {
      mutate_lookup(c, o, &l, wrole, &tbe_null, &args_null, op == 1);
    } else if (k == 9) {
      mutate_tensor(c, &go, "grad_output", Role::kInput, float_ok, Len::kFixed, false);
    } else if (k == 10 || k == 11) {
      mutate_optimizer(c, &opt);
    } else if (k == 12) {  // state: present or absent against the optimizer's needs, or mutated
      Tensor* t = c.rng.chance(0.5) ? &mom1 : &mom2;
      const char* name = t == &mom1 ? "momentum1" : "momentum2";
      const bool used = t == &mom1 ? m1 : m2;
      if (c.touched.count(name)) {
        // already mutated
      } else if (used && c.rng.chance(0.7)) {
        mutate_tensor(c, t, name, Role::kState, [](int dt) { return dt == kF32; }, Len::kFixed, true);
        if (t->d.data == nullptr && !t->null) c.muts.back() += " (absent, but the optimizer keeps it)";
      } else if (used) {
        touch(c, name);
        t->d.data = nullptr;
        c.mut(std::string(name) + " absent", Expect::kFail, kInvalidArgument);
      } else {
        touch(c, name);
        set_shape(&t->d, {c.rng.chance(0.5) ? o.lay.total_rows : o.lay.num_weights});
        materialise(c, t, name, Role::kState, false);
        c.mut(std::string(name) + " given to an optimizer that keeps none", Expect::kFail, kInvalidArgument);
      }
    } else if (k == 13) {  // the gradient of the per-sample weights
      if (gpsw.d.data != nullptr) {
        mutate_tensor(c, &gpsw, "grad_per_sample_weights", Role::kOutput, [](int dt) { return dt == kF32; }, Len::kFixed,
                      true, Data::kOptional);
      } else if (l.psw.d.data == nullptr && l.N > 0 && touch(c, "grad_per_sample_weights")) {
        materialise(c, &gpsw, "grad_per_sample_weights", Role::kOutput, false);
        c.mut("grad_per_sample_weights given", Expect::kLabel);  // judged below, with the final per_sample_weights
      }
    } else if (k == 14) {  // dense-gradient outputs
      if (dense) {
        const uint64_t w = c.rng.below(3);
        if (w == 0) {
          mutate_tensor(c, &urows, "unique_rows", Role::kOutput, [](int dt) { return dt == kI64; }, Len::kFixed, true,
                        l.N > 0 ? Data::kRequired : Data::kOptional);
        } else if (w == 1) {
          mutate_tensor(c, &ugrads, "unique_grads", Role::kOutput, [](int dt) { return dt == kF32; }, Len::kFixed, true,
                        l.N > 0 ? Data::kRequired : Data::kOptional);
        } else if (touch(c, "num_unique")) {
          num_unique = nullptr;
          c.mut("num_unique=NULL", Expect::kFail, kInvalidArgument);
        }
      } else if (l.N > 0) {
        Tensor* t = c.rng.chance(0.5) ? &urows : &ugrads;
        if (!touch(c, t == &urows ? "unique_rows" : "unique_grads")) continue;
        materialise(c, t, "dense output", Role::kOutput, false);
        c.mut("a dense-gradient output given to an updating optimizer", Expect::kFail, kInvalidArgument);
      } else if (touch(c, "num_unique")) {
        num_unique = reinterpret_cast<int64_t*>(c.alloc("num_unique", 8, Role::kOutput)->p());
        c.mut("num_unique given to an updating optimizer", Expect::kFail, kInvalidArgument);
      }
    } else if (k == 15 && touch(c, "rounding")) {
      a.rounding = bad_enum(c, 2);
      c.mut(fmt("rounding=%d", a.rounding), Expect::kFail, kInvalidArgument);
    } else if (k == 16) {
      int32_t* f = c.rng.pick<int32_t*>({&a.max_warp_segment, &a.max_block_segment, &a.block_threads});
      if (!touch(c, f == &a.max_warp_segment ? "max_warp_segment" : f == &a.max_block_segment ? "max_block_segment"
                                                                                            : "block_threads")) {
        // already mutated
      } else if (c.rng.chance(0.5)) {
        *f = c.rng.pick<int32_t>({-1, INT32_MIN});
        c.mut(fmt("tuning=%d", *f), Expect::kFail, kInvalidArgument);
      } else {
        *f = c.rng.pick<int32_t>({1, INT32_MAX, 3, 1 << 30});
        c.mut(fmt("tuning=%d", *f));
      }
    } else {  // a written buffer aliasing another one
      std::vector<std::pair<Tensor*, const char*>> written = {{&mom1, "momentum1"}, {&mom2, "momentum2"},
                                                              {&gpsw, "grad_per_sample_weights"},
                                                              {&urows, "unique_rows"}, {&ugrads, "unique_grads"}};
      if (!dense) written.push_back({&l.weights, "weights"});
      std::vector<std::pair<const Tensor*, const char*>> any = {
          {&l.weights, "weights"}, {&l.indices, "indices"}, {&l.offsets, "offsets"}, {&l.psw, "per_sample_weights"},
          {&go, "grad_output"},    {&mom1, "momentum1"},    {&mom2, "momentum2"},   {&gpsw, "grad_per_sample_weights"},
          {&urows, "unique_rows"}, {&ugrads, "unique_grads"}};
      const auto& w = written[c.rng.below(written.size())];
      const auto& r = any[c.rng.below(any.size())];
      if (w.first != r.first) alias(c, w.first, w.second, *r.first, r.second);
    }
  }
  if (gpsw.d.data != nullptr && l.psw.d.data == nullptr)
    c.mut("=> grad_per_sample_weights without per_sample_weights", Expect::kFail, kInvalidArgument);
  judge_values(c, o, &l, op == 1);
  put();
  if (ctx.c.backend == 1 && cuda) return;
  if (op == 0) {
    size_t storage = 0;
    size_t* bytes = size_out(c, &storage);
    c.snapshot();
    const int rc = embscale_tbe_backward_workspace_size(tbe_null ? nullptr : o.h, ctx.ptr(), args_null ? nullptr : &a,
                                                        bytes);
    check_call(c, c.op.c_str(), rc);
    if (rc == kOk && storage > (size_t{1} << 36)) c.fail(fmt("workspace of %zu bytes for a tiny problem", storage));
    return;
  }
  Workspace ws = make_workspace(c, need, true);
  c.snapshot();
  const int rc = embscale_tbe_backward(tbe_null ? nullptr : o.h, ctx.ptr(), args_null ? nullptr : &a, ws.p, ws.bytes);
  check_call(c, c.op.c_str(), rc);
  if (rc == kOk && dense && num_unique && (*num_unique < 0 || *num_unique > l.N))
    c.fail(fmt("num_unique = %" PRId64 " with %" PRId64 " lookups", *num_unique, l.N));
}

}  // namespace fuzz
