/* embscale C API: a flat, ABI-stable layer over the C++ API for language bindings (the Python package
 * loads it with ctypes). It adds no behaviour: every function validates and runs exactly as its C++
 * counterpart in fp8.h / tbe.h, which document the semantics.
 *
 * Conventions
 *  - Every function returning int returns an embscale::StatusCode (0 = ok). On failure the message,
 *    which names the argument and the problem, is kept per thread: embscale_last_error().
 *  - Enumerations are passed as their C++ values: backend (0 cpu, 1 cuda), dtype (embscale::DType:
 *    0 fp32, 1 fp16, 2 bf16, 3 fp8e4m3, 4 fp8e5m2, 5 int32, 6 int64), amax algo (0 auto, 1 atomic,
 *    2 two_stage), activation (0 relu, 1 gelu_tanh, 2 silu), pooling (0 sum, 1 mean, 2 none), bounds
 *    check (0 error, 1 skip, 2 off, 3 warn), optimizer (0 none, 1 sgd, 2 rowwise_adagrad, 3 adam,
 *    4 partial_rowwise_adam, 5 adagrad, 6 lamb, 7 partial_rowwise_lamb, 8 lars_sgd), weight decay (0 none, 1 l2, 2 decoupled), rounding (0 nearest,
 *    1 stochastic). A value outside its list is refused with kInvalidArgument and a message naming the
 *    argument, the value and the range ("pooling: value 3 is out of range [0, 2]"); the ranges are the
 *    C++ enums' counts (kNumDTypes, ..., embscale::num_optimizers()).
 *  - Optional tensors (per-sample weights, optimizer state, dense-gradient outputs) are absent when
 *    their data is NULL (a zero-initialised embscale_tensor); when present their dtype and shape are
 *    checked like those of every other tensor.
 *  - Pointers live in the memory of the context's backend (device pointers for CUDA); the stream is a
 *    cudaStream_t. Nothing here allocates except embscale_tbe_create, embscale_quant_tbe_create,
 *    embscale_row_cache_create and embscale_host_store_malloc.
 */
#ifndef EMBSCALE_EMBSCALE_C_H_
#define EMBSCALE_EMBSCALE_C_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define EMBSCALE_C_EXPORT __declspec(dllexport)
#else
#define EMBSCALE_C_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct embscale_context {
  int32_t backend;
  int32_t num_threads; /* CPU: OpenMP threads, 0 = all */
  void* stream;        /* CUDA: cudaStream_t, NULL = legacy default stream */
} embscale_context;

typedef struct embscale_tensor {
  void* data;
  int32_t dtype;
  int32_t ndim; /* 1..4, contiguous row-major */
  int64_t shape[4];
} embscale_tensor;

EMBSCALE_C_EXPORT const char* embscale_version(void);
EMBSCALE_C_EXPORT const char* embscale_last_error(void);
/* 1 when the backend is compiled in and usable now (CUDA: a device is present). */
EMBSCALE_C_EXPORT int embscale_backend_available(int32_t backend);
EMBSCALE_C_EXPORT int embscale_backend_compiled(int32_t backend);

/* ---- FP8 current scaling -------------------------------------------------------------------------- */
/* The no-op flag (TransformerEngine's `noop_flag`): every FP8 op below takes it as its last argument, an
 * optional fp32 value in the memory of the context's backend (device memory for CUDA, host memory for the
 * CPU backend, as every other pointer here); NULL means run. When *noop_flag == 1.0f the call checks its
 * arguments as always, then returns 0 without writing anything (outputs, amax, scales and the non-finite
 * flag keep their values), so a captured CUDA graph can skip the op by setting the flag on the device. Any
 * other value runs the op. The *_workspace_size queries take no flag. */
EMBSCALE_C_EXPORT int embscale_amax_workspace_size(const embscale_context* ctx, const embscale_tensor* x,
                                                   int32_t algo, size_t* bytes);
EMBSCALE_C_EXPORT int embscale_amax(const embscale_context* ctx, const embscale_tensor* x, float* amax,
                                    int32_t algo, int32_t* nonfinite_flag, void* workspace,
                                    size_t workspace_bytes, const float* noop_flag);
EMBSCALE_C_EXPORT int embscale_compute_scale(const embscale_context* ctx, const float* amax, int32_t fp8_dtype,
                                             float eps, int32_t power_of_2, float* scale, float* scale_inv,
                                             const float* noop_flag);
