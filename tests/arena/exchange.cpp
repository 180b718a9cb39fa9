#include "arena/exchange.hpp"

#include <unistd.h>

#include <cstdio>

namespace kvtest::arena {

namespace {

bool sameLayout(const kvcomm::KvLayout& a, const kvcomm::KvLayout& b) {
  if (a.version != b.version || a.regions.size() != b.regions.size()) return false;
  for (size_t i = 0; i < a.regions.size(); ++i) {
    const auto &x = a.regions[i], &y = b.regions[i];
    if (x.offset != y.offset || x.blockBytes != y.blockBytes || x.blockStride != y.blockStride ||
        x.numBlocks != y.numBlocks)
      return false;
  }
  return true;
}

}  // namespace

bool ownerSide(kvcomm::ArenaSession& s, kvcomm::MemoryKind kind, const kvcomm::KvLayout& layout, uint64_t tag) {
  kvcomm::ArenaOptions o;
  o.kind = kind;
  kvcomm::Arena a = kvcomm::Arena::create(layout, o);
  std::vector<uint8_t> img = ownerImage(layout, a.bytes(), tag);
  a.write(0, img.data(), img.size());
  sendCapability(s, s.offer(a));
  std::string m = recvText(s);
  if (m != "written") {
    std::fprintf(stderr, "[owner %d] expected \"written\", got \"%s\"\n", getpid(), m.c_str());
    return false;
  }
  std::string diff = compare(a, finalImage(layout, a.bytes(), tag));
  if (!diff.empty()) std::fprintf(stderr, "[owner %d] after the importer wrote: %s\n", getpid(), diff.c_str());
  sendText(s, diff.empty() ? "checked" : "bad");
  // The importer's close() returns once this side dropped the lease; allow for scheduling all the same.
  if (!waitUntil([&] { return a.leases() == 0; }, 5000)) {
    std::fprintf(stderr, "[owner %d] the lease was not dropped after the importer closed\n", getpid());
    return false;
  }
  a.free();
  return diff.empty();
}

bool importerSide(kvcomm::ArenaSession& s, const kvcomm::KvLayout& layout, uint64_t tag,
                  const kvcomm::ImportOptions& options) {
  kvcomm::ArenaCapability cap = recvCapability(s);
  if (cap.importerPid != getpid()) {
    std::fprintf(stderr, "[importer %d] the capability names pid %d\n", getpid(), cap.importerPid);
    return false;
  }
  kvcomm::ArenaImport imp = s.import(cap, options);
  bool ok = true;
  if (!sameLayout(imp.layout(), layout) || imp.bytes() < extentOf(layout) || imp.arenaId() != cap.arenaId ||
      imp.ownerPid() != s.peerPid() || !imp.ownerAlive()) {
    std::fprintf(stderr, "[importer %d] the import does not describe the owner's arena (%zu bytes)\n", getpid(),
                 imp.bytes());
    ok = false;
  }
  std::string diff = compare(imp, ownerImage(layout, imp.bytes(), tag));
  if (!diff.empty()) {
    std::fprintf(stderr, "[importer %d] the owner's bytes: %s\n", getpid(), diff.c_str());
    ok = false;
  }
  writeBlocks(imp, layout, [&](size_t, size_t b) { return b % 2 ? importerSeed(tag) : 0; });
  sendText(s, "written");
  std::string m = recvText(s);
  if (m != "checked") {
    std::fprintf(stderr, "[importer %d] the owner answered \"%s\"\n", getpid(), m.c_str());
    ok = false;
  }
  imp.close();
  if (imp.data() != nullptr || !imp.closed()) {
    std::fprintf(stderr, "[importer %d] the import is not closed\n", getpid());
    ok = false;
  }
  return ok;
}

}  // namespace kvtest::arena
