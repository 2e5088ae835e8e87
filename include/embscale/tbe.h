// Table-batched embeddings (TBE): many embedding tables looked up in one call and pooled into bags.
//
// Layout (as FBGEMM's SplitTableBatchedEmbeddingBags):
//  * tables t = 0..num_tables-1, table t has E_t rows of dimension D_t (any D >= 1, mixed);
//  * the weights of all tables live in one caller-owned buffer, row-major, table t starting at
//    element weight_offset(t) (64-bit addressing: buffers over 2^31 elements work);
//  * T features, each looking up one table through feature_table_map (several features may share a
//    table); the output of feature f occupies columns [output_offset(f), output_offset(f) + D_f);
//  * lookups: indices [N] and offsets [T*B+1] (both int32 or both int64), table-major: bag (f, b) is
//    indices[offsets[f*B + b] : offsets[f*B + b + 1]]; optional per-sample weights [N] fp32.
//  * optional buffers (per-sample weights, optimizer state, dense-gradient outputs) are TensorViews
//    too, so their dtype and length are checked like every other argument; a view whose data is null
//    is absent (a default-constructed TensorView).
//
// A TableBatchedEmbedding is created once (it uploads a few small per-feature tables to the device:
// creation may allocate, ops never do). Its ops are asynchronous on ctx.stream and capturable in a
// CUDA graph unless stated otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "embscale/context.h"
#include "embscale/status.h"
#include "embscale/tensor.h"

