// The quantized TBE (embscale/tbe_quant.h) on every backend: the row layout against FBGEMM's IntNBit sizes and
// hand-worked bytes, the quantizing helpers' round-trip error bounds (and the CUDA quantizer's bytes against the
// host's worked rules), the forward against the float64 reference that decodes the same bytes
// (reference_tbe_quant.h) over seeded random configurations and the edge cases, the bounds-check modes, and
// every refused argument (named, nothing written). CUDA cases skip where no device is present.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "embscale/tbe_quant.h"
#include "reference_tbe_quant.h"

namespace embscale {
namespace {

constexpr QuantWeightType kAllTypes[] = {QuantWeightType::kFp32,    QuantWeightType::kFp16, QuantWeightType::kBf16,
                                         QuantWeightType::kInt8,    QuantWeightType::kInt4, QuantWeightType::kInt2,
                                         QuantWeightType::kFp8E4M3, QuantWeightType::kFp8E5M2};

bool tbe_skips(BoundsCheckMode m) { return m == BoundsCheckMode::kSkip || m == BoundsCheckMode::kWarn; }

Context context_of(Backend b, int threads = 0) { return b == Backend::kCpu ? Context::cpu(threads) : Context::cuda(); }

// A host vector's bytes in a backend's memory (the same memory on the CPU backend's side of a test: a copy).
struct Uploaded {
  Buffer buf;
  Status status;
  Uploaded(Backend b, const void* host, size_t bytes) : buf(b, bytes) {
    status = buf.valid() ? copy_to_backend(context_of(b), buf.data(), host, bytes)
                         : Status(StatusCode::kBackendError, "out of memory");
  }
  template <typename T>
  Uploaded(Backend b, const std::vector<T>& v) : Uploaded(b, v.data(), v.size() * sizeof(T)) {}
  void* data() const { return buf.data(); }
};

std::vector<float> random_rows(int64_t E, int64_t D, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(E * D));
  for (float& v : x) v = u(rng);
  return x;
}

// The tables of `tbe` filled with random rows quantized by quantize_rows, at their offsets.
std::vector<uint8_t> make_weights(const QuantizedTableBatchedEmbedding& tbe, std::mt19937_64& rng) {
  std::vector<uint8_t> w(static_cast<size_t>(tbe.total_bytes()), 0xAB);  // gaps and padding: never read
  for (int t = 0; t < tbe.num_tables(); ++t) {
    const QuantTableSpec& s = tbe.config().tables[t];
    const std::vector<float> x = random_rows(s.num_rows, s.dim, rng);
    const int64_t bytes = s.num_rows * tbe.row_bytes(t);
    const Status st = quantize_rows(s.type, TensorView::mat(x.data(), DType::kF32, s.num_rows, s.dim),
                                    tbe.config().row_alignment, w.data() + tbe.table_offset(t), bytes);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  return w;
}

double output_value(const std::vector<uint8_t>& out, DType dt, size_t i) {
  if (dt == DType::kF32) {
    float f;
    std::memcpy(&f, out.data() + 4 * i, 4);
    return f;
  }
  const uint16_t h = static_cast<uint16_t>(out[2 * i] | (out[2 * i + 1] << 8));
  return dt == DType::kF16 ? reference_quant::half_value(h) : reference_quant::bf16_value(h);
}

struct QCase {
  std::vector<QuantTableSpec> tables;
  std::vector<int> feature_table_map;
  int row_alignment = 16;
  int table_alignment = 128;
  int64_t batch_size = 4;
  int max_bag = 5;  // bag sizes uniform in [0, max_bag]
  PoolingMode pooling = PoolingMode::kSum;
  bool weighted = false;
  DType output = DType::kF32;
  DType index = DType::kI64;
  BoundsCheckMode bounds = BoundsCheckMode::kError;
  double bad_fraction = 0.0;  // share of indices made invalid (negative or >= E)
  int non_finite_every = 0;   // > 0: every k-th row's header gets a non-finite scale or bias (non_finite_headers)
  uint64_t seed = 1;
  std::string str() const {
    std::string s = "seed=" + std::to_string(seed) + " tables=[";
    for (const auto& t : tables)
      s += std::to_string(t.num_rows) + "x" + std::to_string(t.dim) + ":" + quant_weight_type_name(t.type) + " ";
    return s + "] B=" + std::to_string(batch_size) + " L<=" + std::to_string(max_bag) + " pool=" +
           pooling_mode_name(pooling) + (weighted ? " weighted" : "") + " out=" + dtype_name(output) +
           " idx=" + dtype_name(index) + " bounds=" + bounds_check_mode_name(bounds) +
           " align=" + std::to_string(row_alignment) + "/" + std::to_string(table_alignment);
  }
};

struct QRun {
  Status status;
  std::vector<uint8_t> output;   // the output's bytes after the call (poisoned with 0xFF before)
  reference_quant::Result ref;
  int64_t num_skipped = -7;      // -7: untouched
  int64_t max_bag = 0;
};

// Every k-th row of each int or fp8 table gets, in turn, a scale of +inf, NaN or -inf, or (int rows) a bias of
// -inf or NaN: bytes no quantizer writes but a loaded table may hold.
void non_finite_headers(const QuantizedTableBatchedEmbedding& tbe, int every, std::vector<uint8_t>* w) {
  const uint16_t half[] = {0x7c00, 0x7e00, 0xfc00};  // +inf, NaN, -inf
  const uint32_t single[] = {0x7f800000u, 0x7fc00000u, 0xff800000u};
  int turn = 0;
  for (int t = 0; t < tbe.num_tables(); ++t) {
    const QuantTableSpec& s = tbe.config().tables[t];
    if (quant_row_header_bytes(s.type) == 0) continue;
    const bool fp8 = s.type == QuantWeightType::kFp8E4M3 || s.type == QuantWeightType::kFp8E5M2;
    for (int64_t r = 0; r < s.num_rows; r += every, ++turn) {
      uint8_t* h = w->data() + tbe.table_offset(t) + r * tbe.row_bytes(t);
      if (fp8) {
        std::memcpy(h, &single[turn % 3], 4);
      } else {
        const bool bias = turn % 2 == 1;  // scale and bias in turn, each over the three values
        std::memcpy(h + (bias ? 2 : 0), &half[(turn / 2) % 3], 2);
      }
    }
  }
}

// The case's tables, ids and weights made on the host (quantize_rows), the forward run on `backend` with
// every input in its memory, the output and the skip count read back.
QRun run_case(const QCase& c, Backend backend = Backend::kCpu, int threads = 0) {
  QRun r;
  std::mt19937_64 rng(c.seed);
  QuantTbeConfig cfg;
  cfg.tables = c.tables;
  cfg.feature_table_map = c.feature_table_map;
  cfg.row_alignment = c.row_alignment;
  cfg.table_alignment = c.table_alignment;
  std::unique_ptr<QuantizedTableBatchedEmbedding> tbe;
  const Context ctx = context_of(backend, threads);
  r.status = QuantizedTableBatchedEmbedding::create(ctx, cfg, &tbe);
  if (!r.status.ok()) return r;
  std::vector<uint8_t> weights = make_weights(*tbe, rng);
  if (c.non_finite_every > 0) non_finite_headers(*tbe, c.non_finite_every, &weights);

  const int T = tbe->num_features();
  const int64_t B = c.batch_size;
  std::vector<int64_t> offsets(1, 0), indices;
  std::uniform_int_distribution<int> bag(0, c.max_bag);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  for (int f = 0; f < T; ++f) {
    const int64_t E = c.tables[tbe->feature_table(f)].num_rows;
    std::uniform_int_distribution<int64_t> row(0, E - 1);
    for (int64_t b = 0; b < B; ++b) {
      const int L = bag(rng);
      r.max_bag = std::max<int64_t>(r.max_bag, L);
      for (int l = 0; l < L; ++l) {
        int64_t idx = row(rng);
        if (u01(rng) < c.bad_fraction) idx = (rng() & 1) ? -1 - static_cast<int64_t>(rng() % 5) : E + static_cast<int64_t>(rng() % 5);
        indices.push_back(idx);
      }
      offsets.push_back(static_cast<int64_t>(indices.size()));
    }
  }
  const int64_t N = static_cast<int64_t>(indices.size());
  std::vector<float> psw(static_cast<size_t>(N));
  std::uniform_real_distribution<float> wdist(-1.5f, 1.5f);
  for (float& w : psw) w = wdist(rng);
  r.ref = reference_quant::forward(*tbe, weights, indices, offsets, c.weighted ? &psw : nullptr, B, c.pooling);

  std::vector<int32_t> indices32(indices.begin(), indices.end()), offsets32(offsets.begin(), offsets.end());
  const bool i32 = c.index == DType::kI32;
  const int64_t rows = c.pooling == PoolingMode::kNone ? N : B;
  const int64_t cols = c.pooling == PoolingMode::kNone ? (T > 0 ? tbe->feature_dim(0) : 0) : tbe->total_dim();
  r.output.assign(static_cast<size_t>(rows * cols) * dtype_size(c.output), 0xFF);
  const Uploaded d_weights(backend, weights), d_psw(backend, psw), d_out(backend, r.output);
  const Uploaded d_idx = i32 ? Uploaded(backend, indices32) : Uploaded(backend, indices);
  const Uploaded d_off = i32 ? Uploaded(backend, offsets32) : Uploaded(backend, offsets);
  const Uploaded d_skipped(backend, &r.num_skipped, sizeof(r.num_skipped));
  for (const Uploaded* u : {&d_weights, &d_psw, &d_out, &d_idx, &d_off, &d_skipped}) {
    r.status = u->status;
    if (!r.status.ok()) return r;
  }
  QuantTbeForwardArgs a;
  a.weights = d_weights.data();
  a.weights_bytes = static_cast<int64_t>(weights.size());
  a.indices = TensorView::vec(d_idx.data(), c.index, N);
  a.offsets = TensorView::vec(d_off.data(), c.index, static_cast<int64_t>(offsets.size()));
  if (c.weighted) a.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, N);
  a.batch_size = B;
  a.pooling = c.pooling;
  a.bounds_check = c.bounds;
  a.output = TensorView::mat(d_out.data(), c.output, rows, cols);
  a.num_skipped = static_cast<int64_t*>(d_skipped.data());
  r.status = tbe->forward(ctx, a);
  const Status out = copy_to_host(ctx, r.output.data(), d_out.data(), r.output.size());
  const Status skipped = copy_to_host(ctx, &r.num_skipped, d_skipped.data(), sizeof(r.num_skipped));
  if (r.status.ok()) r.status = !out.ok() ? out : skipped;
  return r;
}

// Every output element within the bound of fp32 arithmetic over the bag plus the output's rounding; a
// non-finite reference element must be the same infinity, or a NaN.
std::string compare(const QCase& c, const QRun& r) {
  const double fp32 = (r.max_bag + 4) * std::ldexp(1.0, -23);
  const double out_eps = c.output == DType::kF32 ? 0.0 : c.output == DType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  const double out_abs = c.output == DType::kF16 ? std::ldexp(1.0, -25) : 0.0;  // fp16 subnormals' half step
  for (size_t i = 0; i < r.ref.out.size(); ++i) {
    const double got = output_value(r.output, c.output, i), want = r.ref.out[i];
    if (!std::isfinite(want)) {
      if (std::isnan(want) ? std::isnan(got) : got == want) continue;
      char buf[160];
      std::snprintf(buf, sizeof(buf), "element %zu: got %.9g, reference %.9g", i, got, want);
      return c.str() + ": " + buf;
    }
    const double e32 = fp32 * r.ref.mag[i];
    const double tol = e32 + out_eps * (std::fabs(want) + e32) + out_abs;
    if (!(std::fabs(got - want) <= tol)) {
      char buf[256];
      std::snprintf(buf, sizeof(buf), "element %zu: got %.9g, reference %.9g (tolerance %.3g)", i, got, want, tol);
      return c.str() + ": " + buf;
    }
  }
  return "";
}

void expect_match(const QCase& c, Backend backend) {
  const QRun r = run_case(c, backend);
  ASSERT_TRUE(r.status.ok()) << c.str() << ": " << r.status.message();
  const std::string failure = compare(c, r);
  EXPECT_TRUE(failure.empty()) << failure;
}

// ---- layout ------------------------------------------------------------------------------------------

TEST(TbeQuantLayout, RowBytesFollowFbgemmIntNBitSizes) {
  // FBGEMM: header 4 bytes for int rows, data D * bits / 8, rounded up to the row alignment.
  const struct { QuantWeightType t; int dim, align; int64_t bytes; } cases[] = {
      {QuantWeightType::kInt8, 128, 16, 144}, {QuantWeightType::kInt4, 64, 16, 48}, {QuantWeightType::kInt2, 8, 16, 16},
      {QuantWeightType::kInt4, 64, 1, 36},    {QuantWeightType::kInt2, 32, 1, 12},  {QuantWeightType::kFp16, 3, 1, 6},
      {QuantWeightType::kFp32, 5, 16, 32},    {QuantWeightType::kBf16, 8, 16, 16},  {QuantWeightType::kFp8E4M3, 7, 16, 16},
      {QuantWeightType::kFp8E5M2, 12, 1, 16}, {QuantWeightType::kInt4, 3, 1, 6},    {QuantWeightType::kInt2, 5, 1, 6},
      {QuantWeightType::kInt8, 1, 256, 256},
  };
  for (const auto& k : cases) {
    int64_t bytes = -1;
    ASSERT_TRUE(quant_row_bytes(k.t, k.dim, k.align, &bytes).ok());
    EXPECT_EQ(bytes, k.bytes) << quant_weight_type_name(k.t) << " D=" << k.dim << " align=" << k.align;
  }
}

TEST(TbeQuantLayout, TablesStartAtTheTableAlignment) {
  QuantTbeConfig cfg;
  cfg.tables = {{3, 5, QuantWeightType::kInt4}, {2, 7, QuantWeightType::kFp16}, {1, 1, QuantWeightType::kInt2}};
  std::unique_ptr<QuantizedTableBatchedEmbedding> tbe;
  ASSERT_TRUE(QuantizedTableBatchedEmbedding::create(Context::cpu(), cfg, &tbe).ok());
  EXPECT_EQ(tbe->row_bytes(0), 16);
  EXPECT_EQ(tbe->row_bytes(1), 16);
  EXPECT_EQ(tbe->row_bytes(2), 16);
  EXPECT_EQ(tbe->table_offset(0), 0);
  EXPECT_EQ(tbe->table_offset(1), 128);
  EXPECT_EQ(tbe->table_offset(2), 256);
  EXPECT_EQ(tbe->total_bytes(), 272);
  EXPECT_EQ(tbe->total_dim(), 13);
  cfg.row_alignment = 1;
  cfg.table_alignment = 1;
  ASSERT_TRUE(QuantizedTableBatchedEmbedding::create(Context::cpu(), cfg, &tbe).ok());
  EXPECT_EQ(tbe->row_bytes(0), 7);  // 4 + ceil(5 / 2)
  EXPECT_EQ(tbe->table_offset(1), 21);
  EXPECT_EQ(tbe->table_offset(2), 49);  // 21 + 2 * 14
  EXPECT_EQ(tbe->total_bytes(), 54);
}

TEST(TbeQuantLayout, NamesParseBothSpellings) {
  for (QuantWeightType t : kAllTypes) {
    QuantWeightType back;
    ASSERT_TRUE(parse_quant_weight_type(quant_weight_type_name(t), &back));
    EXPECT_EQ(back, t);
  }
  QuantWeightType t;
  EXPECT_TRUE(parse_quant_weight_type("INT4", &t));
  EXPECT_EQ(t, QuantWeightType::kInt4);
  EXPECT_FALSE(parse_quant_weight_type("FP8", &t));  // FBGEMM's FP8 rows are another layout
  EXPECT_FALSE(parse_quant_weight_type("int3", &t));
  EXPECT_EQ(quant_weight_type_spellings().size(), 14u);
}

// ---- quantizing helpers ------------------------------------------------------------------------------

std::vector<uint8_t> quantize(QuantWeightType t, const std::vector<float>& x, int64_t E, int64_t D, int align) {
  int64_t rb = 0;
  EXPECT_TRUE(quant_row_bytes(t, static_cast<int>(D), align, &rb).ok());
  std::vector<uint8_t> out(static_cast<size_t>(E * rb), 0xCD);
  const Status st = quantize_rows(t, TensorView::mat(x.data(), DType::kF32, E, D), align, out.data(),
                                  static_cast<int64_t>(out.size()));
  EXPECT_TRUE(st.ok()) << st.message();
  return out;
}

TEST(TbeQuantHelpers, Int4RowBytesAreTheWorkedExample) {
  // min 1 (fp16 0x3C00), scale fp16(4 / 15) = 0.2666015625 (0x3444); codes round((x - 1) / scale) =
  // 0, 4, 8, 11, 15, two a byte, the lower column in the low nibble; padded with zeros to 16 bytes.
  const std::vector<uint8_t> got = quantize(QuantWeightType::kInt4, {1, 2, 3, 4, 5}, 1, 5, 16);
  const std::vector<uint8_t> want = {0x44, 0x34, 0x00, 0x3C, 0x40, 0xB8, 0x0F, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(got, want);
}

TEST(TbeQuantHelpers, Int2AndFp8RowBytesAreTheWorkedExamples) {
  // int2 [0, 1, 2, 3]: scale 1 (0x3C00), bias 0, codes 0..3 packed low bits first: 0b11100100.
  EXPECT_EQ(quantize(QuantWeightType::kInt2, {0, 1, 2, 3}, 1, 4, 1), (std::vector<uint8_t>{0x00, 0x3C, 0, 0, 0xE4}));
  // e4m3 [448, -224, 0, 1]: amax 448, scale 1, header 1.0f; codes 0x7E, 0xF6, 0x00, 0x38.
  EXPECT_EQ(quantize(QuantWeightType::kFp8E4M3, {448, -224, 0, 1}, 1, 4, 1),
            (std::vector<uint8_t>{0, 0, 0x80, 0x3F, 0x7E, 0xF6, 0x00, 0x38}));
  // The scale is the range above the fp16-rounded minimum: min 0.7551 -> bias fp16 0.755 (0x3A0A), scale
  // fp16((0.9954 - 0.755) / 3) = 0.0802 (0x2D22; from the unrounded minimum it would be 0x2D21), codes 0, 3, 2.
  EXPECT_EQ(quantize(QuantWeightType::kInt2, {0.7551f, 0.9954f, 0.9495f}, 1, 3, 1),
            (std::vector<uint8_t>{0x22, 0x2D, 0x0A, 0x3A, 0x2C}));
  // A constant row: range 0 -> scale 1, every code 0, bias = the value.
  EXPECT_EQ(quantize(QuantWeightType::kInt8, {-2, -2, -2}, 1, 3, 1),
            (std::vector<uint8_t>{0x00, 0x3C, 0x00, 0xC0, 0, 0, 0}));
}

TEST(TbeQuantHelpers, RoundTripErrorIsWithinEachTypesBound) {
  const uint64_t seed = 20261206;
  std::printf("TbeQuantHelpers.RoundTripErrorIsWithinEachTypesBound: seed %" PRIu64 "\n", seed);
  std::mt19937_64 rng(seed);
  for (QuantWeightType t : kAllTypes) {
    for (int64_t D : {1, 2, 3, 5, 8, 17, 64, 129}) {
      const int64_t E = 7;
      std::vector<float> x = random_rows(E, D, rng);
      for (int64_t c = 0; c < D; ++c) x[c] *= 1000.0f;  // a wide row
      for (int64_t c = 0; c < D; ++c) x[D + c] *= 1e-3f;  // a narrow row
      const std::vector<uint8_t> q = quantize(t, x, E, D, 16);
      std::vector<float> back(static_cast<size_t>(E * D), NAN);
      ASSERT_TRUE(dequantize_rows(t, q.data(), static_cast<int64_t>(q.size()), 16,
                                  TensorView::mat(back.data(), DType::kF32, E, D)).ok());
      int64_t rb = 0;
      ASSERT_TRUE(quant_row_bytes(t, static_cast<int>(D), 16, &rb).ok());
      for (int64_t r = 0; r < E; ++r) {
        double mn = x[r * D], mx = x[r * D], amax = 0;
        for (int64_t c = 0; c < D; ++c) {
          mn = std::min<double>(mn, x[r * D + c]);
          mx = std::max<double>(mx, x[r * D + c]);
          amax = std::max<double>(amax, std::fabs(x[r * D + c]));
        }
        const uint8_t* row = q.data() + r * rb;
        for (int64_t c = 0; c < D; ++c) {
          const double v = x[r * D + c], err = std::fabs(back[r * D + c] - v);
          double bound;
          switch (t) {
            case QuantWeightType::kInt8:
            case QuantWeightType::kInt4:
            case QuantWeightType::kInt2: {
              // Half a step, plus the fp16 rounding of the bias (values below it clamp to code 0) and of
              // the scale (the top code can fall short by qmax * its error), plus fp32 arithmetic.
              const double scale = reference_quant::half_value(reference_quant::u16_at(row));
              const int qmax = (1 << (t == QuantWeightType::kInt8 ? 8 : t == QuantWeightType::kInt4 ? 4 : 2)) - 1;
              bound = 0.5 * scale + std::ldexp(std::fabs(mn), -11) + std::ldexp(1.0, -25) +
                      qmax * (scale * std::ldexp(1.0, -11) + std::ldexp(1.0, -25)) + scale * qmax * std::ldexp(1.0, -20) +
                      4 * std::ldexp(std::fabs(mn) + std::fabs(mx), -24);
              break;
            }
            case QuantWeightType::kFp8E4M3: bound = std::ldexp(std::fabs(v), -4) + amax * std::ldexp(1.0, -9 - 6) + 1e-30; break;
            case QuantWeightType::kFp8E5M2: bound = std::ldexp(std::fabs(v), -3) + amax * std::ldexp(1.0, -16 - 2) + 1e-30; break;
            case QuantWeightType::kFp16: bound = std::ldexp(std::fabs(v), -11) + std::ldexp(1.0, -25); break;
            case QuantWeightType::kBf16: bound = std::ldexp(std::fabs(v), -8); break;
            default: bound = 0; break;
          }
          ASSERT_LE(err, bound) << quant_weight_type_name(t) << " D=" << D << " row " << r << " col " << c << " x=" << v
                                << " back=" << back[r * D + c];
        }
      }
    }
  }
}

TEST(TbeQuantHelpers, RefusedCallsNameTheArgumentAndWriteNothing) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  std::vector<uint8_t> out(32, 0xCD);
  const auto rows = TensorView::mat(x.data(), DType::kF32, 2, 3);
  const auto expect_refused = [&](const Status& st, const char* starts) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    EXPECT_EQ(st.message().rfind(starts, 0), 0u) << st.message();
    EXPECT_EQ(out, std::vector<uint8_t>(32, 0xCD));
  };
  expect_refused(quantize_rows(QuantWeightType::kInt4, rows, 16, out.data(), 31), "out_bytes:");
  expect_refused(quantize_rows(static_cast<QuantWeightType>(99), rows, 16, out.data(), 32), "type:");
  expect_refused(quantize_rows(QuantWeightType::kInt4, rows, 3, out.data(), 32), "row_alignment:");
  expect_refused(quantize_rows(QuantWeightType::kInt4, TensorView::vec(x.data(), DType::kF32, 6), 16, out.data(), 32),
                 "rows:");
  expect_refused(quantize_rows(QuantWeightType::kInt4, rows, 16, nullptr, 32), "out:");
  x[4] = NAN;
  expect_refused(quantize_rows(QuantWeightType::kInt8, rows, 16, out.data(), 32), "rows: row 1, column 1");
  x[4] = 1e8f;  // beyond fp16: an int row's scale cannot hold the range
  expect_refused(quantize_rows(QuantWeightType::kInt8, rows, 16, out.data(), 32), "rows: row 1");
  x[4] = 5;
  EXPECT_TRUE(quantize_rows(QuantWeightType::kInt8, rows, 16, out.data(), 32).ok());
  std::vector<float> back(6);
  EXPECT_EQ(dequantize_rows(QuantWeightType::kInt8, out.data(), 33, 16, TensorView::mat(back.data(), DType::kF32, 2, 3))
                .code(),
            StatusCode::kInvalidArgument);
}

