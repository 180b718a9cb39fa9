// What the KV server example's server and engines agree on: the KV layouts, the block contents (so each side checks
// every byte it receives without seeing the other's data), where the server publishes its metadata, and the
// notification messages they exchange. Everything else travels as kvcomm endpoint metadata and notifications.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../arena_kv/kv_blocks.hpp"  // kvLayout, fillBlock
#include "kvcomm/endpoint.hpp"

namespace kv_server_example {

using arena_example::fillBlock;
using arena_example::kvLayout;

inline constexpr size_t kLayers = 4;
inline constexpr size_t kBlockBytes = 4096;
inline constexpr size_t kServerBlocks = 96;  ///< [0, kPrefixBlocks): the prefix cache; the rest: room for writes
inline constexpr size_t kPrefixBlocks = 32;
inline constexpr size_t kEngineBlocks = 24;  ///< an engine's own KV cache
inline constexpr size_t kReadBlocks = 8;     ///< blocks each engine reads from the prefix cache
inline constexpr size_t kWriteBlocks = 4;    ///< new blocks each engine writes back
inline constexpr uint64_t kPrefixTag = 7;    ///< the prefix cache's content; an engine's new blocks: 100 + index
inline constexpr int kMaxEngines = (kServerBlocks - kPrefixBlocks) / kWriteBlocks;

/// The file the server writes one registration's metadata to ("host" or "cuda"), for engines started separately.
inline std::string metadataPath(const std::string& dir, const std::string& kind) {
  return dir + "/" + kind + ".metadata";
}

/// Writes `bytes` so that a reader sees all of them or none (a rename).
inline void publishFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!f) throw std::runtime_error("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp);
}

/// Waits up to `timeoutMs` for the file and returns its bytes.
inline std::vector<uint8_t> awaitFile(const std::string& path, int timeoutMs) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f) return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    if (std::chrono::steady_clock::now() > until) throw std::runtime_error("no server metadata at " + path);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// Messages are text: a verb, the engine's index, numbers; "hello" carries the engine's own metadata after a newline.
///   engine -> server: "hello I\n<metadata>"      (the server connects to it to answer)
///   server -> engine: "plan I r0 .. r7 w0 .. w3" (prefix blocks to read, pinned for it; blocks to write, reserved)
///   engine -> server: "read I"                   (with the read: the pinned blocks may be freed)
///   engine -> server: "written I"                (with the write: the reserved blocks hold its new KV)
///   server -> engine: "verified I ok|bad"
inline std::string verbOf(const std::string& m) {
  return m.substr(0, m.find_first_of(" \n"));
}

inline std::vector<int64_t> numbersOf(const std::string& m) {
  std::istringstream in(m.substr(0, m.find('\n')));
  std::string verb;
  in >> verb;
  std::vector<int64_t> out;
  for (int64_t v; in >> v;) out.push_back(v);
  return out;
}

/// Waits up to `timeoutMs` for the next notification whose verb is `verb` (others are a protocol error).
inline kvcomm::Notification awaitNotification(kvcomm::Endpoint& ep, const std::string& verb, int timeoutMs) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  while (std::chrono::steady_clock::now() < until) {
    for (kvcomm::Notification& n : ep.notifications(100)) {
      if (verbOf(n.message) != verb)
        throw std::runtime_error("expected \"" + verb + "\", got \"" + n.message.substr(0, 40) + "\"");
      return n;
    }
  }
  throw std::runtime_error("no \"" + verb + "\" notification within " + std::to_string(timeoutMs) + " ms");
}

/// Byte-exact comparison of a whole KV memory image with what it should hold; prints the first difference.
inline bool sameBytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const char* who) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      std::fprintf(stderr, "%s: byte %zu is 0x%02x, expected 0x%02x\n", who, i, got[i], want[i]);
      return false;
    }
  return got.size() == want.size();
}

/// sameBytes over blocks `blocks` of every region of two images laid out as `layout`.
inline bool sameBlocks(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                       const kvcomm::KvLayout& layout, const std::vector<int64_t>& blocks, const char* who) {
  for (const kvcomm::KvRegion& g : layout.regions)
    for (int64_t b : blocks) {
      size_t at = g.offset + static_cast<size_t>(b) * g.blockStride;
      std::vector<uint8_t> x(got.begin() + at, got.begin() + at + g.blockBytes);
      std::vector<uint8_t> y(want.begin() + at, want.begin() + at + g.blockBytes);
      if (!sameBytes(x, y, who)) {
        std::fprintf(stderr, "%s: in block %lld at offset %zu\n", who, static_cast<long long>(b), at);
        return false;
      }
    }
  return true;
}

/// Writes block `block` of every region of `image` (laid out as `layout`) with content (tag, region, id).
inline void fillImage(std::vector<uint8_t>& image, const kvcomm::KvLayout& layout, size_t block, uint64_t tag,
                      size_t id) {
  for (size_t r = 0; r < layout.regions.size(); ++r) {
    const kvcomm::KvRegion& g = layout.regions[r];
    fillBlock(tag, r, id, image.data() + g.offset + block * g.blockStride, g.blockBytes);
  }
}

}  // namespace kv_server_example
