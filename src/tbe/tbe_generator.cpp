// Seeded TBE inputs (embscale/tbe_generator.h). Each feature draws from its own random stream (seeded
// from (seed, feature)), so features are generated in parallel with a result independent of the
// thread count. Bag sizes are drawn first (one stream per feature), offsets are their prefix sums,
// then each feature's indices come from a second stream.
#include "embscale/tbe_generator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "core/dispatch.h"
#include "core/numerics.h"

namespace embscale {

const void* TbeInputs::indices_data() const {
  return index_dtype == DType::kI32 ? static_cast<const void*>(indices32.data()) : static_cast<const void*>(indices.data());
}
const void* TbeInputs::offsets_data() const {
  return index_dtype == DType::kI32 ? static_cast<const void*>(offsets32.data()) : static_cast<const void*>(offsets.data());
}
size_t TbeInputs::indices_bytes() const { return indices.size() * dtype_size(index_dtype); }
size_t TbeInputs::offsets_bytes() const { return offsets.size() * dtype_size(index_dtype); }

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// xoshiro256** (Blackman & Vigna): small, fast, and identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& w : s_) {
      seed = splitmix64(seed);
      w = seed;
    }
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, n) by the multiply-shift map; its bias is below n / 2^64, negligible here.
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }
  // Uniform in [0, 1) with 53 random bits.
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

uint64_t stream_seed(uint64_t seed, uint64_t stream, uint64_t feature) {
  return splitmix64(splitmix64(seed ^ (stream * 0xd1b54a32d192ed03ull)) + feature);
}

// Zipf(alpha) over ranks 1..E: exact inverse CDF for the first kExactRanks ranks, the continuous
// density for the rest (see tbe_generator.h).
class ZipfSampler {
 public:
  static constexpr int64_t kExactRanks = int64_t{1} << 20;

  ZipfSampler(int64_t E, double alpha) : E_(E), alpha_(alpha) {
    const int64_t K = std::min(E, kExactRanks);
    cdf_.resize(static_cast<size_t>(K));
    double acc = 0;
    for (int64_t k = 1; k <= K; ++k) {
      acc += std::pow(static_cast<double>(k), -alpha);
      cdf_[static_cast<size_t>(k - 1)] = acc;
    }
    head_ = acc;
    tail_start_ = static_cast<double>(K) + 0.5;
    tail_ = E > K ? integral(tail_start_, static_cast<double>(E) + 0.5) : 0.0;
  }

  // Rank in [1, E].
  int64_t sample(Rng& rng) const {
    const double x = rng.unit() * (head_ + tail_);
    if (x < head_ || tail_ == 0.0) {
      const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), x);
      return std::min<int64_t>(static_cast<int64_t>(it - cdf_.begin()) + 1, static_cast<int64_t>(cdf_.size()));
    }
    const double y = inverse_integral(tail_start_, x - head_);
    const int64_t k = static_cast<int64_t>(std::floor(y + 0.5));
    return std::min(std::max(k, static_cast<int64_t>(cdf_.size()) + 1), E_);
  }

 private:
  // Integral of x^-alpha over [s, y].
  double integral(double s, double y) const {
    if (std::fabs(alpha_ - 1.0) < 1e-12) return std::log(y / s);
    return (std::pow(y, 1.0 - alpha_) - std::pow(s, 1.0 - alpha_)) / (1.0 - alpha_);
  }
  // y such that integral(s, y) == r.
  double inverse_integral(double s, double r) const {
    if (std::fabs(alpha_ - 1.0) < 1e-12) return s * std::exp(r);
    return std::pow(std::pow(s, 1.0 - alpha_) + (1.0 - alpha_) * r, 1.0 / (1.0 - alpha_));
  }

  int64_t E_;
  double alpha_;
  std::vector<double> cdf_;  // [min(E, 2^20)] cumulative unnormalised mass of ranks 1..k
  double head_ = 0, tail_ = 0, tail_start_ = 0;
};

