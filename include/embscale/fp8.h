// FP8 current scaling: amax -> scale -> cast, on the CPU and on CUDA with identical results.
//
// Scalars (amax, scale, scale_inv, flags) are single fp32/int32 values in the backend's memory
// (device pointers for CUDA), so a whole current-scaling step runs on the GPU without a host
// synchronisation and can be captured in a CUDA graph.
//
// Semantics (TransformerEngine's current-scaling recipe, with the differences stated):
//  * amax = max |x| in fp32 over all elements; empty input -> 0; -0 -> +0; +-inf -> inf; NaN elements
//    are skipped (as TE's fmaxf does) but reported through the optional non-finite flag.
//  * scale: a = max(amax, eps); a in {0, inf, NaN} -> scale 1; else scale = fp8_max / a rounded to
//    nearest (fp8_max: e4m3 448, e5m2 57344); an infinite quotient -> FLT_MAX; with power_of_2 the
//    mantissa is truncated (rounds down to a power of two). scale_inv = 1 / scale.
//  * quantize: y = fp8(saturate(x * scale)) with round-to-nearest-even; +-inf saturate to +-fp8_max,
//    NaN stays NaN. dequantize: x = float(y) * scale_inv, rounded to the output dtype.
//
// Workspaces follow CUB's two-phase convention: ask `*_workspace_size`, pass a buffer of at least that
// many bytes (nullptr is fine when the size is 0). Any content on entry; a workspace must not be shared
// by ops running concurrently. Ops never allocate.
//
// No-op flag: every GPU op takes an optional device pointer `noop_flag`; when *noop_flag == 1.0f the
// op returns without touching its outputs, so a captured graph can skip it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "embscale/context.h"
#include "embscale/status.h"
#include "embscale/tensor.h"

namespace embscale {

// Largest finite value of an fp8 format (448 or 57344); 0 for a non-fp8 dtype.
float fp8_max(DType fp8_dtype);

// ---- amax -----------------------------------------------------------------------------------------
// kAtomic: one atomic max per block into a single value; kTwoStage: block maxima into the workspace,
// then one final reduction. max is exact and order-independent, so both give bit-identical results.
// kAuto picks by size (docs/fp8_cuda.md); the library reads no environment variable to change it.
enum class AmaxAlgo { kAuto = 0, kAtomic, kTwoStage };
constexpr int kNumAmaxAlgos = static_cast<int>(AmaxAlgo::kTwoStage) + 1;  // values 0 .. count - 1
const char* amax_algo_name(AmaxAlgo a);  // "auto", "atomic", "two_stage"
bool parse_amax_algo(const std::string& name, AmaxAlgo* out);

struct AmaxOptions {
  AmaxAlgo algo = AmaxAlgo::kAuto;
  int32_t* nonfinite_flag = nullptr;  // optional output: 1 if any element is inf or NaN, else 0
  const float* noop_flag = nullptr;   // optional input: skip the op when *noop_flag == 1.0f
};

// x: fp32, fp16 or bf16, any shape and size (0 included), any element alignment.
Status amax_workspace_size(const Context& ctx, const TensorView& x, const AmaxOptions& opts, size_t* bytes);
Status amax(const Context& ctx, const TensorView& x, float* amax, const AmaxOptions& opts, void* workspace,
            size_t workspace_bytes);

// ---- scale ----------------------------------------------------------------------------------------
struct ScaleOptions {
  float eps = 0.0f;         // amax is clamped below at eps before the division
  bool power_of_2 = false;  // round the scale down to a power of two
};

// Host/device-neutral scalar rule behind compute_scale, exposed for tests and bindings.
float scale_from_amax(float amax, float fp8_max_value, const ScaleOptions& opts);

// amax, scale, scale_inv: one fp32 each, in the backend's memory. fp8_dtype: kF8E4M3 or kF8E5M2.
Status compute_scale(const Context& ctx, const float* amax, DType fp8_dtype, const ScaleOptions& opts,
                     float* scale, float* scale_inv, const float* noop_flag = nullptr);

// ---- casts ----------------------------------------------------------------------------------------
// x: fp32/fp16/bf16; y: fp8 e4m3/e5m2 with x's number of elements.
Status quantize(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y,
                const float* noop_flag = nullptr);
// y: fp8; x: fp32/fp16/bf16 with y's number of elements.
Status dequantize(const Context& ctx, const TensorView& y, const float* scale_inv, const TensorView& x,
                  const float* noop_flag = nullptr);

// amax -> scale -> cast in one call, all on the device. amax, scale and scale_inv are written. The
// workspace depends on x's dtype, size and the amax algorithm (on CUDA, kAuto asks for a small one, 16
// bytes per SM, for inputs of up to 32 MiB, whose amax partials meet there): ask for it.
struct CurrentScalingOptions {
  AmaxOptions amax;
  ScaleOptions scale;
};
Status quantize_current_scaling_workspace_size(const Context& ctx, const TensorView& x,
                                               const CurrentScalingOptions& opts, size_t* bytes);
Status quantize_current_scaling(const Context& ctx, const TensorView& x, const TensorView& y, float* amax,
                                float* scale, float* scale_inv, const CurrentScalingOptions& opts,
                                void* workspace, size_t workspace_bytes);

// ---- fusions --------------------------------------------------------------------------------------
enum class Activation { kRelu = 0, kGeluTanh, kSilu };
constexpr int kNumActivations = static_cast<int>(Activation::kSilu) + 1;  // values 0 .. count - 1
const char* activation_name(Activation a);  // "relu", "gelu_tanh", "silu"
bool parse_activation(const std::string& name, Activation* out);

// y = act(x) computed in fp32 and rounded to y's dtype (fp32/fp16/bf16); amax = max |y| of the values
// as stored in y, so a following current-scaling quantize of y sees exactly this amax.
//   relu(v) = max(v, 0); gelu_tanh(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)));
//   silu(v) = v / (1 + exp(-v)).
Status activation_amax_workspace_size(const Context& ctx, const TensorView& x, const AmaxOptions& opts,
                                      size_t* bytes);
Status activation_amax(const Context& ctx, Activation act, const TensorView& x, const TensorView& y,
                       float* amax, const AmaxOptions& opts, void* workspace, size_t workspace_bytes);

// x: 2-D [rows, cols] fp32/fp16/bf16. Writes y = quantize(x) as [rows, cols] and its transpose
// yt as [cols, rows] (both fp8 of the same format) in one pass over x.
Status cast_transpose(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y,
                      const TensorView& yt, const float* noop_flag = nullptr);

}  // namespace embscale