EMBSCALE_C_EXPORT int embscale_quantize(const embscale_context* ctx, const embscale_tensor* x,
                                        const float* scale, const embscale_tensor* y, const float* noop_flag);
EMBSCALE_C_EXPORT int embscale_dequantize(const embscale_context* ctx, const embscale_tensor* y,
                                          const float* scale_inv, const embscale_tensor* x, const float* noop_flag);
EMBSCALE_C_EXPORT int embscale_quantize_current_scaling_workspace_size(const embscale_context* ctx,
                                                                       const embscale_tensor* x, int32_t algo,
                                                                       size_t* bytes);
EMBSCALE_C_EXPORT int embscale_quantize_current_scaling(const embscale_context* ctx, const embscale_tensor* x,
                                                        const embscale_tensor* y, float* amax, float* scale,
                                                        float* scale_inv, int32_t algo, float eps,
                                                        int32_t power_of_2, int32_t* nonfinite_flag,
                                                        void* workspace, size_t workspace_bytes,
                                                        const float* noop_flag);
EMBSCALE_C_EXPORT int embscale_activation_amax_workspace_size(const embscale_context* ctx,
                                                              const embscale_tensor* x, int32_t algo,
                                                              size_t* bytes);
EMBSCALE_C_EXPORT int embscale_activation_amax(const embscale_context* ctx, int32_t activation,
                                               const embscale_tensor* x, const embscale_tensor* y, float* amax,
                                               int32_t algo, void* workspace, size_t workspace_bytes,
                                               const float* noop_flag);
EMBSCALE_C_EXPORT int embscale_cast_transpose(const embscale_context* ctx, const embscale_tensor* x,
                                              const float* scale, const embscale_tensor* y,
                                              const embscale_tensor* yt, const float* noop_flag);

/* ---- table-batched embeddings --------------------------------------------------------------------- */
typedef struct embscale_tbe embscale_tbe; /* a TableBatchedEmbedding */

/* num_tables >= 1 tables of num_rows[t] x dims[t]. feature_table_map holds the table of each of the
 * num_features >= 1 features, or is NULL (one feature per table; num_features must then equal num_tables). */
EMBSCALE_C_EXPORT int embscale_tbe_create(const embscale_context* ctx, int32_t num_tables, const int64_t* num_rows,
                                          const int32_t* dims, int32_t num_features,
                                          const int32_t* feature_table_map, int32_t weights_dtype,
                                          embscale_tbe** out);
EMBSCALE_C_EXPORT void embscale_tbe_destroy(embscale_tbe* tbe);

/* Layout of the weights buffer, the row-wise state and the pooled output. */
typedef struct embscale_tbe_layout {
  int64_t num_weights; /* elements of the weights buffer (and of element-wise optimizer state) */
  int64_t total_rows;  /* rows of all tables (length of row-wise optimizer state) */
  int32_t total_dim;   /* columns of the pooled output */
  int32_t max_dim;
} embscale_tbe_layout;
EMBSCALE_C_EXPORT int embscale_tbe_layout_get(const embscale_tbe* tbe, embscale_tbe_layout* out);
/* Per table: first element in the weights buffer and first row in row-wise state (arrays of num_tables). */
EMBSCALE_C_EXPORT int embscale_tbe_table_offsets(const embscale_tbe* tbe, int64_t* weight_offsets,
                                                 int64_t* row_offsets);

typedef struct embscale_tbe_forward_args {
  embscale_tensor weights;
  embscale_tensor indices;
  embscale_tensor offsets;
  embscale_tensor per_sample_weights; /* fp32 [N]; data NULL: unweighted */
  int64_t batch_size;
  int32_t pooling;
  int32_t bounds_check;
  embscale_tensor output;
  int64_t* num_skipped; /* optional */
} embscale_tbe_forward_args;
EMBSCALE_C_EXPORT int embscale_tbe_forward(const embscale_tbe* tbe, const embscale_context* ctx,
                                           const embscale_tbe_forward_args* args);
/* embscale_tbe_forward, and in skip and warn modes the count also stored to num_skipped_host: host memory
 * the device writes itself on CUDA (pinned and mapped at the same address, as cudaHostAlloc's), which the
 * caller polls without an event (tbe.h, TbeForwardArgs::num_skipped_host). NULL: embscale_tbe_forward. */