// quantize_rows on a backend (the context form): rows, out and workspace in its memory.
class TbeQuantRows : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
    ctx = context_of(GetParam());
  }
  // The status of quantizing x ([E, D]) on the backend; *bytes: out after the call (poisoned with 0xCD).
  Status quantize_on(QuantWeightType t, const std::vector<float>& x, int64_t E, int64_t D, int align,
                     std::vector<uint8_t>* bytes, int64_t ws_shortfall = 0) {
    int64_t rb = 0;
    EXPECT_TRUE(quant_row_bytes(t, static_cast<int>(D), align, &rb).ok());
    bytes->assign(static_cast<size_t>(E * rb), 0xCD);
    const Uploaded d_x(GetParam(), x), d_out(GetParam(), *bytes);
    const TensorView rows = TensorView::mat(d_x.data(), DType::kF32, E, D);
    size_t ws = 0;
    const Status size = quantize_rows_workspace_size(ctx, t, rows, align, &ws);
    if (!size.ok()) return size;
    Buffer d_ws(GetParam(), ws);
    const Status st = quantize_rows(ctx, t, rows, align, d_out.data(), static_cast<int64_t>(bytes->size()),
                                    d_ws.data(), ws - static_cast<size_t>(ws_shortfall));
    EXPECT_TRUE(copy_to_host(ctx, bytes->data(), d_out.data(), bytes->size()).ok());
    return st;
  }
  Context ctx;
};

