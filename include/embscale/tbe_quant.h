// Quantized table-batched embeddings for serving: a forward-only TBE whose tables hold int8, int4 or
// int2 rows with a per-row fp16 scale and bias, fp8 (e4m3, e5m2) rows with a per-row fp32 scale, or plain
// fp32/fp16/bf16 rows, each table its own type and dimension, all packed in one byte buffer.
//
// Lookups, pooling, per-sample weights, outputs and bounds checks mean what they mean in tbe.h
// (TbeForwardArgs): indices [N] and offsets [T*B+1], both int32 or both int64, table-major; SUM, MEAN
// (over the valid lookups of a bag; an empty bag gives zeros) or none (sequence: [N, D], all features
// of one D); optional fp32 per-sample weights (not with MEAN); output fp32, fp16 or bf16; the four
// BoundsCheckMode values behave as on the training forward of the same backend (tbe.h): a bad index is
// reported (kError), dropped and counted (kSkip, kWarn) or dropped silently (kOff); broken offsets are an
// error in every mode on the CPU, and on CUDA in kError and in kSkip outside a graph capture (kWarn writes
// -1 to num_skipped instead, kOff clamps the bags and reports nothing).
//
// Backends: CPU and CUDA, the same results up to fp32 rounding (both sum a bag in the order of its indices
// with the same arithmetic per term, so they agree to the bit on the same bytes; docs/tbe_quant.md). On CUDA
// create() uploads a few per-feature arrays (creation may allocate, forward never does); forward is
// asynchronous on ctx.stream and capturable except in kError mode, which reads its result back.
//
// ---- the row layout (FBGEMM's IntNBit inference TBE layout, so its quantized tables load as they are)
// A row of D columns is [header][data][padding]:
//  * int8/int4/int2 (b = 8, 4, 2 bits): header = 4 bytes, the row's scale then its bias, each an IEEE
//    fp16 (little-endian); data = ceil(D * b / 8) bytes, column c in byte c / (8 / b) at bit
//    (c % (8 / b)) * b (the low bits hold the lower column); a column's value is q * scale + bias with q
//    the unsigned b-bit code. FBGEMM sizes the data as D * b / 8 rounded down, so its tables have D a
//    multiple of 8 / b; for those D the two layouts are the same bytes. Unused bits of the last byte are 0.
//  * fp8 e4m3 / e5m2 (OCP, e4m3 without infinities): header = 4 bytes, one fp32 (little-endian): the
//    factor a code is multiplied by to dequantize (the FP8 capability's scale_inv); data = D bytes.
//    (FBGEMM's own FP8 weight type has no per-row scale; it is not this layout.)
//  * fp32 / fp16 / bf16: no header; data = D elements of the type.
// The row's size is its header plus data rounded up to row_alignment bytes (FBGEMM: 16 on GPU, 1 on
// CPU); the padding is never read. Table t starts at byte table_offset(t): the tables in order, each
// starting at a multiple of table_alignment bytes (FBGEMM aligns tables to 128-byte cache lines).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "embscale/context.h"
#include "embscale/status.h"
#include "embscale/tbe.h"
#include "embscale/tensor.h"

