// kvcomm: bootstraps. A Bootstrap gives a fixed set of processes rank(), size(), allgather() and barrier(); a
// Communicator is built on one. Three implementations: TcpBootstrap (unique id), CallbackBootstrap (the engine's
// own process group) and MpiBootstrap (kvcomm/mpi_bootstrap.hpp, target kvcomm::mpi).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvcomm/api.hpp"

namespace kvcomm {

/// Version of kvcomm's wire protocol (bootstrap handshake, rendezvous requests). Peers with a different version are
/// refused with a clear error.
inline constexpr uint32_t kProtocolVersion = 1;

/// Collective services a Communicator boots from. All members call each collective in the same order.
class KVCOMM_API Bootstrap {
 public:
  virtual ~Bootstrap();
  /// This process's rank in [0, size()).
  virtual int rank() const = 0;
  /// Number of processes.
  virtual int size() const = 0;
  /// In-place allgather: `data` holds size() * bytesPerRank bytes; this rank's contribution is at
  /// data + rank() * bytesPerRank on entry, and every rank's is in place on return.
  virtual void allgather(void* data, size_t bytesPerRank) = 0;
  /// Returns when every rank has entered.
  virtual void barrier();
};

/// Opaque identity of a TCP bootstrap group: the root's address and a random 128-bit nonce. Created once (on the
/// root's host), handed to every rank out of band (environment, file, the engine's own store).
struct KVCOMM_API UniqueId {
  std::array<uint8_t, 64> bytes{};
  /// Lower-case hex text, for environment variables and command lines.
  std::string toString() const;
  /// Parses toString()'s form; throws InvalidArgumentError on malformed text.
  static UniqueId fromString(const std::string& text);
};

namespace detail {
class TcpMesh;
}

/// Bootstrap over TCP. Rank 0 listens at the address in the unique id; other ranks connect to it (retrying until
/// the timeout), present the id's magic, protocol version and nonce, and learn every rank's address. Afterwards all
/// traffic goes point to point.
class KVCOMM_API TcpBootstrap : public Bootstrap {
 public:
  /// Creates a new id whose root listens on `ifname` (default: KVCOMM_SOCKET_IFNAME, else the first non-loopback
  /// interface that is up, else loopback). Call it in the process that will be rank 0: it opens the root's
  /// listening socket, which that process's rank-0 TcpBootstrap adopts. (A rank 0 in another process binds the id's
  /// port itself, which works only once the creating process has exited.)
  static UniqueId createUniqueId(const std::string& ifname = "");

  /// Joins the group (collective). `timeoutMs` < 0 uses KVCOMM_BOOTSTRAP_TIMEOUT_MS. Throws NetworkError with code
  /// Timeout when the root cannot be reached in time, and with code NetworkError when the root refuses this rank
  /// (wrong nonce, version or size).
  TcpBootstrap(const UniqueId& id, int rank, int size, int64_t timeoutMs = -1);
  ~TcpBootstrap() override;
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  int rank() const override;
  int size() const override;
  void allgather(void* data, size_t bytesPerRank) override;

  /// The point-to-point mesh (internal; Communicators built on this bootstrap share it).
  std::shared_ptr<detail::TcpMesh> mesh() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Bootstrap over the engine's own process group: the engine supplies an allgather (e.g. over torch.distributed).
class KVCOMM_API CallbackBootstrap : public Bootstrap {
 public:
  /// Gathers `bytesPerRank` bytes from every rank: `send` is this rank's contribution, `recv` receives
  /// size() * bytesPerRank bytes ordered by rank.
  using AllgatherFn = std::function<void(const void* send, void* recv, size_t bytesPerRank)>;
  CallbackBootstrap(int rank, int size, AllgatherFn allgather);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allgather(void* data, size_t bytesPerRank) override;

 private:
  int rank_;
  int size_;
  AllgatherFn allgather_;
};

}  // namespace kvcomm