EMBSCALE_C_EXPORT int embscale_tbe_forward_host_count(const embscale_tbe* tbe, const embscale_context* ctx,
                                                      const embscale_tbe_forward_args* args,
                                                      int64_t* num_skipped_host);

typedef struct embscale_optimizer {
  int32_t type;
  float learning_rate;
  float eps;
  float beta1;
  float beta2;
  float weight_decay;
  int32_t weight_decay_mode;
  float max_norm;
  float gradient_clipping;
  int64_t step;
  float eta;      /* lars_sgd */
  float momentum; /* lars_sgd */
} embscale_optimizer;

/* The optimizers (embscale_optimizer.type: 0 .. embscale_num_optimizers() - 1) and the state buffers
 * each keeps, momentum1 and momentum2 of embscale_tbe_backward_args: absent, row-wise (one float per
 * row of all tables, total_rows) or element-wise (one per weight, num_weights). */
#define EMBSCALE_STATE_ABSENT 0
#define EMBSCALE_STATE_ROWWISE 1
#define EMBSCALE_STATE_ELEMENTWISE 2
typedef struct embscale_optimizer_info {
  const char* name;           /* "none", "sgd", "rowwise_adagrad", "adam", "partial_rowwise_adam", "adagrad",
                               * "lamb", "partial_rowwise_lamb", "lars_sgd" */
  int32_t state_layouts[2];   /* momentum1, momentum2: EMBSCALE_STATE_* */
  const char* state_names[2]; /* their names in the Python package ("sum", "exp_avg", ...); "" when absent */
} embscale_optimizer_info;
EMBSCALE_C_EXPORT int32_t embscale_num_optimizers(void);
EMBSCALE_C_EXPORT int embscale_optimizer_info_get(int32_t optimizer, embscale_optimizer_info* out);
/* How an optimizer applies the weight_decay of embscale_optimizer (C++ OptimizerWeightDecay; FBGEMM's
 * rules): not at all (weight_decay must be 0 or weight_decay_mode none: sgd, adagrad), as
 * weight_decay_mode says (L2, decoupled, or ignored in mode none: rowwise_adagrad), or by the optimizer's
 * own decoupled rule whenever weight_decay != 0, whatever weight_decay_mode says (adam,
 * partial_rowwise_adam, lamb, partial_rowwise_lamb, lars_sgd, as FBGEMM's). */
#define EMBSCALE_WEIGHT_DECAY_NONE 0
#define EMBSCALE_WEIGHT_DECAY_BY_MODE 1
#define EMBSCALE_WEIGHT_DECAY_DECOUPLED 2
EMBSCALE_C_EXPORT int embscale_optimizer_weight_decay_get(int32_t optimizer, int32_t* out);
/* The checks embscale_tbe_backward makes of its optimizer field, on their own: kInvalidArgument naming
 * the field (optimizer.learning_rate, ...) for an unknown type or mode, a hyper-parameter out of range
 * or not finite, or an option the optimizer does not have. For bindings that keep hyper-parameters
 * between steps and refuse a bad one when it is set. */
EMBSCALE_C_EXPORT int embscale_optimizer_check(const embscale_optimizer* optimizer);

typedef struct embscale_tbe_backward_args {
  embscale_tensor weights;
  embscale_tensor indices;
  embscale_tensor offsets;
  embscale_tensor per_sample_weights;
  int64_t batch_size;
  int32_t pooling;
  int32_t bounds_check;
  embscale_tensor grad_output;
  embscale_optimizer optimizer;
  embscale_tensor momentum1; /* fp32; data NULL: absent */
  embscale_tensor momentum2;
  embscale_tensor grad_per_sample_weights; /* fp32 [N], optional */
  embscale_tensor unique_rows;             /* int64 [N], dense-gradient mode */
  int64_t* num_unique;                     /* [1], dense-gradient mode */
  embscale_tensor unique_grads;            /* fp32 [N * max_dim], dense-gradient mode */
  int32_t rounding;
  uint64_t seed;
  int32_t max_warp_segment; /* tuning; 0 = per-device default */
  int32_t max_block_segment;
  int32_t block_threads;
  int64_t* num_skipped;
  embscale_tensor rounding_bases; /* int64 [total_rows], optional: the rows' places for stochastic rounding
                                   * (TbeBackwardArgs::rounding_bases; a row cache's) */
} embscale_tbe_backward_args;
EMBSCALE_C_EXPORT int embscale_tbe_backward_workspace_size(const embscale_tbe* tbe, const embscale_context* ctx,
                                                           const embscale_tbe_backward_args* args, size_t* bytes);
