// Every environment knob kvcomm reads, in one place (documented in docs/environment.md).
// Values are read when an object is created or an operation starts (a communicator keeps the bootstrap timeout it
// was created with), so a process (or a test) may change them between operations.
// Every KVCOMM_* knob is parsed strictly: unset or empty means the default; any other value that is not accepted is an
// InvalidArgumentError naming the variable, the value and what is accepted. A typo is never taken for the default.
#pragma once

#include <cstdint>
#include <string>

namespace kvcomm::env {

/// A knob whose value is one of a few words (case-insensitive): choices[i] holds the spellings of choice i (the first
/// is canonical, unused slots null); unset or empty is choice 0. env owns the spellings and their strict parsing; the
/// feature that reads the knob owns what its choices mean (its own enum, in the same order).
struct WordKnob {
  const char* name;
  const char* choices[4][3];
  const char* accepted;  ///< as errors show it
};
/// The index of the choice the knob's value spells; InvalidArgumentError naming the knob, the value and `accepted`
/// for anything else.
int choice(const WordKnob& knob);
/// The canonical spelling of choice `i`, as errors and reasons show it ("?" outside the choices).
const char* word(const WordKnob& knob, int i) noexcept;

/// KVCOMM_DIRECT = auto | 1, on, force | 0, off: publish directly into peer memory (auto where the group allows it),
/// demand it, or force the gather+insert fallback (publish's DirectRequest).
inline constexpr WordKnob kDirect{
    "KVCOMM_DIRECT", {{"auto"}, {"1", "on", "force"}, {"0", "off"}}, "auto; 1, on or force; 0 or off"};

/// KVCOMM_LOG_LEVEL = error | warn | info | debug (case-insensitive; default warn), as 0..3.
int logLevel();
/// logLevel() for the logger, which must never throw (destructors log): warn when the value is not accepted (the next
/// validate(), run by TcpBootstrap and Communicator::create, reports it).
int logLevelOrWarn() noexcept;

/// KVCOMM_BOOTSTRAP_TIMEOUT_MS: bound on every bootstrap wait (connect, receive); default 120000; an integer up to
/// kMaxTimeoutMs, negative for no bound.
int64_t bootstrapTimeoutMs();

/// KVCOMM_BARRIER_TIMEOUT_MS: bound on every barrier wait (device and host); default 10000; an integer in
/// [0, kMaxBarrierTimeoutMs] (0 is taken as 1 ms by the publisher: a wait is always bounded and always polls once).
int64_t barrierTimeoutMs();

inline constexpr int64_t kMaxTimeoutMs = 1000000000000;    // 10^12 ms (31 years): deadlines stay representable
inline constexpr int64_t kMaxBarrierTimeoutMs = 86400000;  // one day

/// KVCOMM_LIVENESS_TIMEOUT_MS: how long a silent peer (host lost, network cut) may stay unnoticed before it is
/// declared dead; default 4000; 0 or negative relies on the operating system's TCP timeouts.
int64_t livenessTimeoutMs();

/// KVCOMM_SOCKET_IFNAME: network interface whose IPv4 address bootstrap sockets advertise (default: first
/// non-loopback interface that is up, else loopback). A name of 1 to 15 characters; whether it exists and is up is
/// checked where it is used.
std::string socketIfname();

/// KVCOMM_HANDLE_TYPE = auto | posix_fd | fabric | ipc (also cuda_ipc, legacy): how CUDA memory is exported to peers
/// (ipc = legacy CUDA IPC).
enum class HandleType { Auto, PosixFd, Fabric, Ipc };
HandleType handleType();

/// KVCOMM_MULTICAST = 0 | 1; 1 opts in to NVLS multicast publication.
bool multicastRequested();
/// Why multicast will not be used ("" when it would): NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 or
/// NVSHMEM_DISABLE_NVLS=1 is set, or not opted in. Never throws: a KVCOMM_MULTICAST that is not accepted is the reason.
std::string multicastRefusal();

/// KVCOMM_PDL = 0 | 1 (default 1): launch the publish and barrier kernels with programmatic dependent launch on
/// GPUs of compute capability 9.0 and up, so their launch overlaps the end of the kernel before them.
bool dependentLaunch();

/// KVCOMM_FALLBACK_PACK_MAX_BYTES: the GPU fallback packs a call's slots and rows into one record (one AllGather)
/// when that record is at most this many bytes, even when the rows are back to back in the caller's buffers (default
/// 262144); larger calls with contiguous rows gather them in place with a group of AllGathers. 0: never pack those.
int64_t fallbackPackMaxBytes();

/// KVCOMM_FETCH_PATH = auto | kernel | copy (or ce) | host: the path a fetch with FetchOptions::path Auto takes
/// (fetch's FetchPath, in this order).
inline constexpr WordKnob kFetchPath{
    "KVCOMM_FETCH_PATH", {{"auto"}, {"kernel"}, {"copy", "ce"}, {"host"}}, "auto, kernel, copy (or ce), host"};

/// KVCOMM_FETCH_CE_MIN_BYTES: under the auto path, runs of at least this many bytes go to the copy engines
/// (default 4 MiB).
int64_t fetchCopyEngineMinBytes();

/// KVCOMM_FETCH_TRANSPORT = auto | peer | rdma | tcp: what carries a fetch from another member. auto: the peer
/// mappings on one host, RDMA READ to another host when both members have an RDMA device, else TCP. peer, rdma, tcp
/// demand that transport for every other member (one it cannot reach is an error, never a silent substitute)
/// (fetch's TransportDemand, in this order).
inline constexpr WordKnob kFetchTransport{
    "KVCOMM_FETCH_TRANSPORT", {{"auto"}, {"peer"}, {"rdma"}, {"tcp"}}, "auto, peer, rdma, tcp"};

/// KVCOMM_FETCH_NET_TIMEOUT_MS: bound on how long a network fetch waits for progress from a source (connect, reply,
/// next bytes, completions) before it fails naming the source; default 3000; an integer in [100, kMaxBarrierTimeoutMs].
int64_t fetchNetTimeoutMs();

/// KVCOMM_FETCH_TCP_CONNECTIONS: TCP connections a member opens to each source it fetches from (used in parallel
/// by large fetches); default 4; an integer in [1, 16].
int fetchTcpConnections();

/// Reads every KVCOMM_* knob; throws InvalidArgumentError for the first one whose value is not accepted. Run at the
/// start of TcpBootstrap and Communicator::create, so a bad knob is reported before any rank waits on another.
void validate();

}  // namespace kvcomm::env
