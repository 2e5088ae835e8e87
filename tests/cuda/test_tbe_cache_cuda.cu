// RowCache (tbe_cache.h) on CUDA against the same tables trained in device memory: for several steps of
// random batches (hot rows, duplicates, empty bags, indices outside their tables), every forward output
// through the cache equals the device-memory forward bit for bit, and after flush() the host store holds
// bit for bit the tables and optimizer state of device-memory training. Cases: fp16 weights with
// stochastic rounding and row-wise Adagrad, fp32 with Adam (element-wise state travels with its row);
// cached, host-resident and device tables mixed, mixed dimensions, a feature sharing a table; caches
// far smaller than a batch's rows (evictions, set conflicts, staging), LRU and LFU; the next batch
// prefetched before the running one's backward. Also the statistics' identities and the refusals.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "embscale/context.h"
#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "embscale/tbe_cache.h"

namespace embscale {
namespace {

bool have_device() { return backend_available(Backend::kCuda); }

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x
#define ES_OK(x)                                       \
  do {                                                 \
    const ::embscale::Status _s = (x);                 \
    ASSERT_TRUE(_s.ok()) << #x << ": " << _s.to_string(); \
  } while (0)

struct PinnedBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit PinnedBuffer(size_t n) : bytes(n) {
    if (n > 0 && cudaHostAlloc(&p, n, cudaHostAllocDefault) != cudaSuccess) p = nullptr;
  }
  ~PinnedBuffer() {
    if (p) cudaFreeHost(p);
  }
};

// The library's host store (memory.h): managed memory kept on the host, as the Python module's tables.
struct HostStore {
  void* p = nullptr;
  explicit HostStore(size_t n) {
    if (!host_store_malloc(n, &p).ok()) p = nullptr;
  }
  ~HostStore() { host_store_free(p); }
};

struct Batch {
  std::vector<int64_t> indices, offsets;
};

struct Case {
  DType wdtype;
  OptimizerType optimizer;
  CacheAlgorithm algorithm;
  uint32_t seed;
};

// One batch: B bags per feature of 0..max_len lookups, a quarter of them from a few hot rows, some
// indices outside their table (skipped by the forward's bounds check).
Batch make_batch(std::mt19937& rng, const std::vector<int64_t>& feature_rows, int64_t B, int max_len, bool bad) {
  Batch b;
  b.offsets.push_back(0);
  for (size_t f = 0; f < feature_rows.size(); ++f)
    for (int64_t i = 0; i < B; ++i) {
      const int len = static_cast<int>(rng() % (max_len + 1));
      for (int k = 0; k < len; ++k) {
        const int64_t E = feature_rows[f];
        int64_t idx = rng() % 4 == 0 ? static_cast<int64_t>(rng() % 3) : static_cast<int64_t>(rng() % E);
        if (bad && rng() % 97 == 0) idx = rng() % 2 ? -1 : E + static_cast<int64_t>(rng() % 3);
        b.indices.push_back(idx);
      }
      b.offsets.push_back(static_cast<int64_t>(b.indices.size()));
    }
  return b;
}

void run_case(const Case& c) {
  std::printf("seed %u\n", c.seed);
  std::mt19937 rng(c.seed);
  const Context ctx = Context::cuda();
  RowCacheConfig cfg;
  cfg.tables.tables = {TableSpec{1000, 8}, TableSpec{300, 12}, TableSpec{200, 8}, TableSpec{50, 5}, TableSpec{400, 5}};
  cfg.tables.feature_table_map = {0, 1, 2, 3, 4, 0};
  cfg.tables.weights_dtype = c.wdtype;
  cfg.placement = {TablePlacement::kCached, TablePlacement::kCached, TablePlacement::kHost, TablePlacement::kDevice,
                   TablePlacement::kCached};
  cfg.cache_rows = {64, 40, 0, 0, 512};  // the last one holds every row of its table
  cfg.algorithm = c.algorithm;
  cfg.optimizer = c.optimizer;
  const int64_t B = 48;
  const int max_len = 6;
  cfg.max_lookups = 6 * B * max_len;
  std::unique_ptr<RowCache> cache;
  ES_OK(RowCache::create(ctx, cfg, &cache));
  std::unique_ptr<TableBatchedEmbedding> ref;
  ES_OK(TableBatchedEmbedding::create(ctx, cfg.tables, &ref));
  const TableBatchedEmbedding& ct = cache->cache_tbe();
  EXPECT_EQ(ct.num_features(), ref->num_features());
  EXPECT_EQ(ct.total_dim(), ref->total_dim());

  // Starting tables and state, the same in the host store and in the reference.
  OptimizerInfo info;
  ES_OK(optimizer_info(c.optimizer, &info));
  const size_t wb = dtype_size(c.wdtype);
  const auto state_len = [](const TableBatchedEmbedding& t, OptimizerStateLayout l) -> int64_t {
    return l == OptimizerStateLayout::kAbsent ? 0 : l == OptimizerStateLayout::kRowwise ? t.total_rows() : t.num_weights();
  };
  const int64_t m1n = state_len(*ref, info.momentum1.layout), m2n = state_len(*ref, info.momentum2.layout);
  const int64_t cm1n = state_len(ct, info.momentum1.layout), cm2n = state_len(ct, info.momentum2.layout);
  std::vector<uint8_t> w0(static_cast<size_t>(ref->num_weights()) * wb);
  std::uniform_real_distribution<float> uni(-0.5f, 0.5f);
  for (int64_t i = 0; i < ref->num_weights(); ++i) {
    const float v = uni(rng);
    if (wb == 4) {
      std::memcpy(&w0[i * 4], &v, 4);
    } else {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      const uint16_t h = static_cast<uint16_t>(u >> 16);  // bf16 truncation; as fp16 bits: a small finite value
      const uint16_t f16 = static_cast<uint16_t>(0x3000 | (h & 0x83ff));
      std::memcpy(&w0[i * 2], c.wdtype == DType::kBF16 ? &h : &f16, 2);
    }
  }
  std::vector<float> m1_0(static_cast<size_t>(m1n)), m2_0(static_cast<size_t>(m2n));
  for (auto& v : m1_0) v = std::abs(uni(rng)) * (c.optimizer == OptimizerType::kAdam ? 0.1f : 1.0f);
  for (auto& v : m2_0) v = std::abs(uni(rng)) * 0.01f;

  HostStore hw(w0.size()), hm1(m1_0.size() * 4), hm2(m2_0.size() * 4);
  ASSERT_TRUE(hw.p != nullptr);
  std::memcpy(hw.p, w0.data(), w0.size());
  if (m1n) std::memcpy(hm1.p, m1_0.data(), m1_0.size() * 4);
  if (m2n) std::memcpy(hm2.p, m2_0.data(), m2_0.size() * 4);
  Buffer rw(Backend::kCuda, w0.size()), rm1(Backend::kCuda, m1_0.size() * 4 + 4), rm2(Backend::kCuda, m2_0.size() * 4 + 4);
  ES_OK(copy_to_backend(ctx, rw.data(), w0.data(), w0.size()));
  if (m1n) ES_OK(copy_to_backend(ctx, rm1.data(), m1_0.data(), m1_0.size() * 4));
  if (m2n) ES_OK(copy_to_backend(ctx, rm2.data(), m2_0.data(), m2_0.size() * 4));
  Buffer cw(Backend::kCuda, static_cast<size_t>(ct.num_weights()) * wb), cm1(Backend::kCuda, cm1n * 4 + 4),
      cm2(Backend::kCuda, cm2n * 4 + 4), state(Backend::kCuda, cache->state_bytes());
  ASSERT_TRUE(cw.valid() && state.valid());

  RowCacheBuffers bufs;
  bufs.host_weights = TensorView::vec(hw.p, c.wdtype, ref->num_weights());
  if (m1n) bufs.host_momentum1 = TensorView::vec(hm1.p, DType::kF32, m1n);
  if (m2n) bufs.host_momentum2 = TensorView::vec(hm2.p, DType::kF32, m2n);
  bufs.cache_weights = TensorView::vec(cw.data(), c.wdtype, ct.num_weights());
  if (cm1n) bufs.cache_momentum1 = TensorView::vec(cm1.data(), DType::kF32, cm1n);
  if (cm2n) bufs.cache_momentum2 = TensorView::vec(cm2.data(), DType::kF32, cm2n);
  bufs.state = state.data();
  bufs.state_bytes = state.bytes();
  ES_OK(cache->load(ctx, bufs));

  // Each feature's table rows, for the batches.
  std::vector<int64_t> feature_rows;
  for (int t : cfg.tables.feature_table_map) feature_rows.push_back(cfg.tables.tables[t].num_rows);
  const int steps = 7;
  std::vector<Batch> batches;
  for (int s = 0; s < steps + 1; ++s) batches.push_back(make_batch(rng, feature_rows, B, max_len, s % 2 == 1));

  Buffer plans[2] = {Buffer(Backend::kCuda, cache->plan_bytes()), Buffer(Backend::kCuda, cache->plan_bytes())};
  struct Dev {
    Buffer idx, off, remapped;
  };
  const auto upload = [&](const Batch& b) {
    Dev d{Buffer(Backend::kCuda, b.indices.size() * 8 + 8), Buffer(Backend::kCuda, b.offsets.size() * 8),
          Buffer(Backend::kCuda, b.indices.size() * 8 + 8)};
    EXPECT_TRUE(copy_to_backend(ctx, d.idx.data(), b.indices.data(), b.indices.size() * 8).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d.off.data(), b.offsets.data(), b.offsets.size() * 8).ok());
    return d;
  };
  const auto prefetch = [&](const Batch& b, Dev& d, int64_t step, int64_t lock_from) {
    RowCachePrefetchArgs a;
    a.indices = TensorView::vec(d.idx.data(), DType::kI64, static_cast<int64_t>(b.indices.size()));
    a.offsets = TensorView::vec(d.off.data(), DType::kI64, static_cast<int64_t>(b.offsets.size()));
    a.batch_size = B;
    a.step = step;
    a.lock_from = lock_from;
    a.remapped = TensorView::vec(d.remapped.data(), DType::kI64, static_cast<int64_t>(b.indices.size()));
    a.plan = plans[step % 2].data();
    a.plan_bytes = plans[step % 2].bytes();
    return cache->prefetch(ctx, bufs, a);
  };

