// kvcomm: Communicator, Topology and the TP/PCP/PP/DP ParallelGroups of inference engines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvcomm/api.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/capabilities.hpp"

namespace kvcomm {

/// What a communicator knows about one member.
struct MemberInfo {
  int rank = -1;       ///< rank in this communicator
  int worldRank = -1;  ///< rank in the communicator created from the bootstrap
  int pid = 0;
  uint32_t uid = 0;
  std::string hostname;
  std::string bootId;  ///< /proc/sys/kernel/random/boot_id
  uint64_t netns = 0;  ///< inode of /proc/self/ns/net: different namespaces are different hosts
  int hostIndex = -1;  ///< hosts numbered by first appearance in rank order
  int localRank = -1;  ///< index among the members on the same host
  int localSize = 0;   ///< members on the same host
  GpuInfo gpu;
  std::vector<std::string> rdmaDevices;  ///< RDMA devices visible to the member
};

/// Per-member host identity, GPU and RDMA devices, and the P2P access matrix among same-host GPUs.
struct KVCOMM_API Topology {
  std::vector<MemberInfo> members;
  /// p2p[a * size + b]: member a's GPU can access member b's GPU directly (same host, same GPU or CUDA peer access).
  std::vector<uint8_t> p2p;
  int numHosts = 0;

  int size() const { return static_cast<int>(members.size()); }
  /// Members a and b are on one host. Throws InvalidArgumentError unless 0 <= a, b < size().
  bool sameHost(int a, int b) const;
  /// Member a's GPU can access member b's directly. Throws InvalidArgumentError unless 0 <= a, b < size() (or when
  /// p2p does not hold size() * size() entries).
  bool canAccessPeer(int a, int b) const;
  /// Every member on one host.
  bool singleHost() const { return numHosts == 1; }
  /// Every pair of members on one host with GPU P2P access.
  bool allPeerAccess() const;
  /// The first two members on one host that drive the same GPU, or {-1, -1} (NCCL needs one GPU per rank).
  std::pair<int, int> sharedGpu() const;
  /// Members on host `hostIndex`, in rank order.
  std::vector<int> hostMembers(int hostIndex) const;
  /// A human-readable table (members, then the P2P matrix when GPUs are present).
  std::string toString() const;
};

class Communicator;
namespace detail {
class GroupHealth;
GroupHealth& healthOf(const Communicator& comm);
}  // namespace detail

/// A group of processes that run collectives together. A Communicator is a handle: copies share one group.
///
/// Call order: create() on every rank of a bootstrap (collective) -> split()/ParallelGroups::create() (collective over
/// this communicator) -> collectives in the same order on every member. Destroying the last handle closes the group's
/// connections (no collective at teardown).
///
/// Failures: a member's death is noticed by every member within 5 s whatever it is doing (a liveness watch
/// independent of the data path); from then on healthy() is false and every waiting and later call throws a
/// NetworkError naming the dead rank. abort() stops the group on this rank (calls throw ErrorCode::Aborted).
///
/// Threads: one thread at a time may call the collectives and send/recv of one communicator (members must call
/// collectives in the same order, which concurrent calls would not keep). Different communicators, also of one
/// world, may be used from different threads at once. abort(), healthy(), failedRank(), rank(), size(),
/// topology() and id() are safe from any thread at any time.
class KVCOMM_API Communicator {
 public:
  /// Builds the world communicator from a bootstrap (collective over the bootstrap's ranks). The process's current
  /// CUDA device (if any) is recorded as this rank's GPU: call cudaSetDevice first.
  static Communicator create(std::shared_ptr<Bootstrap> bootstrap);

  /// An empty handle: every method but valid() throws InvalidArgumentError ("the communicator is empty").
  Communicator() = default;
  bool valid() const { return impl_ != nullptr; }
  int rank() const;
  int size() const;
  /// Rank of member `rank` in the world communicator this one was split from.
  int worldRank(int rank) const;

  /// MPI_Comm_split semantics (collective): members with the same color form a group, ordered by (key, rank); a
  /// negative color takes part but gets no communicator (std::nullopt).
  std::optional<Communicator> split(int color, int key);

  /// In-place allgather (collective): this rank's bytes at data + rank() * bytesPerRank (data may be null only when
  /// bytesPerRank is 0).
  void allgather(void* data, size_t bytesPerRank);
  /// Returns when every member entered (collective).
  void barrier();
  /// Point-to-point messages among members; `tag` separates independent streams. InvalidArgumentError for a peer
  /// out of range, a tag >= 2^31, or a null `data` with `bytes` > 0.
  void send(const void* data, size_t bytes, int peer, uint32_t tag);
  void recv(void* data, size_t bytes, int peer, uint32_t tag);

  const Topology& topology() const;
  /// Identity of the group (equal on every member, different for each split).
  uint64_t id() const;

  /// Stops the group on this rank, like ncclCommAbort: every call on this communicator that is waiting (in any
  /// thread) and every later one throws an Error with code ErrorCode::Aborted, and so do the calls of objects built
  /// on it (SymmetricBuffer, Publisher) and of communicators split from it. Returns at once; waiting calls return
  /// within 2 s. Local: peers are not told (they see this rank's connections close when it destroys its
  /// communicators or exits). Callable from any thread, any number of times; the handles stay valid and are
  /// destroyed as usual.
  void abort();
  /// False once abort() was called (here or on a communicator this one was split from) or a member is known dead.
  /// Cheap (one atomic load); any thread.
  bool healthy() const;
  /// Rank in this communicator of the first member known dead, or -1.
  int failedRank() const;

  struct Impl;

 private:
  friend detail::GroupHealth& detail::healthOf(const Communicator& comm);
  explicit Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

/// Sizes of an engine's parallel dimensions. world = dp * pp * pcp * tp.
struct ParallelSpec {
  int tp = 1;   ///< tensor parallel
  int pcp = 1;  ///< prefill/context parallel (replicated KV cache)
  int pp = 1;   ///< pipeline parallel
  int dp = 1;   ///< data parallel
};

/// A rank's coordinates. Ranks are numbered the way inference engines number them, TP fastest:
/// rank = ((dp * PP + pp) * PCP + pcp) * TP + tp. So TP2/PCP2 gives TP groups {0,1},{2,3} and PCP groups {0,2},{1,3}.
struct ParallelCoord {
  int tp = 0, pcp = 0, pp = 0, dp = 0;
};

enum class Axis { TP, PCP, PP, DP };

/// The TP, PCP, PP and DP groups of this rank.
struct KVCOMM_API ParallelGroups {
  ParallelSpec spec;
  ParallelCoord coord;
  Communicator tp;   ///< members sharing (dp, pp, pcp); rank = tp coordinate
  Communicator pcp;  ///< members sharing (dp, pp, tp); rank = pcp coordinate
  Communicator pp;   ///< members sharing (dp, pcp, tp); rank = pp coordinate
  Communicator dp;   ///< members sharing (pp, pcp, tp); rank = dp coordinate

  /// Splits `world` into the four groups (collective). Throws InvalidArgumentError unless
  /// world.size() == tp * pcp * pp * dp and every size is positive.
  static ParallelGroups create(Communicator& world, const ParallelSpec& spec);
  /// Coordinates of `rank`, and the rank of coordinates (pure functions).
  static ParallelCoord coordOf(const ParallelSpec& spec, int rank);
  static int rankOf(const ParallelSpec& spec, const ParallelCoord& coord);
  /// World ranks of the group along `axis` that holds `rank`, in group-rank order.
  static std::vector<int> groupOf(const ParallelSpec& spec, int rank, Axis axis);
};

}  // namespace kvcomm
