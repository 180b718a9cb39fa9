// The device runtime's launch limits: what the current device can hold at once, for kernels that size their grids to
// the device (publish, pack, fetch). Queried per device and cached per device, so a thread that switches devices
// gets the limits of the device it launches on.
#pragma once

namespace kvcomm::detail {

/// Streaming multiprocessors of the current device (cudaGetDevice), queried once per device and process. A failed
/// query throws CudaError naming the call (cudaGetDevice or cudaDeviceGetAttribute); no guessed count stands in.
/// Without CUDA: Unsupported.
int currentDeviceSmCount();

}  // namespace kvcomm::detail