TEST_P(TbeQuantRows, BytesAreTheHostQuantizers) {
  // The host quantizer's bytes are its worked examples and FBGEMM's (above, and tests/python); the device's
  // must be the same bits: random rows, wide and narrow ones, constant rows, and a zero minimum written as
  // +0 or -0 first (the bias keeps the first one's sign).
  const uint64_t seed = 5150;
  std::printf("TbeQuantRows.BytesAreTheHostQuantizers: seed %" PRIu64 "\n", seed);
  std::mt19937_64 rng(seed);
  for (QuantWeightType t : kAllTypes) {
    for (int64_t D : {1, 2, 3, 5, 8, 17, 64, 129, 1000}) {
      for (int align : {16, 1}) {
        const int64_t E = 9;
        std::vector<float> x = random_rows(E, D, rng);
        for (int64_t c = 0; c < D; ++c) {
          x[c] *= 1000.0f;             // row 0: wide
          x[D + c] *= 1e-3f;           // row 1: narrow
          x[2 * D + c] = 0.375f;       // row 2: constant
          x[3 * D + c] = std::fabs(x[3 * D + c]);
          x[4 * D + c] = std::fabs(x[4 * D + c]);
          x[5 * D + c] = -std::fabs(x[5 * D + c]) * 1e-30f;  // row 5: tiny negatives (fp16 subnormal bias)
        }
        x[3 * D] = 0.0f;  // row 3: min +0 first, -0 later
        if (D > 1) x[3 * D + D - 1] = -0.0f;
        x[4 * D] = -0.0f;  // row 4: min -0 first
        if (D > 1) x[4 * D + 1] = 0.0f;
        const std::vector<uint8_t> want = quantize(t, x, E, D, align);
        std::vector<uint8_t> got;
        const Status st = quantize_on(t, x, E, D, align, &got);
        ASSERT_TRUE(st.ok()) << st.message();
        ASSERT_EQ(got, want) << quant_weight_type_name(t) << " D=" << D << " align=" << align;
      }
    }
  }
}

