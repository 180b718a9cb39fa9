// The internal entry points libkvcomm exports although they are not API (see include/kvcomm/api.hpp for KVCOMM_API).
// libkvcomm is compiled with hidden visibility; these few are marked KVCOMM_INTERNAL_API in their own headers because
// another binary built from this repository needs the library's own instance of them, not a copy:
//   - libkvcomm_mpi (MpiBootstrap) reports errors like the core library does: detail::currentRank, RankScope,
//     formatMessage, throwError, throwSystem (common/check.hpp) and logLine (common/log.hpp);
//   - kvcomm's tests, and the tools built on its test support (tests/support/), reach device memory through the
//     library's driver table and check its fd server: detail::cudaDriver, requireCudaDriver, cuResultText, throwCu
//     (platform/cuda_driver.hpp), currentGpu (platform/gpu_info.hpp), FdServer and fetchFds (symm/fd_exchange.hpp).
// Nothing else under src/ is exported; the test library.exports holds this list and fails on any other detail
// symbol. Unit tests of other internals link kvcomm_internal, a static library of the same objects, instead. These
// may change at any time: engines must not use them.
#pragma once

#include "kvcomm/api.hpp"

#define KVCOMM_INTERNAL_API KVCOMM_API
