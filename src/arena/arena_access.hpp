// What the layers above arena (endpoints) may take of an Arena beyond its public API: the pieces of memory behind
// it, which a same-host peer maps from their descriptors (no /proc/self/map_files lookup, no privilege needed).
#pragma once

#include <vector>

#include "kvcomm/arena.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail {

struct ArenaAccess {
  /// The arena's pieces now, by offset (empty for legacy IPC arenas and freed ones).
  static std::vector<Piece> pieces(const Arena& arena);
};

}  // namespace kvcomm::detail
