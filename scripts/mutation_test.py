#!/usr/bin/env python3
"""Mutation testing of the CPU library: plant one realistic bug at a time and check that a test fails.

Each mutant below replaces one exact source snippet (found exactly once in its file) in the CPU
library: src/core, src/fp8 and src/tbe outside their cuda/ folders, and src/capi. For every mutant the script applies it in a private copy of the tree,
rebuilds incrementally (CPU backend, <tree>/build-mut), runs the C++ tests (embscale_tests in two
fail-fast shards, then the examples) and, when they all pass, the Python tests (which load the same
libembscale_c); the file is restored byte for byte afterwards (in a finally block, also on Ctrl-C).
The shared source tree is never written: the copy is exported from a git revision (default HEAD) or,
with --worktree, from the files of the working tree.

    python3 scripts/mutation_test.py                 # every mutant (about 2.5 to 3.5 hours on 2 cores)
    python3 scripts/mutation_test.py --only capi     # mutants whose id or file contains 'capi'
    python3 scripts/mutation_test.py --list          # list the mutants and check every snippet is found
                                                     # exactly once (tests/python/test_mutation_list.py)

Wall time: the baseline build of the copy takes 2-3 minutes on 2 cores; then each mutant costs its
incremental rebuild (20 s for a .cpp file, up to 2 minutes for a header most files include) plus the
tests until the first failure (a survivor runs all of them: ~60 s of C++ tests and ~35 s of Python
tests). Not run in CI. Results go to --results (JSON lines, one per mutant) and a summary with the
score per folder is printed at the end; docs/mutation_testing.md is the record of a full run.

Equivalent mutants (same behaviour for every input the API accepts) are not in the list; the ones
that were considered and left out are named in docs/mutation_testing.md.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str      # relative to the repository root
    find: str      # exact snippet, present exactly once in the file
    replace: str
    why: str       # the bug it stands for

    @property
    def folder(self):
        return "/".join(self.file.split("/")[:2])

    @property
    def focus(self):
        """GoogleTest filter of the tests run first (a killed mutant usually fails there, early)."""
        for key, pattern in FOCUS:
            if key in self.file:
                return pattern
        return None


# Tests that exercise a file most directly, run before the rest of the suite (the rest still runs when
# they pass, so the order changes only how fast a mutant is caught, never whether).
FOCUS = [
    ("src/fp8/cpu/fp8", "*Fp8*"), ("src/fp8/fp8", "*Fp8*"), ("scaling.h", "*Fp8*"), ("activation.h", "*Fp8*"),
    ("tbe_forward", "*TbeForward*"), ("vec4.h", "*TbeForward*:*Vec4*"),
    ("tbe_backward", "*TbeBackward*"), ("optimizer.h", "*TbeBackward*"), ("rounding.h", "*TbeBackward*"),
    ("tbe_checks.h", "*Tbe*"), ("src/tbe/tbe", "*Tbe*"), ("tbe_generator", "*Generator*"),
]


M = Mutant
MUTANTS = [
    # ---- src/core: numerics ----
    M("numerics-bf16-ties-away", "src/core/numerics.h",
      "u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even",
      "u += 0x8000u;  // round to nearest even",
      "fp32 -> bf16 rounds ties away from zero instead of to even"),
    M("numerics-bf16-nan-unquieted", "src/core/numerics.h",
      "return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN",
      "return static_cast<uint16_t>(u >> 16);  // quiet NaN",
      "a NaN whose payload is in the low bits truncates to infinity"),
    M("numerics-fp16-overflow-boundary", "src/core/numerics.h",
      "if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);",
      "if (a > 0x477fe000u) return static_cast<uint16_t>(sign | 0x7c00u);",
      "overflow threshold at 65504 (the largest finite fp16) instead of the midpoint 65520"),
    M("numerics-fp16-ties-up", "src/core/numerics.h",
      "const uint32_t r = (a + 0x0fffu + ((a >> 13) & 1u)) >> 13;",
      "const uint32_t r = (a + 0x1000u) >> 13;",
      "fp32 -> fp16 rounds ties up instead of to even"),
    M("numerics-fp16-decode-bias", "src/core/numerics.h",
      "return bits_float(sign | ((exp + 112u) << 23) | (man << 13));",
      "return bits_float(sign | ((exp + 111u) << 23) | (man << 13));",
      "fp16 decode with an exponent bias off by one"),
    M("numerics-fp8-ties-up", "src/core/numerics.h",
      "const uint32_t r = (a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >> kShift;",
      "const uint32_t r = (a + (1u << (kShift - 1))) >> kShift;",
      "scalar fp32 -> fp8 rounds ties up instead of to even (the scalar tail of the SIMD cast)"),
    # ---- src/fp8: scaling ----
    M("scaling-eps-min-instead-of-max", "src/fp8/scaling.h",
      "const float a = (amax < eps) ? eps : amax;",
      "const float a = (amax > eps) ? eps : amax;",
      "eps clamps from above instead of below"),
    M("scaling-no-overflow-clamp", "src/fp8/scaling.h",
      "if (!is_finite_f(scale)) scale = FLT_MAX;",
      "",
      "an overflowing quotient gives an infinite scale"),
    M("scaling-pow2-keeps-a-bit", "src/fp8/scaling.h",
      "scale = bits_float(float_bits(scale) & 0xff800000u);",
      "scale = bits_float(float_bits(scale) & 0xffc00000u);",
      "power-of-2 rounding keeps the top mantissa bit"),
    M("scaling-amax-term-signed", "src/fp8/scaling.h",
      "const float a = bits_float(float_bits(v) & 0x7fffffffu);",
      "const float a = v;",
      "the activation's amax takes max(y) instead of max |y| (negative outputs ignored)"),
    # ---- src/fp8: activation ----
    M("activation-relu-keeps-negative-zero", "src/fp8/activation.h",
      "EMBSCALE_HD float relu_f(float v) { return (v <= 0.0f) ? 0.0f : v; }",
      "EMBSCALE_HD float relu_f(float v) { return (v < 0.0f) ? 0.0f : v; }",
      "relu(-0) returns -0 instead of +0"),
    M("activation-gelu-constant-typo", "src/fp8/activation.h",
      "const float u = k * (v + 0.044715f * v * v * v);",
      "const float u = k * (v + 0.04715f * v * v * v);",
      "GELU's cubic coefficient mistyped"),
    # ---- src/tbe: optimizer ----
    M("optimizer-clip-one-sided", "src/tbe/optimizer.h",
      "    if (g < -c) return -c;\n",
      "",
      "gradient clipping only clips from above"),
    M("optimizer-l2-sign", "src/tbe/optimizer.h",
      "return p.weight_decay_mode == WeightDecayMode::kL2 ? g + p.weight_decay * w : g;",
      "return p.weight_decay_mode == WeightDecayMode::kL2 ? g - p.weight_decay * w : g;",
      "L2 weight decay with the wrong sign"),
    M("optimizer-adagrad-eps-inside-sqrt", "src/tbe/optimizer.h",
      "return p.learning_rate / (sqrtf(mnew) + p.eps);",
      "return p.learning_rate / sqrtf(mnew + p.eps);",
      "row-wise Adagrad's eps added under the square root"),
    M("optimizer-decoupled-without-lr", "src/tbe/optimizer.h",
      "case WeightDecayMode::kDecoupled: return 1.0f - p.learning_rate * p.weight_decay;",
      "case WeightDecayMode::kDecoupled: return 1.0f - p.weight_decay;",
      "decoupled weight decay not scaled by the learning rate"),
    M("optimizer-max-norm-inverted", "src/tbe/optimizer.h",
      "if (norm > p.max_norm) return p.max_norm / norm;",
      "if (norm > p.max_norm) return norm / p.max_norm;",
      "max-norm factor inverted"),
    M("optimizer-adam-m2-not-squared", "src/tbe/optimizer.h",
      "const float b = p.beta2 * *m2 + (1.0f - p.beta2) * (gp * gp);",
      "const float b = p.beta2 * *m2 + (1.0f - p.beta2) * gp;",
      "Adam's second moment accumulates g instead of g^2"),
    M("optimizer-bc2-uses-beta1", "src/tbe/optimizer.h",
      "c.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), s));",
      "c.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), s));",
      "second bias correction computed from beta1 (copy-paste)"),
    M("optimizer-partial-adam-no-bias-correction", "src/tbe/optimizer.h",
      "return sqrtf(vnew / c.bc2) + p.eps;",
      "return sqrtf(vnew) + p.eps;",
      "partial row-wise Adam's denominator without bias correction"),
    # ---- src/tbe: rounding ----
    M("rounding-bf16-half-random-bits", "src/tbe/rounding.h",
      "return static_cast<uint16_t>((u + (rnd >> 16)) >> 16);",
      "return static_cast<uint16_t>((u + (rnd >> 17)) >> 16);",
      "bf16 stochastic rounding with 15 random bits below the kept mantissa (biased toward zero)"),
    M("rounding-bf16-no-overflow-guard", "src/tbe/rounding.h",
      "if (a >= 0x7f7f0000u) return float_to_bf16(x);  // inf, NaN, or beyond the largest finite bf16",
      "if (a >= 0x7f800000u) return float_to_bf16(x);  // inf, NaN, or beyond the largest finite bf16",
      "a finite value above the largest bf16 may round up to infinity by chance"),
    M("rounding-fp16-subnormal-truncates", "src/tbe/rounding.h",
      "const uint32_t m = static_cast<uint32_t>(q) + (r < frac ? 1u : 0u);",
      "const uint32_t m = static_cast<uint32_t>(q);",
      "fp16 subnormals truncated instead of stochastically rounded"),
    M("rounding-nearest-mode-stochastic-bf16", "src/tbe/rounding.h",
      "  if (mode == WeightRounding::kStochastic) return bf16_t{stochastic_round_bf16(v, rounding_bits(key, element))};\n  return bf16_t{float_to_bf16(v)};",
      "  return bf16_t{stochastic_round_bf16(v, rounding_bits(key, element))};",
      "bf16 weights always rounded stochastically, also in nearest mode"),
    M("rounding-fp16-nearest-truncates", "src/tbe/rounding.h",
      "  return fp16_t{float_to_fp16(v)};\n}",
      "  return fp16_t{stochastic_round_fp16(v, 0u)};\n}",
      "fp16 weights truncated (toward zero) in nearest mode"),
    M("rounding-bf16-stochastic-truncates", "src/tbe/rounding.h",
      "if (mode == WeightRounding::kStochastic) return bf16_t{stochastic_round_bf16(v, rounding_bits(key, element))};",
      "if (mode == WeightRounding::kStochastic) return bf16_t{stochastic_round_bf16(v, 0u)};",
      "bf16 stochastic rounding always truncates (no random bits)"),
    M("rounding-fp16-stochastic-truncates", "src/tbe/rounding.h",
      "if (mode == WeightRounding::kStochastic) return fp16_t{stochastic_round_fp16(v, rounding_bits(key, element))};",
      "if (mode == WeightRounding::kStochastic) return fp16_t{stochastic_round_fp16(v, 0u)};",
      "fp16 stochastic rounding always truncates (no random bits)"),
    M("rounding-key-ignores-step", "src/tbe/rounding.h",
      "return mix64(mix64(seed ^ 0x6a09e667f3bcc909ull) + static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ull);",
      "return mix64(mix64(seed ^ 0x6a09e667f3bcc909ull) + 0x9e3779b97f4a7c15ull);",
      "the same random bits at every step (rounding errors correlated across steps)"),
    # ---- src/tbe: input generator ----
    M("generator-variable-bag-off-by-one", "src/tbe/tbe_generator.cpp",
      "spec.variable_bag_size ? static_cast<int64_t>(rng.below(static_cast<uint64_t>(2 * L + 1))) : L;",
      "spec.variable_bag_size ? static_cast<int64_t>(rng.below(static_cast<uint64_t>(2 * L))) : L;",
      "variable bag sizes drawn from [0, 2L) instead of [0, 2L] (mean below L)"),
    M("generator-spread-not-coprime", "src/tbe/tbe_generator.cpp",
      "  while (gcd_u64(m, E) != 1) ++m;\n",
      "",
      "the rank -> row map is not a bijection when the multiplier shares a factor with E"),
    # ---- src/core: shared checks ----
    M("check-threads-boundary", "src/core/check.h",
      "ctx.num_threads > kMaxCpuThreads",
      "ctx.num_threads >= kMaxCpuThreads",
      "the documented maximum thread count refused"),
    M("check-no-alignment", "src/core/check.h",
      "  if (reinterpret_cast<uintptr_t>(t.data) % esize != 0)\n",
      "  if (false)\n",
      "misaligned data pointers accepted"),
    M("check-overlap-adjacent", "src/core/check.h",
      "return a0 < b0 + static_cast<uintptr_t>(b.size_bytes()) && b0 < a0 + static_cast<uintptr_t>(a.size_bytes());",
      "return a0 <= b0 + static_cast<uintptr_t>(b.size_bytes()) && b0 <= a0 + static_cast<uintptr_t>(a.size_bytes());",
      "adjacent (touching) buffers reported as overlapping"),
    M("check-no-byte-overflow", "src/core/check.h",
      "  if (__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(t.dtype)), &n))\n"
      "    return invalid_argument(std::string(name) + \": shape \" + shape_str(t) + \" has too many bytes\");\n",
      "",
      "a tensor whose byte count overflows int64 accepted"),
    # ---- src/fp8: API ----
    M("fp8-api-infinite-eps", "src/fp8/fp8.cpp",
      "if (!(o.eps >= 0.0f) || !std::isfinite(o.eps))",
      "if (!(o.eps >= 0.0f))",
      "an infinite eps accepted"),
    M("fp8-api-unknown-algo", "src/fp8/fp8.cpp",
      "if (algo == AmaxAlgo::kAuto || algo == AmaxAlgo::kAtomic || algo == AmaxAlgo::kTwoStage) return Status::Ok();",
      "if (static_cast<int>(algo) >= 0) return Status::Ok();",
      "an amax algorithm outside AmaxAlgo accepted (a C or Python caller's integer picks some path)"),
    M("fp8-api-quantize-numel", "src/fp8/fp8.cpp",
      "  EMBSCALE_RETURN_IF_ERROR(check_same_numel(\"x\", x, \"y\", y));\n  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, \"scale\", scale));",
      "  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, \"scale\", scale));",
      "quantize writes past a shorter y"),
    M("fp8-api-transpose-shape", "src/fp8/fp8.cpp",
      "if (yt.ndim != 2 || yt.shape[0] != cols || yt.shape[1] != rows)",
      "if (yt.ndim != 2 || yt.shape[0] * yt.shape[1] != rows * cols)",
      "cast_transpose accepts a yt of the right size but the wrong shape"),
    M("fp8-api-scale-dtype", "src/fp8/fp8.cpp",
      "EMBSCALE_RETURN_IF_ERROR(check_fp8_dtype_arg(\"fp8_dtype\", fp8_dtype));",
      "",
      "compute_scale accepts a non-fp8 dtype (fp8_max 0 -> scale 0)"),
    # ---- src/tbe: API ----
    M("tbe-api-feature-map-boundary", "src/tbe/tbe.cpp",
      "if (t < 0 || t >= num_tables)",
      "if (t < 0 || t > num_tables)",
      "a feature mapped to a table one past the last accepted"),
    M("tbe-api-overflow-check", "src/tbe/tbe.cpp",
      "    if (s.num_rows > kMaxElements / s.dim ||\n        tbe->weight_offsets_[t] > kMaxElements - s.num_rows * static_cast<int64_t>(s.dim))\n",
      "    if (tbe->weight_offsets_[t] > kMaxElements - s.num_rows * static_cast<int64_t>(s.dim))\n",
      "E_t * D_t overflow not detected"),
    M("tbe-api-output-overlap", "src/tbe/tbe.cpp",
      "    if (check::overlap(args.output, *in.t))\n",
      "    if (false)\n",
      "forward output aliasing an input accepted"),
    M("tbe-api-sequence-output-shape", "src/tbe/tbe.cpp",
      "if (args.output.ndim != 2 || args.output.shape[0] != N || args.output.shape[1] != D)",
      "if (args.output.ndim != 2 || args.output.shape[0] != N)",
      "sequence output of the wrong width accepted"),
    M("validate-offsets-longer-accepted", "src/tbe/tbe_validate.h",
      "if (a.offsets->numel() != T * B + 1)",
      "if (a.offsets->numel() < T * B + 1)",
      "offsets longer than T*B+1 accepted"),
    M("validate-int32-addressing", "src/tbe/tbe_validate.h",
      "  if (a.indices->dtype == DType::kI32 && N > INT32_MAX)\n",
      "  if (false)\n",
      "more than 2^31-1 int32-addressed lookups accepted"),
    M("validate-sequence-dims-skip-feature-1", "src/tbe/tbe_validate.h",
      "for (int f = 1; f < T; ++f) {",
      "for (int f = 2; f < T; ++f) {",
      "sequence mode does not check feature 1's dimension"),
    M("validate-weights-dtype", "src/tbe/tbe_validate.h",
      "  if (a.weights->dtype != tbe.config().weights_dtype)\n",
      "  if (false)\n",
      "weights of another dtype than configured accepted"),
    M("backward-api-sgd-weight-decay", "src/tbe/tbe_backward.cpp",
      "  if (!adagrad && !adam && wm != WeightDecayMode::kNone && p.weight_decay != 0.0f)\n",
      "  if (false)\n",
      "weight decay for SGD accepted (and silently ignored)"),
    M("backward-api-max-norm-adam", "src/tbe/tbe_backward.cpp",
      "  if (p.max_norm > 0.0f && !adagrad)\n",
      "  if (false)\n",
      "max_norm for Adam accepted (and silently ignored)"),
    M("backward-api-dense-clipping", "src/tbe/tbe_backward.cpp",
      "  if (t == OptimizerType::kNone && p.gradient_clipping > 0.0f)\n",
      "  if (false)\n",
      "gradient clipping in dense mode accepted (and silently ignored)"),
    M("backward-api-step-zero", "src/tbe/tbe_backward.cpp",
      "if (p.step < 1) return",
      "if (p.step < 0) return",
      "step 0 accepted (Adam divides by 1 - beta^0 = 0)"),
    M("backward-api-written-overlap-count", "src/tbe/tbe_backward.cpp",
      "constexpr int kWritten = 6;  // the first six entries are written",
      "constexpr int kWritten = 5;  // the first six entries are written",
      "unique_grads aliasing an input accepted"),
    M("backward-api-negative-tuning", "src/tbe/tbe_backward.cpp",
      "  if (a.tuning.max_warp_segment < 0)\n",
      "  if (false)\n",
      "a negative max_warp_segment accepted"),
    M("backward-api-eps-zero-adam", "src/tbe/tbe_backward.cpp",
      "if ((adagrad || adam) && !(std::isfinite(p.eps) && p.eps > 0.0f))",
      "if (adagrad && !(std::isfinite(p.eps) && p.eps > 0.0f))",
      "eps = 0 accepted for Adam"),
    # ---- src/fp8/cpu ----
    M("cpu-fp8-amax-inf-excluded", "src/fp8/cpu/fp8_cpu.cpp",
      "const U keep = static_cast<U>(-static_cast<U>(a <= MagBits<T>::kInf));",
      "const U keep = static_cast<U>(-static_cast<U>(a < MagBits<T>::kInf));",
      "amax skips infinities as if they were NaN"),
    M("cpu-fp8-split-gap", "src/fp8/cpu/fp8_cpu.cpp",
      "f(n / nt * t + std::min<int64_t>(t, n % nt), n / nt * (t + 1) + std::min<int64_t>(t + 1, n % nt), t);",
      "f(n / nt * t + std::min<int64_t>(t, n % nt), n / nt * (t + 1) + std::min<int64_t>(t, n % nt), t);",
      "the thread split drops the remainder element of each block"),
    M("cpu-fp8-stale-dequantize-table", "src/fp8/cpu/fp8_cpu.cpp",
      "if (!t.valid || t.scale_bits != sb) {",
      "if (!t.valid) {",
      "the per-thread dequantize table is not rebuilt when the scale changes"),
    M("cpu-fp8-activation-flag-overwritten", "src/fp8/cpu/fp8_cpu.cpp",
      "nf |= is_finite_f(stored) ? 0 : 1;",
      "nf = is_finite_f(stored) ? 0 : 1;",
      "the activation's non-finite flag reflects only the last element"),
    M("cpu-fp8-transpose-stride", "src/fp8/cpu/fp8_cpu.cpp",
      "std::memcpy(yt + (c0 + c) * rows + r0, tile[c], static_cast<size_t>(nr) * sizeof(F8));",
      "std::memcpy(yt + (c0 + c) * cols + r0, tile[c], static_cast<size_t>(nr) * sizeof(F8));",
      "transposed rows written with the wrong stride"),
    M("cpu-fp8-noop-any-nonzero", "src/fp8/cpu/fp8_cpu.cpp",
      "bool skip(const float* noop_flag) { return noop_flag != nullptr && *noop_flag == 1.0f; }",
      "bool skip(const float* noop_flag) { return noop_flag != nullptr && *noop_flag != 0.0f; }",
      "any non-zero no-op flag skips the op (documented: exactly 1.0f)"),
    M("cpu-fp8-current-scaling-skips-flag", "src/fp8/cpu/fp8_cpu.cpp",
      "amax_any(ctx, x, &a, opts.amax.nonfinite_flag);",
      "amax_any(ctx, x, &a, nullptr);",
      "quantize_current_scaling does not write the non-finite flag"),
    M("cpu-fp8-simd-inf-as-nan", "src/fp8/cpu/fp8_cast_simd.h",
      "const __m256i is_nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));",
      "const __m256i is_nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f7fffff));",
      "AVX2 cast: an infinite product becomes NaN instead of saturating to the fp8 maximum"),
    M("cpu-fp8-simd-ties-up", "src/fp8/cpu/fp8_cast_simd.h",
      "const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(Fmt::kRoundHalfMinusOne)), odd);",
      "const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(Fmt::kRoundHalfMinusOne)), _mm256_set1_epi32(1));",
      "AVX2 cast rounds ties up instead of to even"),
    M("cpu-fp8-sse-ties-up", "src/fp8/cpu/fp8_cast_simd.h",
      "const __m128i rounded = _mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32(Fmt::kRoundHalfMinusOne)), odd);",
      "const __m128i rounded = _mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32(Fmt::kRoundHalfMinusOne)), _mm_set1_epi32(1));",
      "SSE4.1 cast (the fallback without AVX2) rounds ties up"),
    M("cpu-vec4-fp16-special-threshold", "src/tbe/cpu/vec4.h",
      "const u32x4 special = (u32x4)((i32x4)em >= 0x0f800000);",
      "const u32x4 special = (u32x4)((i32x4)em > 0x0f800000);",
      "fp16 infinity decoded as a finite value in the vector loads"),
    # ---- src/tbe/cpu: forward ----
    M("cpu-forward-int32-row-offset", "src/tbe/cpu/tbe_forward_cpu.cpp",
      "const W* __restrict row = table + r * D + col;",
      "const W* __restrict row = table + static_cast<int32_t>(r * D) + col;",
      "row offset narrowed to int32 (rows beyond element 2^31 wrap)"),
    M("cpu-forward-int32-table-offset", "src/tbe/cpu/tbe_forward_cpu.cpp",
      "const W* __restrict table = weights + meta.weight_offsets[f];",
      "const W* __restrict table = weights + static_cast<int32_t>(meta.weight_offsets[f]);",
      "table offset narrowed to int32 (tables starting beyond element 2^31 wrap)"),
    M("cpu-forward-mean-empty-bag", "src/tbe/cpu/tbe_forward_cpu.cpp",
      "if (mean && count > 0) {",
      "if (mean) {",
      "MEAN of an empty bag divides 0 by 0"),
    M("cpu-forward-mean-counts-skipped", "src/tbe/cpu/tbe_forward_cpu.cpp",
      "const float n = static_cast<float>(count);",
      "const float n = static_cast<float>(end - start);",
      "MEAN divides by the bag length including skipped lookups"),
    M("cpu-forward-sequence-leading-rows", "src/tbe/cpu/tbe_forward_cpu.cpp",
      "for (int64_t r = 0; r < first * out_stride; ++r) out[r] = from_float<O>(0.0f);",
      "for (int64_t r = 0; r + out_stride < first * out_stride; ++r) out[r] = from_float<O>(0.0f);",
      "the last sequence row before offsets[0] is not zeroed"),
    M("cpu-forward-first-bad-index-last", "src/tbe/cpu/tbe_forward_cpu.cpp",
      "        --count;\n        if (check == BoundsCheckMode::kSkip) {\n          ++my_skipped;\n"
      "        } else if (check == BoundsCheckMode::kError && item < my_bad.item) {",
      "        --count;\n        if (check == BoundsCheckMode::kSkip) {\n          ++my_skipped;\n"
      "        } else if (check == BoundsCheckMode::kError && item <= my_bad.item) {",
      "with two bad indices in one bag the last one is reported, not the first"),
    M("cpu-forward-sequence-skip-not-zeroed", "src/tbe/cpu/tbe_forward_cpu.cpp",
      "            for (int64_t d = 0; d < D; ++d) o[d] = from_float<O>(0.0f);\n            continue;",
      "            continue;",
      "a skipped lookup's sequence row left unwritten"),
    M("cpu-forward-weighted-tail", "src/tbe/cpu/tbe_forward_cpu.cpp",
      "for (int64_t c = col; c < D; ++c) acc[c] += kWeighted ? w * load1(row + c) : load1(row + c);",
      "for (int64_t c = col; c < D; ++c) acc[c] += load1(row + c);",
      "per-sample weights ignored in the last D % 4 columns"),
    M("cpu-checks-negative-first-offset", "src/tbe/cpu/tbe_checks.h",
      "  if (static_cast<int64_t>(offsets[0]) < 0)\n",
      "  if (false)\n",
      "a negative first offset accepted"),
    M("cpu-checks-last-offset", "src/tbe/cpu/tbe_checks.h",
      "if (static_cast<int64_t>(offsets[TB]) != N)",
      "if (static_cast<int64_t>(offsets[TB]) > N)",
      "a last offset below N accepted"),
    M("cpu-checks-position-absolute", "src/tbe/cpu/tbe_checks.h",
      "\", position \" + std::to_string(bad.pos - start)",
      "\", position \" + std::to_string(bad.pos)",
      "the bad index's position reported within indices instead of within its bag"),
    # ---- src/tbe/cpu: backward ----
    M("cpu-backward-row-sum-tail", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "for (int k = 0; d + k < D; ++k) p[k] += term(d + k);",
      "for (int k = 0; d + k + 1 < D; ++k) p[k] += term(d + k);",
      "row sums drop the last column when D is not a multiple of 8"),
    M("cpu-backward-mean-counts-skipped", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "const float mean_scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;",
      "const float mean_scale = count > 0 ? 1.0f / static_cast<float>(end - start) : 0.0f;",
      "MEAN's gradient divided by the bag length including skipped lookups"),
    M("cpu-backward-key-bits-short", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "while ((kSkippedKey >> key_bits) != 0) ++key_bits;",
      "while ((kSkippedKey >> key_bits) > 1) ++key_bits;",
      "the radix sort skips the key's top bit"),
    M("cpu-backward-dense-pad-not-zeroed", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "for (int d = D; d < max_dim; ++d) g[d] = 0.0f;",
      "",
      "dense-mode unique_grads columns past D left unwritten"),
    M("cpu-backward-table-of-lower-bound", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "return static_cast<int>(std::upper_bound(row_first.begin(), row_first.end(), key) - row_first.begin()) - 1;",
      "return static_cast<int>(std::lower_bound(row_first.begin(), row_first.end(), key) - row_first.begin()) - 1;",
      "a table's first row attributed to the previous table"),
    M("cpu-backward-empty-num-unique", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "    if (a.optimizer.type == OptimizerType::kNone) *a.num_unique = 0;\n",
      "",
      "dense mode with no lookups leaves num_unique unwritten"),
    M("cpu-backward-gpsw-skipped-not-zeroed", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "        if (pairs[pos].key == kSkippedKey) {\n          gpsw[pos] = 0.0f;\n          continue;\n        }",
      "        if (pairs[pos].key == kSkippedKey) continue;",
      "grad_per_sample_weights of a skipped lookup left unwritten"),
    M("cpu-backward-partial-adam-state-index", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "const float denom = opt::partial_rowwise_adam_denominator(m2 + key, sum_sq, D, op, corr);",
      "const float denom = opt::partial_rowwise_adam_denominator(m2 + welem / D, sum_sq, D, op, corr);",
      "row-wise state indexed by the weight offset / D instead of the linearised row"),
    M("cpu-backward-max-norm-before-update", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "const float sum_w = row_sum(D, [&](int d) { return wv[d] * wv[d]; });",
      "const float sum_w = row_sum(D, [&](int d) { return to_float(w[d]) * to_float(w[d]); });",
      "max-norm measured on the row before the update"),
    M("cpu-backward-int32-weight-offset", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "*welem = tbe.weight_offset(t) + (key - row_first[t]) * *D;",
      "*welem = static_cast<int32_t>(tbe.weight_offset(t) + (key - row_first[t]) * *D);",
      "the backward's weight element offset narrowed to int32"),
    M("cpu-backward-rounding-fixed-step", "src/tbe/cpu/tbe_backward_cpu.cpp",
      "const uint64_t rkey = rounding_key(a.seed, op.step);",
      "const uint64_t rkey = rounding_key(a.seed, 1);",
      "stochastic rounding ignores the step"),
    # ---- src/capi ----
    M("capi-enum-last-refused", "src/capi/embscale_c.cpp",
      "if (value < 0 || value > last) {",
      "if (value < 0 || value >= last) {",
      "the last value of every enumeration refused"),
    M("capi-beta2-copy-paste", "src/capi/embscale_c.cpp",
      "o.beta2 = a->optimizer.beta2;",
      "o.beta2 = a->optimizer.beta1;",
      "beta2 read from beta1"),
    M("capi-seed-dropped", "src/capi/embscale_c.cpp",
      "  out->seed = a->seed;\n",
      "",
      "the stochastic-rounding seed is not passed on (always 0)"),
    M("capi-num-features-unchecked", "src/capi/embscale_c.cpp",
      "    } else if (num_features != num_tables) {\n"
      "      return embscale::invalid_argument(\"num_features: must equal num_tables when feature_table_map is null\");\n"
      "    }\n",
      "    }\n",
      "a num_features that disagrees with num_tables accepted without a map"),
    M("capi-row-offsets", "src/capi/embscale_c.cpp",
      "if (row_offsets != nullptr) row_offsets[t] = tbe->impl->row_offset(t);",
      "if (row_offsets != nullptr) row_offsets[t] = tbe->impl->weight_offset(t);",
      "row offsets reported as weight offsets"),
    M("capi-amax-flag-dropped", "src/capi/embscale_c.cpp",
      "    a.opts.nonfinite_flag = nonfinite_flag;\n",
      "",
      "embscale_amax ignores its non-finite flag"),
    M("capi-power-of-2-dropped", "src/capi/embscale_c.cpp",
      "    opts.power_of_2 = power_of_2 != 0;\n    return embscale::compute_scale(",
      "    return embscale::compute_scale(",
      "embscale_compute_scale ignores power_of_2"),
    M("capi-last-error-stale", "src/capi/embscale_c.cpp",
      "g_last_error = st.ok() ? std::string() : st.message();",
      "if (!st.ok()) g_last_error = st.message();",
      "embscale_last_error() keeps an old message after a call that succeeded"),
]


# --------------------------------------------------------------------------------------------------

def check_list(root, mutants, verbose=True):
    """Every snippet exactly once in its file, replacement different, ids unique. Returns problems."""
    problems = []
    seen = set()
    for m in mutants:
        if m.id in seen:
            problems.append(f"{m.id}: duplicate id")
        seen.add(m.id)
        path = os.path.join(root, m.file)
        if not os.path.isfile(path):
            problems.append(f"{m.id}: {m.file} does not exist")
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        n = text.count(m.find)
        if n != 1:
            problems.append(f"{m.id}: snippet found {n} times in {m.file}")
        if m.find == m.replace:
            problems.append(f"{m.id}: replacement equals the snippet")
        if not m.file.startswith("src/") or "/cuda/" in m.file:
            problems.append(f"{m.id}: {m.file} is not a CPU library source (src/ outside any cuda/ folder)")
    if verbose:
        for m in mutants:
            print(f"{m.id:45s} {m.file:32s} {m.why}")
        by = {}
        for m in mutants:
            by[m.folder] = by.get(m.folder, 0) + 1
        print(f"{len(mutants)} mutants: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())))
    return problems


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def sync_tree(src_dir, dst_dir):
    """Makes dst_dir hold exactly src_dir's files (build-mut kept); unchanged files keep their mtime so
    the incremental build stays incremental."""
    os.makedirs(dst_dir, exist_ok=True)
    wanted = set()
    for base, dirs, files in os.walk(src_dir):
        rel = os.path.relpath(base, src_dir)
        for name in files:
            r = os.path.normpath(os.path.join(rel, name))
            wanted.add(r)
            s, d = os.path.join(src_dir, r), os.path.join(dst_dir, r)
            with open(s, "rb") as f:
                data = f.read()
            if os.path.isfile(d):
                with open(d, "rb") as f:
                    if f.read() == data:
                        continue
            os.makedirs(os.path.dirname(d), exist_ok=True)
            with open(d, "wb") as f:
                f.write(data)
            shutil.copymode(s, d)
    for base, dirs, files in os.walk(dst_dir):
        rel = os.path.relpath(base, dst_dir)
        if rel.split(os.sep)[0] == "build-mut":
            dirs[:] = []
            continue
        for name in files:
            r = os.path.normpath(os.path.join(rel, name))
            if r not in wanted:
                os.remove(os.path.join(dst_dir, r))


def export_tree(args):
    """Exports the tree to measure into args.tree; returns a description of what was measured."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.worktree:
            files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                                   stdout=subprocess.PIPE).stdout.decode().split("\0")
            for r in filter(None, files):
                s = os.path.join(ROOT, r)
                if os.path.isfile(s):
                    os.makedirs(os.path.dirname(os.path.join(tmp, r)), exist_ok=True)
                    shutil.copy2(s, os.path.join(tmp, r))
            rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                                 stdout=subprocess.PIPE, text=True).stdout.strip()
            what = f"working tree on {rev}"
        else:
            rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=ROOT, check=True,
                                 stdout=subprocess.PIPE, text=True).stdout.strip()
            archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, check=True,
                                     stdout=subprocess.PIPE).stdout
            tar_path = os.path.join(tmp, "tree.tar")
            with open(tar_path, "wb") as f:
                f.write(archive)
            with tarfile.open(tar_path) as t:
                t.extractall(os.path.join(tmp, "x"))
            os.remove(tar_path)
            shutil.move(os.path.join(tmp, "x"), os.path.join(tmp, "y"))
            tmp = os.path.join(tmp, "y")
            what = f"commit {rev}"
        sync_tree(tmp, args.tree)
    return what