TEST_P(TbeQuantRows, RefusedRowsGiveTheHostsMessageAndWriteNothing) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<uint8_t> got;
  const auto expect_refused = [&](QuantWeightType t, StatusCode code = StatusCode::kInvalidArgument,
                                  int64_t shortfall = 0) {
    std::vector<uint8_t> host(64, 0xCD);
    const Status want = quantize_rows(t, TensorView::mat(x.data(), DType::kF32, 3, 3), 16, host.data(), 48);
    const Status st = quantize_on(t, x, 3, 3, 16, &got, shortfall);
    EXPECT_EQ(st.code(), code) << st.message();
    if (code == StatusCode::kInvalidArgument) EXPECT_EQ(st.message(), want.message());
    EXPECT_EQ(got, std::vector<uint8_t>(got.size(), 0xCD));
  };
  x[4] = NAN;
  x[8] = INFINITY;  // a later row: the first refused row is named
  expect_refused(QuantWeightType::kFp16);
  x[4] = 5;
  x[8] = 9;
  x[5] = 1e8f;  // beyond fp16: an int row's scale cannot hold the range
  expect_refused(QuantWeightType::kInt4);
  x[3] = -1e6f;  // and its minimum cannot be a bias either
  expect_refused(QuantWeightType::kInt8);
  x[3] = 4;
  x[5] = 6;
  if (GetParam() == Backend::kCuda) expect_refused(QuantWeightType::kInt8, StatusCode::kWorkspaceTooSmall, 1);
  std::vector<uint8_t> none;
  EXPECT_TRUE(quantize_on(QuantWeightType::kInt8, {}, 0, 3, 16, &none).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, TbeQuantRows, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });

