// Quantized table-batched embeddings, API layer: weight type names, the row and table layout,
// QuantizedTableBatchedEmbedding::create (config validation), forward()'s host-side checks before the
// backend (tbe/tbe_quant_backend.h), and the host quantizing helpers. Layout and rounding rules:
// embscale/tbe_quant.h.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/numerics.h"
#include "core/spelling.h"
#include "embscale/fp8.h"
#include "embscale/tbe_quant.h"
#include "tbe/quant_rows.h"
#include "tbe/tbe_quant_backend.h"
#include "tbe/tbe_validate.h"

namespace embscale {

namespace {

constexpr Spelling<QuantWeightType> kQuantTypeSpellings[] = {
    {"fp32", QuantWeightType::kFp32}, {"fp16", QuantWeightType::kFp16},       {"bf16", QuantWeightType::kBf16},
    {"int8", QuantWeightType::kInt8}, {"int4", QuantWeightType::kInt4},       {"int2", QuantWeightType::kInt2},
    {"fp8e4m3", QuantWeightType::kFp8E4M3}, {"fp8e5m2", QuantWeightType::kFp8E5M2},
    {"FP32", QuantWeightType::kFp32}, {"FP16", QuantWeightType::kFp16},       {"BF16", QuantWeightType::kBf16},
    {"INT8", QuantWeightType::kInt8}, {"INT4", QuantWeightType::kInt4},       {"INT2", QuantWeightType::kInt2},
};

bool valid_type(QuantWeightType t) {
  return static_cast<int>(t) >= 0 && static_cast<int>(t) < kNumQuantWeightTypes;
}

bool power_of_two_in(int x, int hi) { return x >= 1 && x <= hi && (x & (x - 1)) == 0; }

std::string s(int64_t x) { return std::to_string(x); }

// Data bytes of a row (the header excluded, the padding too).
int64_t data_bytes(QuantWeightType t, int64_t dim) {
  switch (t) {
    case QuantWeightType::kFp32: return 4 * dim;
    case QuantWeightType::kFp16:
    case QuantWeightType::kBf16: return 2 * dim;
    case QuantWeightType::kInt8:
    case QuantWeightType::kFp8E4M3:
    case QuantWeightType::kFp8E5M2: return dim;
    case QuantWeightType::kInt4: return (dim + 1) / 2;
    case QuantWeightType::kInt2: return (dim + 3) / 4;
  }
  return 0;
}

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// The rows argument of the helpers: 2-D fp32 host memory [E, D], D >= 1.
Status check_rows(const char* name, const TensorView& rows) {
  EMBSCALE_RETURN_IF_ERROR(check::shape(name, rows, 2));
  EMBSCALE_RETURN_IF_ERROR(check::data(name, rows));
  if (rows.ndim != 2) return invalid_argument(std::string(name) + ": shape " + check::shape_str(rows) + " is not 2-D [E, D]");
  if (rows.dtype != DType::kF32)
    return invalid_argument(std::string(name) + ": dtype " + dtype_name(rows.dtype) + " is not supported; expected fp32");
  if (rows.shape[1] < 1 || rows.shape[1] > INT_MAX)
    return invalid_argument(std::string(name) + ": shape " + check::shape_str(rows) + "; D must be in [1, 2^31-1]");
  return Status::Ok();
}

// The packed buffer of the helpers: E rows of `row_bytes`, exactly.
Status check_packed(const char* name, const void* p, int64_t bytes, int64_t E, int64_t row_bytes) {
  if (E > INT64_MAX / row_bytes)
    return invalid_argument(std::string(name) + ": " + s(E) + " rows of " + s(row_bytes) + " bytes overflow");
  if (bytes != E * row_bytes)
    return invalid_argument(std::string(name) + "_bytes: " + s(bytes) + "; expected E * row bytes = " + s(E) + " * " +
                            s(row_bytes) + " = " + s(E * row_bytes));
  if (p == nullptr && bytes > 0) return invalid_argument(std::string(name) + ": null, with " + s(bytes) + " bytes");
  return Status::Ok();
}

// One row of the quantizing helper (the rules: tbe_quant.h); the row's values are finite.
Status quantize_row(QuantWeightType type, const float* x, int64_t D, int64_t r, uint8_t* out, bool write) {
  const int bits = tbe_quant::int_bits(type);
  if (bits > 0) {
    float mn = x[0], mx = x[0];
    for (int64_t c = 1; c < D; ++c) {
      mn = std::min(mn, x[c]);
      mx = std::max(mx, x[c]);
    }
    const float row_min = mn;
    const uint16_t bias_h = float_to_fp16(mn);
    mn = fp16_to_float(bias_h);
    const int qmax = (1 << bits) - 1;
    const float range = mx - mn;
    float scale = range == 0.0f ? 1.0f : range / static_cast<float>(qmax);
    if (!is_finite_f(mn) || !is_finite_f(fp16_to_float(float_to_fp16(scale))))
      return invalid_argument("rows: row " + s(r) + ": its minimum " + std::to_string(row_min) +
                              " or its range does not fit the fp16 bias and scale of an " +
                              quant_weight_type_name(type) + " row");
    scale = fp16_to_float(float_to_fp16(scale));
    if (scale == 0.0f) scale = 1.0f;
    float inverse = 1.0f / scale;
    if (!is_finite_f(inverse)) scale = inverse = 1.0f;
    if (!write) return Status::Ok();
    const uint16_t scale_h = float_to_fp16(scale);
    std::memcpy(out, &scale_h, 2);
    std::memcpy(out + 2, &bias_h, 2);
    uint8_t* data = out + 4;
    const int per_byte = 8 / bits;
    for (int64_t c = 0; c < D; ++c) {
      // nearbyint: the current rounding mode, round-half-to-even by default (as lrintf).
      const float q = std::nearbyint((x[c] - mn) * inverse);
      const unsigned code = static_cast<unsigned>(std::min<float>(std::max<float>(q, 0.0f), static_cast<float>(qmax)));
      data[c / per_byte] = static_cast<uint8_t>(data[c / per_byte] | (code << ((c % per_byte) * bits)));
    }
    return Status::Ok();
  }
  if (!write) return Status::Ok();
  switch (type) {
    case QuantWeightType::kFp8E4M3:
    case QuantWeightType::kFp8E5M2: {
      const bool e4m3 = type == QuantWeightType::kFp8E4M3;
      float amax = 0.0f;
      for (int64_t c = 0; c < D; ++c) amax = std::max(amax, std::fabs(x[c]));
      const float scale = scale_from_amax(amax, fp8_max(e4m3 ? DType::kF8E4M3 : DType::kF8E5M2), ScaleOptions{});
      const float scale_inv = 1.0f / scale;
      std::memcpy(out, &scale_inv, 4);
      for (int64_t c = 0; c < D; ++c) out[4 + c] = e4m3 ? float_to_e4m3(x[c] * scale) : float_to_e5m2(x[c] * scale);
      return Status::Ok();
    }
    case QuantWeightType::kFp16:
    case QuantWeightType::kBf16:
      for (int64_t c = 0; c < D; ++c) {
        const uint16_t h = type == QuantWeightType::kFp16 ? float_to_fp16(x[c]) : float_to_bf16(x[c]);
        std::memcpy(out + 2 * c, &h, 2);
      }
      return Status::Ok();
    default:  // kFp32
      std::memcpy(out, x, static_cast<size_t>(4 * D));
      return Status::Ok();
  }
}

}  // namespace

const char* quant_weight_type_name(QuantWeightType t) {
  switch (t) {
    case QuantWeightType::kFp32: return "fp32";
    case QuantWeightType::kFp16: return "fp16";
    case QuantWeightType::kBf16: return "bf16";
    case QuantWeightType::kInt8: return "int8";
    case QuantWeightType::kInt4: return "int4";
    case QuantWeightType::kInt2: return "int2";
    case QuantWeightType::kFp8E4M3: return "fp8e4m3";
    case QuantWeightType::kFp8E5M2: return "fp8e5m2";
  }
  return "unknown";
}

bool parse_quant_weight_type(const std::string& name, QuantWeightType* out) {
  return parse_spelling(kQuantTypeSpellings, name, out);
}

std::vector<std::string> quant_weight_type_spellings() { return spellings(kQuantTypeSpellings); }

int quant_row_header_bytes(QuantWeightType t) {
  return tbe_quant::int_bits(t) > 0 || t == QuantWeightType::kFp8E4M3 || t == QuantWeightType::kFp8E5M2 ? 4 : 0;
}

Status quant_row_bytes(QuantWeightType type, int dim, int row_alignment, int64_t* bytes) {
  if (bytes == nullptr) return invalid_argument("bytes: must not be null");
  if (!valid_type(type)) return invalid_argument("type: unknown weight type " + s(static_cast<int>(type)));
  if (dim < 1) return invalid_argument("dim: " + s(dim) + "; the dimension must be >= 1");
  if (!power_of_two_in(row_alignment, 256))
    return invalid_argument("row_alignment: " + s(row_alignment) + " is not a power of two from 1 to 256");
  *bytes = round_up(quant_row_header_bytes(type) + data_bytes(type, dim), row_alignment);
  return Status::Ok();
}

Status QuantizedTableBatchedEmbedding::create(const Context& ctx, const QuantTbeConfig& cfg,
                                              std::unique_ptr<QuantizedTableBatchedEmbedding>* out) {
  if (out == nullptr) return invalid_argument("out: must not be null");
  out->reset();
  EMBSCALE_RETURN_IF_ERROR(check::context(ctx));
  if (cfg.tables.empty()) return invalid_argument("cfg.tables: no tables; at least one is required");
  if (cfg.tables.size() > static_cast<size_t>(INT_MAX)) return invalid_argument("cfg.tables: too many tables");
  if (!power_of_two_in(cfg.row_alignment, 256))
    return invalid_argument("cfg.row_alignment: " + s(cfg.row_alignment) + " is not a power of two from 1 to 256");
  if (!power_of_two_in(cfg.table_alignment, 4096))
    return invalid_argument("cfg.table_alignment: " + s(cfg.table_alignment) +
                            " is not a power of two from 1 to 4096");

  std::unique_ptr<QuantizedTableBatchedEmbedding> tbe(new QuantizedTableBatchedEmbedding());
  tbe->cfg_ = cfg;
  tbe->backend_ = ctx.backend;
  const int num_tables = static_cast<int>(cfg.tables.size());
  tbe->row_bytes_.assign(num_tables, 0);
  tbe->table_offsets_.assign(num_tables, 0);
  constexpr int64_t kMaxBytes = int64_t{1} << 62;
  int64_t end = 0;
  for (int t = 0; t < num_tables; ++t) {
    const QuantTableSpec& spec = cfg.tables[t];
    const std::string name = "cfg.tables[" + s(t) + "]";
    if (!valid_type(spec.type))
      return invalid_argument(name + ".type: unknown weight type " + s(static_cast<int>(spec.type)));
    if (spec.num_rows < 1)
      return invalid_argument(name + ".num_rows: " + s(spec.num_rows) + " rows; a table needs at least 1");
    if (spec.dim < 1) return invalid_argument(name + ".dim: " + s(spec.dim) + "; the dimension must be >= 1");
    int64_t rb = 0;
    EMBSCALE_RETURN_IF_ERROR(quant_row_bytes(spec.type, spec.dim, cfg.row_alignment, &rb));
    const int64_t start = round_up(end, cfg.table_alignment);
    if (spec.num_rows > kMaxBytes / rb || start > kMaxBytes - spec.num_rows * rb)
      return invalid_argument(name + ": the tables up to this one exceed 2^62 bytes");
    tbe->row_bytes_[t] = rb;
    tbe->table_offsets_[t] = start;
    end = start + spec.num_rows * rb;
  }
  tbe->total_bytes_ = end;

  EMBSCALE_RETURN_IF_ERROR(tbe_validate::resolve_features(
      cfg.feature_table_map, num_tables, [&](int t) { return cfg.tables[t].dim; }, &tbe->feature_table_,
      &tbe->output_offsets_, &tbe->max_dim_));
  *out = std::move(tbe);
  return Status::Ok();
}

Status QuantizedTableBatchedEmbedding::forward(const Context& ctx, const QuantTbeForwardArgs& args) const {
  if (ctx.backend != backend_)
    return invalid_argument(std::string("ctx: backend ") + backend_name(ctx.backend) +
                            " differs from the backend this QuantizedTableBatchedEmbedding was created on (" +
                            backend_name(backend_) + ")");
  EMBSCALE_RETURN_IF_ERROR(check::context(ctx));
  const tbe_validate::LookupArgs lookup{nullptr,        &args.indices, &args.offsets, &args.per_sample_weights,
                                        args.batch_size, args.pooling, args.bounds_check};
  const int64_t T = num_features();
  EMBSCALE_RETURN_IF_ERROR(tbe_validate::check_modes_and_batch(T, lookup));
  if (args.weights_bytes != total_bytes_)
    return invalid_argument("weights_bytes: " + s(args.weights_bytes) + "; expected total_bytes() = " + s(total_bytes_));
  if (args.weights == nullptr) return invalid_argument("weights: null; the packed tables are required");
  EMBSCALE_RETURN_IF_ERROR(tbe_validate::check_indices_offsets(T, lookup));
  const int64_t B = args.batch_size;
  const int64_t N = args.indices.numel();

  EMBSCALE_RETURN_IF_ERROR(tbe_validate::check_output("output", args.output, *this, args.pooling, B, N));

  using check::region;
  EMBSCALE_RETURN_IF_ERROR(check::disjoint(
      {region("output", args.output), check::scalar("num_skipped", args.num_skipped)},
      {check::Region{"weights", args.weights, static_cast<size_t>(args.weights_bytes)}, region("indices", args.indices),
       region("offsets", args.offsets), region("per_sample_weights", args.per_sample_weights)}));

  if (ctx.backend == Backend::kCpu) return cpu::tbe_quant_forward(ctx, *this, args);
  return unsupported("ctx: the quantized TBE forward has no CUDA kernel yet; run it on the CPU backend "
                     "(docs/tbe_quant.md)");
}

Status quantize_rows(QuantWeightType type, const TensorView& rows, int row_alignment, void* out, int64_t out_bytes) {
  if (!valid_type(type)) return invalid_argument("type: unknown weight type " + s(static_cast<int>(type)));
  EMBSCALE_RETURN_IF_ERROR(check_rows("rows", rows));
  const int64_t E = rows.shape[0], D = rows.shape[1];
  int64_t rb = 0;
  EMBSCALE_RETURN_IF_ERROR(quant_row_bytes(type, static_cast<int>(D), row_alignment, &rb));
  EMBSCALE_RETURN_IF_ERROR(check_packed("out", out, out_bytes, E, rb));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint({check::Region{"out", out, static_cast<size_t>(out_bytes)}},
                                           {check::region("rows", rows)}));
  const float* x = static_cast<const float*>(rows.data);
  // Every check before the first byte is written: a refused call changes nothing.
  for (int64_t r = 0; r < E; ++r) {
    for (int64_t c = 0; c < D; ++c)
      if (!is_finite_f(x[r * D + c]))
        return invalid_argument("rows: row " + s(r) + ", column " + s(c) + " is not finite (" +
                                std::to_string(x[r * D + c]) + ")");
    EMBSCALE_RETURN_IF_ERROR(quantize_row(type, x + r * D, D, r, nullptr, false));
  }
  auto* bytes = static_cast<uint8_t*>(out);
  if (out_bytes > 0) std::memset(bytes, 0, static_cast<size_t>(out_bytes));
  for (int64_t r = 0; r < E; ++r) EMBSCALE_RETURN_IF_ERROR(quantize_row(type, x + r * D, D, r, bytes + r * rb, true));
  return Status::Ok();
}

Status dequantize_rows(QuantWeightType type, const void* in, int64_t in_bytes, int row_alignment,
                       const TensorView& rows) {
  if (!valid_type(type)) return invalid_argument("type: unknown weight type " + s(static_cast<int>(type)));
  EMBSCALE_RETURN_IF_ERROR(check_rows("rows", rows));
  const int64_t E = rows.shape[0], D = rows.shape[1];
  int64_t rb = 0;
  EMBSCALE_RETURN_IF_ERROR(quant_row_bytes(type, static_cast<int>(D), row_alignment, &rb));
  EMBSCALE_RETURN_IF_ERROR(check_packed("in", in, in_bytes, E, rb));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint({check::region("rows", rows)},
                                           {check::Region{"in", in, static_cast<size_t>(in_bytes)}}));
  float* x = static_cast<float*>(rows.data);
  const auto* bytes = static_cast<const uint8_t*>(in);
  for (int64_t r = 0; r < E; ++r)
    tbe_quant::visit_row(type, bytes + r * rb, D, [&](int64_t c, float v) { x[r * D + c] = v; });
  return Status::Ok();
}

}  // namespace embscale
