// The HIP build's <cuda_runtime.h>: the CUDA runtime names the GPU backend uses, mapped onto the HIP
// runtime, so the backend's sources are one for NVIDIA and AMD. This folder (src/core/hip/include) is on
// the include path of the HIP build only; the CUDA build never sees it. Names are mapped one to one where
// HIP has the same call; the few whose shape differs in the packaged HIP (pointer attributes, memory
// advice with a location) are small adapters below. What HIP lacks (thread-block clusters, programmatic
// dependent launch) the launchers never ask for on AMD (core/cuda/pdl.cuh, core/cuda/device.cu).
#pragma once

#include <hip/hip_runtime.h>

// ---- types and status ----
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaStream_t hipStream_t
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName
#define cudaDeviceProp hipDeviceProp_t
#define cudaFuncAttributes hipFuncAttributes

// ---- devices ----
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDeviceAttr hipDeviceAttribute_t
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrMaxThreadsPerMultiProcessor hipDeviceAttributeMaxThreadsPerMultiProcessor
#define cudaDevAttrCooperativeLaunch hipDeviceAttributeCooperativeLaunch
#define cudaDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#define cudaDevAttrConcurrentManagedAccess hipDeviceAttributeConcurrentManagedAccess

// ---- memory ----
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocHost hipHostMalloc
#define cudaHostAlloc hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaHostAllocDefault hipHostMallocDefault
#define cudaHostAllocPortable hipHostMallocPortable
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaHostRegister hipHostRegister
#define cudaHostUnregister hipHostUnregister
#define cudaHostRegisterMapped hipHostRegisterMapped
#define cudaMallocManaged hipMallocManaged
#define cudaMemAttachGlobal hipMemAttachGlobal
#define cudaMemAdviseSetPreferredLocation hipMemAdviseSetPreferredLocation
#define cudaMemAdviseSetAccessedBy hipMemAdviseSetAccessedBy
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyDefault hipMemcpyDefault
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice

// ---- streams, graphs, kernels ----
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamIsCapturing hipStreamIsCapturing
#define cudaStreamCaptureStatus hipStreamCaptureStatus
#define cudaStreamCaptureStatusNone hipStreamCaptureStatusNone
#define cudaFuncSetAttribute embscale_hip_func_set_attribute
#define cudaFuncGetAttributes embscale_hip_func_get_attributes
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor

// CUDA's kernel-attribute calls take the kernel itself; HIP's take its address as const void*.
template <typename F>
inline hipError_t embscale_hip_func_get_attributes(hipFuncAttributes* a, F* kernel) {
  return hipFuncGetAttributes(a, reinterpret_cast<const void*>(kernel));
}
template <typename F>
inline hipError_t embscale_hip_func_set_attribute(F* kernel, hipFuncAttribute attr, int value) {
  return hipFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// ---- pointer attributes: CUDA's `type` field and its unregistered-host value ----
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
// HIP reports managed memory through isManaged and refuses memory it does not know (unregistered host
// memory) with an error, as CUDA before 11 did; the callers treat that error as unregistered memory.
inline hipError_t cudaPointerGetAttributes(cudaPointerAttributes* out, const void* ptr) {
  hipPointerAttribute_t a;
  const hipError_t e = hipPointerGetAttributes(&a, ptr);
  if (e != hipSuccess) return e;
  out->type = a.isManaged ? cudaMemoryTypeManaged
              : a.memoryType == hipMemoryTypeHost ? cudaMemoryTypeHost
                                                  : cudaMemoryTypeDevice;
  out->device = a.device;
  out->devicePointer = a.devicePointer;
  out->hostPointer = a.hostPointer;
  return hipSuccess;
}

// ---- memory advice with a location (CUDA 13's form): HIP names the host as device hipCpuDeviceId ----
enum cudaMemLocationType { cudaMemLocationTypeDevice = 1, cudaMemLocationTypeHost = 2 };
struct cudaMemLocation {
  cudaMemLocationType type;
  int id;
};
inline hipError_t cudaMemAdvise(const void* ptr, size_t bytes, hipMemoryAdvise advice, cudaMemLocation where) {
  return hipMemAdvise(ptr, bytes, advice, where.type == cudaMemLocationTypeHost ? hipCpuDeviceId : where.id);
}

#include "core/hip/include/embscale_hip_device.h"
