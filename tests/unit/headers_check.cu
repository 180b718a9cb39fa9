// The public headers under nvcc (C++17), device functions instantiated in a kernel.
#include "headers_check.cpp"

__global__ void headersCheckKernel(kvcomm::SymmDeviceHandle h, kvcomm::BarrierDeviceHandle b, const char* src) {
  kvcomm::warpStoreToReplicas<16>(h, kvcomm::slotDestination(1, 0, 16, 4096, 256), src, 256, threadIdx.x % 32);
  kvcomm::barrierAfterGrid(b, 0, kvcomm::barrierNextEpoch(b, 0));
}
