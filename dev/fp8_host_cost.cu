// Where the time of a small FP8 call goes: the host or the GPU. Back-to-back calls of an op on a few
// MiB are not limited by memory, so a benchmark that times them (as `embscale bench fp8` does) reports
// whichever of the host's submission and the GPU's execution is slower. This program separates them.
//
//  1. The argument check's cost per pointer (core/check.h `check::memory`): the library's check as
//     built, the runtime's cudaPointerGetAttributes alone, the driver's cuPointerGetAttributes with the
//     four attributes the check needs (an alternative, fetched through the runtime), and cudaGetDevice
//     alone; for device, pinned, managed and plain host memory. The library's verdict on each kind is
//     checked (device, pinned and managed accepted, host refused).
//  2. amax through the library and through the TransformerEngine-design peer (te_atomic, the benchmark's
//     peer), bf16 and fp32 at 64 KiB..16 MiB, inputs rotating through copies covering 3x the L2:
//     host_us = the host's time to enqueue one call (200 calls enqueued, no wait), wall_us = per call
//     with the wait for the last, graph_us = per call when the same 200 calls are replayed as one CUDA
//     graph (no host work: the GPU's own time per call, launch gaps included). Median of 7 repetitions,
//     the two implementations alternating. Every amax is checked against the host's.
//  3. The host's enqueue cost of the launch primitives those calls are made of (launch_costs below).
// One JSON record per line.
#include <cuda_bf16.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/device.cuh"
#include "core/cuda/pdl.cuh"
#include "core/cuda_runtime.h"
#include "cuda_check.h"
#include "embscale/context.h"
#include "embscale/fp8.h"
#include "peers_fp8.h"

using namespace embscale;

namespace {

using PointerAttributesFn = CUresult (*)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr);
PointerAttributesFn g_query = nullptr;
volatile int g_sink = 0;

bool runtime_query(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type != cudaMemoryTypeUnregistered;
}

bool driver_query(const void* p) {
  unsigned int type = 0, managed = 0;
  int ordinal = -1;
  CUdeviceptr dptr = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_POINTER};
  void* values[] = {&type, &managed, &ordinal, &dptr};
  g_query(4, attrs, values, reinterpret_cast<CUdeviceptr>(p));
  return type != 0;
}

bool get_device(const void*) {
  int dev = 0;
  cudaGetDevice(&dev);
  return dev >= 0;
}

bool library_check(const void* p) { return cuda::check_device_memory("x", p).ok(); }
// The cached device facts every launcher asks for (each asks cudaGetDevice first), and the error read
// after each launch.
bool sm_count_cached(const void*) { return cuda::sm_count() > 0; }
bool pdl_enabled_cached(const void*) { return cuda::pdl_enabled(); }
bool get_last_error(const void*) { return cudaGetLastError() == cudaSuccess; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ns_per_check(bool (*fn)(const void*), const void* p, int calls) {
  std::vector<double> reps;
  for (int r = 0; r < 7; ++r) {
    int ok = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) ok += fn(p) ? 1 : 0;
    const auto t1 = std::chrono::steady_clock::now();
    g_sink = g_sink + ok;
    reps.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / calls);
  }
  return median(reps);
}

