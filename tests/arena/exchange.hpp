// The two halves of one arena exchange, used by the tests in either direction (the server or the client owns):
// the owner fills an arena (guard bytes everywhere, then every block), offers it over the session and checks what
// the importer wrote back; the importer maps it, checks every byte against the oracle, writes the odd blocks and
// closes. Both print what went wrong and return false.
#pragma once

#include <cstdint>

#include "arena/harness.hpp"
#include "kvcomm/arena.hpp"

namespace kvtest::arena {

inline uint64_t guardSeed(uint64_t tag) {
  return 1000 + tag;
}
inline uint64_t ownerSeed(uint64_t tag) {
  return 2000 + tag;
}
inline uint64_t importerSeed(uint64_t tag) {
  return 3000 + tag;
}

/// Expected bytes after the importer wrote its blocks (odd ones) over the owner's.
inline std::vector<uint8_t> finalImage(const kvcomm::KvLayout& l, size_t bytes, uint64_t tag) {
  return image(l, bytes, guardSeed(tag), [&](size_t, size_t b) { return b % 2 ? importerSeed(tag) : ownerSeed(tag); });
}
inline std::vector<uint8_t> ownerImage(const kvcomm::KvLayout& l, size_t bytes, uint64_t tag) {
  return image(l, bytes, guardSeed(tag), [&](size_t, size_t) { return ownerSeed(tag); });
}

bool ownerSide(kvcomm::ArenaSession& s, kvcomm::MemoryKind kind, const kvcomm::KvLayout& layout, uint64_t tag);
bool importerSide(kvcomm::ArenaSession& s, const kvcomm::KvLayout& layout, uint64_t tag,
                  const kvcomm::ImportOptions& options = {});

}  // namespace kvtest::arena