// ---- forward -----------------------------------------------------------------------------------------

QCase random_qcase(uint64_t seed) {
  std::mt19937_64 rng(seed);
  QCase c;
  c.seed = seed;
  const auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const PoolingMode pools[] = {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone};
  c.pooling = pools[pick(3)];
  const int num_tables = 1 + pick(4);
  const int seq_dim = 1 + pick(40);
  for (int t = 0; t < num_tables; ++t) {
    QuantTableSpec s;
    s.num_rows = pick(4) == 0 ? 1 : 1 + pick(300);
    s.dim = c.pooling == PoolingMode::kNone ? seq_dim : 1 + pick(pick(3) == 0 ? 300 : 40);
    s.type = kAllTypes[pick(8)];
    c.tables.push_back(s);
  }
  if (pick(2)) {
    const int T = 1 + pick(5);
    for (int f = 0; f < T; ++f) c.feature_table_map.push_back(pick(num_tables));
  }
  const int aligns[] = {1, 4, 16, 64};
  c.row_alignment = aligns[pick(4)];
  c.table_alignment = pick(2) ? 128 : 1;
  c.batch_size = pick(8) == 0 ? 0 : 1 + pick(9);
  c.max_bag = pick(3) == 0 ? 0 : pick(30);
  c.weighted = c.pooling != PoolingMode::kMean && pick(2);
  const DType outs[] = {DType::kF32, DType::kF16, DType::kBF16};
  c.output = outs[pick(3)];
  c.index = pick(2) ? DType::kI32 : DType::kI64;
  const BoundsCheckMode modes[] = {BoundsCheckMode::kSkip, BoundsCheckMode::kOff, BoundsCheckMode::kWarn};
  if (pick(3) == 0) {
    c.bounds = modes[pick(3)];
    c.bad_fraction = 0.1;
  }
  return c;
}

class TbeQuantForward : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
  }
};

TEST_P(TbeQuantForward, RandomConfigsMatchTheReference) {
  constexpr uint64_t kBaseSeed = 20261206;
  constexpr int kCases = 400;
  std::printf("TbeQuantForward.RandomConfigsMatchTheReference: seeds %" PRIu64 "..%" PRIu64 "\n", kBaseSeed,
              kBaseSeed + kCases - 1);
  int nonzero = 0;
  for (int i = 0; i < kCases; ++i) {
    const QCase c = random_qcase(kBaseSeed + i);
    const QRun r = run_case(c, GetParam());
    ASSERT_TRUE(r.status.ok()) << c.str() << ": " << r.status.message();
    const std::string failure = compare(c, r);
    ASSERT_TRUE(failure.empty()) << failure;
    if (tbe_skips(c.bounds)) ASSERT_EQ(r.num_skipped, r.ref.skipped) << c.str();
    for (double v : r.ref.out) nonzero += v != 0.0;
  }
  EXPECT_GT(nonzero, 1000);
}

