// quantize_current_scaling with x marked persisting in L2 by the user: a persisting set-aside
// (cudaLimitPersistingL2CacheSize, device-wide) and a stream access-policy window over x, so the cast's
// second read of x might come from L2. The library sets neither (both belong to the user); this program
// measures what a user who sets them gets. Record: bench/results/2026-12-03-nvidia-h200-qcs-l2-persisting-window.md.
//
// bf16 -> e4m3 at 2^22..2^25 elements; inputs rotate through enough copies to cover 3x the L2 (as
// `embscale bench fp8` does). Modes, alternated per size: none (no set-aside, no window), window
// (set-aside = the device's maximum, window over the whole call's x, hitRatio 1), window_ratio (hitRatio
// = set-aside / window). Each call's amax is checked against the host's. One JSON record per line.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "embscale/context.h"
#include "embscale/fp8.h"
#include "embscale/tensor.h"

using namespace embscale;

int main() {
  const unsigned seed = 20261203;
  std::fprintf(stderr, "seed %u\n", seed);
  int l2 = 0, max_persist = 0, max_window = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  CK(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, 0));
  CK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, 0));
  std::fprintf(stderr, "L2 %d B, max persisting set-aside %d B, max window %d B\n", l2, max_persist, max_window);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const Context ctx = Context::cuda(s);
  const char* modes[] = {"none", "window", "window_ratio"};
  for (int lg = 22; lg <= 25; ++lg) {
    const int64_t n = int64_t{1} << lg;
    const size_t xb = static_cast<size_t>(n) * 2;
    const int copies = std::max(3, static_cast<int>(3.0 * l2 / xb) + 1);
    std::vector<__nv_bfloat16> h(n);
    std::mt19937 rng(seed + lg);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    float want = 0.0f;
    for (auto& v : h) {
      v = __float2bfloat16(dist(rng));
      want = std::max(want, std::fabs(__bfloat162float(v)));
    }
    std::vector<void*> xs(copies), ys(copies);
    for (int c = 0; c < copies; ++c) {
      CK(cudaMalloc(&xs[c], xb));
      CK(cudaMalloc(&ys[c], n));
      CK(cudaMemcpy(xs[c], h.data(), xb, cudaMemcpyHostToDevice));
    }
    float* dev_f = nullptr;  // amax, scale, scale_inv
    CK(cudaMalloc(&dev_f, 3 * sizeof(float)));
    const CurrentScalingOptions opts;
    size_t ws_bytes = 0;
    if (!quantize_current_scaling_workspace_size(ctx, TensorView::vec(xs[0], DType::kBF16, n), opts, &ws_bytes).ok()) return 1;
    void* ws = nullptr;
    if (ws_bytes > 0) CK(cudaMalloc(&ws, ws_bytes));
    for (int mode = 0; mode < 3; ++mode) {
      const size_t set_aside = mode == 0 ? 0 : static_cast<size_t>(max_persist);
      CK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, set_aside));
      CK(cudaCtxResetPersistingL2Cache());
      auto call = [&](int c) {
        cudaStreamAttrValue a = {};
        if (mode > 0) {
          a.accessPolicyWindow.base_ptr = xs[c];
          a.accessPolicyWindow.num_bytes = std::min<size_t>(xb, static_cast<size_t>(max_window));
          a.accessPolicyWindow.hitRatio =
              mode == 1 ? 1.0f : std::min(1.0f, static_cast<float>(set_aside) / a.accessPolicyWindow.num_bytes);
          a.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
          a.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
        }
        if (cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &a) != cudaSuccess) return false;
        return quantize_current_scaling(ctx, TensorView::vec(xs[c], DType::kBF16, n), TensorView::vec(ys[c], DType::kF8E4M3, n),
                                        dev_f, dev_f + 1, dev_f + 2, opts, ws, ws_bytes)
            .ok();
      };
      for (int i = 0; i < 2 * copies; ++i)
        if (!call(i % copies)) return 1;
      CK(cudaStreamSynchronize(s));
      float got = -1.0f;
      CK(cudaMemcpy(&got, dev_f, sizeof(float), cudaMemcpyDeviceToHost));
      if (got != want) {
        std::fprintf(stderr, "2^%d %s: amax %g, host %g\n", lg, modes[mode], got, want);
        return 1;
      }
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      std::vector<float> per_call;
      const int calls = 50;
      for (int b = 0; b < 30; ++b) {
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < calls; ++i)
          if (!call((b * calls + i) % copies)) return 1;
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        per_call.push_back(ms * 1000.0f / calls);
      }
      std::sort(per_call.begin(), per_call.end());
      std::printf("{\"op\":\"quantize_current_scaling\",\"impl\":\"embscale\",\"dtype\":\"bf16\",\"n\":%lld,"
                  "\"l2_mode\":\"%s\",\"set_aside_bytes\":%zu,\"copies\":%d,\"median_us\":%.2f,\"min_us\":%.2f}\n",
                  static_cast<long long>(n), modes[mode], set_aside, copies, per_call[per_call.size() / 2],
                  per_call[0]);
      cudaStreamAttrValue none = {};
      CK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &none));
      CK(cudaEventDestroy(e0));
      CK(cudaEventDestroy(e1));
    }
    CK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0));
    for (int c = 0; c < copies; ++c) {
      CK(cudaFree(xs[c]));
      CK(cudaFree(ys[c]));
    }
    CK(cudaFree(dev_f));
    if (ws != nullptr) CK(cudaFree(ws));
  }
  return 0;
}
