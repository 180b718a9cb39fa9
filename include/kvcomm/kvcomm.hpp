// kvcomm: everything an engine includes (host API; kernels include kvcomm/device/*.hpp).
#pragma once

#include "kvcomm/api.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/barrier.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/device_error.hpp"
#include "kvcomm/endpoint.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/limits.hpp"
#include "kvcomm/publish.hpp"
#include "kvcomm/stream.hpp"
#include "kvcomm/symm.hpp"
#include "kvcomm/version.hpp"
