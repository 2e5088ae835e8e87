// The TBE part of the C API fuzzer's harness: a small module made through the C API, lookups on it
// (indices, offsets, per-sample weights) with their mutations, and the checks shared by the forward
// and backward cases (fuzz_tbe_forward.cpp, fuzz_tbe_backward.cpp).
#pragma once

#include "fuzz_capi.h"

namespace fuzz {

// ---- TBE: forward, backward workspace size, backward ------------------------------------------------
const std::set<std::string> kTbeVocab = {
    "ctx", "backend", "num_threads", "tbe", "args", "weights", "indices", "offsets", "per_sample_weights",
    "batch_size", "pooling", "bounds_check", "output", "num_skipped", "grad_output", "optimizer", "type",
    "learning_rate", "eps", "beta1", "beta2", "weight_decay", "weight_decay_mode", "max_norm",
    "gradient_clipping", "step", "momentum1", "momentum2", "grad_per_sample_weights", "unique_rows",
    "num_unique", "unique_grads", "rounding", "seed", "tuning", "max_warp_segment",
    "max_block_segment", "block_threads", "workspace", "workspace_bytes", "bytes"};

// A small valid TableBatchedEmbedding made through the C API (destroyed with the case).
struct TbeObj {
  embscale_tbe* h = nullptr;
  std::vector<int64_t> rows;
  std::vector<int32_t> dims, fmap;  // fmap: the table of each feature
  int wdt = kF32;
  embscale_tbe_layout lay{};
  std::vector<int64_t> woff, roff;
  ~TbeObj() { embscale_tbe_destroy(h); }
  int F() const { return static_cast<int>(fmap.size()); }
  int D(int f) const { return dims[fmap[f]]; }
  int64_t E(int f) const { return rows[fmap[f]]; }
};

inline bool make_tbe(Case& c, TbeObj* o, bool same_dims) {
  const int T = static_cast<int>(c.rng.range(1, 4));
  const int32_t D = static_cast<int32_t>(c.rng.pick<int64_t>({1, 2, 3, 4, 5, 8, 13, 33}));
  for (int t = 0; t < T; ++t) {
    o->rows.push_back(c.rng.chance(0.15) ? 1 : c.rng.range(1, 40));
    o->dims.push_back(same_dims ? D : static_cast<int32_t>(c.rng.pick<int64_t>({1, 2, 3, 4, 7, 8, 16, 33, 65})));
  }
  const bool identity = c.rng.chance(0.3);
  const int F = identity ? T : static_cast<int>(c.rng.range(1, 5));
  for (int f = 0; f < F; ++f) o->fmap.push_back(identity ? f : static_cast<int32_t>(c.rng.below(T)));
  o->wdt = c.rng.pick<int32_t>({kF32, kF32, kF16, kBF16});
  embscale_context ctx{};
  const int rc = embscale_tbe_create(&ctx, T, o->rows.data(), o->dims.data(), F, identity ? nullptr : o->fmap.data(),
                                     o->wdt, &o->h);
  if (rc != kOk || o->h == nullptr) {
    c.fail(fmt("embscale_tbe_create refused a valid configuration: %s", embscale_last_error()));
    return false;
  }
  o->woff.assign(T, 0);
  o->roff.assign(T, 0);
  if (embscale_tbe_layout_get(o->h, &o->lay) != kOk || embscale_tbe_table_offsets(o->h, o->woff.data(), o->roff.data()) != kOk) {
    c.fail(fmt("layout of a valid TableBatchedEmbedding: %s", embscale_last_error()));
    return false;
  }
  return true;
}

inline int64_t get_index(const void* p, int dt, int64_t i) {
  if (dt == kI32) {
    int32_t v;
    std::memcpy(&v, static_cast<const char*>(p) + 4 * i, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, static_cast<const char*>(p) + 8 * i, 8);
  return v;
}
inline void set_index(void* p, int dt, int64_t i, int64_t v) {
  if (dt == kI32) {
    const int32_t w = static_cast<int32_t>(v);
    std::memcpy(static_cast<char*>(p) + 4 * i, &w, 4);
  } else {
    std::memcpy(static_cast<char*>(p) + 8 * i, &v, 8);
  }
}

// The lookup arguments shared by forward and backward, valid, before mutations.
struct Lookup {
  int idx_dt = kI64;
  int64_t B = 0, N = 0, TB = 0;  // B may be mutated; TB (bags the offsets hold) is the valid T*B
  int32_t pooling = 0, bounds = 0;
  Tensor weights, indices, offsets, psw;
  bool bad_indices = false;  // out-of-range index values were written (skip/off: dropped)
  int64_t* num_skipped = nullptr;
};

inline void make_lookup(Case& c, const TbeObj& o, Lookup* l, int32_t pooling, Role weights_role, bool specials) {
  for (Tensor* t : {&l->weights, &l->indices, &l->offsets, &l->psw}) t->embedded = true;
  l->pooling = pooling;
  l->bounds = static_cast<int32_t>(c.rng.range(0, 2));
  l->idx_dt = c.rng.pick<int32_t>({kI32, kI64});
  l->B = c.rng.chance(0.05) ? 0 : c.rng.range(1, 5);
  const int64_t TB = l->TB = o.F() * l->B;
  std::vector<int64_t> off(TB + 1, 0), idx;
  for (int f = 0; f < o.F(); ++f)
    for (int64_t b = 0; b < l->B; ++b) {
      const int64_t len = c.rng.chance(0.15) ? 0 : c.rng.range(1, 5);
      for (int64_t j = 0; j < len; ++j) idx.push_back(c.rng.chance(0.3) ? 0 : c.rng.range(0, o.E(f) - 1));
      off[f * l->B + b + 1] = static_cast<int64_t>(idx.size());
    }
  l->N = static_cast<int64_t>(idx.size());
  l->weights.d.dtype = o.wdt;
  set_shape(&l->weights.d, {o.lay.num_weights});
  materialise(c, &l->weights, "weights", weights_role, false);
  fill_values(c, l->weights.buf->p(), o.wdt, o.lay.num_weights, specials);
  l->indices.d.dtype = l->idx_dt;
  set_shape(&l->indices.d, {l->N});
  materialise(c, &l->indices, "indices", Role::kInput, false);
  for (int64_t i = 0; i < l->N; ++i) set_index(l->indices.buf->p(), l->idx_dt, i, idx[i]);
  l->offsets.d.dtype = l->idx_dt;
  set_shape(&l->offsets.d, {TB + 1});
  materialise(c, &l->offsets, "offsets", Role::kInput, false);
  for (int64_t i = 0; i <= TB; ++i) set_index(l->offsets.buf->p(), l->idx_dt, i, off[i]);
  l->psw.d.dtype = kF32;
  set_shape(&l->psw.d, {l->N});
  if (pooling != 1 && c.rng.chance(0.35)) {
    materialise(c, &l->psw, "per_sample_weights", Role::kInput, false);
    fill_values(c, l->psw.buf->p(), kF32, l->N, specials);
  }
  if (c.rng.chance(0.7)) l->num_skipped = reinterpret_cast<int64_t*>(c.alloc("num_skipped", 8, Role::kOutput)->p());
}

// Whether element i (of index dtype dt) can be written through t's data pointer: its own buffer, not
// NULL or shortened by an earlier mutation.
inline bool room(const Tensor& t, int64_t i, int dt) {
  return t.d.data != nullptr && t.buf != nullptr && t.d.data == t.buf->p() &&
         static_cast<size_t>(i + 1) * dtype_size(dt) <= t.buf->bytes;
}

// Points tensor w's data into buffer r (an alias), when r's bytes hold w's claimed bytes.
inline bool alias(Case& c, Tensor* w, const std::string& wname, const Tensor& r, const std::string& rname) {
  const int64_t n = w->numel(), m = r.numel();
  if (n <= 0 || m <= 0 || r.d.data == nullptr || w->d.data == nullptr || r.buf == nullptr) return false;
  if (static_cast<size_t>(n) * dtype_size(w->d.dtype) > r.buf->bytes || !touch(c, wname)) return false;
  w->d.data = r.d.data;
  c.mut(wname + " aliases " + rname, Expect::kFail, kInvalidArgument);
  return true;
}

// Mutations of the lookup arguments (both ops). `values_checked`: whether the op reads the offsets and
// indices (a size query does not: it sees only shapes).
inline void mutate_lookup(Case& c, const TbeObj& o, Lookup* l, Role weights_role, bool* tbe_null, bool* args_null,
                   bool values_checked = true) {
  const int64_t TB = l->TB;
  switch (c.rng.below(16)) {
    case 0:
      *tbe_null = true;
      c.mut("tbe=NULL", Expect::kFail, kInvalidArgument);
      break;
    case 1:
      *args_null = true;
      c.mut("args=NULL", Expect::kFail, kInvalidArgument);
      break;
    case 2:
      mutate_tensor(c, &l->weights, "weights", weights_role, [&](int dt) { return dt == o.wdt; }, Len::kFixed, true);
      break;
    case 3:
      // Another N is seen through offsets[T*B] (a value: not by a size query) or the [N] buffers.
      if (mutate_tensor(c, &l->indices, "indices", Role::kInput, [](int dt) { return dt == kI32 || dt == kI64; },
                        values_checked ? Len::kFixed : Len::kPartner, false))
        c.fail_code = -1;  // another N: offsets, per-sample weights or outputs no longer match
      break;
    case 4:
      mutate_tensor(c, &l->offsets, "offsets", Role::kInput, [&](int dt) { return dt == l->idx_dt; }, Len::kFixed, false);
      break;
    case 5: {  // indices and offsets of different index dtypes (same buffers reinterpreted: shapes shrink)
      Tensor* t = c.rng.chance(0.5) ? &l->indices : &l->offsets;
      if (!touch(c, t == &l->indices ? "indices" : "offsets")) break;
      const int other = l->idx_dt == kI32 ? kI64 : kI32;
      const int64_t n = t->numel();
      if (n < 0 || n > (int64_t{1} << 40)) break;  // (an earlier mutation made the shape invalid)
      const int64_t m = other == kI64 ? n / 2 : n * 2;
      t->d.dtype = other;
      set_shape(&t->d, {m});
      c.mut(std::string(t == &l->indices ? "indices" : "offsets") + ": the other index dtype", Expect::kFail, -1);
      break;
    }
    case 6: {  // bad offset values: refused in every mode on the CPU
      void* p = l->offsets.d.data;
      if (!room(l->offsets, TB, l->idx_dt)) break;
      const uint64_t k = c.rng.below(4);
      if (k == 0) {
        set_index(p, l->idx_dt, 0, c.rng.pick<int64_t>({-1, -5, INT32_MIN}));
        c.mut("offsets[0] negative", Expect::kLabel);
      } else if (k == 1 && TB >= 1) {
        const int64_t i = c.rng.range(1, TB);
        set_index(p, l->idx_dt, i, get_index(p, l->idx_dt, i - 1) - c.rng.range(1, 3));
        c.mut(fmt("offsets[%" PRId64 "] decreasing", i), Expect::kLabel);
      } else if (k == 2) {
        const int64_t last = get_index(p, l->idx_dt, TB);
        set_index(p, l->idx_dt, TB, c.rng.chance(0.5) ? last + c.rng.range(1, 3) : last - 1);
        c.mut("offsets: last != N", Expect::kLabel);
      } else {
        const int64_t i = c.rng.range(0, TB);
        const int64_t big = l->idx_dt == kI32 ? INT32_MAX : c.rng.pick<int64_t>({int64_t{1} << 40, INT64_MAX});
        set_index(p, l->idx_dt, i, big);
        c.mut(fmt("offsets[%" PRId64 "]=%" PRId64, i, big), Expect::kLabel);
      }
      break;
    }
    case 7: {  // out-of-range index values
      if (l->N == 0 || !room(l->indices, l->N - 1, l->idx_dt)) break;
      int64_t maxE = 0;
      for (int64_t e : o.rows) maxE = std::max(maxE, e);
      const int64_t i = c.rng.range(0, l->N - 1);
      int64_t v = c.rng.pick<int64_t>({-1, maxE, maxE + 7, int64_t{1} << 40, INT64_MIN, INT64_MAX, -(int64_t{1} << 40)});
      if (l->idx_dt == kI32) v = c.rng.pick<int64_t>({-1, maxE, maxE + 7, INT32_MAX, INT32_MIN});
      set_index(l->indices.d.data, l->idx_dt, i, v);
      c.mut(fmt("indices[%" PRId64 "]=%" PRId64, i, v), Expect::kLabel);
      break;
    }
    case 8: {
      const int64_t B = TB / o.F();
      l->B = c.rng.pick<int64_t>({-1, INT64_MIN, int64_t{1} << 62, INT64_MAX, B + 1, B - 1, (INT64_MAX - 1) / o.F() + 1});
      c.mut(fmt("batch_size=%" PRId64 " (offsets hold %" PRId64 " bags)", l->B, TB), Expect::kFail, kInvalidArgument);
      break;
    }
    case 9:
      if (!touch(c, "pooling")) break;
      l->pooling = bad_enum(c, 3);
      c.mut(fmt("pooling=%d", l->pooling), Expect::kFail, kInvalidArgument);
      break;
    case 10:
      l->bounds = bad_enum(c, 3);
      c.mut(fmt("bounds_check=%d", l->bounds), Expect::kFail, kInvalidArgument);
      break;
    case 11:
      if (!touch(c, "pooling") || !touch(c, "per_sample_weights")) break;
      if (l->psw.d.data != nullptr && l->pooling != 2 && l->N > 0) {
        l->pooling = 1;
        c.mut("mean pooling with per-sample weights", Expect::kFail, kInvalidArgument);
      } else if (l->psw.d.data == nullptr && l->pooling != 1) {
        materialise(c, &l->psw, "per_sample_weights", Role::kInput, false);
        fill_values(c, l->psw.buf->p(), kF32, l->N, false);
        c.mut("per-sample weights added", Expect::kOk);
      }
      break;
    case 12:
      if (l->psw.d.data != nullptr)
        mutate_tensor(c, &l->psw, "per_sample_weights", Role::kInput, [](int dt) { return dt == kF32; }, Len::kFixed, true,
                      Data::kOptional);
      break;
    case 13:
      if (l->num_skipped) {
        l->num_skipped = nullptr;
        c.mut("num_skipped=NULL", Expect::kOk);
      }
      break;
    default:
      break;  // (the op's own mutations)
  }
}

// The verdict on the offsets and index values as they are after all mutations (when their buffers are
// still the ones generated): bad offsets are refused in every mode on the CPU (kOutOfRange); an index
// outside its table is refused in error mode and dropped in skip and off modes.
inline void judge_values(Case& c, const TbeObj& o, Lookup* l, bool values_checked) {
  const int64_t TB = l->TB, N = l->N;
  const bool intact = l->offsets.d.dtype == l->idx_dt && l->indices.d.dtype == l->idx_dt &&
                      l->offsets.numel() == TB + 1 && l->indices.numel() == N && room(l->offsets, TB, l->idx_dt) &&
                      (N == 0 || room(l->indices, N - 1, l->idx_dt));
  if (!intact) return;  // another mutation changed these buffers and decides
  const void* off = l->offsets.d.data;
  bool bad_off = get_index(off, l->idx_dt, 0) < 0 || get_index(off, l->idx_dt, TB) != N;
  for (int64_t i = 1; i <= TB && !bad_off; ++i)
    bad_off = get_index(off, l->idx_dt, i) < get_index(off, l->idx_dt, i - 1);
  if (bad_off) {
    if (values_checked) c.mut("=> offsets invalid", Expect::kFail, kOutOfRange);
    return;
  }
  const int64_t B = TB / std::max(1, o.F());
  for (int f = 0; f < o.F() && B > 0; ++f)
    for (int64_t i = get_index(off, l->idx_dt, f * B); i < get_index(off, l->idx_dt, (f + 1) * B); ++i) {
      const int64_t r = get_index(l->indices.d.data, l->idx_dt, i);
      if (r < 0 || r >= o.E(f)) l->bad_indices = true;
    }
  if (!l->bad_indices) return;
  // error: refused naming feature, bag and position; skip: dropped and counted; off: dropped, nothing reported
  if (l->bounds == 0) c.mut("=> an index outside its table (error mode)", values_checked ? Expect::kFail : Expect::kAny,
                            kOutOfRange);
  else if (l->bounds == 1 || l->bounds == 2) c.mut("=> an index outside its table (dropped)", Expect::kOk);
}

// Fills a C struct's lookup fields.
template <typename A>
inline void put_lookup(const Lookup& l, A* a) {
  a->weights = l.weights.d;
  a->indices = l.indices.d;
  a->offsets = l.offsets.d;
  a->per_sample_weights = l.psw.d;
  a->batch_size = l.B;
  a->pooling = l.pooling;
  a->bounds_check = l.bounds;
  a->num_skipped = l.num_skipped;
}

// The forward as the header defines it (fp32 accumulation in double), for a valid call's check.

}  // namespace fuzz
