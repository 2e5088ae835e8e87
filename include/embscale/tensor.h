// Non-owning views of contiguous, row-major tensors. The library never owns or allocates the memory a
// view points to; which memory space the pointer lives in is given by the Context of the call
// (host memory for Backend::kCpu, device memory for Backend::kCuda).
#pragma once

#include <cstdint>

#include "embscale/dtype.h"

namespace embscale {

constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 1;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  int64_t size_bytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype)); }

  static TensorView vec(const void* data, DType dtype, int64_t n) {
    TensorView t;
    t.data = const_cast<void*>(data);
    t.dtype = dtype;
    t.ndim = 1;
    t.shape[0] = n;
    return t;
  }
  static TensorView mat(const void* data, DType dtype, int64_t rows, int64_t cols) {
    TensorView t;
    t.data = const_cast<void*>(data);
    t.dtype = dtype;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    return t;
  }
};

}  // namespace embscale