namespace embscale {

namespace detail {
class KnownPointers;  // the buffers a handle's memory checks accepted (the library's, not part of the API)
}

enum class PoolingMode { kSum = 0, kMean, kNone };
constexpr int kNumPoolingModes = static_cast<int>(PoolingMode::kNone) + 1;  // values 0 .. count - 1
const char* pooling_mode_name(PoolingMode m);  // "sum", "mean", "none"
// Takes the names, FBGEMM's PoolingMode names (SUM, MEAN, NONE) and "sequence" (kNone), nothing else;
// pooling_mode_spellings() lists exactly those, for help texts and messages.
bool parse_pooling_mode(const std::string& name, PoolingMode* out);
std::vector<std::string> pooling_mode_spellings();

// What to do with an index outside [0, E_t):
//  kError: report an error Status naming feature, bag and position; outputs are unspecified, tables
//          are never written. On CUDA the check reads one small result back, so the op synchronises
//          the stream in this mode (use kSkip or kOff inside a captured graph).
//  kSkip:  the index is treated as absent (it adds nothing, and MEAN divides by the valid count); the
//          number skipped is written to `num_skipped` when given. On CUDA, outside a captured graph,
//          the op reads the device's report back at the end (broken offsets are an error Status).
//  kWarn:  as kSkip, but the op never waits for the device: `num_skipped` (backend memory) receives the
//          number skipped, or -1 when the offsets are broken (their bags are then clamped and the
//          backward writes no row), and the caller reads it when it likes (the Python module warns
//          at a later call, reading the copy the device stores to num_skipped_host; FBGEMM's WARNING
//          mode warns too, but maps a bad index to row 0 rather than dropping it). No error Status is
//          returned for bad indices or offsets on CUDA; on the CPU, where nothing is waited for, broken
//          offsets are an error as in every mode.
//  kOff:   nothing is checked or reported (fastest); the caller guarantees valid indices. On the CPU
//          an index outside its table is still dropped (never read), and the backward on either
//          backend clamps it into its table (an unspecified row may be updated, never memory outside
//          the tables). The CUDA forward trusts the indices, as FBGEMM does: an invalid one there is
//          undefined behaviour.
// Offsets that decrease (a negative first offset included), or a last offset that differs from the
// number of indices, are an error in kError and kSkip modes, and in every mode on the CPU (where the
// check costs nothing next to the gathers). In kOff mode on CUDA they are not reported (that would need
// a read-back) but each bag is clamped into [0, N], so no bag reads outside the indices; an index that
// broken offsets move into another table's bag is then as undefined as any bad index in kOff mode. In
// sequence mode (kNone) a skipped lookup's output row is zeros.
enum class BoundsCheckMode { kError = 0, kSkip, kOff, kWarn };
constexpr int kNumBoundsCheckModes = static_cast<int>(BoundsCheckMode::kWarn) + 1;  // values 0 .. count - 1
// "error", "skip", "off", "warn". parse_bounds_check_mode takes these and FBGEMM's BoundsCheckMode names
// (FATAL, IGNORE, NONE, WARNING) for the nearest mode (FBGEMM's IGNORE and WARNING map a bad index to row 0,
// where kSkip and kWarn drop it), as the Python package does, nothing else; bounds_check_mode_spellings()
// lists exactly those, for help texts and messages.
const char* bounds_check_mode_name(BoundsCheckMode m);
bool parse_bounds_check_mode(const std::string& name, BoundsCheckMode* out);
std::vector<std::string> bounds_check_mode_spellings();

struct TableSpec {
  int64_t num_rows = 0;  // E_t >= 1
  int dim = 0;           // D_t >= 1
};

struct TbeConfig {
  std::vector<TableSpec> tables;
  std::vector<int> feature_table_map;  // [T] table of each feature; empty = one feature per table
  DType weights_dtype = DType::kF32;   // fp32, fp16 or bf16
};

struct TbeForwardArgs {
  TensorView weights;                        // [num_weights()] of weights_dtype
  TensorView indices;                        // [N] int32 or int64
  TensorView offsets;                        // [T*B+1], the dtype of indices
  TensorView per_sample_weights;             // optional [N] fp32 (data null: unweighted); SUM or kNone
                                             // only: with MEAN an invalid_argument (as FBGEMM)
  int64_t batch_size = 0;                    // B
  PoolingMode pooling = PoolingMode::kSum;
  BoundsCheckMode bounds_check = BoundsCheckMode::kError;
  // Pooled: [B, total_dim()] fp32/fp16/bf16. kNone (sequence embeddings): [N, D], all features of one
  // dimension D; row i is the (weighted) row looked up by indices[i].
  TensorView output;
  int64_t* num_skipped = nullptr;            // optional (backend memory): invalid indices skipped (kSkip, kWarn)
  // Optional, kSkip and kWarn: host memory that also receives *num_skipped, written by the device itself on
  // CUDA (pinned memory mapped at the same address, as cudaHostAlloc's under unified addressing), so a
  // caller can poll it from the host without an event or a copy on the stream (the Python module's warn
  // mode: a sentinel stored before the call turns into the count once the device has written it). On CUDA
  // in kSkip mode, broken offsets leave -1 there, as in *num_skipped, before the call returns its error.
  int64_t* num_skipped_host = nullptr;
};


// ---- backward fused with the optimizer -------------------------------------------------------------
// The gradient never materialises as a dense tensor: lookups are linearised into (table row) keys,
// radix-sorted on the key's significant bits, run-length encoded into unique rows, each unique row's
// gradient is summed in fp32 in a fixed order (sorted lookup order), and the optimizer updates that row
// in place exactly once. Optimizer state is fp32, caller-owned, laid out per table:
//   row-wise state ([total_rows()] floats): row r of table t at row_offset(t) + r;
//   element-wise state ([num_weights()] floats): the weights' layout (weight_offset(t) + r*D_t + d).
enum class OptimizerType {
  kNone = 0,           // dense-gradient mode: unique rows and their summed gradients, no update
  kSgd,                // exact SGD: w -= lr * g
  kRowwiseAdagrad,     // FBGEMM's exact row-wise Adagrad (momentum1: row-wise)
  kAdam,               // Adam with bias correction and decoupled weight decay, FBGEMM's ADAM (momentum1,
                       // momentum2: element-wise)
  kPartialRowwiseAdam, // Adam with a row-wise second moment (momentum1 element-wise, momentum2 row-wise),
                       // FBGEMM's PARTIAL_ROWWISE_ADAM
  kAdagrad,            // element-wise Adagrad, FBGEMM's EXACT_ADAGRAD (momentum1: element-wise)
  kLamb,               // LAMB: Adam's step scaled per row by ||w|| / ||step||, FBGEMM's LAMB (momentum1,
                       // momentum2: element-wise)
  kPartialRowwiseLamb, // LAMB with a row-wise second moment, FBGEMM's PARTIAL_ROWWISE_LAMB (momentum1
                       // element-wise, momentum2 row-wise)
  kLarsSgd             // SGD with momentum and a per-row learning rate from ||w|| / ||g|| (LARS), FBGEMM's
                       // LARS_SGD (momentum1: element-wise)
};
// "none", "sgd", "rowwise_adagrad", "adam", "partial_rowwise_adam", "adagrad", "lamb", "partial_rowwise_lamb",
// "lars_sgd"
const char* optimizer_name(OptimizerType o);
bool parse_optimizer(const std::string& name, OptimizerType* out);

// The state buffers an optimizer keeps (TbeBackwardArgs::momentum1/momentum2), for bindings that size
// and name them: where each buffer's elements are, and the name the Python package gives it.
enum class OptimizerStateLayout { kAbsent = 0, kRowwise = 1, kElementwise = 2 };  // [total_rows()] / [num_weights()]
struct OptimizerStateInfo {
  OptimizerStateLayout layout = OptimizerStateLayout::kAbsent;
  const char* name = "";  // "sum", "exp_avg", "exp_avg_sq", "momentum_buffer"; "" when absent
};
// How an optimizer applies OptimizerParams::weight_decay (FBGEMM's rules): not at all (kNone: weight_decay
// must be 0 or weight_decay_mode kNone; SGD, Adagrad), as weight_decay_mode says (kByMode: L2, decoupled,
// or ignored in mode kNone; row-wise Adagrad), or by the optimizer's own decoupled rule whenever
// weight_decay != 0, whatever weight_decay_mode says (kDecoupled: Adam, partial row-wise Adam, LAMB,
// partial row-wise LAMB and LARS-SGD, as FBGEMM's, whose kernels take no mode).
enum class OptimizerWeightDecay { kNone = 0, kByMode = 1, kDecoupled = 2 };
struct OptimizerInfo {
  const char* name = "";  // optimizer_name()
  OptimizerStateInfo momentum1, momentum2;
  OptimizerWeightDecay weight_decay = OptimizerWeightDecay::kNone;
};
int num_optimizers();  // OptimizerType's values are 0 .. num_optimizers() - 1
// invalid_argument naming `optimizer` for a value outside the enum.
Status optimizer_info(OptimizerType optimizer, OptimizerInfo* out);

enum class WeightDecayMode { kNone = 0, kL2, kDecoupled };
constexpr int kNumWeightDecayModes = static_cast<int>(WeightDecayMode::kDecoupled) + 1;  // values 0 .. count - 1

struct OptimizerParams {
  OptimizerType type = OptimizerType::kRowwiseAdagrad;
  float learning_rate = 0.01f;  // may change between steps
  float eps = 1e-8f;
  float beta1 = 0.9f;           // Adam and LAMB variants
  float beta2 = 0.999f;
  float weight_decay = 0.0f;   // applied as OptimizerInfo::weight_decay says (Adam: decoupled, any mode)
  WeightDecayMode weight_decay_mode = WeightDecayMode::kNone;  // read by row-wise Adagrad only
  float max_norm = 0.0f;        // > 0: after the update, rescale a row whose L2 norm exceeds it (row-wise Adagrad)
  float gradient_clipping = 0.0f;  // > 0: clip each summed gradient element to [-c, c] before the update
  int64_t step = 1;             // 1-based step counter for Adam's bias correction; may change between steps
  float eta = 0.001f;           // LARS-SGD: the trust coefficient of its per-row learning rate (FBGEMM's eta)
  float momentum = 0.9f;        // LARS-SGD: the momentum of its velocity (FBGEMM's momentum)
};

// The checks backward() makes of its optimizer argument (the type and mode known, the hyper-parameters
// finite and in range, options the optimizer does not have left unset), for code that holds
// hyper-parameters between steps and wants a bad value refused when it is set rather than at the next
// backward. invalid_argument naming the field (optimizer.learning_rate, ...).
Status check_optimizer_params(const OptimizerParams& params);

// fp16/bf16 weights: how an updated fp32 value is rounded back to the weights' dtype.
enum class WeightRounding { kNearest = 0, kStochastic };
constexpr int kNumWeightRoundings = static_cast<int>(WeightRounding::kStochastic) + 1;  // values 0 .. count - 1

// Tunables of the segment strategy (0 = the per-device default chosen by measurement).
struct TbeBackwardTuning {
  // The CUDA backend's default max_block_segment (H200 sweeps, docs/tbe_backward_cuda.md).
  static constexpr int kDefaultMaxBlockSegment = 512;
  int max_warp_segment = 0;   // segments up to this many lookups: a warp per row
  int max_block_segment = 0;  // longer segments up to this: a thread block per row; beyond: split across blocks
  int block_threads = 0;      // threads per block of the block-per-row path
};

struct TbeBackwardArgs {
  TensorView weights;                         // [num_weights()] updated in place (not in kNone mode)
  TensorView indices;                         // [N] int32 or int64, as in the forward
  TensorView offsets;                         // [T*B+1]
  TensorView per_sample_weights;              // optional [N] fp32, as in the forward
  int64_t batch_size = 0;
  PoolingMode pooling = PoolingMode::kSum;
  BoundsCheckMode bounds_check = BoundsCheckMode::kError;
  TensorView grad_output;                     // pooled: [B, total_dim()]; kNone: [N, D]; fp32/fp16/bf16
  OptimizerParams optimizer;
  // Optimizer state (see above), fp32, updated in place: exactly those the optimizer keeps are given,
  // row-wise ones of total_rows() elements, element-wise ones of num_weights() elements.
  TensorView momentum1;
  TensorView momentum2;
  TensorView grad_per_sample_weights;         // optional [N] fp32: dot(weight row before the update, grad of its bag)
  // Dense-gradient mode (optimizer.type == kNone): unique linearised rows (row_offset(t) + r, ascending),
  // their count, and their summed fp32 gradients (row u uses its table's D columns).
  TensorView unique_rows;                     // [N] int64
  int64_t* num_unique = nullptr;              // [1]
  TensorView unique_grads;                    // [N * max_dim()] fp32 (any shape of that many elements)
  WeightRounding rounding = WeightRounding::kStochastic;
  uint64_t seed = 0;                          // stochastic rounding: same seed and step -> same result
  // Optional [total_rows()] int64: per row, the element index stochastic rounding hashes for its first
  // weight (absent: the row's own, weight_offset(t) + r * D_t). A RowCache (tbe_cache.h) gives its rows'
  // places in the tables they cache, so a row rounds the same through the cache as in place.
  TensorView rounding_bases;
  TbeBackwardTuning tuning;
  int64_t* num_skipped = nullptr;             // as in the forward
};

class TableBatchedEmbedding {
 public:
  static Status create(const Context& ctx, const TbeConfig& cfg, std::unique_ptr<TableBatchedEmbedding>* out);
  ~TableBatchedEmbedding();
  TableBatchedEmbedding(const TableBatchedEmbedding&) = delete;
  TableBatchedEmbedding& operator=(const TableBatchedEmbedding&) = delete;

