// Quantized table-batched embeddings, API layer: weight type names, the row and table layout,
// QuantizedTableBatchedEmbedding::create (config validation; on CUDA one allocation for DeviceMeta),
// forward()'s host-side checks before the backend (tbe/tbe_quant_backend.h), and the quantizing helpers (the
// host one, and the CUDA one's protocol: check on the device, read the verdict back, then write). Layout and
// rounding rules: embscale/tbe_quant.h.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cuda_runtime.h"
#include "core/known_pointers.h"
#include "core/numerics.h"
#include "core/spelling.h"
#include "core/scaling.h"
#include "core/workspace.h"
#include "embscale/memory.h"
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

// Why row r of [E, D] fp32 values x cannot be quantized to `type`, or Ok: the first non-finite column, then
// (int rows) a min or scale that overflows fp16. Both backends' quantize_rows refuse a call with this message
// (the CUDA one finds the row on the device and words it here from a copy of the row).
Status check_row(QuantWeightType type, const float* x, int64_t D, int64_t r) {
  for (int64_t c = 0; c < D; ++c)
    if (!is_finite_f(x[c]))
      return invalid_argument("rows: row " + s(r) + ", column " + s(c) + " is not finite (" + std::to_string(x[c]) + ")");
  const int bits = tbe_quant::int_bits(type);
  if (bits == 0) return Status::Ok();
  float mn = x[0], mx = x[0];
  for (int64_t c = 1; c < D; ++c) {
    mn = std::min(mn, x[c]);
    mx = std::max(mx, x[c]);
  }
  if (!tbe_quant::int_row_scale(mn, mx, bits).fits)
    return invalid_argument("rows: row " + s(r) + ": its minimum " + std::to_string(mn) +
                            " or its range does not fit the fp16 bias and scale of an " + quant_weight_type_name(type) +
                            " row");
  return Status::Ok();
}

