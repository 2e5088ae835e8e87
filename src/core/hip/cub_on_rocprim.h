// The HIP build's CUB: the device-wide and block-wide algorithms the GPU backend calls through CUB's
// names (radix sort of pairs, unique-by-key, select-flagged, run-length encode, exclusive sum, block
// reduce and scan), each forwarded to its rocPRIM counterpart with the same two-phase temporary-storage
// contract (a null buffer asks for the size). Only the calls the backend makes are here; the backward's
// tuned 9-bit onesweep policy is CUB's own and is not compiled on AMD (tbe_backward.cu). hipCUB would
// do the same but is not packaged with the compiler this build uses (scripts/install_hip.sh).
#pragma once

#include <hip/hip_runtime.h>

#include <cstdint>
#include <rocprim/rocprim.hpp>

namespace cub {

template <typename T>
struct DoubleBuffer {
  T* d_buffers[2];
  int selector = 0;
  DoubleBuffer(T* current, T* alternate) : d_buffers{current, alternate} {}
  T* Current() const { return d_buffers[selector]; }
  T* Alternate() const { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
  template <typename K, typename V, typename N>
  static hipError_t SortPairs(void* temp, size_t& bytes, const K* keys_in, K* keys_out, const V* vals_in, V* vals_out,
                              N n, int begin_bit = 0, int end_bit = static_cast<int>(sizeof(K) * 8),
                              hipStream_t stream = 0) {
    return rocprim::radix_sort_pairs(temp, bytes, keys_in, keys_out, vals_in, vals_out, static_cast<size_t>(n),
                                     static_cast<unsigned>(begin_bit), static_cast<unsigned>(end_bit), stream);
  }
};

struct DeviceSelect {
  template <typename KeysIn, typename ValsIn, typename KeysOut, typename ValsOut, typename Count, typename N>
  static hipError_t UniqueByKey(void* temp, size_t& bytes, KeysIn keys_in, ValsIn vals_in, KeysOut keys_out,
                                ValsOut vals_out, Count count_out, N n, hipStream_t stream = 0) {
    return rocprim::unique_by_key(temp, bytes, keys_in, vals_in, keys_out, vals_out, count_out,
                                  static_cast<size_t>(n), rocprim::equal_to<typename std::iterator_traits<KeysIn>::value_type>(),
                                  stream);
  }
  template <typename In, typename Flags, typename Out, typename Count, typename N>
  static hipError_t Flagged(void* temp, size_t& bytes, In in, Flags flags, Out out, Count count_out, N n,
                            hipStream_t stream = 0) {
    return rocprim::select(temp, bytes, in, flags, out, count_out, static_cast<size_t>(n), stream);
  }
};

struct DeviceRunLengthEncode {
  template <typename In, typename UniqueOut, typename CountsOut, typename RunsOut, typename N>
  static hipError_t Encode(void* temp, size_t& bytes, In in, UniqueOut unique_out, CountsOut counts_out,
                           RunsOut runs_out, N n, hipStream_t stream = 0) {
    return rocprim::run_length_encode(temp, bytes, in, static_cast<size_t>(n), unique_out, counts_out, runs_out,
                                      stream);
  }
};

struct DeviceScan {
  template <typename In, typename Out, typename N>
  static hipError_t ExclusiveSum(void* temp, size_t& bytes, In in, Out out, N n, hipStream_t stream = 0) {
    using T = typename std::iterator_traits<Out>::value_type;
    return rocprim::exclusive_scan(temp, bytes, in, out, T{}, static_cast<size_t>(n), rocprim::plus<T>(), stream);
  }
};

// Block-wide reduce and scan of kThreads threads: CUB's object-over-storage form over rocPRIM's.
template <typename T, int kThreads>
class BlockReduce {
  using Impl = rocprim::block_reduce<T, kThreads>;

 public:
  using TempStorage = typename Impl::storage_type;
  __device__ explicit BlockReduce(TempStorage& storage) : storage_(storage) {}
  // The block's reduction, valid in thread 0 (as CUB's).
  template <typename Op>
  __device__ T Reduce(T x, Op op) {
    T out;
    Impl().reduce(x, out, storage_, op);
    return out;
  }

 private:
  TempStorage& storage_;
};

template <typename T, int kThreads>
class BlockScan {
  using Impl = rocprim::block_scan<T, kThreads>;

 public:
  using TempStorage = typename Impl::storage_type;
  __device__ explicit BlockScan(TempStorage& storage) : storage_(storage) {}
  template <typename Op>
  __device__ void ExclusiveScan(T x, T& out, T init, Op op, T& total) {
    Impl().exclusive_scan(x, out, init, total, storage_, op);
  }

 private:
  TempStorage& storage_;
};

}  // namespace cub

namespace thrust {
template <typename T>
using counting_iterator = rocprim::counting_iterator<T>;
}  // namespace thrust
