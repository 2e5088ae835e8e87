// Every enumeration value the C API takes, at every entry point that takes it, on the CPU backend: the
// first value past the documented range and -1 are refused with kInvalidArgument and a message that
// starts with the argument's name, the value and the range ("pooling: value 3 is out of range [0, 2]"),
// while the last documented value gets past the check. The ranges below are the header's
// (include/embscale/embscale_c.h), written out here rather than taken from the library, so a range
// widened (or narrowed) by one in the library fails. Each entry point first runs with all its
// arguments valid, so the value under test is the only thing wrong.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "embscale/context.h"
#include "embscale/dtype.h"
#include "embscale/embscale_c.h"
#include "embscale/fp8.h"
#include "embscale/tbe.h"
#include "embscale/tbe_cache.h"

namespace {

constexpr int kInvalidArgument = 1;

// The documented values of each enumeration are 0 .. count - 1.
constexpr int32_t kBackends = 2, kDtypes = 7, kAmaxAlgos = 3, kActivations = 3, kPoolings = 3, kBoundsChecks = 4,
                  kOptimizers = 9, kWeightDecayModes = 3, kRoundings = 2;
constexpr int32_t kF32 = 0, kE4M3 = 3, kI64 = 6, kSgd = 1;

embscale_tensor tensor(void* data, int32_t dtype, std::vector<int64_t> shape) {
  embscale_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

// Valid arguments for every entry point: FP8 ops on 8 fp32 elements (2 x 4 for cast_transpose), and
// one fp32 table of 4 rows x 2 columns with one bag of lookups {1, 3} for the TBE ops (SGD).
struct Calls {
  embscale_context ctx{0, 1, nullptr};
  std::vector<float> xs = {1, -2, 3, -4, 5, -6, 7, -8}, ys = std::vector<float>(8), scalars = {8, 1, 1, 0};
  std::vector<uint8_t> codes = std::vector<uint8_t>(8), codes_t = std::vector<uint8_t>(8);
  std::vector<unsigned char> workspace = std::vector<unsigned char>(1 << 16);
  embscale_tensor x = tensor(xs.data(), kF32, {8}), y8 = tensor(codes.data(), kE4M3, {8});
  embscale_tensor y = tensor(ys.data(), kF32, {8});
  embscale_tensor x2 = tensor(xs.data(), kF32, {2, 4}), y2 = tensor(codes.data(), kE4M3, {2, 4});
  embscale_tensor yt = tensor(codes_t.data(), kE4M3, {4, 2});
  float* amax = &scalars[0];
  float* scale = &scalars[1];
  float* scale_inv = &scalars[2];
  float* noop = &scalars[3];  // 0: run
  int32_t algo = 0, activation = 0, fp8_dtype = kE4M3, weights_dtype = kF32, optimizer = kSgd;
  int32_t nonfinite = 0;
  size_t bytes = 0;

  int64_t rows[1] = {4};
  int32_t dims[1] = {2};
  std::vector<float> weights = std::vector<float>(8, 0.5f), out = std::vector<float>(2), grad = {1, 1};
  std::vector<float> psw = {1, 1}, grad_psw = std::vector<float>(2), momentum = std::vector<float>(8);
  std::vector<float> unique_grads = std::vector<float>(4);
  std::vector<int64_t> indices = {1, 3}, offsets = {0, 2}, unique_rows = std::vector<int64_t>(2);
  embscale_tbe* tbe = nullptr;
  embscale_tbe_forward_args fwd{};
  embscale_tbe_backward_args bwd{};
  embscale_optimizer opt{};

  Calls() {
    EXPECT_EQ(embscale_tbe_create(&ctx, 1, rows, dims, 1, nullptr, kF32, &tbe), 0) << embscale_last_error();
    fwd.weights = tensor(weights.data(), kF32, {8});
    fwd.indices = tensor(indices.data(), kI64, {2});
    fwd.offsets = tensor(offsets.data(), kI64, {2});
    fwd.batch_size = 1;
    fwd.output = tensor(out.data(), kF32, {1, 2});
    bwd.weights = fwd.weights;
    bwd.indices = fwd.indices;
    bwd.offsets = fwd.offsets;
    bwd.batch_size = 1;
    bwd.grad_output = tensor(grad.data(), kF32, {1, 2});
    opt.type = kSgd;
    opt.learning_rate = 0.5f;
    opt.step = 1;
    bwd.optimizer = opt;
    bwd.rounding = 0;
  }
  ~Calls() { embscale_tbe_destroy(tbe); }
  Calls(const Calls&) = delete;
  Calls& operator=(const Calls&) = delete;
};

// One enumeration argument of an entry point: its name in messages, its count, where it lives in the
// call's arguments and, for an optional tensor's dtype, what makes the tensor present.
struct Field {
  std::string name;
  int32_t count;
  std::function<int32_t*(Calls&)> at;
  std::function<void(Calls&)> present;
};

struct Entry {
  std::string name;
  std::function<int(Calls&)> call;
  std::vector<Field> fields;
};

using Tensor = std::function<embscale_tensor*(Calls&)>;

Field ctx_backend() { return {"ctx.backend", kBackends, [](Calls& c) { return &c.ctx.backend; }, nullptr}; }
Field algo() { return {"algo", kAmaxAlgos, [](Calls& c) { return &c.algo; }, nullptr}; }
Field dtype_of(const std::string& name, Tensor t) {
  return {name + ".dtype", kDtypes, [t](Calls& c) { return &t(c)->dtype; }, nullptr};
}
// An optional tensor (absent when its data is NULL) is made present, as `present_as` gives it, so that
// its dtype is checked.
Field optional_dtype_of(const std::string& name, Tensor t, std::function<embscale_tensor(Calls&)> present_as) {
  return {name + ".dtype", kDtypes, [t](Calls& c) { return &t(c)->dtype; },
          [t, present_as](Calls& c) { *t(c) = present_as(c); }};
}

// The lookup fields the forward and the backward share, in args(c) (the forward's or the backward's).
template <typename Args>
std::vector<Field> lookup_fields(Args args) {
  return {ctx_backend(),
          dtype_of("weights", [args](Calls& c) { return &args(c)->weights; }),
          dtype_of("indices", [args](Calls& c) { return &args(c)->indices; }),
          dtype_of("offsets", [args](Calls& c) { return &args(c)->offsets; }),
          optional_dtype_of("per_sample_weights", [args](Calls& c) { return &args(c)->per_sample_weights; },
                            [](Calls& c) { return tensor(c.psw.data(), kF32, {2}); }),
          {"pooling", kPoolings, [args](Calls& c) { return &args(c)->pooling; }, nullptr},
          {"bounds_check", kBoundsChecks, [args](Calls& c) { return &args(c)->bounds_check; }, nullptr}};
}

std::vector<Field> optimizer_fields(std::function<embscale_optimizer*(Calls&)> o) {
  return {{"optimizer.type", kOptimizers, [o](Calls& c) { return &o(c)->type; }, nullptr},
          {"optimizer.weight_decay_mode", kWeightDecayModes, [o](Calls& c) { return &o(c)->weight_decay_mode; },
           nullptr}};
}

std::vector<Field> backward_fields() {
  auto bwd = [](Calls& c) { return &c.bwd; };
  std::vector<Field> f = lookup_fields(bwd);
  for (Field& o : optimizer_fields([](Calls& c) { return &c.bwd.optimizer; })) f.push_back(o);
  f.push_back(dtype_of("grad_output", [](Calls& c) { return &c.bwd.grad_output; }));
  f.push_back({"rounding", kRoundings, [](Calls& c) { return &c.bwd.rounding; }, nullptr});
  const auto floats = [](std::vector<float> Calls::*v, int64_t n) {
    return [v, n](Calls& c) { return tensor((c.*v).data(), kF32, {n}); };
  };
  f.push_back(optional_dtype_of("momentum1", [](Calls& c) { return &c.bwd.momentum1; }, floats(&Calls::momentum, 8)));
  f.push_back(optional_dtype_of("momentum2", [](Calls& c) { return &c.bwd.momentum2; }, floats(&Calls::momentum, 8)));
  f.push_back(optional_dtype_of("grad_per_sample_weights", [](Calls& c) { return &c.bwd.grad_per_sample_weights; },
                                floats(&Calls::grad_psw, 2)));
  f.push_back(optional_dtype_of("unique_rows", [](Calls& c) { return &c.bwd.unique_rows; },
                                [](Calls& c) { return tensor(c.unique_rows.data(), kI64, {2}); }));
  f.push_back(optional_dtype_of("unique_grads", [](Calls& c) { return &c.bwd.unique_grads; },
                                floats(&Calls::unique_grads, 4)));
  return f;
}

std::vector<Entry> entries() {
  const Tensor x = [](Calls& c) { return &c.x; }, y8 = [](Calls& c) { return &c.y8; };
  const Tensor y = [](Calls& c) { return &c.y; };
  const Field fp8_dtype{"fp8_dtype", kDtypes, [](Calls& c) { return &c.fp8_dtype; }, nullptr};
  const Field activation{"activation", kActivations, [](Calls& c) { return &c.activation; }, nullptr};
  const std::vector<Field> amax_fields = {ctx_backend(), dtype_of("x", x), algo()};
  const std::vector<Field> cast_fields = {ctx_backend(), dtype_of("x", x), dtype_of("y", y8)};
  // dequantize reads y (fp8) into x (here the fp32 buffer c.y).
  const std::vector<Field> dequantize_fields = {ctx_backend(), dtype_of("y", y8), dtype_of("x", y)};
  const std::vector<Field> qcs_fields = {ctx_backend(), dtype_of("x", x), dtype_of("y", y8), algo()};
  const std::vector<Field> activation_fields = {ctx_backend(), activation, dtype_of("x", x), dtype_of("y", y), algo()};
  const std::vector<Field> transpose_fields = {ctx_backend(), dtype_of("x", [](Calls& c) { return &c.x2; }),
                                               dtype_of("y", [](Calls& c) { return &c.y2; }),
                                               dtype_of("yt", [](Calls& c) { return &c.yt; })};
  const auto ws = [](Calls& c) { return c.workspace.data(); };
  const size_t wsb = 1 << 16;
  return {
      {"embscale_amax_workspace_size",
       [](Calls& c) { return embscale_amax_workspace_size(&c.ctx, &c.x, c.algo, &c.bytes); }, amax_fields},
      {"embscale_amax",
       [=](Calls& c) { return embscale_amax(&c.ctx, &c.x, c.amax, c.algo, &c.nonfinite, ws(c), wsb, c.noop); },
       amax_fields},
      {"embscale_compute_scale",
       [](Calls& c) {
         return embscale_compute_scale(&c.ctx, c.amax, c.fp8_dtype, 0.0f, 0, c.scale, c.scale_inv, c.noop);
       },
       {ctx_backend(), fp8_dtype}},
      {"embscale_quantize", [](Calls& c) { return embscale_quantize(&c.ctx, &c.x, c.scale, &c.y8, c.noop); },
       cast_fields},
      {"embscale_dequantize", [](Calls& c) { return embscale_dequantize(&c.ctx, &c.y8, c.scale_inv, &c.y, c.noop); },
       dequantize_fields},
      {"embscale_quantize_current_scaling_workspace_size",
       [](Calls& c) { return embscale_quantize_current_scaling_workspace_size(&c.ctx, &c.x, c.algo, &c.bytes); },
       amax_fields},
      {"embscale_quantize_current_scaling",
       [=](Calls& c) {
         return embscale_quantize_current_scaling(&c.ctx, &c.x, &c.y8, c.amax, c.scale, c.scale_inv, c.algo, 0.0f, 0,
                                                  &c.nonfinite, ws(c), wsb, c.noop);
       },
       qcs_fields},
      {"embscale_activation_amax_workspace_size",
       [](Calls& c) { return embscale_activation_amax_workspace_size(&c.ctx, &c.x, c.algo, &c.bytes); }, amax_fields},
      {"embscale_activation_amax",
       [=](Calls& c) {
         return embscale_activation_amax(&c.ctx, c.activation, &c.x, &c.y, c.amax, c.algo, ws(c), wsb, c.noop);
       },
       activation_fields},
      {"embscale_cast_transpose",
       [](Calls& c) { return embscale_cast_transpose(&c.ctx, &c.x2, c.scale, &c.y2, &c.yt, c.noop); },
       transpose_fields},
      {"embscale_tbe_create",
       [](Calls& c) {
         embscale_tbe* made = nullptr;
         const int rc = embscale_tbe_create(&c.ctx, 1, c.rows, c.dims, 1, nullptr, c.weights_dtype, &made);
         embscale_tbe_destroy(made);
         return rc;
       },
       {ctx_backend(), {"weights_dtype", kDtypes, [](Calls& c) { return &c.weights_dtype; }, nullptr}}},
      {"embscale_tbe_forward", [](Calls& c) { return embscale_tbe_forward(c.tbe, &c.ctx, &c.fwd); },
       [] {
         std::vector<Field> f = lookup_fields([](Calls& c) { return &c.fwd; });
         f.push_back(dtype_of("output", [](Calls& c) { return &c.fwd.output; }));
         return f;
       }()},
      {"embscale_tbe_forward_host_count",
       [](Calls& c) {
         int64_t skipped = 0;
         return embscale_tbe_forward_host_count(c.tbe, &c.ctx, &c.fwd, &skipped);
       },
       [] {
         std::vector<Field> f = lookup_fields([](Calls& c) { return &c.fwd; });
         f.push_back(dtype_of("output", [](Calls& c) { return &c.fwd.output; }));
         return f;
       }()},
      {"embscale_optimizer_info_get",
       [](Calls& c) {
         embscale_optimizer_info info{};
         return embscale_optimizer_info_get(c.optimizer, &info);
       },
       {{"optimizer", kOptimizers, [](Calls& c) { return &c.optimizer; }, nullptr}}},
      {"embscale_optimizer_weight_decay_get",
       [](Calls& c) {
         int32_t rule = 0;
         return embscale_optimizer_weight_decay_get(c.optimizer, &rule);
       },
       {{"optimizer", kOptimizers, [](Calls& c) { return &c.optimizer; }, nullptr}}},
      {"embscale_optimizer_check", [](Calls& c) { return embscale_optimizer_check(&c.opt); },
       optimizer_fields([](Calls& c) { return &c.opt; })},
      {"embscale_tbe_backward_workspace_size",
       [](Calls& c) { return embscale_tbe_backward_workspace_size(c.tbe, &c.ctx, &c.bwd, &c.bytes); },
       backward_fields()},
      {"embscale_tbe_backward",
       [=](Calls& c) { return embscale_tbe_backward(c.tbe, &c.ctx, &c.bwd, ws(c), wsb); }, backward_fields()},
  };
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

TEST(CapiEnums, EveryEntryPointRunsWithTheValidArguments) {
  for (const Entry& e : entries()) {
    Calls c;
    EXPECT_EQ(e.call(c), 0) << e.name << ": " << embscale_last_error();
  }
}

TEST(CapiEnums, FirstValuePastTheRangeAndMinusOneAreRefusedByEveryEntryPoint) {
  int checked = 0;
  for (const Entry& e : entries()) {
    for (const Field& f : e.fields) {
      for (const int32_t bad : {f.count, -1}) {
        Calls c;
        if (f.present) f.present(c);
        *f.at(c) = bad;
        const int rc = e.call(c);
        const std::string message = embscale_last_error();
        const std::string want = f.name + ": value " + std::to_string(bad) + " is out of range [0, " +
                                 std::to_string(f.count - 1) + "]";
        EXPECT_EQ(rc, kInvalidArgument) << e.name << " with " << f.name << " = " << bad << ": " << message;
        EXPECT_TRUE(starts_with(message, want)) << e.name << " with " << f.name << " = " << bad << ": '" << message
                                                << "', expected '" << want << "'";
        ++checked;
      }
      // The last documented value gets past the check (the call may still fail for another reason: an
      // fp8 dtype where a float one is needed, the CUDA backend in a CPU build).
      Calls c;
      if (f.present) f.present(c);
      *f.at(c) = f.count - 1;
      e.call(c);
      EXPECT_FALSE(starts_with(embscale_last_error(), f.name + ": value"))
          << e.name << " refuses the last value of " << f.name << ": " << embscale_last_error();
    }
  }
  std::printf("%d refusals checked\n", checked);
}

TEST(CapiEnums, BackendQueriesAnswerNoOutsideTheRange) {
  for (const int32_t bad : {kBackends, -1}) {
    EXPECT_EQ(embscale_backend_available(bad), 0) << bad;
    EXPECT_EQ(embscale_backend_compiled(bad), 0) << bad;
  }
  EXPECT_EQ(embscale_backend_available(0), 1);
  EXPECT_EQ(embscale_backend_compiled(0), 1);
}

// The header's lists of values ("pooling (0 sum, 1 mean, 2 none)") are those of the C++ enums: the
// same count, and where the enum has names, the same name for each value.
std::map<std::string, std::vector<std::string>> documented_enums() {
  std::ifstream in(std::string(EMBSCALE_SOURCE_DIR) + "/include/embscale/embscale_c.h");
  std::stringstream text;
  text << in.rdbuf();
  // The conventions comment as one line: comment decorations and line breaks become single spaces.
  const std::string flat = std::regex_replace(text.str(), std::regex(R"(\s*\n\s*\*?\s*)"), " ");
  std::map<std::string, std::vector<std::string>> lists;
  const std::regex list(R"(([a-z][a-z ]*) \((?:embscale::\w+: )?((?:\d+ \w+(?:, )?)+)\))");
  for (std::sregex_iterator it(flat.begin(), flat.end(), list), end; it != end; ++it) {
    std::vector<std::string> names;
    const std::string values = (*it)[2];
    const std::regex value(R"((\d+) (\w+))");
    for (std::sregex_iterator v(values.begin(), values.end(), value); v != end; ++v) {
      EXPECT_EQ(std::stoi((*v)[1]), static_cast<int>(names.size())) << (*it)[0];
      names.push_back((*v)[2]);
    }
    lists[(*it)[1]] = names;
  }
  return lists;
}

template <typename E, typename Name>
std::vector<std::string> names_of(int count, Name name) {
  std::vector<std::string> names;
  for (int v = 0; v < count; ++v) names.push_back(name(static_cast<E>(v)));
  return names;
}

TEST(CapiEnums, TheHeaderListsTheCppEnumsValues) {
  const auto lists = documented_enums();
  const auto documented = [&](const std::string& label) {
    const auto it = lists.find(label);
    EXPECT_NE(it, lists.end()) << "embscale_c.h documents no values of " << label;
    return it == lists.end() ? std::vector<std::string>() : it->second;
  };
  using namespace embscale;
  EXPECT_EQ(documented("backend"), (names_of<Backend>(kNumBackends, backend_name)));
  EXPECT_EQ(documented("dtype"), (names_of<DType>(kNumDTypes, dtype_name)));
  EXPECT_EQ(documented("amax algo"), (names_of<AmaxAlgo>(kNumAmaxAlgos, amax_algo_name)));
  EXPECT_EQ(documented("activation"), (names_of<Activation>(kNumActivations, activation_name)));
  EXPECT_EQ(documented("pooling"), (names_of<PoolingMode>(kNumPoolingModes, pooling_mode_name)));
  EXPECT_EQ(documented("bounds check"), (names_of<BoundsCheckMode>(kNumBoundsCheckModes, bounds_check_mode_name)));
  EXPECT_EQ(documented("optimizer"), (names_of<OptimizerType>(num_optimizers(), optimizer_name)));
  EXPECT_EQ(documented("weight decay").size(), static_cast<size_t>(kNumWeightDecayModes));
  EXPECT_EQ(documented("rounding").size(), static_cast<size_t>(kNumWeightRoundings));
}

// embscale_row_cache_create's enumerations (placement per table 0..2, algorithm 0..1, optimizer): the first
// value past each range and -1 are refused naming the argument; the last value gets past the check (the CPU
// backend then refuses the cache itself: kUnsupported, a row cache is a CUDA object).
TEST(CapiEnums, RowCacheCreateRefusesValuesOutsideEachEnum) {
  const int32_t kPlacements = 3, kAlgorithms = 2;
  EXPECT_EQ(kPlacements, embscale::kNumTablePlacements);
  EXPECT_EQ(kAlgorithms, embscale::kNumCacheAlgorithms);
  embscale_context ctx{0, 1, nullptr};
  int64_t rows[2] = {100, 50}, cache_rows[2] = {32, 0};
  int32_t dims[2] = {4, 8};
  struct Args {
    int32_t placement0 = 2, placement1 = 1, algorithm = 0, optimizer = 2;
  };
  const auto create = [&](const Args& a) {
    int32_t placement[2] = {a.placement0, a.placement1};
    embscale_row_cache* cache = nullptr;
    const int rc = embscale_row_cache_create(&ctx, 2, rows, dims, 2, nullptr, kF32, placement, cache_rows, a.algorithm,
                                             a.optimizer, 64, &cache);
    embscale_row_cache_destroy(cache);
    return rc;
  };
  EXPECT_EQ(create(Args{}), static_cast<int>(embscale::StatusCode::kUnsupported)) << embscale_last_error();
  const struct {
    const char* name;
    int32_t Args::*field;
    int32_t count;
  } fields[] = {{"placement[0]", &Args::placement0, kPlacements}, {"placement[1]", &Args::placement1, kPlacements},
                {"algorithm", &Args::algorithm, kAlgorithms}, {"optimizer", &Args::optimizer, kOptimizers}};
  for (const auto& f : fields) {
    for (int32_t bad : {f.count, -1}) {
      Args a;
      a.*f.field = bad;
      EXPECT_EQ(create(a), kInvalidArgument) << f.name << " = " << bad;
      EXPECT_EQ(std::string(embscale_last_error()).rfind(f.name, 0), 0u) << embscale_last_error();
    }
  }
}

}  // namespace
