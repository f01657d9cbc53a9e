// The GPU runtime calls gpu/hip_copy.cc makes, spelled as HIP's, for both platforms.
//
// AMD (the default): HIP's own header. NVIDIA (CKPTFS_GPU_CUDA): each call mapped straight onto
// the CUDA runtime API. HIP's CUDA path (hip/nvidia_detail/) is not used: its inline wrappers cover
// the whole API, and those of an older HIP call CUDA functions a current CUDA no longer has (device
// properties, textures, context creation), so including them fails to compile there. The handful
// below have kept their meaning across CUDA releases (this file is built against 13.0 and 11.8).
#ifndef CKPTFS_GPU_GPU_RUNTIME_H_
#define CKPTFS_GPU_GPU_RUNTIME_H_

#if defined(CKPTFS_GPU_CUDA)

#include <cuda_runtime_api.h>

#include <cstddef>

using hipError_t = cudaError_t;
using hipStream_t = cudaStream_t;
using hipEvent_t = cudaEvent_t;
using hipMemcpyKind = cudaMemcpyKind;

inline constexpr hipError_t hipSuccess = cudaSuccess;
inline constexpr hipMemcpyKind hipMemcpyHostToDevice = cudaMemcpyHostToDevice;
inline constexpr unsigned hipHostMallocDefault = cudaHostAllocDefault;
inline constexpr unsigned hipStreamNonBlocking = cudaStreamNonBlocking;
inline constexpr unsigned hipEventDisableTiming = cudaEventDisableTiming;

inline const char* hipGetErrorName(hipError_t e) { return cudaGetErrorName(e); }
inline const char* hipGetErrorString(hipError_t e) { return cudaGetErrorString(e); }
inline hipError_t hipGetDeviceCount(int* n) { return cudaGetDeviceCount(n); }
inline hipError_t hipGetDevice(int* d) { return cudaGetDevice(d); }
inline hipError_t hipSetDevice(int d) { return cudaSetDevice(d); }
inline hipError_t hipHostMalloc(void** p, size_t n, unsigned flags) {
  return cudaHostAlloc(p, n, flags);
}
inline hipError_t hipHostFree(void* p) { return cudaFreeHost(p); }
inline hipError_t hipStreamCreateWithFlags(hipStream_t* s, unsigned flags) {
  return cudaStreamCreateWithFlags(s, flags);
}
inline hipError_t hipStreamSynchronize(hipStream_t s) { return cudaStreamSynchronize(s); }
inline hipError_t hipStreamDestroy(hipStream_t s) { return cudaStreamDestroy(s); }
inline hipError_t hipEventCreateWithFlags(hipEvent_t* e, unsigned flags) {
  return cudaEventCreateWithFlags(e, flags);
}
inline hipError_t hipEventRecord(hipEvent_t e, hipStream_t s) { return cudaEventRecord(e, s); }
inline hipError_t hipEventSynchronize(hipEvent_t e) { return cudaEventSynchronize(e); }
inline hipError_t hipEventDestroy(hipEvent_t e) { return cudaEventDestroy(e); }
inline hipError_t hipMemcpyAsync(void* dst, const void* src, size_t n, hipMemcpyKind kind,
                                 hipStream_t s) {
  return cudaMemcpyAsync(dst, src, n, kind, s);
}

#else

#include <hip/hip_runtime_api.h>

#endif

#endif  // CKPTFS_GPU_GPU_RUNTIME_H_