EMBSCALE_C_EXPORT int embscale_tbe_backward(const embscale_tbe* tbe, const embscale_context* ctx,
                                            const embscale_tbe_backward_args* args, void* workspace,
                                            size_t workspace_bytes);

/* ---- quantized tables for serving (tbe_quant.h) ------------------------------------------------------- */
typedef struct embscale_quant_tbe embscale_quant_tbe; /* a QuantizedTableBatchedEmbedding */

/* types[t]: per table, weight type (embscale::QuantWeightType: 0 fp32, 1 fp16, 2 bf16, 3 int8, 4 int4,
 * 5 int2, 6 fp8e4m3, 7 fp8e5m2). num_tables >= 1 tables of num_rows[t] x dims[t] in types[t]; feature_table_map as embscale_tbe_create's;
 * row_alignment (1 .. 256) and table_alignment (1 .. 4096) powers of two (tbe_quant.h's layout). */
EMBSCALE_C_EXPORT int embscale_quant_tbe_create(const embscale_context* ctx, int32_t num_tables,
                                                const int64_t* num_rows, const int32_t* dims, const int32_t* types,
                                                int32_t num_features, const int32_t* feature_table_map,
                                                int32_t row_alignment, int32_t table_alignment,
                                                embscale_quant_tbe** out);
EMBSCALE_C_EXPORT void embscale_quant_tbe_destroy(embscale_quant_tbe* tbe);
typedef struct embscale_quant_tbe_layout {
  int64_t total_bytes; /* bytes of the packed tables */
  int32_t total_dim;   /* columns of the pooled output */
  int32_t max_dim;
} embscale_quant_tbe_layout;
/* row_bytes, table_offsets: NULL, or [num_tables] bytes of each table's rows and its first byte. */
EMBSCALE_C_EXPORT int embscale_quant_tbe_layout_get(const embscale_quant_tbe* tbe, embscale_quant_tbe_layout* out,
                                                    int64_t* row_bytes, int64_t* table_offsets);
typedef struct embscale_quant_tbe_forward_args {
  const void* weights; /* the packed tables, weights_bytes == total_bytes */
  int64_t weights_bytes;
  embscale_tensor indices;
  embscale_tensor offsets;
  embscale_tensor per_sample_weights; /* fp32 [N]; data NULL: unweighted */
  int64_t batch_size;
  int32_t pooling;
  int32_t bounds_check;
  embscale_tensor output; /* fp32, fp16 or bf16 */
  int64_t* num_skipped;   /* optional, the backend's memory */
} embscale_quant_tbe_forward_args;
EMBSCALE_C_EXPORT int embscale_quant_tbe_forward(const embscale_quant_tbe* tbe, const embscale_context* ctx,
                                                 const embscale_quant_tbe_forward_args* args);
/* quantize_rows of tbe_quant.h on ctx's backend: rows is [E, D] fp32; rows, out and workspace in the backend's
 * memory (host memory for the CPU backend, whose workspace is 0 bytes). Both backends write the same bytes; on
 * CUDA the call synchronises ctx's stream once, to read the rows' check back, before writing. */
EMBSCALE_C_EXPORT int embscale_quantize_rows_workspace_size(const embscale_context* ctx, int32_t type,
                                                            const embscale_tensor* rows, int32_t row_alignment,
                                                            size_t* bytes);
EMBSCALE_C_EXPORT int embscale_quantize_rows(const embscale_context* ctx, int32_t type, const embscale_tensor* rows,
                                             int32_t row_alignment, void* out, int64_t out_bytes, void* workspace,
                                             size_t workspace_bytes);
/* dequantize_rows of tbe_quant.h (host memory): rows is [E, D] fp32. */
EMBSCALE_C_EXPORT int embscale_dequantize_rows(int32_t type, const void* in, int64_t in_bytes,
                                               int32_t row_alignment, const embscale_tensor* rows);

/* ---- row cache: tables in host memory, their rows cached in device memory (tbe_cache.h) -------------- */
typedef struct embscale_row_cache embscale_row_cache; /* a RowCache (CUDA only) */

