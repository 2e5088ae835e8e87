// The laboratory programs' check of a CUDA runtime call: on an error, the call and the error's text on
// stderr, then exit status 1 (a measurement with a failed call means nothing).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                       \
  do {                                                              \
    const cudaError_t e_ = (x);                                     \
    if (e_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                 \
    }                                                               \
  } while (0)
