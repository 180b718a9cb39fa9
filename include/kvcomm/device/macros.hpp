// kvcomm device API: the one place that decides inline/host/device qualifiers, so that every device header compiles
// from plain C++ (.cc/.cpp, host view of the structs) and from nvcc (.cu, C++17).
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define KVCOMM_DEVICE_INLINE __forceinline__ __device__
#define KVCOMM_HOST_DEVICE_INLINE __forceinline__ __host__ __device__
#define KVCOMM_ON_DEVICE_COMPILER 1
#else
#define KVCOMM_DEVICE_INLINE inline
#define KVCOMM_HOST_DEVICE_INLINE inline
#define KVCOMM_ON_DEVICE_COMPILER 0
#endif

#if defined(__CUDA_ARCH__)
#define KVCOMM_DEVICE_CODE 1
#else
#define KVCOMM_DEVICE_CODE 0
#endif