TEST_P(TbeQuantForward, EveryTypeDimensionPoolingAndOutput) {
  // Row alignment 16 reads whole 16-byte chunks on CUDA (8 for int2), 1 reads bytes (the scalar path).
  const uint64_t seed = 77;
  std::printf("TbeQuantForward.EveryTypeDimensionPoolingAndOutput: seed %" PRIu64 "\n", seed);
  for (int align : {16, 1}) {
    for (QuantWeightType t : kAllTypes) {
      for (int D : {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 28, 33, 60, 128}) {
        for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone}) {
          for (DType out : {DType::kF32, DType::kF16, DType::kBF16}) {
            QCase c;
            c.seed = seed;
            c.tables = {{1, D, t}, {50, D, t}};  // a one-row table beside a larger one
            c.row_alignment = align;
            c.pooling = pool;
            c.output = out;
            c.weighted = pool != PoolingMode::kMean;
            c.max_bag = 6;  // bags of 0 to 6: empty bags (MEAN of nothing is 0) included
            expect_match(c, GetParam());
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

TEST_P(TbeQuantForward, NonFiniteScalesAndBiasesGiveTheReferencesInfinitiesAndNaNs) {
  // Such rows take their own decode on CUDA, chosen per step of lookups, so they sit among finite rows.
  const uint64_t seed = 91;
  std::printf("TbeQuantForward.NonFiniteScalesAndBiasesGiveTheReferencesInfinitiesAndNaNs: seed %" PRIu64 "\n", seed);
  int non_finite = 0;
  for (int align : {16, 1}) {
    for (QuantWeightType t : {QuantWeightType::kInt8, QuantWeightType::kInt4, QuantWeightType::kInt2,
                              QuantWeightType::kFp8E4M3, QuantWeightType::kFp8E5M2}) {
      for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kNone}) {
        for (DType index : {DType::kI32, DType::kI64}) {
          QCase c;
          c.seed = seed;
          c.tables = {{40, 60, t}, {30, 128, t}};
          if (pool == PoolingMode::kNone) c.tables[1].dim = 60;
          c.row_alignment = align;
          c.pooling = pool;
          c.index = index;
          c.weighted = true;
          c.batch_size = 6;
          c.max_bag = 9;
          c.non_finite_every = 7;
          const QRun r = run_case(c, GetParam());
          ASSERT_TRUE(r.status.ok()) << c.str() << ": " << r.status.message();
          const std::string failure = compare(c, r);
          ASSERT_TRUE(failure.empty()) << failure;
          for (double v : r.ref.out) non_finite += !std::isfinite(v);
        }
      }
    }
  }
  EXPECT_GT(non_finite, 1000);  // the cases reach the non-finite rows
}

TEST_P(TbeQuantForward, WideRowsAndLongBags) {
  // Rows wider than a warp's chunks (several passes over the bag on CUDA: fp32 D = 1000 is 250 chunks) and
  // bags longer than a step of lookups, with hot duplicate rows.
  const uint64_t seed = 909;
  std::printf("TbeQuantForward.WideRowsAndLongBags: seed %" PRIu64 "\n", seed);
  for (QuantWeightType t : kAllTypes) {
    for (int D : {257, 516, 1000, 2049}) {
      for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kNone}) {
        QCase c;
        c.seed = seed + D;
        c.tables = {{3, D, t}, {40, D, t}};  // three rows: every bag repeats them
        c.pooling = pool;
        c.weighted = true;
        c.batch_size = 3;
        c.max_bag = 37;
        expect_match(c, GetParam());
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(TbeQuantForward, MixedTypesAndDimensionsAcrossTables) {
  QCase c;
  c.seed = 5;
  for (QuantWeightType t : kAllTypes) c.tables.push_back({40, 3 + 5 * static_cast<int>(t), t});
  c.feature_table_map = {7, 0, 3, 3, 5, 1, 6, 2, 4};
  c.batch_size = 6;
  c.max_bag = 9;
  for (bool weighted : {false, true}) {
    c.weighted = weighted;
    for (DType idx : {DType::kI32, DType::kI64}) {
      c.index = idx;
      expect_match(c, GetParam());
    }
  }
  c.weighted = false;
  c.pooling = PoolingMode::kMean;
  expect_match(c, GetParam());
  c.row_alignment = 4;  // mixed paths on CUDA: 16-byte-multiple rows by chunks, the others by bytes
  c.table_alignment = 16;
  expect_match(c, GetParam());
}

TEST_P(TbeQuantForward, EmptyBatchAndAllEmptyBags) {
  QCase c;
  c.tables = {{10, 6, QuantWeightType::kInt4}};
  for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone}) {
    c.pooling = pool;
    c.batch_size = 0;
    expect_match(c, GetParam());
    c.batch_size = 5;
    c.max_bag = 0;  // every bag empty: zeros (sequence: no rows)
    const QRun r = run_case(c, GetParam());
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    for (size_t i = 0; i < r.ref.out.size(); ++i) EXPECT_EQ(output_value(r.output, c.output, i), 0.0);
  }
}

TEST_P(TbeQuantForward, EveryBoundsCheckModeWithBadIndices) {
  // Out-of-range ids are dropped in every mode, off included (no mode reads outside a table), and counted
  // in skip and warn modes; error mode names the first one.
  for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone}) {
    QCase c;
    c.seed = 11;
    c.tables = {{20, 8, QuantWeightType::kInt2}, {30, 8, QuantWeightType::kFp8E4M3}};
    c.pooling = pool;
    c.max_bag = 8;
    c.bad_fraction = 0.2;
    for (BoundsCheckMode m : {BoundsCheckMode::kSkip, BoundsCheckMode::kWarn, BoundsCheckMode::kOff}) {
      c.bounds = m;
      const QRun r = run_case(c, GetParam());
      ASSERT_TRUE(r.status.ok()) << c.str() << ": " << r.status.message();
      ASSERT_GT(r.ref.skipped, 0) << c.str();
      EXPECT_TRUE(compare(c, r).empty()) << compare(c, r);
      EXPECT_EQ(r.num_skipped, tbe_skips(m) ? r.ref.skipped : -7) << c.str();
    }
    c.bounds = BoundsCheckMode::kError;
    const QRun r = run_case(c, GetParam());
    EXPECT_EQ(r.status.code(), StatusCode::kOutOfRange) << r.status.message();
    EXPECT_EQ(r.status.message().rfind("indices: feature ", 0), 0u) << r.status.message();
    EXPECT_NE(r.status.message().find("is outside table"), std::string::npos) << r.status.message();
  }
}

