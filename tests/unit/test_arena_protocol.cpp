// The arena session protocol's decoder (every field of peer bytes checked; canonical round trips) and the
// capability table (one use, expiry, binding to process and generation), in one process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "arena/capability_table.hpp"
#include "arena/protocol.hpp"

namespace {

using namespace kvcomm::detail::arena;
using kvcomm::detail::PieceMeta;

std::vector<Message> samples() {
  std::vector<Message> out;
  Message m;
  m.type = MsgType::Hello;
  m.hello = HelloBody{1234, 0, 0};
  out.push_back(m);
  m.type = MsgType::Welcome;
  out.push_back(m);
  m = Message{};
  m.type = MsgType::Refused;
  m.reason = "uid 65534 is not allowed";
  out.push_back(m);
  m = Message{};
  m.type = MsgType::Import;
  m.seq = 9;
  m.import.arenaId = 0x1234;
  m.import.generation = 3;
  for (int i = 0; i < 16; ++i) m.import.token[i] = static_cast<uint8_t>(i * 7);
  out.push_back(m);
  m = Message{};
  m.type = MsgType::Grant;
  m.seq = 9;
  m.grant = GrantBody{0x1234, 3, 1, 1 << 20, 1 << 16, 4096, 7, 1, -1, 0, 2, {}};
  m.regions = {{256, 1024, 1216, 16}, {20000, 2048, 2240, 16}};
  out.push_back(m);
  m = Message{};
  m.type = MsgType::Pieces;
  m.pieces = PiecesBody{0x1234, 1, 0, 1};
  m.metas = {{0, 8192, 0, 8192}, {8192, 4096, 0, 4096}};
  out.push_back(m);
  m = Message{};
  m.type = MsgType::Grown;
  m.grown = GrownBody{0x1234, 1, 4, 1 << 17, 8, 0, 1};
  m.regions = {{256, 1024, 1216, 32}};
  out.push_back(m);
  m = Message{};
  m.type = MsgType::GrowAck;
  m.growAck = GrowAckBody{0x1234, 1, 4, 0, 0};
  m.reason = "mapping failed";
  out.push_back(m);
  m.growAck.ok = 1;
  m.reason.clear();
  out.push_back(m);
  m = Message{};
  m.type = MsgType::Close;
  m.lease = LeaseBody{0x1234, 1};
  out.push_back(m);
  m.type = MsgType::CloseAck;
  out.push_back(m);
  m = Message{};
  m.type = MsgType::Revoked;
  m.revoked = RevokedBody{0x1234, 1};
  m.reason = "released";
  out.push_back(m);
  m = Message{};
  m.type = MsgType::User;
  m.user = {1, 2, 3};
  out.push_back(m);
  m = Message{};
  m.type = MsgType::Bye;
  out.push_back(m);
  return out;
}

size_t fdsOf(const Message& m) {
  return m.type == MsgType::Pieces ? m.metas.size() : 0;
}

TEST(ArenaProtocol, EveryMessageRoundTripsCanonically) {
  for (const Message& m : samples()) {
    std::vector<uint8_t> bytes = encode(m);
    Message d;
    ASSERT_EQ(decode(bytes.data(), bytes.size(), fdsOf(m), &d), "") << msgTypeName(m.type);
    EXPECT_EQ(encode(d), bytes) << msgTypeName(m.type);
    EXPECT_EQ(d.type, m.type);
    EXPECT_EQ(d.seq, m.seq);
  }
}

TEST(ArenaProtocol, MalformedMessagesAreRefusedWithAReason) {
  auto refuse = [](std::vector<uint8_t> bytes, size_t nfds, const std::string& part) {
    Message d;
    std::string why = decode(bytes.data(), bytes.size(), nfds, &d);
    EXPECT_NE(why, "");
    EXPECT_NE(why.find(part), std::string::npos) << "reason: " << why << " (expected it to mention: " << part << ")";
  };
  auto all = samples();
  const Message& grant = all[4];
  const Message& pieces = all[5];
  std::vector<uint8_t> g = encode(grant);
  refuse({1, 2, 3}, 0, "shorter than its header");
  std::vector<uint8_t> bad = g;
  bad[0] ^= 1;
  refuse(bad, 0, "magic");
  bad = g;
  bad[4] = 2;  // version
  refuse(bad, 0, "version 2");
  bad = g;
  bad.push_back(0);
  refuse(bad, 0, "body bytes");
  refuse(g, 1, "descriptors attached");
  refuse(encode(pieces), 1, "1 descriptors for 2 pieces");
  Message m = grant;
  m.grant.granularity = 3000;
  refuse(encode(m), 0, "power of two");
  m = grant;
  m.grant.bytes = m.grant.capacity * 2;
  refuse(encode(m), 0, "bytes");
  m = grant;
  m.grant.capacity = 1ull << 60;
  refuse(encode(m), 0, "capacity");
  m = grant;
  m.grant.handleKind = 3;  // fabric: never sent
  refuse(encode(m), 0, "handle kind");
  m = grant;
  m.grant.ipcHandle[5] = 1;
  refuse(encode(m), 0, "IPC handle");
  m = grant;
  m.regions.assign(kMaxRegions + 1, WireRegion{0, 1, 1, 1});
  refuse(encode(m), 0, "regions");
  m = grant;
  m.grant.numPieces = 0;
  refuse(encode(m), 0, "pieces");
  m = pieces;
  m.metas[0].chunkOffset = 4096;  // 8192 bytes at 4096 of an 8192-byte chunk
  refuse(encode(m), 2, "malformed");
  m = pieces;
  m.metas[1].offset = ~0ull - 100;
  refuse(encode(m), 2, "malformed");
  m = pieces;
  m.metas.assign(kPiecesPerMessage + 1, PieceMeta{0, 4096, 0, 4096});
  refuse(encode(m), kPiecesPerMessage + 1, "pieces in one message");
  m = all[0];
  m.hello.reserved = 1;
  refuse(encode(m), 0, "reserved");
  m = all[7];
  m.growAck.ok = 2;
  refuse(encode(m), 0, "ok = 2");
  m = all[2];
  m.reason.assign(kMaxReason, 'x');
  std::vector<uint8_t> longReason = encode(m);
  longReason.push_back('y');
  reinterpret_cast<Header*>(longReason.data())->length += 1;
  refuse(longReason, 0, "reason");
  std::vector<uint8_t> unknown = encode(all.back());
  reinterpret_cast<Header*>(unknown.data())->type = 99;
  refuse(unknown, 0, "unknown message type");
  refuse(std::vector<uint8_t>(kMaxMessage + 1, 0), 0, "at most");
}

TEST(ArenaProtocol, RandomBytesNeverCrashTheDecoder) {
  std::mt19937_64 rng(42);
  auto all = samples();
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> bytes = encode(all[rng() % all.size()]);
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    if (rng() % 8 == 0) bytes.resize(rng() % (bytes.size() + 1));
    Message d;
    if (decode(bytes.data(), bytes.size(), rng() % 3, &d).empty()) {
      EXPECT_EQ(encode(d), bytes) << "a message that decodes must be canonical";
    }
  }
}

