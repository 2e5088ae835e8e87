// A host backend of core/lanes.h: a warp of kLanes lanes (32 or 64) emulated on the CPU, each lane a
// thread running the same code, so the warp-level algorithms the kernels use are checked at both widths
// without a GPU. A collective (shfl, shfl_xor, ballot, reduce_max, reduce_or) is where the lanes meet:
// every lane of the warp must call it, as on the device (the kernels call them converged). Each lane
// posts its value, a barrier, each reads the one it asked for, a barrier. A block is several such warps
// with a block-wide barrier (sync_threads), for the two-level reductions.
//
// The shuffles follow CUDA's definition (HIP's is the same): with width w, lane l's segment is the w
// lanes from l & ~(w - 1); shfl reads lane src mod w of the segment, shfl_xor lane l ^ offset, or its
// own value when that lane is outside the segment. Masks are not checked (every lane takes part).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/lanes.h"

namespace embscale {
namespace lane_emulation {

// Reusable barrier for n threads (C++17 has none).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
};

// One warp's meeting place: a slot a lane, 8 bytes each (every value shuffled is at most 8 bytes).
struct WarpExchange {
  explicit WarpExchange(int lanes) : barrier(lanes), slots(lanes) {}
  Barrier barrier;
  std::vector<uint64_t> slots;
};

struct LaneContext {
  WarpExchange* warp = nullptr;
  Barrier* block = nullptr;
  int lane = 0;
  int warp_index = 0;
};
inline LaneContext& context() {
  thread_local LaneContext c;
  return c;
}

template <int kLanes>
struct HostLanes : LaneShape<kLanes> {
  using Mask = typename LaneShape<kLanes>::Mask;
  static constexpr Mask kFull = LaneShape<kLanes>::kFull;

  static int lane() { return context().lane; }
  static int warp() { return context().warp_index; }

  template <typename T>
  static T shfl(T v, int src, int width = kLanes, Mask = kFull) {
    const int l = lane();
    return exchange(v, (l & ~(width - 1)) + (src & (width - 1)));
  }
  template <typename T>
  static T shfl_xor(T v, int offset, int width = kLanes, Mask = kFull) {
    const int l = lane();
    const int t = l ^ offset;
    return exchange(v, (t & ~(width - 1)) == (l & ~(width - 1)) ? t : l);
  }
  static Mask ballot(bool p, Mask = kFull) {
    Mask m = 0;
    post(static_cast<uint64_t>(p));
    for (int i = 0; i < kLanes; ++i)
      if (context().warp->slots[i] != 0) m |= Mask{1} << i;
    context().warp->barrier.wait();
    return m;
  }
  // What the AMD device backend does (no single-instruction warp reduction there).
  static uint32_t reduce_max(uint32_t v) { return lane_max_by_shuffles<HostLanes>(v); }
  static uint32_t reduce_or(uint32_t v) { return lane_or_by_shuffles<HostLanes>(v); }
  // The block-wide barrier (__syncthreads) of run_block.
  static void sync_threads() { context().block->wait(); }

  // Runs body() once on every lane of one warp (a thread each) and waits for them.
  static void run(const std::function<void()>& body) { run_block(1, body); }
  // Runs body() on every lane of nwarps warps (a block of nwarps * kLanes threads).
  static void run_block(int nwarps, const std::function<void()>& body) {
    std::vector<std::unique_ptr<WarpExchange>> warps;
    for (int w = 0; w < nwarps; ++w) warps.push_back(std::make_unique<WarpExchange>(kLanes));
    Barrier block(nwarps * kLanes);
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(nwarps) * kLanes);
    for (int w = 0; w < nwarps; ++w)
      for (int l = 0; l < kLanes; ++l)
        threads.emplace_back([&, w, l] {
          context() = LaneContext{warps[w].get(), &block, l, w};
          body();
          context() = LaneContext{};
        });
    for (std::thread& t : threads) t.join();
  }

 private:
  static void post(uint64_t bits) {
    WarpExchange& x = *context().warp;
    x.slots[lane()] = bits;
    x.barrier.wait();
  }
  template <typename T>
  static T exchange(T v, int from) {
    static_assert(sizeof(T) <= 8, "a lane's value is at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    post(bits);
    const uint64_t got = context().warp->slots[from];
    context().warp->barrier.wait();
    T r;
    std::memcpy(&r, &got, sizeof(T));
    return r;
  }
};

}  // namespace lane_emulation
}  // namespace embscale