TEST_P(TbeQuantForward, FloatTablesMatchTheTrainingForwardBitForBit) {
  // fp32/fp16/bf16 rows without padding are the training TBE's layout, and both sum a bag in lookup order
  // in fp32: the outputs are the same bits.
  const uint64_t seed = 4242;
  std::printf("TbeQuantForward.FloatTablesMatchTheTrainingForwardBitForBit: seed %" PRIu64 "\n", seed);
  std::mt19937_64 rng(seed);
  const struct { QuantWeightType q; DType d; } types[] = {
      {QuantWeightType::kFp32, DType::kF32}, {QuantWeightType::kFp16, DType::kF16}, {QuantWeightType::kBf16, DType::kBF16}};
  for (const auto& ty : types) {
    for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone}) {
      const int64_t E = 60, B = 7;
      const int D = 37;
      QuantTbeConfig qcfg;
      qcfg.tables = {{E, D, ty.q}, {E, D, ty.q}};
      qcfg.row_alignment = 1;
      qcfg.table_alignment = 1;
      TbeConfig tcfg;
      tcfg.tables = {{E, D}, {E, D}};
      tcfg.weights_dtype = ty.d;
      std::unique_ptr<QuantizedTableBatchedEmbedding> q;
      std::unique_ptr<TableBatchedEmbedding> t;
      const Context ctx = context_of(GetParam());
      ASSERT_TRUE(QuantizedTableBatchedEmbedding::create(ctx, qcfg, &q).ok());
      ASSERT_TRUE(TableBatchedEmbedding::create(ctx, tcfg, &t).ok());
      ASSERT_EQ(q->total_bytes(), t->num_weights() * static_cast<int64_t>(dtype_size(ty.d)));
      const std::vector<uint8_t> w = make_weights(*q, rng);
      std::vector<int64_t> offsets(1, 0), indices;
      for (int64_t bag = 0; bag < 2 * B; ++bag) {
        for (int64_t l = 0, L = static_cast<int64_t>(rng() % 9); l < L; ++l) indices.push_back(static_cast<int64_t>(rng() % E));
        offsets.push_back(static_cast<int64_t>(indices.size()));
      }
      const int64_t N = static_cast<int64_t>(indices.size());
      std::vector<float> psw(static_cast<size_t>(N));
      for (float& x : psw) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 333.0f;
      const bool weighted = pool != PoolingMode::kMean;
      const int64_t rows = pool == PoolingMode::kNone ? N : B, cols = pool == PoolingMode::kNone ? D : 2 * D;
      std::vector<float> out_q(static_cast<size_t>(rows * cols), -1.0f), out_t(out_q.size(), -2.0f);
      const Uploaded d_w(GetParam(), w), d_idx(GetParam(), indices), d_off(GetParam(), offsets),
          d_psw(GetParam(), psw), d_q(GetParam(), out_q), d_t(GetParam(), out_t);
      QuantTbeForwardArgs qa;
      qa.weights = d_w.data();
      qa.weights_bytes = static_cast<int64_t>(w.size());
      qa.indices = TensorView::vec(d_idx.data(), DType::kI64, N);
      qa.offsets = TensorView::vec(d_off.data(), DType::kI64, static_cast<int64_t>(offsets.size()));
      if (weighted) qa.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, N);
      qa.batch_size = B;
      qa.pooling = pool;
      qa.output = TensorView::mat(d_q.data(), DType::kF32, rows, cols);
      TbeForwardArgs ta;
      ta.weights = TensorView::vec(d_w.data(), ty.d, t->num_weights());
      ta.indices = qa.indices;
      ta.offsets = qa.offsets;
      ta.per_sample_weights = qa.per_sample_weights;
      ta.batch_size = B;
      ta.pooling = pool;
      ta.output = TensorView::mat(d_t.data(), DType::kF32, rows, cols);
      ASSERT_TRUE(q->forward(ctx, qa).ok());
      ASSERT_TRUE(t->forward(ctx, ta).ok());
      ASSERT_TRUE(copy_to_host(ctx, out_q.data(), d_q.data(), out_q.size() * sizeof(float)).ok());
      ASSERT_TRUE(copy_to_host(ctx, out_t.data(), d_t.data(), out_t.size() * sizeof(float)).ok());
      ASSERT_EQ(0, std::memcmp(out_q.data(), out_t.data(), out_q.size() * sizeof(float)))
          << quant_weight_type_name(ty.q) << " " << pooling_mode_name(pool);
    }
  }
}

TEST(TbeQuantForwardCpu, ThreadCountDoesNotChangeTheResult) {
  // About 40,000 lookups of rows of 1,024 and 128 bytes, ~23 MB gathered: the call fans out to 2 threads
  // (one per 8 MiB, thread_policy.h) when the context allows 2.
  QCase c;
  c.seed = 31337;
  c.tables = {{2000, 256, QuantWeightType::kFp32}, {3000, 240, QuantWeightType::kInt4}};
  c.batch_size = 2000;
  c.max_bag = 20;
  c.weighted = true;
  c.bad_fraction = 0.001;
  std::printf("TbeQuantForwardCpu.ThreadCountDoesNotChangeTheResult: seed %" PRIu64 "\n", c.seed);
  for (BoundsCheckMode m : {BoundsCheckMode::kSkip, BoundsCheckMode::kError}) {
    c.bounds = m;
    QRun runs[2];
    for (int threads : {1, 2}) runs[threads - 1] = run_case(c, Backend::kCpu, threads);
    EXPECT_EQ(runs[0].status.code(), runs[1].status.code());
    EXPECT_EQ(runs[0].status.message(), runs[1].status.message());
    if (m == BoundsCheckMode::kSkip) {
      ASSERT_TRUE(runs[0].status.ok()) << runs[0].status.message();
      EXPECT_EQ(runs[0].output, runs[1].output);
      EXPECT_EQ(runs[0].num_skipped, runs[1].num_skipped);
      EXPECT_EQ(runs[0].num_skipped, runs[0].ref.skipped);
      EXPECT_TRUE(compare(c, runs[1]).empty()) << compare(c, runs[1]);
    } else {
      EXPECT_EQ(runs[0].status.code(), StatusCode::kOutOfRange);
    }
  }
}

// ---- refused arguments -------------------------------------------------------------------------------

class TbeQuantErrors : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
    ctx = context_of(GetParam());
    cfg.tables = {{10, 4, QuantWeightType::kInt4}, {10, 6, QuantWeightType::kFp16}};
    ASSERT_TRUE(QuantizedTableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
    weights.assign(static_cast<size_t>(tbe->total_bytes()), 0);
    out.assign(2 * 10, 0x7f7f7f7f);
    d_weights = Buffer(GetParam(), weights.size());
    for (auto* b : {&d_indices, &d_offsets, &d_psw, &d_out, &d_skipped}) *b = Buffer(GetParam(), 256);
    ASSERT_TRUE(copy_to_backend(ctx, d_weights.data(), weights.data(), weights.size()).ok());
    ASSERT_TRUE(copy_to_backend(ctx, d_psw.data(), psw.data(), psw.size() * sizeof(float)).ok());
    upload();
    a.weights = d_weights.data();
    a.weights_bytes = tbe->total_bytes();
    a.indices = TensorView::vec(d_indices.data(), DType::kI64, 4);
    a.offsets = TensorView::vec(d_offsets.data(), DType::kI64, 5);
    a.batch_size = 2;
    a.output = TensorView::mat(d_out.data(), DType::kF32, 2, 10);
  }
  // indices, offsets and the poisoned output into the backend's memory.
  void upload() {
    ASSERT_TRUE(copy_to_backend(ctx, d_indices.data(), indices.data(), indices.size() * 8).ok());
    ASSERT_TRUE(copy_to_backend(ctx, d_offsets.data(), offsets.data(), offsets.size() * 8).ok());
    ASSERT_TRUE(copy_to_backend(ctx, d_out.data(), out.data(), out.size() * 4).ok());
  }
  std::vector<uint32_t> output() {
    std::vector<uint32_t> got(out.size());
    EXPECT_TRUE(copy_to_host(ctx, got.data(), d_out.data(), got.size() * 4).ok());
    return got;
  }
  // Refused with `code` and a message starting with `starts`; the output untouched.
  void expect_refused(const QuantTbeForwardArgs& args, const char* starts,
                      StatusCode code = StatusCode::kInvalidArgument) {
    const Status st = tbe->forward(ctx, args);
    EXPECT_EQ(st.code(), code) << st.message();
    EXPECT_EQ(st.message().rfind(starts, 0), 0u) << st.message();
    if (code == StatusCode::kInvalidArgument) EXPECT_EQ(output(), out);
  }
  bool cuda() const { return GetParam() == Backend::kCuda; }
  Context ctx;
  QuantTbeConfig cfg;
  std::unique_ptr<QuantizedTableBatchedEmbedding> tbe;
  std::vector<uint8_t> weights;
  std::vector<int64_t> indices = {1, 2, 3, 4};
  std::vector<int64_t> offsets = {0, 1, 2, 3, 4};
  std::vector<float> psw = {1, 1, 1, 1};
  std::vector<uint32_t> out;
  Buffer d_weights, d_indices, d_offsets, d_psw, d_out, d_skipped;
  QuantTbeForwardArgs a;
};

