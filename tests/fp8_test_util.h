// Shared plumbing of the FP8 tests: a fixture parametrised over backends (CUDA tests skip themselves
// when no device is present), buffers in the backend's memory filled from and read back into the
// oracle's host tensors, seeded random inputs, and poisoning of outputs.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "embscale/context.h"
#include "embscale/fp8.h"
#include "embscale/memory.h"
#include "reference_fp8.h"

namespace embscale {
namespace fp8test {

constexpr uint64_t kBaseSeed = 20261130;
constexpr uint8_t kPoisonByte = 0xA5;  // as fp32 / fp16 / bf16 / fp8 a finite, unlikely value

class Fp8Test : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
  }
  Backend backend() const { return GetParam(); }
  Context ctx() const { return GetParam() == Backend::kCuda ? Context::cuda(nullptr) : Context::cpu(); }
};

inline std::string backend_param_name(const ::testing::TestParamInfo<Backend>& info) {
  return backend_name(info.param);
}

#define EMBSCALE_FP8_INSTANTIATE(Suite)                                                            \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite, ::testing::Values(Backend::kCpu, Backend::kCuda), \
                           ::embscale::fp8test::backend_param_name)

// The seed of one random case, printed so a failure can be replayed.
inline uint64_t case_seed(uint64_t salt) {
  const uint64_t s = kBaseSeed * 1000003ull + salt;
  std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(s));
  return s;
}

// A tensor in backend memory, optionally starting `offset` elements into its allocation so the data
// pointer is misaligned relative to any vector width.
struct DevTensor {
  Buffer buf;
  DType dtype = DType::kF32;
  int64_t offset = 0;
  int64_t n = 0;

  DevTensor(Backend b, DType t, int64_t numel, int64_t offset_elems = 0)
      : buf(b, static_cast<size_t>(numel + offset_elems) * dtype_size(t) + 1), dtype(t), offset(offset_elems), n(numel) {}
  void* data() const { return static_cast<uint8_t*>(buf.data()) + offset * dtype_size(dtype); }
  size_t bytes() const { return static_cast<size_t>(n) * dtype_size(dtype); }
  TensorView vec() const { return TensorView::vec(data(), dtype, n); }
  TensorView mat(int64_t rows, int64_t cols) const { return TensorView::mat(data(), dtype, rows, cols); }

  Status upload(const Context& ctx, const ref::HostTensor& h) const {
    return copy_to_backend(ctx, data(), h.bytes.data(), bytes());
  }
  Status poison(const Context& ctx) const { return fill_bytes(ctx, buf.data(), kPoisonByte, buf.bytes()); }
  // True when the bytes around the tensor inside its allocation still hold the poison (no stray writes).
  bool guards_intact(const Context& ctx) const {
    std::vector<uint8_t> all(buf.bytes());
    if (!copy_to_host(ctx, all.data(), buf.data(), all.size()).ok()) return false;
    const size_t b = static_cast<size_t>(offset) * dtype_size(dtype), e = b + bytes();
    for (size_t i = 0; i < all.size(); ++i)
      if ((i < b || i >= e) && all[i] != kPoisonByte) return false;
    return true;
  }
  ref::HostTensor download(const Context& ctx) const {
    ref::HostTensor h(dtype, n);
    EXPECT_TRUE(copy_to_host(ctx, h.bytes.data(), data(), bytes()).ok());
    return h;
  }
};

// One scalar in backend memory.
template <typename T>
struct DevScalar {
  Buffer buf;
  explicit DevScalar(Backend b) : buf(b, sizeof(T)) {}
  T* ptr() const { return buf.as<T>(); }
  void set(const Context& ctx, T v) const { EXPECT_TRUE(copy_to_backend(ctx, buf.data(), &v, sizeof(T)).ok()); }
  T get(const Context& ctx) const {
    T v;
    EXPECT_TRUE(copy_to_host(ctx, &v, buf.data(), sizeof(T)).ok());
    return v;
  }
  void poison(const Context& ctx) const { EXPECT_TRUE(fill_bytes(ctx, buf.data(), kPoisonByte, sizeof(T)).ok()); }
};

inline uint32_t float_bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float poison_float() {
  float f;
  const uint32_t u = 0xA5A5A5A5u;
  std::memcpy(&f, &u, 4);
  return f;
}

// Normal(0, sigma) values rounded into x's dtype; a few elements of larger magnitude so the maximum
// sits at a random position rather than wherever the tail happens to be.
inline void fill_random(ref::HostTensor* x, std::mt19937_64& rng, double sigma = 3.0) {
  std::normal_distribution<double> nd(0.0, sigma);
  for (int64_t i = 0; i < x->numel(); ++i) x->set(i, nd(rng));
  if (x->numel() > 0) {
    std::uniform_int_distribution<int64_t> pos(0, x->numel() - 1);
    for (int k = 0; k < 3; ++k) x->set(pos(rng), nd(rng) * 8.0);
  }
}

inline const DType kFloatDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
inline const DType kFp8DTypes[] = {DType::kF8E4M3, DType::kF8E5M2};

}  // namespace fp8test
}  // namespace embscale
