// Seeded rotating inputs and outputs of `embscale bench fp8` (bench_fp8.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bench_fp8.h"
#include "core/numerics.h"

namespace embscale {
namespace tools {
namespace fp8_bench {
namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Element i of the seeded input: roughly normal (a sum of three uniforms, standard deviation 1,
// range about +-5.2) so amax is a rare element and the fp8 cast sees a realistic spread of exponents.
// A counter-based hash makes the data independent of the thread count.
float input_value(uint64_t seed, int64_t i) {
  const uint64_t h = splitmix64(seed ^ (static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull));
  const float u0 = static_cast<float>(h & 0x1fffff) * (1.0f / 2097152.0f);
  const float u1 = static_cast<float>((h >> 21) & 0x1fffff) * (1.0f / 2097152.0f);
  const float u2 = static_cast<float>((h >> 42) & 0x1fffff) * (1.0f / 2097152.0f);
  return (u0 + u1 + u2 - 1.5f) * 2.0f;
}

// Stores v as dtype at dst; returns |v| as stored (the exact amax contribution).
float store_as(DType t, void* dst, float v) {
  switch (t) {
    case DType::kF16: {
      const uint16_t b = float_to_fp16(v);
      std::memcpy(dst, &b, 2);
      return std::fabs(fp16_to_float(b));
    }
    case DType::kBF16: {
      const uint16_t b = float_to_bf16(v);
      std::memcpy(dst, &b, 2);
      return std::fabs(bf16_to_float(b));
    }
    default:
      std::memcpy(dst, &v, 4);
      return std::fabs(v);
  }
}

// Copy 0 from the host, then the copies made so far doubled at each step (copies [0, k) to [k, 2k)),
// so even hundreds of thousands of small copies take a few dozen copy calls.
Status replicate(const Context& ctx, Buffer* buf, size_t stride, int copies, const std::vector<unsigned char>& host) {
  EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, buf->data(), host.data(), host.size()));
  if (copies > 1 && stride > host.size())  // the padding of copy 0 too, so every byte copied is defined
    EMBSCALE_RETURN_IF_ERROR(fill_bytes(ctx, buf->as<char>() + host.size(), 0, stride - host.size()));
  for (size_t done = 1; done < static_cast<size_t>(copies);) {
    const size_t step = std::min(done, static_cast<size_t>(copies) - done);
    EMBSCALE_RETURN_IF_ERROR(copy_within_backend(ctx, buf->as<char>() + done * stride, buf->data(), step * stride));
    done += step;
  }
  return synchronize(ctx);
}

}  // namespace

Status make_input(const Context& ctx, DType dtype, int64_t n, int copies, uint64_t seed, InputSet* in) {
  const size_t es = dtype_size(dtype);
  std::vector<unsigned char> host(static_cast<size_t>(n) * es);
  float amax = 0;
#pragma omp parallel for reduction(max : amax) schedule(static)
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, store_as(dtype, host.data() + i * es, input_value(seed, i)));
  in->stride = round_up(host.size());
  in->copies = copies;
  in->n = n;
  in->dtype = dtype;
  in->amax = amax;
  in->data = Buffer(ctx.backend, in->stride * copies);
  if (!in->data.valid())
    return Status(StatusCode::kBackendError, "input: allocation of " + std::to_string(in->stride * copies) + " bytes failed");
  return replicate(ctx, &in->data, in->stride, copies, host);
}

Status make_fp8_input(const Context& ctx, DType fp8, int64_t n, int copies, uint64_t seed, InputSet* in) {
  std::vector<unsigned char> host(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint8_t b = static_cast<uint8_t>(splitmix64(seed ^ (static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull)) >> 56);
    if (fp8 == DType::kF8E4M3 && (b & 0x7f) == 0x7f) b ^= 0x01;
    if (fp8 == DType::kF8E5M2 && (b & 0x7c) == 0x7c) b ^= 0x40;
    host[i] = b;
  }
  in->stride = round_up(host.size());
  in->copies = copies;
  in->n = n;
  in->dtype = fp8;
  in->data = Buffer(ctx.backend, in->stride * copies);
  if (!in->data.valid())
    return Status(StatusCode::kBackendError, "input: allocation of " + std::to_string(in->stride * copies) + " bytes failed");
  return replicate(ctx, &in->data, in->stride, copies, host);
}

Status make_output(Backend b, size_t bytes, int copies, OutputSet* out) {
  out->stride = round_up(bytes);
  out->copies = copies;
  out->data = Buffer(b, out->stride * copies);
  if (!out->data.valid())
    return Status(StatusCode::kBackendError, "output: allocation of " + std::to_string(out->stride * copies) + " bytes failed");
  // Touch every page once, so timed calls do not pay first-touch page faults (host) or lazy mapping.
  Context ctx;
  ctx.backend = b;
  EMBSCALE_RETURN_IF_ERROR(fill_bytes(ctx, out->data.data(), 0x5a, out->stride * copies));
  return synchronize(ctx);
}

}  // namespace fp8_bench
}  // namespace tools
}  // namespace embscale