  const int64_t cols = ref->total_dim();
  Buffer out_ref(Backend::kCuda, static_cast<size_t>(B * cols) * 4), out_cache(Backend::kCuda, static_cast<size_t>(B * cols) * 4);
  Buffer grad(Backend::kCuda, static_cast<size_t>(B * cols) * 4), skipped(Backend::kCuda, 8);
  std::vector<Dev> dev;
  for (const Batch& b : batches) dev.push_back(upload(b));
  ES_OK(prefetch(batches[0], dev[0], 1, 1));
  for (int s = 0; s < steps; ++s) {
    const Batch& b = batches[s];
    const int64_t N = static_cast<int64_t>(b.indices.size());
    const int64_t step = s + 1;
    ES_OK(cache->fetch(ctx, bufs, plans[step % 2].data(), plans[step % 2].bytes()));
    // Forward, both ways.
    const auto forward = [&](const TableBatchedEmbedding& t, void* w, void* idx, void* out) {
      TbeForwardArgs f;
      f.weights = TensorView::vec(w, c.wdtype, t.num_weights());
      f.indices = TensorView::vec(idx, DType::kI64, N);
      f.offsets = TensorView::vec(dev[s].off.data(), DType::kI64, static_cast<int64_t>(b.offsets.size()));
      f.batch_size = B;
      f.pooling = PoolingMode::kSum;
      f.bounds_check = BoundsCheckMode::kSkip;
      f.output = TensorView::mat(out, DType::kF32, B, cols);
      f.num_skipped = static_cast<int64_t*>(skipped.data());
      return t.forward(ctx, f);
    };
    ES_OK(forward(*ref, rw.data(), dev[s].idx.data(), out_ref.data()));
    ES_OK(forward(ct, cw.data(), dev[s].remapped.data(), out_cache.data()));
    std::vector<float> o1(static_cast<size_t>(B * cols)), o2(o1.size());
    ES_OK(copy_to_host(ctx, o1.data(), out_ref.data(), o1.size() * 4));
    ES_OK(copy_to_host(ctx, o2.data(), out_cache.data(), o2.size() * 4));
    ASSERT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * 4), 0) << "step " << step << ": forward differs";
    // The next batch is planned before this one's backward (its rows locked from this step on).
    ES_OK(prefetch(batches[s + 1], dev[s + 1], step + 1, step));
    std::vector<float> g(o1.size());
    for (auto& v : g) v = uni(rng);
    ES_OK(copy_to_backend(ctx, grad.data(), g.data(), g.size() * 4));
    const auto backward = [&](const TableBatchedEmbedding& t, void* w, void* m1, void* m2, int64_t n1, int64_t n2,
                              void* idx, const int64_t* bases) {
      TbeBackwardArgs a;
      a.weights = TensorView::vec(w, c.wdtype, t.num_weights());
      a.indices = TensorView::vec(idx, DType::kI64, N);
      a.offsets = TensorView::vec(dev[s].off.data(), DType::kI64, static_cast<int64_t>(b.offsets.size()));
      a.batch_size = B;
      a.pooling = PoolingMode::kSum;
      a.bounds_check = BoundsCheckMode::kSkip;
      a.grad_output = TensorView::mat(grad.data(), DType::kF32, B, cols);
      a.optimizer.type = c.optimizer;
      a.optimizer.learning_rate = 0.05f;
      a.optimizer.eps = 0.1f;
      a.optimizer.step = step;
      if (n1) a.momentum1 = TensorView::vec(m1, DType::kF32, n1);
      if (n2) a.momentum2 = TensorView::vec(m2, DType::kF32, n2);
      a.rounding = WeightRounding::kStochastic;
      a.seed = 1234;
      if (bases) a.rounding_bases = TensorView::vec(const_cast<int64_t*>(bases), DType::kI64, t.total_rows());
      size_t ws = 0;
      EMBSCALE_RETURN_IF_ERROR(t.backward_workspace_size(ctx, a, &ws));
      Buffer wsb(Backend::kCuda, ws);
      return t.backward(ctx, a, wsb.data(), ws);
    };
    ES_OK(backward(*ref, rw.data(), rm1.data(), rm2.data(), m1n, m2n, dev[s].idx.data(), nullptr));
    const int64_t* bases =
        reinterpret_cast<const int64_t*>(static_cast<const char*>(state.data()) + cache->rounding_bases_offset());
    ES_OK(backward(ct, cw.data(), cm1.data(), cm2.data(), cm1n, cm2n, dev[s].remapped.data(), bases));
    ES_OK(cache->write_back(ctx, bufs, plans[step % 2].data(), plans[step % 2].bytes()));
  }
  // The last batch planned is fetched too (every prefetch is followed by its fetch), then everything flushed.
  ES_OK(cache->fetch(ctx, bufs, plans[(steps + 1) % 2].data(), plans[(steps + 1) % 2].bytes()));
  ES_OK(cache->flush(ctx, bufs));
  ES_OK(synchronize(ctx));
  // The host store now holds device-memory training's tables and state, bit for bit.
  std::vector<uint8_t> w_ref(w0.size());
  ES_OK(copy_to_host(ctx, w_ref.data(), rw.data(), w_ref.size()));
  int64_t changed = 0;
  for (size_t i = 0; i < w0.size(); ++i) changed += w_ref[i] != w0[i];
  EXPECT_GT(changed, 0) << "the steps changed no weight: nothing was compared";
  for (int t = 0; t < ref->num_tables(); ++t) {
    const size_t first = static_cast<size_t>(ref->weight_offset(t)) * wb;
    const size_t last = t + 1 < ref->num_tables() ? static_cast<size_t>(ref->weight_offset(t + 1)) * wb : w0.size();
    EXPECT_EQ(std::memcmp(w_ref.data() + first, static_cast<uint8_t*>(hw.p) + first, last - first), 0)
        << "table " << t << " (" << table_placement_name(cfg.placement[t]) << ") differs after flush";
  }
  const auto same_state = [&](const Buffer& d, const HostStore& h, int64_t n, const char* what) {
    if (n == 0) return;
    std::vector<float> r(static_cast<size_t>(n));
    ASSERT_TRUE(copy_to_host(ctx, r.data(), d.data(), r.size() * 4).ok());
    EXPECT_EQ(std::memcmp(r.data(), h.p, r.size() * 4), 0) << what << " differs after flush";
  };
  same_state(rm1, hm1, m1n, "momentum1");
  same_state(rm2, hm2, m2n, "momentum2");

  // Statistics: every looked-up row hit or missed; every miss fetched; conflicts happened (the caches
  // are far smaller than a batch's rows) and rows were written back.
  std::vector<int64_t> stats(kNumStats);
  ES_OK(copy_to_host(ctx, stats.data(), state.data(), stats.size() * 8));
  std::printf("lookups %lld hits %lld misses %lld conflicts %lld evictions %lld fetched %lld written %lld bytes %lld\n",
              (long long)stats[kStatLookups], (long long)stats[kStatHits], (long long)stats[kStatMisses],
              (long long)stats[kStatConflicts], (long long)stats[kStatEvictions], (long long)stats[kStatRowsFetched],
              (long long)stats[kStatRowsWrittenBack], (long long)stats[kStatBytesMoved]);
  EXPECT_EQ(stats[kStatHits] + stats[kStatMisses], stats[kStatLookups]);
  EXPECT_GT(stats[kStatHits], 0);
  EXPECT_GT(stats[kStatConflicts], 0);
  EXPECT_GT(stats[kStatEvictions], 0);
  EXPECT_GE(stats[kStatRowsFetched], stats[kStatMisses]);  // plus the host table's staged rows
  EXPECT_GT(stats[kStatRowsWrittenBack], 0);
}