int pointer_checks() {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  CK(cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &entry, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "cuPointerGetAttributes not found\n");
    return 1;
  }
  g_query = reinterpret_cast<PointerAttributesFn>(entry);
  void *dev = nullptr, *pinned = nullptr, *managed = nullptr;
  CK(cudaMalloc(&dev, 1 << 20));
  CK(cudaMallocHost(&pinned, 1 << 20));
  CK(cudaMallocManaged(&managed, 1 << 20));
  std::vector<char> host(1 << 20);
  std::vector<void*> others(256);  // more live allocations, as a training process holds
  for (auto& o : others) CK(cudaMalloc(&o, 1 << 16));
  struct Kind {
    const char* name;
    const void* p;
    bool accept;
  } kinds[] = {{"device", dev, true}, {"pinned", pinned, true}, {"managed", managed, true}, {"host", host.data(), false}};
  struct Method {
    const char* name;
    bool (*fn)(const void*);
  } methods[] = {{"library_check", library_check},
                 {"runtime_query", runtime_query},
                 {"driver_query", driver_query},
                 {"get_device", get_device},
                 {"sm_count_cached", sm_count_cached},
                 {"pdl_enabled_cached", pdl_enabled_cached},
                 {"get_last_error", get_last_error}};
  int bad = 0;
  for (const Kind& k : kinds) {
    if (library_check(k.p) != k.accept) {
      std::fprintf(stderr, "library check on %s memory: wrong verdict\n", k.name);
      ++bad;
    }
    for (const Method& m : methods)
      std::printf("{\"bench\":\"pointer_check\",\"pointer\":\"%s\",\"method\":\"%s\",\"ns_per_call\":%.1f}\n", k.name,
                  m.name, ns_per_check(m.fn, k.p, 100000));
  }
  for (auto& o : others) cudaFree(o);
  cudaFree(dev);
  cudaFreeHost(pinned);
  cudaFree(managed);
  return bad;
}

// One implementation's call on copy c.
using Call = std::function<Status(int c)>;

struct Times {
  double host_us, wall_us, graph_us;
};

Times time_calls(const Call& call, cudaStream_t s, int calls) {
  std::vector<double> host, wall, graph;
  for (int r = 0; r < 7; ++r) {
    CK(cudaStreamSynchronize(s));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i)
      if (!call(i).ok()) std::exit(2);
    const auto t1 = std::chrono::steady_clock::now();
    CK(cudaStreamSynchronize(s));
    const auto t2 = std::chrono::steady_clock::now();
    host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / calls);
    wall.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() / calls);
  }
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i)
    if (!call(i).ok()) std::exit(3);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    graph.push_back(1000.0 * ms / calls);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return Times{median(host), median(wall), median(graph)};
}

__global__ void empty_kernel(float* p) {
  if (p != nullptr && threadIdx.x == 1024) *p = 0.0f;  // never true: keeps the parameter live
}

// The host's enqueue cost of the launch primitives an amax call is made of, alone and in the pairs the
// paths use: a 4-byte memset, an empty kernel through <<<>>>, through cudaLaunchKernelEx without
// attributes and with programmatic stream serialization. 200 enqueues per timing (then a wait, so the
// queue never fills), median of 7.
int launch_costs() {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* d = nullptr;
  CK(cudaMalloc(&d, 4));
  auto ex = [&](bool pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(264);
    cfg.blockDim = dim3(512);
    cfg.stream = s;
    cudaLaunchAttribute a[1];
    a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = pdl ? a : nullptr;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, empty_kernel, d));
  };
  auto memset4 = [&] { CK(cudaMemsetAsync(d, 0, 4, s)); };
  auto chevron = [&] { empty_kernel<<<264, 512, 0, s>>>(d); };
  const std::pair<const char*, std::function<void()>> prims[] = {
      {"memset", memset4},
      {"kernel_chevron", chevron},
      {"kernel_ex", [&] { ex(false); }},
      {"kernel_ex_pdl", [&] { ex(true); }},
      {"memset+kernel_chevron", [&] { memset4(), chevron(); }},
      {"memset+kernel_ex_pdl", [&] { memset4(), ex(true); }},
      {"kernel_ex_pdl+kernel_ex_pdl", [&] { ex(true), ex(true); }},
  };
  for (int round = 0; round < 2; ++round)
    for (const auto& p : prims) {
      std::vector<double> host;
      for (int r = 0; r < 7; ++r) {
        CK(cudaStreamSynchronize(s));
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 200; ++i) p.second();
        const auto t1 = std::chrono::steady_clock::now();
        host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 200);
      }
      CK(cudaStreamSynchronize(s));
      std::printf("{\"bench\":\"launch_cost\",\"what\":\"%s\",\"round\":%d,\"host_us\":%.2f}\n", p.first, round,
                  median(host));
    }
  CK(cudaGetLastError());
  cudaFree(d);
  cudaStreamDestroy(s);
  return 0;
}

