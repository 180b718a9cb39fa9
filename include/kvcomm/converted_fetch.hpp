// kvcomm: converted fetches between the members of one group (a Communicator's SymmetricBuffer) whose caches are
// laid out differently -- a prefill group of TP 8 and a decode group of TP 2 in one world, other block sizes, another
// token/head order -- the collective counterpart of readConverted (converted_read.hpp). The Fetcher (fetch.hpp)
// moves whole blocks between members with one layout; a ConvertedFetcher moves tokens between members that each
// describe their own: the descriptions are checked and exchanged once, at create, on every member, and every fetch
// after that is one-sided and names its sources by member rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvcomm/api.hpp"
#include "kvcomm/converted_read.hpp"
#include "kvcomm/kv_contents.hpp"
#include "kvcomm/kv_conversion.hpp"
#include "kvcomm/kv_layout.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm {

struct ConvertedFetcherOptions {
  /// Where this member's endpoint listens for members on other hosts ("a.b.c.d:port"; "": this host's address as
  /// KVCOMM_SOCKET_IFNAME picks it, an ephemeral port).
  std::string tcpAddress;
  /// A transfer with no progress for this long fails, naming the member (< 0: KVCOMM_FETCH_NET_TIMEOUT_MS).
  int64_t netTimeoutMs = -1;
};

/// Converted fetches among the members of a SymmetricBuffer's group.
///
///   1. create(buffer, layout, contents) on every member (collective). Each member passes its own layout (inside
///      the backed part of its buffer) and what its regions hold; layouts may differ between members (that is the
///      point: TP split, block size, order). Each member checks its own (checkDescription) and registers its memory
///      with an endpoint of its own (the endpoint transports: same-host mappings, RDMA, TCP); the outcomes are voted
///      on, so a bad layout or description on one member makes every member throw, naming it and why. Then every
///      member learns every other's layout and contents through the communicator (the endpoints' metadata).
///   2. fetch(sources, tokens): one-sided, from any member at any time, as readConverted does it -- a source on this
///      host read straight through its mapping (the conversion kernel or the CPU copies out of it), any other landing
///      whole blocks first; all or nothing. The sources must hold the tokens' bytes final before (e.g. after a
///      barrier); the fetcher does not order a source's writes.
///   3. Destroy it on every member once no member fetches any more (a source that went away fails the fetches that
///      still name it, naming it; nothing hangs).
///
/// The buffer's memory is registered as it is at create; blocks it stops backing later are neither read nor
/// written (a fetch touching them fails). Fetches through one ConvertedFetcher run one at a time.
class KVCOMM_API ConvertedFetcher {
 public:
  /// Collective over buffer.communicator(). Throws InvalidArgumentError on every member when a member's layout is
  /// malformed or not backed, or its contents do not describe its layout (the message names the member, the region
  /// and the field); other failures of a member's setup (its endpoint cannot listen, memory that cannot be
  /// registered) throw on every member with that member's error code, naming it.
  static ConvertedFetcher create(SymmetricBuffer& buffer, const KvLayout& layout, const KvDescription& contents,
                                 const ConvertedFetcherOptions& options = {});

  ConvertedFetcher();
  ~ConvertedFetcher();
  ConvertedFetcher(ConvertedFetcher&&) noexcept;
  ConvertedFetcher& operator=(ConvertedFetcher&&) noexcept;
  ConvertedFetcher(const ConvertedFetcher&) = delete;
  ConvertedFetcher& operator=(const ConvertedFetcher&) = delete;
  bool valid() const { return impl_ != nullptr; }

  /// Reads tokens [tokens.firstToken, + tokens.numTokens) from the members `sources` (ranks of the group, each once,
  /// never this member) into this member's memory, converting TP split, block size and order on the way:
  /// tokens.srcBlocks is the block table every source shares, tokens.dstBlocks this member's. Only the sources that
  /// hold a head this member needs are read (a replicated region from one: options.conversion.preferredSource, an
  /// index into `sources`, else the first). The result's sourcesRead and sourcesMapped are member ranks. Throws
  /// InvalidArgumentError before anything moves for a source outside the group, repeated, or this member, and for
  /// whatever readConverted refuses (descriptions that cannot be converted, tables too short, ids outside a layout);
  /// a source that fails (it died, stopped serving) fails the fetch (status Failed, naming it), this member's memory
  /// untouched.
  ConvertedReadResult fetch(const std::vector<int>& sources, const KvTokenRange& tokens,
                            const ConvertedReadOptions& options = {});

  /// Member `rank`'s layout and contents, as it registered them at create.
  const KvLayout& layout(int rank) const;
  const KvDescription& contents(int rank) const;
  int rank() const;
  int size() const;

  struct Impl;

 private:
  explicit ConvertedFetcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcomm
