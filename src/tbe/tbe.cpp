// Table-batched embeddings, API layer: names and parsers, TableBatchedEmbedding::create (config
// validation, the per-feature tables, one backend allocation for DeviceMeta) and forward()'s host-side
// argument checks before dispatching to a backend. Values that live in backend memory (offsets,
// indices) are checked by the backend according to args.bounds_check (tbe/tbe_backend.h).
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "core/known_pointers.h"
#include "core/spelling.h"
#include "tbe/tbe_backend.h"
#include "tbe/tbe_validate.h"
#include "embscale/memory.h"
#include "embscale/tbe.h"

namespace embscale {

namespace {

// The names, FBGEMM's PoolingMode names, then "sequence" for no pooling.
constexpr Spelling<PoolingMode> kPoolingSpellings[] = {
    {"sum", PoolingMode::kSum}, {"mean", PoolingMode::kMean}, {"none", PoolingMode::kNone},
    {"SUM", PoolingMode::kSum}, {"MEAN", PoolingMode::kMean}, {"NONE", PoolingMode::kNone},
    {"sequence", PoolingMode::kNone},
};

// The names, then FBGEMM's BoundsCheckMode names for the modes that do the same job.
constexpr Spelling<BoundsCheckMode> kBoundsCheckSpellings[] = {
    {"error", BoundsCheckMode::kError}, {"skip", BoundsCheckMode::kSkip},
    {"off", BoundsCheckMode::kOff},     {"warn", BoundsCheckMode::kWarn},
    {"FATAL", BoundsCheckMode::kError}, {"IGNORE", BoundsCheckMode::kSkip},
    {"NONE", BoundsCheckMode::kOff},    {"WARNING", BoundsCheckMode::kWarn},
};

}  // namespace

const char* pooling_mode_name(PoolingMode m) {
  switch (m) {
    case PoolingMode::kSum: return "sum";
    case PoolingMode::kMean: return "mean";
    case PoolingMode::kNone: return "none";
  }
  return "unknown";
}

bool parse_pooling_mode(const std::string& name, PoolingMode* out) {
  return parse_spelling(kPoolingSpellings, name, out);
}

std::vector<std::string> pooling_mode_spellings() { return spellings(kPoolingSpellings); }

const char* bounds_check_mode_name(BoundsCheckMode m) {
  switch (m) {
    case BoundsCheckMode::kError: return "error";
    case BoundsCheckMode::kSkip: return "skip";
    case BoundsCheckMode::kOff: return "off";
    case BoundsCheckMode::kWarn: return "warn";
  }
  return "unknown";
}

bool parse_bounds_check_mode(const std::string& name, BoundsCheckMode* out) {
  return parse_spelling(kBoundsCheckSpellings, name, out);
}

std::vector<std::string> bounds_check_mode_spellings() { return spellings(kBoundsCheckSpellings); }

namespace {

// Layout of the single backend allocation behind DeviceMeta. The int64 arrays come first so every
// array is naturally aligned: [scratch | weight_offsets | num_rows] as int64, then [dims |
// output_offsets] as int32.
struct MetaLayout {
  size_t scratch = 0, weight_offsets = 0, num_rows = 0, row_offsets = 0, dims = 0, output_offsets = 0, bytes = 0;
  explicit MetaLayout(size_t T) {
    scratch = 0;
    weight_offsets = scratch + sizeof(int64_t) * TableBatchedEmbedding::kScratchWords;
    num_rows = weight_offsets + sizeof(int64_t) * T;
    row_offsets = num_rows + sizeof(int64_t) * T;
    dims = row_offsets + sizeof(int64_t) * T;
    output_offsets = dims + sizeof(int32_t) * T;
    bytes = output_offsets + sizeof(int32_t) * (T + 1);
  }
};

}  // namespace

Status TableBatchedEmbedding::create(const Context& ctx, const TbeConfig& cfg,
                                     std::unique_ptr<TableBatchedEmbedding>* out) {
  if (out == nullptr) return invalid_argument("out: must not be null");
  out->reset();
  if (ctx.backend != Backend::kCpu && ctx.backend != Backend::kCuda)
    return invalid_argument("ctx: unknown backend");
  if (!backend_compiled(ctx.backend))
    return unsupported(std::string("ctx: backend ") + backend_name(ctx.backend) + " is not compiled into this build");
  if (cfg.tables.empty()) return invalid_argument("cfg.tables: no tables; at least one is required");
  if (cfg.tables.size() > static_cast<size_t>(INT_MAX)) return invalid_argument("cfg.tables: too many tables");
  if (!is_float_dtype(cfg.weights_dtype))
    return invalid_argument(std::string("cfg.weights_dtype: ") + dtype_name(cfg.weights_dtype) +
                            " is not supported; expected fp32, fp16 or bf16");

  const int num_tables = static_cast<int>(cfg.tables.size());
  std::unique_ptr<TableBatchedEmbedding> tbe(new TableBatchedEmbedding());
  tbe->cfg_ = cfg;
  tbe->backend_ = ctx.backend;
  tbe->known_pointers_.reset(new detail::KnownPointers());

  // Weight offsets in elements, 64-bit: E_t * D_t and their running sum are checked against
  // overflow so a buffer over 2^31 (or 2^32) elements is addressed correctly.
  tbe->weight_offsets_.assign(num_tables + 1, 0);
  tbe->row_offsets_.assign(num_tables + 1, 0);
  constexpr int64_t kMaxElements = int64_t{1} << 62;
  for (int t = 0; t < num_tables; ++t) {
    const TableSpec& s = cfg.tables[t];
    const std::string name = "cfg.tables[" + std::to_string(t) + "]";
    if (s.num_rows < 1)
      return invalid_argument(name + ".num_rows: " + std::to_string(s.num_rows) + " rows; a table needs at least 1");
    if (s.dim < 1) return invalid_argument(name + ".dim: " + std::to_string(s.dim) + "; the dimension must be >= 1");
    if (s.num_rows > kMaxElements / s.dim ||
        tbe->weight_offsets_[t] > kMaxElements - s.num_rows * static_cast<int64_t>(s.dim))
      return invalid_argument(name + ": the weights of the tables up to this one exceed 2^62 elements");
    tbe->weight_offsets_[t + 1] = tbe->weight_offsets_[t] + s.num_rows * static_cast<int64_t>(s.dim);
    tbe->row_offsets_[t + 1] = tbe->row_offsets_[t] + s.num_rows;  // <= weight_offsets_, so no overflow
  }

  // Features: the map, or one feature per table; their output columns.
  EMBSCALE_RETURN_IF_ERROR(tbe_validate::resolve_features(
      cfg.feature_table_map, num_tables, [&](int t) { return cfg.tables[t].dim; }, &tbe->feature_table_,
      &tbe->output_offsets_, &tbe->max_dim_));
  const int T = static_cast<int>(tbe->feature_table_.size());

  // DeviceMeta: per-feature arrays and the zeroed scratch words, uploaded in one copy.
  const MetaLayout L(static_cast<size_t>(T));
  std::vector<unsigned char> host(L.bytes, 0);
  auto* w_off = reinterpret_cast<int64_t*>(host.data() + L.weight_offsets);
  auto* rows = reinterpret_cast<int64_t*>(host.data() + L.num_rows);
  auto* r_off = reinterpret_cast<int64_t*>(host.data() + L.row_offsets);
  auto* dims = reinterpret_cast<int32_t*>(host.data() + L.dims);
  auto* o_off = reinterpret_cast<int32_t*>(host.data() + L.output_offsets);
  for (int f = 0; f < T; ++f) {
    const int t = tbe->feature_table_[f];
    w_off[f] = tbe->weight_offsets_[t];
    rows[f] = cfg.tables[t].num_rows;
    r_off[f] = tbe->row_offsets_[t];
    dims[f] = cfg.tables[t].dim;
  }
  for (int f = 0; f <= T; ++f) o_off[f] = tbe->output_offsets_[f];

  void* storage = nullptr;
  EMBSCALE_RETURN_IF_ERROR(backend_malloc(ctx.backend, L.bytes, &storage));
  const Status st = copy_to_backend(ctx, storage, host.data(), L.bytes);
  if (!st.ok()) {
    backend_free(ctx.backend, storage);
    return st;
  }
  tbe->meta_storage_ = storage;
  auto* base = static_cast<unsigned char*>(storage);
  tbe->meta_.scratch = reinterpret_cast<int64_t*>(base + L.scratch);
  tbe->meta_.weight_offsets = reinterpret_cast<const int64_t*>(base + L.weight_offsets);
  tbe->meta_.num_rows = reinterpret_cast<const int64_t*>(base + L.num_rows);
  tbe->meta_.row_offsets = reinterpret_cast<const int64_t*>(base + L.row_offsets);
  tbe->meta_.dims = reinterpret_cast<const int32_t*>(base + L.dims);
  tbe->meta_.output_offsets = reinterpret_cast<const int32_t*>(base + L.output_offsets);
  *out = std::move(tbe);
  return Status::Ok();
}

TableBatchedEmbedding::~TableBatchedEmbedding() { backend_free(backend_, meta_storage_); }

Status TableBatchedEmbedding::forward(const Context& ctx, const TbeForwardArgs& args) const {
  EMBSCALE_RETURN_IF_ERROR(tbe_validate::check_lookup_args(
      *this, ctx,
      {&args.weights, &args.indices, &args.offsets, &args.per_sample_weights, args.batch_size, args.pooling,
       args.bounds_check}));
  const int64_t B = args.batch_size;
  const int64_t N = args.indices.numel();

  EMBSCALE_RETURN_IF_ERROR(tbe_validate::check_output("output", args.output, *this, args.pooling, B, N));

  // The output and the skip count are written while the inputs are read: they share memory with nothing.
  using check::region;
  EMBSCALE_RETURN_IF_ERROR(check::disjoint(
      {region("output", args.output), check::scalar("num_skipped", args.num_skipped),
       check::scalar("num_skipped_host", args.num_skipped_host)},
      {region("weights", args.weights), region("indices", args.indices), region("offsets", args.offsets),
       region("per_sample_weights", args.per_sample_weights)}));
  const struct { const char* name; const TensorView* t; } inputs[] = {
      {"weights", &args.weights}, {"indices", &args.indices}, {"offsets", &args.offsets},
      {"per_sample_weights", &args.per_sample_weights}};
  detail::KnownPointers* known = known_pointers_.get();
  for (const auto& in : inputs) EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, in.name, in.t->data, known));
  EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, "output", args.output.data, known));
  EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, "num_skipped", args.num_skipped, known));
  EMBSCALE_RETURN_IF_ERROR(check::mapped_host_memory(ctx, "num_skipped_host", args.num_skipped_host, known));

  if (ctx.backend == Backend::kCpu) return cpu::tbe_forward(ctx, *this, args);
#if EMBSCALE_WITH_CUDA
  return cuda::tbe_forward(ctx, *this, args);
#else
  return unsupported("ctx: this build of embscale has no CUDA backend");
#endif
}

}  // namespace embscale
