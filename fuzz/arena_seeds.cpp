#include "arena_seeds.hpp"
#include "replay_seeds.hpp"

#include "arena/protocol.hpp"

using namespace kvcomm::detail::arena;

std::vector<std::vector<uint8_t>> arenaProtocolSeeds() {
  std::vector<Message> ms;
  Message m;
  m.type = MsgType::Hello;
  m.hello = HelloBody{1234, 1000, 0};
  ms.push_back(m);
  m.type = MsgType::Welcome;
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::Refused;
  m.reason = "uid 65534 is not allowed";
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::Import;
  m.seq = 3;
  m.import.arenaId = 0x1234;
  m.import.generation = 1;
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::Grant;
  m.seq = 3;
  m.grant = GrantBody{0x1234, 1, 1, 1 << 20, 1 << 16, 4096, 7, 1, -1, 0, 2, {}};
  m.regions = {{256, 1024, 1216, 16}, {20000, 2048, 2240, 16}};
  ms.push_back(m);
  m.grant.handleKind = 4;  // cuda_ipc: a handle, no pieces
  m.grant.device = 0;
  m.grant.numPieces = 0;
  m.grant.granularity = 2 << 20;
  m.grant.capacity = 4 << 20;
  m.grant.bytes = 2 << 20;
  m.grant.ipcHandle[0] = 1;
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::Deny;
  m.reason = "token refused: already used";
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::Pieces;
  m.pieces = PiecesBody{0x1234, 1, 0, 1};
  m.metas = {{0, 8192, 0, 8192}, {8192, 4096, 0, 4096}};
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::Grown;
  m.grown = GrownBody{0x1234, 1, 2, 1 << 17, 8, 0, 1};
  m.regions = {{256, 1024, 1216, 32}};
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::GrowAck;
  m.growAck = GrowAckBody{0x1234, 1, 2, 0, 0};
  m.reason = "mapping failed";
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::Close;
  m.lease = LeaseBody{0x1234, 1};
  ms.push_back(m);
  m.type = MsgType::CloseAck;
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::Revoked;
  m.revoked = RevokedBody{0x1234, 1};
  m.reason = "released";
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::User;
  m.user = {1, 2, 3, 4};
  ms.push_back(m);
  m = Message{};
  m.type = MsgType::Bye;
  ms.push_back(m);
  std::vector<std::vector<uint8_t>> out;
  for (const Message& x : ms) {
    std::vector<uint8_t> bytes = encode(x);
    bytes.insert(bytes.begin(), static_cast<uint8_t>(x.type == MsgType::Pieces ? x.metas.size() : 0));
    out.push_back(std::move(bytes));
  }
  return out;
}

std::vector<std::vector<uint8_t>> replaySeeds() {
  return arenaProtocolSeeds();
}