TEST(ArenaCapabilities, OneUseBoundExpiringAndRevocable) {
  CapabilityTable t;
  int me = getpid();
  auto c = t.issue(7, 1, me, 1000, 60000);
  EXPECT_EQ(c.arenaId, 7u);
  EXPECT_EQ(c.importerPid, me);
  EXPECT_EQ(t.live(), 1u);
  // Another process (pid or uid) is refused and the token stays for its rightful holder.
  EXPECT_NE(t.take(c.token, 1, 1, me + 1, 1000).find("issued to pid"), std::string::npos);
  EXPECT_NE(t.take(c.token, 1, 1, me, 1001).find("uid 1001"), std::string::npos);
  // A tampered generation, and then the real use.
  EXPECT_NE(t.take(c.token, 2, 1, me, 1000).find("presented for generation 2"), std::string::npos);
  EXPECT_EQ(t.take(c.token, 1, 1, me, 1000), "");
  EXPECT_NE(t.take(c.token, 1, 1, me, 1000).find("already used"), std::string::npos);
  EXPECT_EQ(t.live(), 0u);
  // Forged.
  uint8_t forged[16] = {1, 2, 3};
  EXPECT_NE(t.take(forged, 1, 1, me, 1000).find("never issued"), std::string::npos);
  // Stale: the arena grew since.
  auto s = t.issue(7, 1, me, 1000, 60000);
  EXPECT_NE(t.take(s.token, 1, 2, me, 1000).find("generation 2"), std::string::npos);
  EXPECT_NE(t.take(s.token, 1, 2, me, 1000).find("generation"), std::string::npos);
  // Expired.
  auto e = t.issue(7, 1, me, 1000, 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_NE(t.take(e.token, 1, 1, me, 1000).find("expired"), std::string::npos);
  // Revoked.
  auto r = t.issue(7, 1, me, 1000, 60000);
  t.revokeAll("the arena was freed");
  EXPECT_NE(t.take(r.token, 1, 1, me, 1000).find("freed"), std::string::npos);
  // Bad arguments.
  EXPECT_THROW(t.issue(7, 1, 0, 0, 1000), kvcomm::InvalidArgumentError);
  EXPECT_THROW(t.issue(7, 1, me, 0, 0), kvcomm::InvalidArgumentError);
}

}  // namespace