  const TbeConfig& config() const { return cfg_; }
  Backend backend() const { return backend_; }
  int num_tables() const { return static_cast<int>(cfg_.tables.size()); }
  int num_features() const { return static_cast<int>(feature_table_.size()); }
  int feature_table(int f) const { return feature_table_[f]; }
  int feature_dim(int f) const { return cfg_.tables[feature_table_[f]].dim; }
  int64_t weight_offset(int table) const { return weight_offsets_[table]; }  // elements
  int64_t num_weights() const { return weight_offsets_.back(); }              // elements in the buffer
  int output_offset(int feature) const { return output_offsets_[feature]; }  // column of feature
  int total_dim() const { return output_offsets_.back(); }                    // sum over features of D
  int max_dim() const { return max_dim_; }

  // Pooled or sequence lookup (see TbeForwardArgs).
  Status forward(const Context& ctx, const TbeForwardArgs& args) const;

  // Backward fused with the optimizer (see TbeBackwardArgs). The workspace holds the sort and encode
  // scratch; its size depends on the number of lookups N, the batch size and the arguments' modes.
  Status backward_workspace_size(const Context& ctx, const TbeBackwardArgs& args, size_t* bytes) const;
  Status backward(const Context& ctx, const TbeBackwardArgs& args, void* workspace, size_t workspace_bytes) const;

