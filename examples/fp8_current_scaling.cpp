// Quantize a bf16 tensor to fp8 e4m3 with current scaling: amax -> scale -> cast in one call.
// Runs on the CUDA backend when a GPU is present, else on the CPU; the code is the same.
#include <cstdio>
#include <cstring>
#include <vector>

#include "embscale/fp8.h"
#include "embscale/memory.h"

int main() {
  using namespace embscale;
  const Context ctx = backend_available(Backend::kCuda) ? Context::cuda() : Context::cpu();
  const int64_t n = 1000003;

  std::vector<uint16_t> host_x(n);  // bf16 bits of a ramp in [-3, 3)
  for (int64_t i = 0; i < n; ++i) {
    const float v = -3.0f + 6.0f * static_cast<float>(i) / static_cast<float>(n);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    host_x[i] = static_cast<uint16_t>(u >> 16);
  }

  Buffer x(ctx.backend, n * 2), y(ctx.backend, n), scalars(ctx.backend, 3 * sizeof(float));
  if (!copy_to_backend(ctx, x.data(), host_x.data(), n * 2).ok()) return 1;
  float* amax = scalars.as<float>();
  float* scale = amax + 1;
  float* scale_inv = amax + 2;

  const TensorView xv = TensorView::vec(x.data(), DType::kBF16, n);
  const TensorView yv = TensorView::vec(y.data(), DType::kF8E4M3, n);
  CurrentScalingOptions opts;  // eps 0, no power-of-2 rounding, amax algorithm chosen by size
  size_t ws_bytes = 0;
  Status st = quantize_current_scaling_workspace_size(ctx, xv, opts, &ws_bytes);
  Buffer ws(ctx.backend, ws_bytes);
  if (st.ok()) st = quantize_current_scaling(ctx, xv, yv, amax, scale, scale_inv, opts, ws.data(), ws_bytes);
  float host_s[3];
  if (st.ok()) st = copy_to_host(ctx, host_s, scalars.data(), sizeof host_s);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  std::printf("backend %s: amax %g, scale %g, scale_inv %g\n", backend_name(ctx.backend), host_s[0], host_s[1],
              host_s[2]);
  // Bad input is a Status naming the argument, never a crash:
  st = quantize(ctx, xv, scale, TensorView::vec(y.data(), DType::kF32, n));
  std::printf("quantize into fp32: %s\n", st.to_string().c_str());
  return host_s[0] == 3.0f ? 0 : 1;
}
