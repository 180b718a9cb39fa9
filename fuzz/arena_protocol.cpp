// The arena session decoder (arena/protocol.hpp), fed whole datagrams as a peer could send them. The first input
// byte is the number of descriptors that "arrived" with the datagram (0 to 64); the rest is the datagram.
// Invariants: decode() never reads outside the input or crashes; a datagram it accepts is canonical (re-encodes to
// the same bytes) and within every bound the session relies on (counts, piece ranges, descriptors per message).
#include <cstdint>
#include <cstring>
#include <vector>

#include "arena/protocol.hpp"
#include "fuzz_check.hpp"

using namespace kvcomm::detail::arena;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  size_t nfds = data[0] % (kPiecesPerMessage + 1);
  // A copy of exactly the datagram, so that a read past its end is a sanitizer error, not a read of the next byte.
  std::vector<uint8_t> datagram(data + 1, data + size);
  Message m;
  std::string why = decode(datagram.data(), datagram.size(), nfds, &m);
  if (!why.empty()) return 0;
  FUZZ_CHECK(encode(m) == datagram);
  FUZZ_CHECK(datagram.size() <= kMaxMessage);
  FUZZ_CHECK(m.regions.size() <= kMaxRegions);
  FUZZ_CHECK(m.reason.size() <= kMaxReason && m.user.size() <= kMaxUserBytes);
  if (m.type == MsgType::Pieces) {
    FUZZ_CHECK(m.metas.size() == nfds && nfds > 0 && nfds <= kPiecesPerMessage);
    for (const auto& p : m.metas) FUZZ_CHECK(p.bytes > 0 && p.chunkOffset + p.bytes <= p.chunkBytes);
  } else {
    FUZZ_CHECK(nfds == 0);
  }
  if (m.type == MsgType::Grant) {
    FUZZ_CHECK(m.grant.bytes <= m.grant.capacity && m.grant.capacity <= kMaxCapacity);
    FUZZ_CHECK(m.grant.granularity && (m.grant.granularity & (m.grant.granularity - 1)) == 0);
    FUZZ_CHECK(m.regions.size() == m.grant.numRegions && !m.regions.empty());
  }
  return 0;
}
