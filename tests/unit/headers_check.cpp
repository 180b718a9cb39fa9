// Compile check: every public header, as C++17 (this file) and under nvcc (headers_check.cu includes this file).
#include "kvcomm/api.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/barrier.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/converted_fetch.hpp"
#include "kvcomm/converted_read.hpp"
#include "kvcomm/device/barrier.hpp"
#include "kvcomm/device/error_record.hpp"
#include "kvcomm/device/fetch.hpp"
#include "kvcomm/device/macros.hpp"
#include "kvcomm/device/publish.hpp"
#include "kvcomm/device/symm_device.hpp"
#include "kvcomm/device_error.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/kv_contents.hpp"
#include "kvcomm/kv_conversion.hpp"
#include "kvcomm/kv_layout.hpp"
#include "kvcomm/kvcomm.h"
#include "kvcomm/kvcomm.hpp"
#include "kvcomm/limits.hpp"
#include "kvcomm/publish.hpp"
#include "kvcomm/stream.hpp"
#include "kvcomm/symm.hpp"
#include "kvcomm/version.hpp"

#if __cplusplus < 201703L
#error "public headers must compile as C++17"
#endif

static_assert(sizeof(kvcomm::SymmDeviceHandle) > 0 && sizeof(kvcomm::BarrierDeviceHandle) > 0, "device view");