namespace embscale {

enum class QuantWeightType { kFp32 = 0, kFp16, kBf16, kInt8, kInt4, kInt2, kFp8E4M3, kFp8E5M2 };
constexpr int kNumQuantWeightTypes = static_cast<int>(QuantWeightType::kFp8E5M2) + 1;  // values 0 .. count - 1
// "fp32", "fp16", "bf16", "int8", "int4", "int2", "fp8e4m3", "fp8e5m2"; "unknown" outside the enum.
const char* quant_weight_type_name(QuantWeightType t);
// Takes the names and FBGEMM's SparseType names for the same rows (FP32, FP16, BF16, INT8, INT4, INT2;
// not FP8, whose rows differ), nothing else.
bool parse_quant_weight_type(const std::string& name, QuantWeightType* out);
std::vector<std::string> quant_weight_type_spellings();

// Bytes before a row's data: 4 for int8/int4/int2 (fp16 scale, fp16 bias) and fp8 (fp32 scale), else 0.
int quant_row_header_bytes(QuantWeightType t);
// Bytes of one row (header, data, padding to row_alignment). invalid_argument naming `type`, `dim` (>= 1)
// or `row_alignment` (a power of two from 1 to 256).
Status quant_row_bytes(QuantWeightType type, int dim, int row_alignment, int64_t* bytes);

struct QuantTableSpec {
  int64_t num_rows = 0;                       // E_t >= 1
  int dim = 0;                                // D_t >= 1
  QuantWeightType type = QuantWeightType::kInt8;
};

struct QuantTbeConfig {
  std::vector<QuantTableSpec> tables;
  std::vector<int> feature_table_map;  // [T] table of each feature; empty = one feature per table
  int row_alignment = 16;              // a power of two, 1 to 256
  int table_alignment = 128;           // a power of two, 1 to 4096
};

struct QuantTbeForwardArgs {
  const void* weights = nullptr;  // the packed tables in backend memory (any alignment; CUDA reads 16 bytes at a
                                  // time where the table's base and its row size allow, docs/tbe_quant.md)
  int64_t weights_bytes = 0;      // must equal total_bytes()
  TensorView indices;             // [N] int32 or int64
  TensorView offsets;             // [T*B+1], the dtype of indices
  TensorView per_sample_weights;  // optional [N] fp32; SUM or none only
  int64_t batch_size = 0;         // B
  PoolingMode pooling = PoolingMode::kSum;
  BoundsCheckMode bounds_check = BoundsCheckMode::kError;
  TensorView output;              // pooled [B, total_dim()], sequence [N, D]; fp32, fp16 or bf16
  int64_t* num_skipped = nullptr; // optional (backend memory): invalid indices dropped (kSkip, kWarn), as tbe.h
};

class QuantizedTableBatchedEmbedding {
 public:
  // Validates the config (each bad field named) and computes the layout; allocates nothing on a device.
  static Status create(const Context& ctx, const QuantTbeConfig& cfg,
                       std::unique_ptr<QuantizedTableBatchedEmbedding>* out);
  ~QuantizedTableBatchedEmbedding();
  QuantizedTableBatchedEmbedding(const QuantizedTableBatchedEmbedding&) = delete;
  QuantizedTableBatchedEmbedding& operator=(const QuantizedTableBatchedEmbedding&) = delete;

  const QuantTbeConfig& config() const { return cfg_; }
  Backend backend() const { return backend_; }
  int num_tables() const { return static_cast<int>(cfg_.tables.size()); }
  int num_features() const { return static_cast<int>(feature_table_.size()); }
  int feature_table(int f) const { return feature_table_[f]; }
  int feature_dim(int f) const { return cfg_.tables[feature_table_[f]].dim; }
  int64_t row_bytes(int table) const { return row_bytes_[table]; }
  int64_t table_offset(int table) const { return table_offsets_[table]; }  // bytes into weights
  int64_t total_bytes() const { return total_bytes_; }                     // bytes of the packed buffer
  int output_offset(int feature) const { return output_offsets_[feature]; }
  int total_dim() const { return output_offsets_.back(); }
  int max_dim() const { return max_dim_; }

  // Pooled or sequence lookup (QuantTbeForwardArgs). A refused call writes nothing; a bounds error
  // (kOutOfRange) leaves the output unspecified.
  Status forward(const Context& ctx, const QuantTbeForwardArgs& args) const;