/* The tables as embscale_tbe_create takes them; per table its placement (0 device, 1 host, 2 cached) and
 * its cache's rows (cached tables: >= 1; others 0); algorithm 0 lru, 1 lfu; the optimizer whose state rows
 * travel with the weights; max_lookups: the largest batch's lookups. */
EMBSCALE_C_EXPORT int embscale_row_cache_create(const embscale_context* ctx, int32_t num_tables,
                                                const int64_t* num_rows, const int32_t* dims, int32_t num_features,
                                                const int32_t* feature_table_map, int32_t weights_dtype,
                                                const int32_t* placement, const int64_t* cache_rows,
                                                int32_t algorithm, int32_t optimizer, int64_t max_lookups,
                                                embscale_row_cache** out);
EMBSCALE_C_EXPORT void embscale_row_cache_destroy(embscale_row_cache* cache);
/* Host memory for the host store on the current CUDA device (memory.h's host_store_malloc: managed memory
 * kept on the host, or pinned and mapped); bytes == 0 gives NULL. Freed by embscale_host_store_free. */
EMBSCALE_C_EXPORT int embscale_host_store_malloc(uint64_t bytes, void** out);
EMBSCALE_C_EXPORT void embscale_host_store_free(void* ptr);
/* The tables the forward and backward run on (lent: valid while the cache lives; embscale_tbe_destroy
 * leaves it alone). Its layout: embscale_tbe_layout_get, embscale_tbe_table_offsets. */
EMBSCALE_C_EXPORT const embscale_tbe* embscale_row_cache_tbe(const embscale_row_cache* cache);
typedef struct embscale_row_cache_info {
  int64_t state_bytes;           /* the persistent state's size (device memory, 256-byte aligned) */
  int64_t rounding_bases_offset; /* bytes into the state: int64 [cache total_rows], the backward's rounding_bases */
  int64_t plan_bytes;            /* one batch's plan (device memory, 256-byte aligned) */
} embscale_row_cache_info;
/* cache_slots: NULL, or [num_tables] rows of each table's cache (whole sets of 32). */
EMBSCALE_C_EXPORT int embscale_row_cache_info_get(const embscale_row_cache* cache, embscale_row_cache_info* out,
                                                  int64_t* cache_slots);
typedef struct embscale_row_cache_buffers {
  embscale_tensor host_weights; /* host store: pinned, mapped host memory in the tables' layout */
  embscale_tensor host_momentum1;
  embscale_tensor host_momentum2;
  embscale_tensor cache_weights; /* device memory in the layout of embscale_row_cache_tbe */
  embscale_tensor cache_momentum1;
  embscale_tensor cache_momentum2;
  void* state;
  size_t state_bytes;
} embscale_row_cache_buffers;
typedef struct embscale_row_cache_prefetch_args {
  embscale_tensor indices;
  embscale_tensor offsets;
  int64_t batch_size;
  int64_t step;
  int64_t lock_from;
  int32_t training;
  embscale_tensor remapped;
  void* plan;
  size_t plan_bytes;
} embscale_row_cache_prefetch_args;
EMBSCALE_C_EXPORT int embscale_row_cache_load(const embscale_row_cache* cache, const embscale_context* ctx,
                                              const embscale_row_cache_buffers* buffers);
EMBSCALE_C_EXPORT int embscale_row_cache_prefetch(const embscale_row_cache* cache, const embscale_context* ctx,
                                                  const embscale_row_cache_buffers* buffers,
                                                  const embscale_row_cache_prefetch_args* args);
EMBSCALE_C_EXPORT int embscale_row_cache_fetch(const embscale_row_cache* cache, const embscale_context* ctx,
                                               const embscale_row_cache_buffers* buffers, const void* plan,
                                               size_t plan_bytes);
EMBSCALE_C_EXPORT int embscale_row_cache_write_back(const embscale_row_cache* cache, const embscale_context* ctx,
                                                    const embscale_row_cache_buffers* buffers, const void* plan,
                                                    size_t plan_bytes);
EMBSCALE_C_EXPORT int embscale_row_cache_flush(const embscale_row_cache* cache, const embscale_context* ctx,
                                               const embscale_row_cache_buffers* buffers);

#ifdef __cplusplus
}
#endif

#endif /* EMBSCALE_EMBSCALE_C_H_ */