  int64_t row_offset(int table) const { return row_offsets_[table]; }  // first row of table in row-wise state
  int64_t total_rows() const { return row_offsets_.back(); }           // rows of all tables

  // Per-feature tables in the backend's memory, for the backend implementations.
  struct DeviceMeta {
    const int64_t* weight_offsets = nullptr;  // [T] element offset of each feature's table
    const int64_t* num_rows = nullptr;        // [T] E of each feature's table
    const int32_t* dims = nullptr;            // [T] D of each feature
    const int32_t* output_offsets = nullptr;  // [T+1] output column of each feature
    const int64_t* row_offsets = nullptr;     // [T] first linearised row of each feature's table
    // kScratchWords int64 of backend memory owned by this object, zeroed at creation: a backend keeps
    // its bounds-check error record and skip counter here (ops on one object must not run
    // concurrently on different streams in kError/kSkip/kWarn mode).
    int64_t* scratch = nullptr;
  };
  static constexpr int kScratchWords = 8;
  const DeviceMeta& device_meta() const { return meta_; }
  // The buffers this object's calls have found in memory the backend can use, for the argument checks:
  // each is asked about once, not on every call.
  detail::KnownPointers* known_pointers() const { return known_pointers_.get(); }

 private:
  TableBatchedEmbedding() = default;
  TbeConfig cfg_;
  Backend backend_ = Backend::kCpu;
  std::vector<int> feature_table_;
  std::vector<int64_t> weight_offsets_;  // [num_tables + 1]
  std::vector<int64_t> row_offsets_;     // [num_tables + 1]
  std::vector<int> output_offsets_;      // [T + 1]
  int max_dim_ = 0;
  void* meta_storage_ = nullptr;         // one allocation holding DeviceMeta's arrays
  DeviceMeta meta_;
  std::unique_ptr<detail::KnownPointers> known_pointers_;
};

}  // namespace embscale