  // Per-feature arrays in the backend's memory, for the backend implementations (CUDA; null on the CPU).
  struct DeviceMeta {
    const int64_t* table_offsets = nullptr;   // [T] byte offset of each feature's table in weights
    const int64_t* num_rows = nullptr;        // [T] E of each feature's table
    const int64_t* row_bytes = nullptr;       // [T] bytes of one row of each feature's table
    const int32_t* dims = nullptr;            // [T] D of each feature
    const int32_t* types = nullptr;           // [T] QuantWeightType of each feature's table
    const int32_t* output_offsets = nullptr;  // [T+1] output column of each feature
    // kScratchWords int64, zeroed at creation: the bounds checks' records, as TableBatchedEmbedding's
    // (forward calls on one object must not run concurrently on different streams in kError/kSkip/kWarn mode).
    int64_t* scratch = nullptr;
  };
  static constexpr int kScratchWords = 8;
  const DeviceMeta& device_meta() const { return meta_; }

 private:
  QuantizedTableBatchedEmbedding() = default;
  Status upload_meta(const Context& ctx);  // CUDA: DeviceMeta's arrays, in one allocation
  QuantTbeConfig cfg_;
  Backend backend_ = Backend::kCpu;
  std::vector<int> feature_table_;
  std::vector<int64_t> row_bytes_;      // [num_tables]
  std::vector<int64_t> table_offsets_;  // [num_tables]
  std::vector<int> output_offsets_;     // [T + 1]
  int64_t total_bytes_ = 0;
  int max_dim_ = 0;
  void* meta_storage_ = nullptr;        // one CUDA allocation holding DeviceMeta's arrays
  DeviceMeta meta_;
  std::unique_ptr<detail::KnownPointers> known_pointers_;  // as TableBatchedEmbedding's: forward's accepted buffers
};

// ---- quantizing helpers -------------------------------------------------------------------------------
// rows: 2-D [E, D] fp32 host memory. out: E rows of quant_row_bytes(type, D, row_alignment) bytes, the
// layout above (padding written as 0), exactly out_bytes = E * row bytes. Non-finite values are refused
// (invalid_argument naming the row and column) before anything is written.
//  * int8/int4/int2 (FBGEMM's FloatToFusedNBitRowwiseQuantizedSBHalf rule, qmax = 2^b - 1): per row,
//    bias = fp16(min) rounded to nearest-even, m = float(bias); scale = (max - m) / qmax in fp32 (1 when
//    max == m), rounded to fp16 to nearest-even; a scale that rounds to 0, or whose fp32 reciprocal is
//    infinite, becomes 1. q = clamp(round_half_even((x - m) * (1 / scale)), 0, qmax), all in fp32. A row
//    whose min or scale overflows fp16 is refused.
//  * fp8: amax = max |x| of the row; scale = scale_from_amax(amax, fp8_max(type), {}) (fp8.h's rule:
//    fp8_max / amax rounded to nearest, 1 for an all-zero row); code = fp8(x * scale), round to
//    nearest-even, saturating; the header holds 1 / scale.
//  * fp32/fp16/bf16: each value rounded to nearest-even (fp16 overflows to infinity as the dtype does).
Status quantize_rows(QuantWeightType type, const TensorView& rows, int row_alignment, void* out, int64_t out_bytes);
// The same on a backend: rows, out and workspace in ctx's backend memory, the same bytes as above on either
// backend (the CUDA quantizer runs the rules of the host one, operation for operation). On CUDA it checks
// every row on the device, reads the verdict back (it synchronises ctx.stream once, so it cannot be
// captured), and only then zeroes out and writes the rows, asynchronously on ctx.stream: a refused call
// writes nothing to out and gives the host form's message. The workspace holds the verdict:
// quantize_rows_workspace_size gives its bytes (0 on the CPU, where this is the host form).
Status quantize_rows_workspace_size(const Context& ctx, QuantWeightType type, const TensorView& rows,
                                    int row_alignment, size_t* bytes);
Status quantize_rows(const Context& ctx, QuantWeightType type, const TensorView& rows, int row_alignment, void* out,
                     int64_t out_bytes, void* workspace, size_t workspace_bytes);
// The inverse: E rows of the layout -> [E, D] fp32 (each value as the forward reads it: q * scale + bias
// in fp32, code * scale for fp8).
Status dequantize_rows(QuantWeightType type, const void* in, int64_t in_bytes, int row_alignment,
                       const TensorView& rows);

}  // namespace embscale