int amax_costs() {
  const unsigned seed = 20261203;
  std::fprintf(stderr, "seed %u\n", seed);
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Context ctx = Context::cuda(s);
  float* d_amax = nullptr;
  CK(cudaMalloc(&d_amax, sizeof(float)));
  const int calls = 200;
  int bad = 0;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const size_t es = dtype_size(dt);
    for (int64_t bytes : {int64_t(64) << 10, int64_t(2) << 20, int64_t(4) << 20, int64_t(8) << 20, int64_t(16) << 20}) {
      const int64_t n = bytes / static_cast<int64_t>(es);
      const int copies = std::max(2, static_cast<int>(3.0 * l2 / bytes) + 1);
      std::mt19937 rng(seed + static_cast<unsigned>(n));
      std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
      std::vector<char> h(bytes);
      float want = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        const float v = dist(rng);
        if (dt == DType::kF32) {
          reinterpret_cast<float*>(h.data())[i] = v;
          want = std::max(want, std::fabs(v));
        } else {
          const __nv_bfloat16 b = __float2bfloat16(v);
          reinterpret_cast<__nv_bfloat16*>(h.data())[i] = b;
          want = std::max(want, std::fabs(__bfloat162float(b)));
        }
      }
      std::vector<void*> xs(copies);
      for (auto& x : xs) {
        CK(cudaMalloc(&x, bytes));
        CK(cudaMemcpy(x, h.data(), bytes, cudaMemcpyHostToDevice));
      }
      size_t ws_bytes = 0;
      if (!amax_workspace_size(ctx, TensorView::vec(xs[0], dt, n), AmaxOptions{}, &ws_bytes).ok()) return 1;
      void* ws = nullptr;
      if (ws_bytes > 0) CK(cudaMalloc(&ws, ws_bytes));
      const Call ours = [&](int c) {
        return amax(ctx, TensorView::vec(xs[c % copies], dt, n), d_amax, AmaxOptions{}, ws, ws_bytes);
      };
      const Call peer = [&](int c) {
        return tools::peers::amax_peer(tools::peers::AmaxPeer::kTeAtomic, xs[c % copies], dt, n, d_amax, nullptr, 0, s);
      };
      const std::pair<const char*, const Call*> impls[] = {{"embscale", &ours}, {"te_atomic", &peer}};
      std::vector<Times> t[2];
      for (int round = 0; round < 3; ++round)
        for (int k = 0; k < 2; ++k) {
          t[k].push_back(time_calls(*impls[k].second, s, calls));
          float got = -1.0f;
          CK(cudaMemcpy(&got, d_amax, sizeof(float), cudaMemcpyDeviceToHost));
          if (got != want) {
            std::fprintf(stderr, "%s %s n=%lld: amax %g, host %g\n", impls[k].first, dtype_name(dt),
                         static_cast<long long>(n), got, want);
            ++bad;
          }
        }
      for (int k = 0; k < 2; ++k) {
        std::vector<double> hu, wu, gu;
        for (const Times& x : t[k]) hu.push_back(x.host_us), wu.push_back(x.wall_us), gu.push_back(x.graph_us);
        std::printf(
            "{\"bench\":\"fp8_host_cost\",\"op\":\"amax\",\"impl\":\"%s\",\"dtype\":\"%s\",\"n\":%lld,\"bytes\":%lld,"
            "\"copies\":%d,\"calls\":%d,\"host_us\":%.2f,\"wall_us\":%.2f,\"graph_us\":%.2f}\n",
            impls[k].first, dtype_name(dt), static_cast<long long>(n), static_cast<long long>(bytes), copies, calls,
            median(hu), median(wu), median(gu));
      }
      for (auto& x : xs) cudaFree(x);
      if (ws) cudaFree(ws);
    }
  }
  cudaFree(d_amax);
  cudaStreamDestroy(s);
  return bad;
}

}  // namespace

int main() {
  int bad = pointer_checks();
  bad += launch_costs();
  bad += amax_costs();
  std::fflush(stdout);
  return bad == 0 ? 0 : 1;
}