// One checked row of the quantizing helper (the rules: tbe_quant.h) into `out`, which is zeroed.
void quantize_row(QuantWeightType type, const float* x, int64_t D, uint8_t* out) {
  const int bits = tbe_quant::int_bits(type);
  if (bits > 0) {
    float mn = x[0], mx = x[0];
    for (int64_t c = 1; c < D; ++c) {
      mn = std::min(mn, x[c]);
      mx = std::max(mx, x[c]);
    }
    const tbe_quant::IntRowScale q = tbe_quant::int_row_scale(mn, mx, bits);
    std::memcpy(out, &q.scale_h, 2);
    std::memcpy(out + 2, &q.bias_h, 2);
    uint8_t* data = out + 4;
    const int per_byte = 8 / bits;
    for (int64_t c = 0; c < D; ++c)
      data[c / per_byte] = static_cast<uint8_t>(data[c / per_byte] |
                                                (tbe_quant::int_code_of(x[c], q, bits) << ((c % per_byte) * bits)));
    return;
  }
  switch (type) {
    case QuantWeightType::kFp8E4M3:
    case QuantWeightType::kFp8E5M2: {
      const bool e4m3 = type == QuantWeightType::kFp8E4M3;
      float amax = 0.0f;
      for (int64_t c = 0; c < D; ++c) amax = std::max(amax, std::fabs(x[c]));
      const float scale = scale_from_amax_rule(amax, e4m3 ? kFp8E4M3Max : kFp8E5M2Max, 0.0f, false);
      const float scale_inv = scale_inv_from_scale(scale);
      std::memcpy(out, &scale_inv, 4);
      for (int64_t c = 0; c < D; ++c) out[4 + c] = e4m3 ? float_to_e4m3(x[c] * scale) : float_to_e5m2(x[c] * scale);
      return;
    }
    case QuantWeightType::kFp16:
    case QuantWeightType::kBf16:
      for (int64_t c = 0; c < D; ++c) {
        const uint16_t h = type == QuantWeightType::kFp16 ? float_to_fp16(x[c]) : float_to_bf16(x[c]);
        std::memcpy(out + 2 * c, &h, 2);
      }
      return;
    default:  // kFp32
      std::memcpy(out, x, static_cast<size_t>(4 * D));
      return;
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
  return tbe_quant::header_bytes(t);
}

Status quant_row_bytes(QuantWeightType type, int dim, int row_alignment, int64_t* bytes) {
  if (bytes == nullptr) return invalid_argument("bytes: must not be null");
  if (!valid_type(type)) return invalid_argument("type: unknown weight type " + s(static_cast<int>(type)));
  if (dim < 1) return invalid_argument("dim: " + s(dim) + "; the dimension must be >= 1");
  if (!power_of_two_in(row_alignment, 256))
    return invalid_argument("row_alignment: " + s(row_alignment) + " is not a power of two from 1 to 256");
  *bytes = round_up(quant_row_header_bytes(type) + tbe_quant::data_bytes(type, dim), row_alignment);
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
  tbe->known_pointers_.reset(new detail::KnownPointers());
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
  if (ctx.backend == Backend::kCuda) EMBSCALE_RETURN_IF_ERROR(tbe->upload_meta(ctx));
  *out = std::move(tbe);
  return Status::Ok();
}

namespace {

// The single CUDA allocation behind DeviceMeta: [scratch | table_offsets | num_rows | row_bytes] as int64,
// then [dims | types | output_offsets] as int32, so every array is naturally aligned.
struct QuantMetaLayout {
  size_t scratch = 0, table_offsets = 0, num_rows = 0, row_bytes = 0, dims = 0, types = 0, output_offsets = 0,
         bytes = 0;
  explicit QuantMetaLayout(size_t T) {
    table_offsets = scratch + sizeof(int64_t) * QuantizedTableBatchedEmbedding::kScratchWords;
    num_rows = table_offsets + sizeof(int64_t) * T;
    row_bytes = num_rows + sizeof(int64_t) * T;
    dims = row_bytes + sizeof(int64_t) * T;
    types = dims + sizeof(int32_t) * T;
    output_offsets = types + sizeof(int32_t) * T;
    bytes = output_offsets + sizeof(int32_t) * (T + 1);
  }
};

}  // namespace

Status QuantizedTableBatchedEmbedding::upload_meta(const Context& ctx) {
  const int T = num_features();
  const QuantMetaLayout L(static_cast<size_t>(T));
  std::vector<unsigned char> host(L.bytes, 0);
  auto* t_off = reinterpret_cast<int64_t*>(host.data() + L.table_offsets);
  auto* rows = reinterpret_cast<int64_t*>(host.data() + L.num_rows);
  auto* rbytes = reinterpret_cast<int64_t*>(host.data() + L.row_bytes);
  auto* dims = reinterpret_cast<int32_t*>(host.data() + L.dims);
  auto* types = reinterpret_cast<int32_t*>(host.data() + L.types);
  auto* o_off = reinterpret_cast<int32_t*>(host.data() + L.output_offsets);
  for (int f = 0; f < T; ++f) {
    const int t = feature_table_[f];
    t_off[f] = table_offsets_[t];
    rows[f] = cfg_.tables[t].num_rows;
    rbytes[f] = row_bytes_[t];
    dims[f] = cfg_.tables[t].dim;
    types[f] = static_cast<int32_t>(cfg_.tables[t].type);
  }
  for (int f = 0; f <= T; ++f) o_off[f] = output_offsets_[f];
  void* storage = nullptr;
  EMBSCALE_RETURN_IF_ERROR(backend_malloc(ctx.backend, L.bytes, &storage));
  const Status st = copy_to_backend(ctx, storage, host.data(), L.bytes);
  if (!st.ok()) {
    backend_free(ctx.backend, storage);
    return st;
  }
  meta_storage_ = storage;
  auto* base = static_cast<unsigned char*>(storage);
  meta_.scratch = reinterpret_cast<int64_t*>(base + L.scratch);
  meta_.table_offsets = reinterpret_cast<const int64_t*>(base + L.table_offsets);
  meta_.num_rows = reinterpret_cast<const int64_t*>(base + L.num_rows);
  meta_.row_bytes = reinterpret_cast<const int64_t*>(base + L.row_bytes);
  meta_.dims = reinterpret_cast<const int32_t*>(base + L.dims);
  meta_.types = reinterpret_cast<const int32_t*>(base + L.types);
  meta_.output_offsets = reinterpret_cast<const int32_t*>(base + L.output_offsets);
  return Status::Ok();
}

QuantizedTableBatchedEmbedding::~QuantizedTableBatchedEmbedding() { backend_free(backend_, meta_storage_); }

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
  const struct { const char* name; const void* p; } memory[] = {
      {"weights", args.weights}, {"indices", args.indices.data}, {"offsets", args.offsets.data},
      {"per_sample_weights", args.per_sample_weights.data}, {"output", args.output.data},
      {"num_skipped", args.num_skipped}};
  for (const auto& m : memory) EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, m.name, m.p, known_pointers_.get()));

  if (ctx.backend == Backend::kCpu) return cpu::tbe_quant_forward(ctx, *this, args);
#if EMBSCALE_WITH_CUDA
  return cuda::tbe_quant_forward(ctx, *this, args);
#else
  return unsupported("ctx: this build of embscale has no CUDA backend");
#endif
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
  for (int64_t r = 0; r < E; ++r) EMBSCALE_RETURN_IF_ERROR(check_row(type, x + r * D, D, r));
  auto* bytes = static_cast<uint8_t*>(out);
  if (out_bytes > 0) std::memset(bytes, 0, static_cast<size_t>(out_bytes));
  for (int64_t r = 0; r < E; ++r) quantize_row(type, x + r * D, D, bytes + r * rb);
  return Status::Ok();
}