TEST(TbeCacheCuda, Fp16RowwiseAdagradLruEqualsDeviceTraining) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  run_case({DType::kF16, OptimizerType::kRowwiseAdagrad, CacheAlgorithm::kLru, 11});
}

TEST(TbeCacheCuda, Bf16SgdLfuEqualsDeviceTraining) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  run_case({DType::kBF16, OptimizerType::kSgd, CacheAlgorithm::kLfu, 12});
}

TEST(TbeCacheCuda, Fp32AdamStateTravelsWithItsRow) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  run_case({DType::kF32, OptimizerType::kAdam, CacheAlgorithm::kLru, 13});
}

TEST(TbeCacheCuda, Fp32PartialRowwiseAdamLfu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  run_case({DType::kF32, OptimizerType::kPartialRowwiseAdam, CacheAlgorithm::kLfu, 14});
}

TEST(TbeCacheCuda, RefusesBadArgumentsByName) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const Context ctx = Context::cuda();
  RowCacheConfig cfg;
  cfg.tables.tables = {TableSpec{100, 4}, TableSpec{50, 8}};
  cfg.placement = {TablePlacement::kCached, TablePlacement::kHost};
  cfg.cache_rows = {32, 0};
  cfg.max_lookups = 64;
  std::unique_ptr<RowCache> cache;
  const auto refused = [&](RowCacheConfig c, const char* needle) {
    const Status st = RowCache::create(ctx, c, &cache);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  };
  RowCacheConfig c = cfg;
  c.cache_rows = {0, 0};
  refused(c, "cfg.cache_rows[0]");
  c = cfg;
  c.cache_rows = {32, 5};
  refused(c, "cfg.cache_rows[1]");
  c = cfg;
  c.placement = {TablePlacement::kCached};
  refused(c, "cfg.placement");
  c = cfg;
  c.optimizer = OptimizerType::kNone;
  refused(c, "cfg.optimizer");
  c = cfg;
  c.max_lookups = 0;
  refused(c, "cfg.max_lookups");
  EXPECT_EQ(RowCache::create(Context::cpu(), cfg, &cache).code(), StatusCode::kUnsupported);
  ES_OK(RowCache::create(ctx, cfg, &cache));
  // A host store in device memory is refused before anything runs.
  Buffer dev_w(Backend::kCuda, 400 * 4 + 400 * 4), state(Backend::kCuda, cache->state_bytes());
  Buffer cw(Backend::kCuda, static_cast<size_t>(cache->cache_tbe().num_weights()) * 4);
  RowCacheBuffers b;
  b.host_weights = TensorView::vec(dev_w.data(), DType::kF32, cache->host_tbe().num_weights());
  b.cache_weights = TensorView::vec(cw.data(), DType::kF32, cache->cache_tbe().num_weights());
  b.state = state.data();
  b.state_bytes = state.bytes();
  const Status st = cache->load(ctx, b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("host_weights"), std::string::npos) << st.to_string();
  PinnedBuffer hw(400 * 4 + 400 * 4);  // pinned memory serves as a host store too
  b.host_weights = TensorView::vec(hw.p, DType::kF32, cache->host_tbe().num_weights());
  b.state_bytes = cache->state_bytes() - 1;
  const Status small = cache->load(ctx, b);
  EXPECT_NE(small.message().find("state_bytes"), std::string::npos) << small.to_string();
}