class Runner:
    def __init__(self, args):
        self.args = args
        self.tree = args.tree
        self.build = os.path.join(self.tree, "build-mut")
        self.env = dict(os.environ)

    def configure(self):
        run(["cmake", "-S", self.tree, "-B", self.build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
             "-DEMBSCALE_CUDA=OFF", "-DEMBSCALE_BUILD_TOOLS=OFF"], stdout=subprocess.DEVNULL)

    def build_ok(self):
        r = subprocess.run(["cmake", "--build", self.build, "-j", str(self.args.jobs)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        return r.returncode == 0, r.stdout[-3000:]

    def _procs_until_failure(self, cmds, timeout):
        """Runs the commands concurrently; stops all at the first failure. Returns (ok, detail)."""
        procs = []
        # Output goes to files, not pipes: a test that prints more than a pipe holds must not block.
        for cmd, cwd, env in cmds:
            log = tempfile.TemporaryFile()
            procs.append((cmd, subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True), log))
        deadline = time.time() + timeout
        done = set()
        failed = None
        try:
            while True:
                running = 0
                for cmd, p, log in procs:
                    if p.poll() is None:
                        running += 1
                    elif id(p) not in done:
                        done.add(id(p))
                        if p.returncode != 0 and failed is None:
                            log.seek(0)
                            failed = (cmd, p.returncode, log.read().decode(errors="replace"))
                if failed or running == 0:
                    break
                if time.time() > deadline:
                    failed = (["timeout"], -1, f"timed out after {timeout} s")
                    break
                time.sleep(0.2)
        finally:
            for _, p, log in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                log.close()
        if failed is None:
            return True, ""
        cmd, rc, out = failed
        if rc == -1:
            return False, out
        lines = out.splitlines()
        # The first failed test (gtest, pytest, ctest), else the first failure line, else the last line.
        picks = ([l for l in lines if re.match(r"\[  FAILED  \] [A-Za-z_]", l)] or
                 [l for l in lines if l.startswith("FAILED ") or "tests FAILED" in l or l.strip().endswith("(Failed)")] or
                 [l for l in lines if "Failure" in l or "Error" in l] or lines[-1:] or [""])
        detail = picks[0].strip()
        if rc < 0:
            detail = f"killed by signal {-rc}; " + detail
        return False, f"{os.path.basename(cmd[0])} rc={rc}: {detail[:300]}"

    def gtest(self, gtest_filter):
        exe = os.path.join(self.build, "embscale_tests")
        cmds = []
        shards = self.args.shards
        for i in range(shards):
            env = dict(self.env, GTEST_TOTAL_SHARDS=str(shards), GTEST_SHARD_INDEX=str(i))
            cmds.append(([exe, "--gtest_fail_fast", "--gtest_brief=1", "--gtest_filter=" + gtest_filter], self.build,
                         env))
        return self._procs_until_failure(cmds, self.args.timeout)

    def cpp_tests(self, focus=None):
        for f in ([focus, "-" + focus] if focus else ["*"]):
            ok, detail = self.gtest(f)
            if not ok:
                return False, "C++: " + detail
        # The other ctest tests of the build: the examples and, where the tree has them, the fuzzers.
        cmd = ["ctest", "--test-dir", self.build, "-R", r"^(example|fuzz)\.", "-j", str(self.args.shards),
               "--stop-on-failure", "--output-on-failure"]
        ok, detail = self._procs_until_failure([(cmd, self.build, self.env)], self.args.timeout)
        if not ok:
            return False, "ctest: " + detail
        return True, ""

    def python_tests(self):
        env = dict(self.env, EMBSCALE_LIBRARY=os.path.join(self.build, "libembscale_c.so"),
                   PYTHONPATH=os.path.join(self.tree, "python"))
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "tests/python"]
        ok, detail = self._procs_until_failure([(cmd, self.tree, env)], self.args.timeout)
        if ok:
            return True, ""
        return False, "Python: " + detail

    def all_tests(self, m=None):
        """C++ tests (the mutant's focus first), then the Python tests; for a C API mutant the Python
        tests first (they are its main callers)."""
        stages = [lambda: self.cpp_tests(m.focus if m else None)]
        if not self.args.no_python:
            stages.append(self.python_tests)
        if m is not None and m.folder == "src/capi":
            stages.reverse()
        for stage in stages:
            ok, detail = stage()
            if not ok:
                return False, detail
        return True, ""