namespace {

// The checks common to both forms of quantize_rows: the type, rows, the row size; *rb is the row's bytes.
Status check_quantize_args(QuantWeightType type, const TensorView& rows, int row_alignment, int64_t* rb) {
  if (!valid_type(type)) return invalid_argument("type: unknown weight type " + s(static_cast<int>(type)));
  EMBSCALE_RETURN_IF_ERROR(check_rows("rows", rows));
  return quant_row_bytes(type, static_cast<int>(rows.shape[1]), row_alignment, rb);
}

// The CUDA quantizer's workspace: one int64, the verdict of the row check (tbe/tbe_quant_backend.h).
WorkspaceLayout quantize_workspace(const Context& ctx, const TensorView& rows) {
  WorkspaceLayout layout(WorkspaceLayout::Base::kAsGiven);
  layout.add(ctx.backend == Backend::kCuda && rows.shape[0] > 0 ? sizeof(int64_t) : 0);
  return layout;
}

}  // namespace

Status quantize_rows_workspace_size(const Context& ctx, QuantWeightType type, const TensorView& rows,
                                    int row_alignment, size_t* bytes) {
  if (bytes == nullptr) return invalid_argument("bytes: must not be null");
  EMBSCALE_RETURN_IF_ERROR(check::context(ctx));
  int64_t rb = 0;
  EMBSCALE_RETURN_IF_ERROR(check_quantize_args(type, rows, row_alignment, &rb));
  *bytes = quantize_workspace(ctx, rows).size();
  return Status::Ok();
}

Status quantize_rows(const Context& ctx, QuantWeightType type, const TensorView& rows, int row_alignment, void* out,
                     int64_t out_bytes, void* workspace, size_t workspace_bytes) {
  EMBSCALE_RETURN_IF_ERROR(check::context(ctx));
  if (ctx.backend == Backend::kCpu) {
    EMBSCALE_RETURN_IF_ERROR(check_workspace(ctx, workspace, workspace_bytes, 0, "quantize_rows_workspace_size"));
    return quantize_rows(type, rows, row_alignment, out, out_bytes);
  }
  int64_t rb = 0;
  EMBSCALE_RETURN_IF_ERROR(check_quantize_args(type, rows, row_alignment, &rb));
  const int64_t E = rows.shape[0], D = rows.shape[1];
  EMBSCALE_RETURN_IF_ERROR(check_packed("out", out, out_bytes, E, rb));
  const WorkspaceLayout layout = quantize_workspace(ctx, rows);
  EMBSCALE_RETURN_IF_ERROR(layout.check(ctx, workspace, workspace_bytes, "quantize_rows_workspace_size"));
  EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, "rows", rows.data));
  EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, "out", out));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint({check::Region{"out", out, static_cast<size_t>(out_bytes)}},
                                           {check::region("rows", rows)}));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint({check::Region{"workspace", workspace, layout.size()}},
                                           {check::Region{"out", out, static_cast<size_t>(out_bytes)},
                                            check::region("rows", rows)}));
  if (E == 0) return Status::Ok();
#if EMBSCALE_WITH_CUDA
  // The verdict first (a refused call writes nothing to out), then the rows.
  int64_t* verdict = layout.at<int64_t>(workspace, WorkspaceSlice{0, sizeof(int64_t)});
  EMBSCALE_RETURN_IF_ERROR(cuda::memset_async(verdict, 0, sizeof(int64_t), ctx.stream));
  EMBSCALE_RETURN_IF_ERROR(cuda::quantize_rows_check(ctx, type, rows, verdict));
  int64_t key = 0;
  EMBSCALE_RETURN_IF_ERROR(cuda::memcpy_sync(&key, verdict, sizeof(key), ctx.stream));
  if (key != 0) {
    // ~key = r * (D + 1) + c: the first refused row r; its message is the host check's, on a copy of the row.
    const int64_t r = static_cast<int64_t>(~static_cast<uint64_t>(key)) / (D + 1);
    std::vector<float> row(static_cast<size_t>(D));
    EMBSCALE_RETURN_IF_ERROR(cuda::memcpy_sync(row.data(), static_cast<const float*>(rows.data) + r * D,
                                               sizeof(float) * static_cast<size_t>(D), ctx.stream));
    const Status st = check_row(type, row.data(), D, r);
    if (!st.ok()) return st;
    return Status(StatusCode::kBackendError, "rows: the device refused row " + s(r) + ", which the host check takes");
  }
  EMBSCALE_RETURN_IF_ERROR(cuda::memset_async(out, 0, static_cast<size_t>(out_bytes), ctx.stream));
  return cuda::quantize_rows_write(ctx, type, rows, rb, out);
#else
  (void)D;
  return unsupported("ctx: this build of embscale has no CUDA backend");
#endif
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
