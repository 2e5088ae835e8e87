// C API fuzzer: embscale_tbe_create, embscale_tbe_layout_get and embscale_tbe_table_offsets.

#include "fuzz_capi.h"

namespace fuzz {

const std::set<std::string> kCreateVocab = {"ctx", "backend", "num_threads", "num_tables", "num_rows", "dims",
                                            "num_features", "feature_table_map", "weights_dtype", "out", "cfg",
                                            "tables", "tbe"};

void case_tbe_create(Case& c, bool cuda) {
  c.op = "embscale_tbe_create";
  c.vocab = kCreateVocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda, 0.05);
  // Mutations are labels only here: whether the call must succeed is decided from the final
  // arguments below (an exact model of the documented rules).
  c.must_fail = false;
  c.fail_votes = 0;
  int32_t T = static_cast<int32_t>(c.rng.range(1, 6));
  std::vector<int64_t> rows(T);
  std::vector<int32_t> dims(T);
  for (int t = 0; t < T; ++t) {
    rows[t] = c.rng.range(1, 1000);
    dims[t] = static_cast<int32_t>(c.rng.range(1, 300));
  }
  const int32_t F = static_cast<int32_t>(c.rng.range(1, 8));
  std::vector<int32_t> fmap(F);
  for (auto& f : fmap) f = static_cast<int32_t>(c.rng.below(T));
  bool use_map = c.rng.chance(0.7);
  int32_t num_features = use_map ? F : T;
  int32_t wdt = c.rng.pick<int32_t>({kF32, kF16, kBF16});
  bool rows_null = false, dims_null = false;
  const int nmut = c.rng.chance(0.6) ? static_cast<int>(c.rng.range(1, 2)) : 0;
  for (int m = 0; m < nmut; ++m) {
    const int t = static_cast<int>(c.rng.below(rows.size()));
    switch (c.rng.below(12)) {
      case 0:
        rows[t] = c.rng.pick<int64_t>({0, -1, INT64_MIN});
        c.mut(fmt("num_rows[%d]=%" PRId64, t, rows[t]));
        break;
      case 1:
        dims[t] = c.rng.pick<int32_t>({0, -1, INT32_MIN});
        c.mut(fmt("dims[%d]=%d", t, dims[t]));
        break;
      case 2:  // rows x dims (or their running sum) beyond 2^62 elements
        rows[t] = c.rng.pick<int64_t>({INT64_MAX, int64_t{1} << 62, int64_t{1} << 40, (int64_t{1} << 61) + 1});
        dims[t] = c.rng.pick<int32_t>({INT32_MAX, 1 << 30, 4, 2});
        c.mut(fmt("table %d: %" PRId64 " rows x %d", t, rows[t], dims[t]));
        break;
      case 3:  // huge but representable tables: creation allocates nothing of their size
        rows[t] = int64_t{1} << 40;
        c.mut(fmt("num_rows[%d]=2^40", t));
        break;
      case 4:
        dims[t] = INT32_MAX;
        c.mut(fmt("dims[%d]=INT32_MAX", t));  // more than 2^31-1 output columns with another feature
        break;
      case 5:
        T = c.rng.pick<int32_t>({0, -1, INT32_MIN});
        c.mut(fmt("num_tables=%d", T));
        break;
      case 6:
        if (c.rng.chance(0.5)) {
          rows_null = true;
          c.mut("num_rows=NULL");
        } else {
          dims_null = true;
          c.mut("dims=NULL");
        }
        break;
      case 7:
        if (!use_map) break;
        fmap[c.rng.below(F)] = c.rng.pick<int32_t>({-1, T, T + 5, INT32_MAX, INT32_MIN});
        c.mut("feature_table_map: a table that does not exist");
        break;
      case 8:
        if (use_map) {
          num_features = c.rng.pick<int32_t>({-1, INT32_MIN});
          c.mut(fmt("num_features=%d", num_features));
        } else {
          num_features = T + static_cast<int32_t>(c.rng.range(1, 3));
          c.mut("num_features!=num_tables without a map");
        }
        break;
      case 9:
        if (use_map) {
          num_features = static_cast<int32_t>(c.rng.range(0, F - 1));
          c.mut(fmt("num_features=%d, fewer than the map's entries", num_features));
        }
        break;
      case 10:
        wdt = c.rng.chance(0.5) ? c.rng.pick<int32_t>({kE4M3, kE5M2, kI32, kI64}) : bad_enum(c, kNumDtypes);
        c.mut(fmt("weights_dtype=%d", wdt));
        break;
      default:
        use_map = false;
        num_features = c.rng.chance(0.8) ? T : F;
        c.mut(fmt("feature_table_map=NULL, num_features=%d", num_features));
        break;
    }
  }
  // The model: what a valid call is, from the header's rules.
  bool bad = false, unsupported_only = false;
  if (ctx.null || ctx.c.backend < 0 || ctx.c.backend > 1) bad = true;
  if (!bad && ctx.c.backend == 1 && !cuda) unsupported_only = true;
  bool bad_args = T <= 0 || ((rows_null || dims_null) && T > 0) || !is_float(wdt);
  const __int128 kMax = static_cast<__int128>(1) << 62;  // elements of all tables together
  __int128 total = 0;
  for (int t = 0; t < T && !bad_args; ++t) {
    if (rows[t] < 1 || dims[t] < 1) bad_args = true;
    total += static_cast<__int128>(rows[t]) * dims[t];
  }
  if (!bad_args && total > kMax) bad_args = true;
  if (!bad_args) {
    // A map holds num_features >= 1 entries; only a NULL one means one feature per table.
    const bool mapped = use_map;
    const int32_t nf = mapped ? num_features : T;
    if (use_map && num_features < 1) bad_args = true;
    if (!use_map && num_features != T) bad_args = true;
    double cols = 0;
    for (int32_t f = 0; f < nf && !bad_args; ++f) {
      const int32_t tab = mapped ? fmap[f] : f;
      if (tab < 0 || tab >= T) bad_args = true;
      else cols += dims[tab];
    }
    if (!bad_args && cols > 2147483647.0) bad_args = true;
  }
  if (bad || bad_args) {
    c.must_fail = true;
    c.fail_votes = 2;  // any refusal code
  } else if (unsupported_only) {
    c.must_fail = true;
    c.fail_votes = 1;
    c.fail_code = kUnsupported;
  } else {
    c.must_ok = true;
  }
  if (ctx.c.backend == 1 && cuda) return;
  embscale_tbe* tbe = reinterpret_cast<embscale_tbe*>(&c);  // must be overwritten
  const bool null_out = c.rng.chance(0.03);
  if (null_out) {
    c.mut("out=NULL");
    c.must_ok = false;
    c.must_fail = true;
    c.fail_votes = 2;
  }
  c.snapshot();
  // The arrays hold num_tables (and num_features) entries whenever those counts are positive.
  if (num_features > static_cast<int32_t>(fmap.size())) fmap.resize(num_features, 0);
  const int rc = embscale_tbe_create(ctx.ptr(), T, rows_null ? nullptr : rows.data(), dims_null ? nullptr : dims.data(),
                                     num_features, use_map ? fmap.data() : nullptr, wdt,
                                     null_out ? nullptr : &tbe);
  check_call(c, c.op.c_str(), rc);
  if (null_out) return;
  if (rc != kOk) {
    if (tbe != nullptr) c.fail("embscale_tbe_create: refused but *out is not NULL");
    embscale_tbe_destroy(nullptr);  // must be a no-op
    return;
  }
  if (tbe == nullptr) {
    c.fail("embscale_tbe_create: OK but *out is NULL");
    return;
  }
  // layout and offsets of the new object
  embscale_tbe_layout lay{};
  const int rc2 = embscale_tbe_layout_get(tbe, &lay);
  if (rc2 != kOk) c.fail(fmt("embscale_tbe_layout_get failed on a created object: %s", embscale_last_error()));
  std::vector<int64_t> woff(T, -1), roff(T, -1);
  const int rc3 = embscale_tbe_table_offsets(tbe, c.rng.chance(0.2) ? nullptr : woff.data(),
                                             c.rng.chance(0.2) ? nullptr : roff.data());
  if (rc3 != kOk) c.fail(fmt("embscale_tbe_table_offsets failed on a created object: %s", embscale_last_error()));
  if (rc2 == kOk && (lay.num_weights < 0 || lay.total_rows < 0 || lay.total_dim < 0 || lay.max_dim < 0))
    c.fail("embscale_tbe_layout_get: negative sizes");
  // hostile uses of the layout functions
  c.vocab.insert({"tbe", "out"});
  expect_refusal(c, "embscale_tbe_layout_get(NULL, out)", embscale_tbe_layout_get(nullptr, &lay));
  expect_refusal(c, "embscale_tbe_layout_get(tbe, NULL)", embscale_tbe_layout_get(tbe, nullptr));
  expect_refusal(c, "embscale_tbe_table_offsets(NULL, ...)", embscale_tbe_table_offsets(nullptr, woff.data(), roff.data()));
  embscale_tbe_destroy(tbe);
}

}  // namespace fuzz