uint64_t gcd_u64(uint64_t a, uint64_t b) {
  while (b) {
    const uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// An odd-looking multiplier coprime to E, so rank -> row is a bijection of [0, E).
uint64_t spread_multiplier(uint64_t E) {
  if (E <= 2) return 1;
  uint64_t m = 0x9e3779b97f4a7c15ull % E;
  if (m < 2) m = 2;
  while (gcd_u64(m, E) != 1) ++m;
  return m;
}

}  // namespace

Status generate_tbe_inputs(const TbeInputSpec& spec, TbeInputs* out) {
  if (out == nullptr) return invalid_argument("out: must not be null");
  if (spec.batch_size < 0) return invalid_argument("batch_size: " + std::to_string(spec.batch_size) + " is negative");
  if (spec.bag_size < 0) return invalid_argument("bag_size: " + std::to_string(spec.bag_size) + " is negative");
  if (!(spec.alpha >= 0.0) || !std::isfinite(spec.alpha))
    return invalid_argument("alpha: " + std::to_string(spec.alpha) + "; expected 0 (uniform) or a finite value > 0");
  if (!is_index_dtype(spec.index_dtype))
    return invalid_argument(std::string("index_dtype: ") + dtype_name(spec.index_dtype) + "; expected int32 or int64");
  for (size_t f = 0; f < spec.num_rows.size(); ++f)
    if (spec.num_rows[f] < 1)
      return invalid_argument("num_rows[" + std::to_string(f) + "]: " + std::to_string(spec.num_rows[f]) +
                              "; a table needs at least 1 row");

  const int64_t T = static_cast<int64_t>(spec.num_rows.size());
  const int64_t B = spec.batch_size;
  const int64_t L = spec.bag_size;
  if (T > 0 && B > (int64_t{1} << 40) / T) return invalid_argument("batch_size: too large for the number of features");
  if (spec.index_dtype == DType::kI32) {
    const int64_t max_n = T * B * (spec.variable_bag_size ? 2 * L : L);
    if (max_n > INT32_MAX) return invalid_argument("index_dtype: int32 cannot address up to " + std::to_string(max_n) + " lookups");
    for (size_t f = 0; f < spec.num_rows.size(); ++f)
      if (spec.num_rows[f] - 1 > INT32_MAX)
        return invalid_argument("index_dtype: int32 cannot hold rows of num_rows[" + std::to_string(f) + "]");
  }

  TbeInputs& r = *out;
  r = TbeInputs();
  r.index_dtype = spec.index_dtype;
  r.offsets.assign(static_cast<size_t>(T * B + 1), 0);

  // Bag sizes, then offsets as their prefix sum (table-major).
#pragma omp parallel for schedule(static)
  for (int64_t f = 0; f < T; ++f) {
    Rng rng(stream_seed(spec.seed, 1, static_cast<uint64_t>(f)));
    for (int64_t b = 0; b < B; ++b)
      r.offsets[static_cast<size_t>(f * B + b + 1)] =
          spec.variable_bag_size ? static_cast<int64_t>(rng.below(static_cast<uint64_t>(2 * L + 1))) : L;
  }
  for (int64_t i = 1; i <= T * B; ++i) r.offsets[static_cast<size_t>(i)] += r.offsets[static_cast<size_t>(i - 1)];
  const int64_t N = r.offsets.back();
  r.indices.assign(static_cast<size_t>(N), 0);
  if (spec.weighted) r.per_sample_weights.assign(static_cast<size_t>(N), 0.0f);

  // One Zipf sampler per distinct table size (building one costs ~2^20 pow calls).
  std::map<int64_t, std::unique_ptr<ZipfSampler>> samplers;
  if (spec.alpha > 0)
    for (int64_t E : spec.num_rows)
      if (!samplers.count(E)) samplers[E].reset(new ZipfSampler(E, spec.alpha));

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t f = 0; f < T; ++f) {
    Rng rng(stream_seed(spec.seed, 2, static_cast<uint64_t>(f)));
    const uint64_t E = static_cast<uint64_t>(spec.num_rows[static_cast<size_t>(f)]);
    const int64_t begin = r.offsets[static_cast<size_t>(f * B)];
    const int64_t end = r.offsets[static_cast<size_t>(f * B + B)];
    if (spec.alpha > 0) {
      const ZipfSampler& z = *samplers.at(static_cast<int64_t>(E));
      const uint64_t m = spread_multiplier(E);
      const uint64_t rot = rng.below(E);
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t rank0 = static_cast<uint64_t>(z.sample(rng) - 1);
        r.indices[static_cast<size_t>(i)] =
            static_cast<int64_t>((static_cast<unsigned __int128>(rank0) * m + rot) % E);
      }
    } else {
      for (int64_t i = begin; i < end; ++i) r.indices[static_cast<size_t>(i)] = static_cast<int64_t>(rng.below(E));
    }
    if (spec.weighted) {
      Rng wrng(stream_seed(spec.seed, 3, static_cast<uint64_t>(f)));
      for (int64_t i = begin; i < end; ++i) r.per_sample_weights[static_cast<size_t>(i)] = static_cast<float>(wrng.unit());
    }
  }

  if (spec.index_dtype == DType::kI32) {
    r.indices32.assign(r.indices.begin(), r.indices.end());
    r.offsets32.assign(r.offsets.begin(), r.offsets.end());
  }
  return Status::Ok();
}

Status init_uniform_weights(DType dtype, float a, uint64_t seed, int64_t first, int64_t count, void* host_out) {
  if (!is_float_dtype(dtype))
    return invalid_argument(std::string("dtype: ") + dtype_name(dtype) + "; expected fp32, fp16 or bf16");
  if (!(a >= 0.0f) || !std::isfinite(a)) return invalid_argument("a: " + std::to_string(a) + "; expected a finite value >= 0");
  if (first < 0 || count < 0) return invalid_argument("first, count: must be >= 0");
  if (count > 0 && host_out == nullptr) return invalid_argument("host_out: null but count is " + std::to_string(count));
  const uint64_t key = splitmix64(seed ^ 0x5851f42d4c957f2dull);
  // Counter-based: element i's value is splitmix64(key + i) mapped to [-a, a], independent of chunking.
  return dispatch_float(dtype, "dtype", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(host_out);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t h = splitmix64(key + static_cast<uint64_t>(first + i) * 0x9e3779b97f4a7c15ull);
      const float u = static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-53);  // [0, 1]
      out[i] = from_float<T>(a * (2.0f * u - 1.0f));
    }
  });
}

}  // namespace embscale
