// Programmatic dependent launch (compute capability 9.0 and up): a kernel launched with it is scheduled while the
// kernel before it on the stream finishes, and waits for that kernel's completion and memory (griddepcontrol.wait)
// before it touches memory. What it saves is the launch gap between back-to-back small kernels (the barrier, the
// publish of a few rows), which is most of their cost inside a CUDA graph. Captured launches keep it (programmatic
// edges). KVCOMM_PDL=0 turns it off.
#pragma once

#include <cuda_runtime.h>

namespace kvcomm::detail {

/// Whether kernels on the current device are launched with programmatic dependent launch (KVCOMM_PDL, and a GPU of
/// compute capability 9.0 or later). Cached per device.
bool dependentLaunchOn();

/// First statement of every kernel launched by launchDependent(): waits until the kernels before it on the stream
/// completed and their memory operations are visible, then lets the kernel after it be scheduled. A no-op when the
/// kernel was launched without the attribute.
__device__ __forceinline__ void awaitPriorKernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// kernel<<<blocks, threads, 0, stream>>>(args...), with programmatic stream serialisation when dependentLaunchOn().
template <typename... Params, typename... Args>
cudaError_t launchDependent(void (*kernel)(Params...), int blocks, int threads, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependentLaunchOn() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

}  // namespace kvcomm::detail
