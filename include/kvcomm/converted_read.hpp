// kvcomm: reading a token range from peers whose caches are laid out differently (TP split, block size, token/head
// order; kv_contents.hpp) into a local registration, converting on the way (kv_conversion.hpp). Over endpoints: a
// source on this host is read straight through its mapping; any other source's blocks land through the usual path
// (RDMA, TCP) in a landing area on the local side first. The conversion then rebuilds the local blocks: the CPU
// into host memory, one conversion kernel launch into CUDA memory.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvcomm/api.hpp"
#include "kvcomm/endpoint.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/kv_contents.hpp"
#include "kvcomm/kv_conversion.hpp"

namespace kvcomm {

/// One source of a converted read: a peer's registration (Endpoint::connect) and what its regions hold. Empty
/// contents: those its owner registered (RegisterOptions::contents), carried in its metadata (RemoteMemory::
/// contents()); contents given where the metadata carries some must equal them. Either way they are checked against
/// the layout the metadata carries.
struct ConvertedSource {
  RemoteMemory remote;
  KvDescription contents;
};

struct ConvertedReadOptions {
  KvConversionOptions conversion;  ///< preferredSource: for heads several sources hold (the nearest)
  TransferVia via = TransferVia::Auto;
  int64_t timeoutMs = -1;  ///< for the whole read (< 0: no bound); at expiry the read fails, local untouched
};

struct ConvertedReadResult {
  FetchStatus status;           ///< Done, or Failed naming the source and why (then nothing was written locally)
  uint64_t bytesConverted = 0;  ///< bytes written into the local registration
  uint64_t bytesLanded = 0;     ///< bytes the transports moved (whole source blocks)
  size_t pieces = 0;  ///< work items of the copy (segment x run of heads x chunk), or its contiguous pieces where
                      ///< neither block size divides the other
  std::vector<int32_t> sourcesRead;    ///< the sources that supplied a head (the others were not read)
  std::vector<int32_t> sourcesMapped;  ///< of those, the ones read through a same-host mapping (nothing landed)
};

/// Reads tokens [tokens.firstToken, + tokens.numTokens) from `sources` into `local` (a host or CUDA registration of
/// this endpoint described by `localContents`, or when that is empty by its RegisterOptions::contents), converting TP
/// split, block size and order on the way. Synchronous: it returns when every byte is in place, or when a source failed
/// (status Failed, naming the source and the transport's error; then nothing was written into `local`, all or nothing).
/// How each source used is read (options.via as Endpoint::read takes it): Auto reads a source on this host with
/// memory of the local kind through the peer path's mapping, the pieces copied straight out of it (no landing, no
/// second pass: the layout changes in the copy); any other source (another host, another memory kind; or via Tcp /
/// Rdma) has the whole blocks the tokens need read once, by the transport, into a landing area of the local memory's
/// kind registered with the endpoint, and copied from there. The copy is described compactly -- the block tables,
/// and per region the runs of heads that come from one source -- and its addresses are computed where it runs: by
/// the CPU for host memory, by one launch of the conversion kernel on the local registration's device (waited for)
/// for CUDA memory; so the host's work does not grow with the tokens. Where neither block size divides the other,
/// the plan's pieces are made on the host and copied the same two ways. A mapped source's memory is held
/// mapped until the copies ended (its owner's revoke or unregister waits that long).
/// Throws InvalidArgumentError before anything moves for what planConversion refuses (naming the source, region,
/// table or index), for a side described neither by the caller nor at registration, for contents given that differ
/// from the registered ones, and for an invalid handle; Unsupported when via is Peer and the peer path cannot reach a
/// source (naming it and why). A source whose owner refuses its metadata (stale, forged, unregistered) fails the read.
/// One-shot: its landing areas are allocated and registered for the call (page faults included); a ConvertedReader
/// keeps them between reads.
KVCOMM_API ConvertedReadResult readConverted(Endpoint& endpoint, const Registration& local,
                                             const KvDescription& localContents,
                                             const std::vector<ConvertedSource>& sources, const KvTokenRange& tokens,
                                             const ConvertedReadOptions& options = {});

/// readConverted with landing areas kept between reads (one per source position, grown as needed, re-registered
/// only when the layout a read needs changes), so that repeated reads pay neither allocation nor page faults. Reads
/// through one reader run one at a time (a mutex); readers are independent. The endpoint must outlive it.
class KVCOMM_API ConvertedReader {
 public:
  explicit ConvertedReader(Endpoint& endpoint);
  /// Unregisters and frees its landing areas.
  ~ConvertedReader();
  ConvertedReader(ConvertedReader&&) noexcept;
  ConvertedReader& operator=(ConvertedReader&&) noexcept;
  ConvertedReader(const ConvertedReader&) = delete;
  ConvertedReader& operator=(const ConvertedReader&) = delete;

  ConvertedReadResult read(const Registration& local, const KvDescription& localContents,
                           const std::vector<ConvertedSource>& sources, const KvTokenRange& tokens,
                           const ConvertedReadOptions& options = {});
  /// Bytes of landing memory held between reads.
  uint64_t landingBytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcomm
