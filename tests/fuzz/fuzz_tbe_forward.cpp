// C API fuzzer: embscale_tbe_forward, its output checked against a reference sum.

#include <climits>

#include "fuzz_capi.h"
#include "fuzz_tbe.h"

namespace fuzz {

void check_forward_values(Case& c, const TbeObj& o, const Lookup& l, const Tensor& out) {
  const int64_t B = l.B;
  const bool seq = l.pooling == 2;
  int64_t skipped = 0;
  int col = 0;
  for (int f = 0; f < o.F(); ++f) {
    const int D = o.D(f);
    const int64_t base = o.woff[o.fmap[f]];
    for (int64_t b = 0; b < B; ++b) {
      const int64_t s = get_index(l.offsets.d.data, l.idx_dt, f * B + b), e = get_index(l.offsets.d.data, l.idx_dt, f * B + b + 1);
      std::vector<double> acc(D, 0.0), mag(D, 0.0);
      int64_t valid = 0;
      for (int64_t i = s; i < e; ++i) {
        const int64_t r = get_index(l.indices.d.data, l.idx_dt, i);
        const bool ok = r >= 0 && r < o.E(f);
        if (!ok) ++skipped;
        const double w = l.psw.d.data ? load_float(l.psw.d.data, kF32, i) : 1.0;
        for (int d = 0; d < D; ++d) {
          const double v = ok ? w * load_float(l.weights.d.data, o.wdt, base + r * D + d) : 0.0;
          if (seq) {
            const float got = load_float(out.d.data, kF32, i * D + d);
            if (std::fabs(v) < 1e37 && std::fabs(got - v) > 1e-5 * (1 + std::fabs(v))) {
              c.fail(fmt("output[%" PRId64 ", %d] = %g, expected %g", i, d, got, v));
              return;
            }
          }
          acc[d] += v;
          mag[d] += std::fabs(v);
        }
        valid += ok;
      }
      if (seq) continue;
      for (int d = 0; d < D; ++d) {
        double want = acc[d];
        if (l.pooling == 1 && valid > 0) want /= static_cast<double>(valid);
        const float got = load_float(out.d.data, kF32, b * o.lay.total_dim + col + d);
        if (mag[d] < 1e37 && std::fabs(got - want) > 1e-5 * (1 + mag[d])) {
          c.fail(fmt("output[%" PRId64 ", %d] (feature %d) = %g, expected %g", b, col + d, f, got, want));
          return;
        }
      }
    }
    col += D;
  }
  if (l.bounds == 1 && l.num_skipped && *l.num_skipped != skipped)
    c.fail(fmt("num_skipped = %" PRId64 ", expected %" PRId64, *l.num_skipped, skipped));
}

void case_tbe_forward(Case& c, bool cuda) {
  c.op = "embscale_tbe_forward";
  c.vocab = kTbeVocab;
  const int32_t pooling = static_cast<int32_t>(c.rng.range(0, 2));
  TbeObj o;
  if (!make_tbe(c, &o, pooling == 2)) return;
  Ctx ctx;
  make_ctx(c, &ctx, cuda, 0.06, true);
  const bool specials = c.rng.chance(0.2);
  Lookup l;
  make_lookup(c, o, &l, pooling, Role::kInput, specials);
  Tensor out;
  out.embedded = true;
  out.d.dtype = c.rng.pick<int32_t>({kF32, kF32, kF16, kBF16});
  if (pooling == 2) set_shape(&out.d, {l.N, o.D(0)});
  else set_shape(&out.d, {l.B, o.lay.total_dim});
  materialise(c, &out, "output", Role::kOutput, false);
  bool tbe_null = false, args_null = false;
  const int nmut = c.rng.chance(0.65) ? static_cast<int>(c.rng.range(1, 2)) : 0;
  for (int m = 0; m < nmut; ++m) {
    if (c.rng.chance(0.8)) {
      mutate_lookup(c, o, &l, Role::kInput, &tbe_null, &args_null);
    } else if (c.rng.chance(0.6)) {
      mutate_tensor(c, &out, "output", Role::kOutput, float_ok, Len::kFixed, false);
    } else {
      const uint64_t k = c.rng.below(4);
      const Tensor& r = k == 0 ? l.weights : k == 1 ? l.indices : k == 2 ? l.offsets : l.psw;
      alias(c, &out, "output", r, k == 0 ? "weights" : k == 1 ? "indices" : k == 2 ? "offsets" : "per_sample_weights");
    }
  }
  judge_values(c, o, &l, true);
  if (ctx.c.backend == 1 && cuda) return;
  embscale_tbe_forward_args a{};
  put_lookup(l, &a);
  a.output = out.d;
  c.snapshot();
  // Now and then through embscale_tbe_forward_host_count with a host word (the CPU backend takes any host
  // memory; on CUDA plain host memory is refused): written with the count in skip and warn modes, equal
  // to *num_skipped, and untouched in the other modes and by a refused call.
  const bool host_count = ctx.c.backend == 0 && c.rng.chance(0.3);
  int64_t host_word = INT64_MIN;
  const int rc = host_count ? embscale_tbe_forward_host_count(tbe_null ? nullptr : o.h, ctx.ptr(),
                                                              args_null ? nullptr : &a, &host_word)
                            : embscale_tbe_forward(tbe_null ? nullptr : o.h, ctx.ptr(), args_null ? nullptr : &a);
  check_call(c, c.op.c_str(), rc);
  if (host_count) {
    const bool counts = rc == kOk && (l.bounds == 1 || l.bounds == 3);
    if (!counts && host_word != INT64_MIN)
      c.fail(fmt("num_skipped_host written (%" PRId64 ") by a call that counts nothing (rc %d, bounds %d)",
                 host_word, rc, l.bounds));
    else if (counts && !c.must_fail && c.unknown == 0 && l.num_skipped && host_word != *l.num_skipped)
      c.fail(fmt("num_skipped_host = %" PRId64 ", num_skipped = %" PRId64, host_word, *l.num_skipped));
  }
  if (rc == kOk && !c.must_fail && c.unknown == 0 && !specials && out.d.dtype == kF32 && !(l.bad_indices && l.bounds == 2))
    check_forward_values(c, o, l, out);
}

// Valid optimizer hyper-parameters for `type`.

}  // namespace fuzz