// host_store_malloc: managed memory kept on the host where the device can access managed memory
// concurrently (pinned, mapped memory elsewhere), which the CPU writes and a copy reads back.
TEST(TbeCacheCuda, HostStoreIsHostMemoryTheDeviceMaps) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  void* p = reinterpret_cast<void*>(1);
  ES_OK(host_store_malloc(0, &p));
  EXPECT_EQ(p, nullptr);
  const Status null_out = host_store_malloc(16, nullptr);
  EXPECT_EQ(null_out.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(null_out.message().find("ptr"), std::string::npos) << null_out.to_string();

  const size_t n = (size_t{3} << 20) + 12;  // beyond one 2 MiB page, not a whole number of them
  HostStore h(n);
  ASSERT_NE(h.p, nullptr);
  int dev = 0, concurrent = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev));
  cudaPointerAttributes attr;
  CUDA_OK(cudaPointerGetAttributes(&attr, h.p));
  EXPECT_EQ(attr.type, concurrent ? cudaMemoryTypeManaged : cudaMemoryTypeHost);
  auto* bytes = static_cast<unsigned char*>(h.p);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 3);
  Buffer d(Backend::kCuda, n);
  const Context ctx = Context::cuda();
  ES_OK(copy_within_backend(ctx, d.data(), h.p, n));
  std::vector<unsigned char> back(n);
  ES_OK(copy_to_host(ctx, back.data(), d.data(), n));
  for (size_t i = 0; i < n; i += 4093) ASSERT_EQ(back[i], static_cast<unsigned char>(i * 7 + 3)) << i;
  EXPECT_EQ(back[n - 1], static_cast<unsigned char>((n - 1) * 7 + 3));
}

}  // namespace
}  // namespace embscale