def apply_and_test(runner, m):
    path = os.path.join(runner.tree, m.file)
    with open(path, "rb") as f:
        original = f.read()
    text = original.decode("utf-8")
    if text.count(m.find) != 1:
        return {"status": "invalid", "detail": f"snippet found {text.count(m.find)} times"}
    t0 = time.time()
    try:
        with open(path, "wb") as f:
            f.write(text.replace(m.find, m.replace).encode("utf-8"))
        ok, log = runner.build_ok()
        if not ok:
            return {"status": "build_error", "detail": log[-600:], "seconds": round(time.time() - t0)}
        passed, detail = runner.all_tests(m)
        return {"status": "survived" if passed else "killed", "detail": detail, "seconds": round(time.time() - t0)}
    finally:
        with open(path, "wb") as f:
            f.write(original)
        with open(path, "rb") as f:
            assert f.read() == original, f"failed to restore {m.file}"


def summarize(results, mutants):
    by_folder = {}
    for m in mutants:
        r = results.get(m.id)
        if r is None or r["status"] not in ("killed", "survived"):
            continue
        k, n = by_folder.get(m.folder, (0, 0))
        by_folder[m.folder] = (k + (r["status"] == "killed"), n + 1)
    lines = []
    tk = tn = 0
    for folder in sorted(by_folder):
        k, n = by_folder[folder]
        lines.append(f"  {folder:12s} {k:3d}/{n:<3d} caught ({100.0 * k / n:5.1f}%)")
        if folder != "src/capi":
            tk, tn = tk + k, tn + n
    if tn:
        lines.append(f"  common+api+cpu {tk}/{tn} caught ({100.0 * tk / tn:.1f}%)")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="run only mutants whose id or file contains this string (several: comma-separated)")
    ap.add_argument("--list", action="store_true", help="list the mutants and check every snippet (exit 1 on a problem)")
    ap.add_argument("--quiet", action="store_true", help="with --list: print problems only")
    ap.add_argument("--tree", default=os.path.join(tempfile.gettempdir(), "embscale-mutation"),
                    help="private copy of the tree to mutate (default: %(default)s)")
    ap.add_argument("--rev", default="HEAD", help="git revision to measure (default: HEAD)")
    ap.add_argument("--worktree", action="store_true", help="measure the working tree's files instead of --rev")
    ap.add_argument("--jobs", type=int, default=2, help="build parallelism (default: %(default)s)")
    ap.add_argument("--shards", type=int, default=2, help="parallel shards of embscale_tests (default: %(default)s)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per test stage (default: %(default)s)")
    ap.add_argument("--no-python", action="store_true", help="C++ tests only")
    ap.add_argument("--results", default=None, help="JSON lines output (default: <tree>/mutation_results.jsonl)")
    ap.add_argument("--resume", action="store_true",
                    help="skip the mutants the results file already holds a verdict for (same measured tree)")
    args = ap.parse_args()

    patterns = [p for p in (args.only or "").split(",") if p]
    mutants = [m for m in MUTANTS if not patterns or any(p in m.id or p in m.file for p in patterns)]
    if args.list:
        problems = check_list(ROOT, mutants, verbose=not args.quiet)
        for p in problems:
            print("problem:", p, file=sys.stderr)
        return 1 if problems else 0
    if not mutants:
        print("no mutant matches", args.only, file=sys.stderr)
        return 2
    if os.path.realpath(args.tree).startswith(os.path.realpath(ROOT) + os.sep) or \
            os.path.realpath(args.tree) == os.path.realpath(ROOT):
        print("--tree must be outside the repository: the shared tree is never mutated", file=sys.stderr)
        return 2

    # SIGTERM ends the run like Ctrl-C: through the finally blocks, so the copy is restored.
    def on_term(signum, _frame):
        print(f"stopped by signal {signum}; restoring the copy", file=sys.stderr, flush=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    what = export_tree(args)
    problems = check_list(args.tree, mutants, verbose=False)
    if problems:
        for p in problems:
            print("problem:", p, file=sys.stderr)
        return 1
    results_path = args.results or os.path.join(args.tree, "mutation_results.jsonl")
    runner = Runner(args)
    started = time.time()
    print(f"measuring {what} in {args.tree}; {len(mutants)} mutants; results -> {results_path}", flush=True)
    runner.configure()
    ok, log = runner.build_ok()
    if not ok:
        print("baseline build failed:\n" + log, file=sys.stderr)
        return 1
    ok, detail = runner.all_tests()
    if not ok:
        print("baseline tests fail, nothing to measure: " + detail, file=sys.stderr)
        return 1
    print(f"baseline built and passing ({time.time() - started:.0f} s)", flush=True)

    results = {}
    if args.resume and os.path.exists(results_path):
        with open(results_path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("measured") == what and r["status"] in ("killed", "survived"):
                    results[r["id"]] = r
    with open(results_path, "a") as out:
        for i, m in enumerate(mutants, 1):
            if m.id in results:
                r = results[m.id]
                print(f"[{i}/{len(mutants)}] {r['status']:11s} {m.id:45s} (earlier run)", flush=True)
                continue
            r = apply_and_test(runner, m)
            r.update(id=m.id, file=m.file, why=m.why, measured=what,
                     date=datetime.datetime.now().isoformat(timespec="seconds"))
            results[m.id] = r
            out.write(json.dumps(r) + "\n")
            out.flush()
            print(f"[{i}/{len(mutants)}] {r['status']:11s} {m.id:45s} {r.get('seconds', 0):4d} s  {r['detail'][:140]}",
                  flush=True)
    # Leave the copy built from unmutated sources.
    runner.build_ok()
    print(f"\n{what}: {len(mutants)} mutants in {(time.time() - started) / 60:.1f} min")
    print(summarize(results, mutants))
    survivors = [m for m in mutants if results[m.id]["status"] == "survived"]
    for m in survivors:
        print(f"  survived: {m.id} ({m.file}): {m.why}")
    broken = [m for m in mutants if results[m.id]["status"] in ("build_error", "invalid")]
    for m in broken:
        print(f"  not measured ({results[m.id]['status']}): {m.id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
