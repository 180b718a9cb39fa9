// Every environment knob kvcomm reads, in one place (documented in docs/environment.md).
// Values are read when an object is created or an operation starts (a communicator keeps the bootstrap timeout it
// was created with), so a process (or a test) may change them between operations.
#pragma once

#include <cstdint>
#include <string>

namespace kvcomm::env {

/// KVCOMM_DIRECT = auto | 1 | 0: publish directly into peer memory (auto where the group allows it), demand it,
/// or force the gather+insert fallback.
enum class DirectMode { Auto, Force, Off };
DirectMode direct();

/// KVCOMM_LOG_LEVEL = error | warn | info | debug (default warn).
int logLevel();

/// KVCOMM_BOOTSTRAP_TIMEOUT_MS: bound on every bootstrap wait (connect, receive); default 120000.
int64_t bootstrapTimeoutMs();

/// KVCOMM_BARRIER_TIMEOUT_MS: bound on every barrier wait (device and host); default 10000.
int64_t barrierTimeoutMs();

/// KVCOMM_LIVENESS_TIMEOUT_MS: how long a silent peer (host lost, network cut) may stay unnoticed before it is
/// declared dead; default 4000; <= 0 relies on the operating system's TCP timeouts.
int64_t livenessTimeoutMs();

/// KVCOMM_SOCKET_IFNAME: network interface whose IPv4 address bootstrap sockets advertise (default: first
/// non-loopback interface that is up, else loopback).
std::string socketIfname();

/// KVCOMM_HANDLE_TYPE = auto | posix_fd | fabric | ipc: how CUDA memory is exported to peers (ipc = legacy CUDA IPC).
std::string handleType();

/// KVCOMM_MULTICAST = 1 opts in to NVLS multicast publication.
bool multicastRequested();
/// Why multicast will not be used ("" when it would): not opted in, or NCCL_NVLS_ENABLE=0,
/// TORCH_SYMM_MEM_DISABLE_MULTICAST=1 or NVSHMEM_DISABLE_NVLS=1 is set.
std::string multicastRefusal();

/// Reads an integer knob; `fallback` when unset or malformed.
int64_t getInt(const char* name, int64_t fallback);
/// Reads a string knob; `fallback` when unset.
std::string getString(const char* name, const std::string& fallback);

}  // namespace kvcomm::env