TEST_P(TbeQuantErrors, ValidCallSucceeds) { EXPECT_TRUE(tbe->forward(ctx, a).ok()); }

TEST_P(TbeQuantErrors, ConfigFieldsAreNamed) {
  const auto refused = [&](QuantTbeConfig c, const char* starts) {
    std::unique_ptr<QuantizedTableBatchedEmbedding> t;
    const Status st = QuantizedTableBatchedEmbedding::create(ctx, c, &t);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    EXPECT_EQ(st.message().rfind(starts, 0), 0u) << st.message();
    EXPECT_FALSE(t);
  };
  QuantTbeConfig c = cfg;
  c.tables[1].type = static_cast<QuantWeightType>(8);
  refused(c, "cfg.tables[1].type:");
  c = cfg;
  c.tables[0].num_rows = 0;
  refused(c, "cfg.tables[0].num_rows:");
  c = cfg;
  c.tables[1].dim = 0;
  refused(c, "cfg.tables[1].dim:");
  c = cfg;
  c.row_alignment = 12;
  refused(c, "cfg.row_alignment:");
  c = cfg;
  c.table_alignment = 0;
  refused(c, "cfg.table_alignment:");
  c = cfg;
  c.feature_table_map = {0, 2};
  refused(c, "cfg.feature_table_map[1]:");
  c = cfg;
  c.tables.clear();
  refused(c, "cfg.tables:");
  c = cfg;
  c.tables[0].num_rows = int64_t{1} << 60;
  refused(c, "cfg.tables[0]:");
}

TEST_P(TbeQuantErrors, ForwardArgumentsAreNamed) {
  QuantTbeForwardArgs b = a;
  b.weights_bytes -= 1;
  expect_refused(b, "weights_bytes:");
  b = a;
  b.weights = nullptr;
  expect_refused(b, "weights:");
  b = a;
  b.indices.dtype = DType::kF32;
  expect_refused(b, "indices:");
  b = a;
  b.offsets = TensorView::vec(d_offsets.data(), DType::kI64, 4);
  expect_refused(b, "offsets:");
  b = a;
  b.output.dtype = DType::kI32;
  expect_refused(b, "output:");
  b = a;
  b.output.shape[1] = 9;
  expect_refused(b, "output:");
  b = a;
  b.pooling = PoolingMode::kMean;
  b.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, 4);
  expect_refused(b, "per_sample_weights:");
  b = a;
  b.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, 3);
  expect_refused(b, "per_sample_weights:");
  b = a;
  b.pooling = PoolingMode::kNone;  // tables of 4 and 6 columns
  b.output = TensorView::mat(d_out.data(), DType::kF32, 4, 4);
  expect_refused(b, "pooling:");
  b = a;
  b.pooling = static_cast<PoolingMode>(7);
  expect_refused(b, "pooling:");
  b = a;
  b.bounds_check = static_cast<BoundsCheckMode>(9);
  expect_refused(b, "bounds_check:");
  b = a;
  b.batch_size = -1;
  expect_refused(b, "batch_size:");
  b = a;
  b.output.data = d_weights.data();
  expect_refused(b, "output:");  // overlaps weights
  if (cuda()) {
    // Host memory the device cannot read, each pointer named.
    b = a;
    b.weights = weights.data();
    expect_refused(b, "weights:");
    b = a;
    b.indices.data = indices.data();
    expect_refused(b, "indices:");
    b = a;
    int64_t host_count = 0;
    b.bounds_check = BoundsCheckMode::kSkip;
    b.num_skipped = &host_count;
    expect_refused(b, "num_skipped:");
    const Status st = tbe->forward(Context::cpu(), a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message().rfind("ctx: backend cpu differs", 0), 0u) << st.message();
    return;
  }
  Context other = ctx;
  other.num_threads = -1;
  const Status st = tbe->forward(other, a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("ctx.num_threads:", 0), 0u) << st.message();
}

TEST_P(TbeQuantErrors, BrokenOffsetsAreReportedAsOnTheTrainingForward) {
  // The CPU: an error in every mode. CUDA (tbe.h): an error in error and skip modes; warn mode returns at
  // once and leaves -1 in num_skipped; off mode clamps the bags and reports nothing.
  for (BoundsCheckMode m : {BoundsCheckMode::kError, BoundsCheckMode::kSkip, BoundsCheckMode::kOff, BoundsCheckMode::kWarn}) {
    QuantTbeForwardArgs b = a;
    b.bounds_check = m;
    b.num_skipped = static_cast<int64_t*>(d_skipped.data());
    const bool reported = !cuda() || m == BoundsCheckMode::kError || m == BoundsCheckMode::kSkip;
    for (const auto& broken : {std::vector<int64_t>{0, 2, 1, 3, 4}, std::vector<int64_t>{0, 1, 2, 3, 3}}) {
      offsets = broken;
      upload();
      const Status st = tbe->forward(ctx, b);
      if (reported) {
        EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << bounds_check_mode_name(m) << ": " << st.message();
        EXPECT_EQ(st.message().rfind(broken[2] == 1 ? "offsets: position 2" : "offsets: the last value 3", 0), 0u)
            << st.message();
      } else {
        EXPECT_TRUE(st.ok()) << bounds_check_mode_name(m) << ": " << st.message();
      }
      if (cuda() && m == BoundsCheckMode::kWarn) {
        int64_t count = 0;
        ASSERT_TRUE(copy_to_host(ctx, &count, d_skipped.data(), sizeof(count)).ok());
        EXPECT_EQ(count, -1);
      }
    }
    offsets = {0, 1, 2, 3, 4};
    upload();
  }
}

TEST_P(TbeQuantErrors, BadIndexIsReportedByFeatureBagAndPosition) {
  indices[3] = 10;
  upload();
  expect_refused(a, "indices: feature 1, bag 1, position 0 (indices[3]): index 10 is outside table 1 (10 rows)",
                 StatusCode::kOutOfRange);
}

INSTANTIATE_TEST_SUITE_P(Backends, TbeQuantForward, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });
INSTANTIATE_TEST_SUITE_P(Backends, TbeQuantErrors, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });

}  // namespace
}  // namespace embscale
