// The fd server's decoding of a request (and its one-use token table), and the client's decoding of a reply.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "fuzz_check.hpp"
#include "kvcomm/error.hpp"
#include "symm/fd_exchange.hpp"

using namespace kvcomm::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static TokenTable* table = [] {
    auto* t = new TokenTable();
    auto set = std::make_shared<ExportSet>();
    for (int g = 0; g < 4; ++g) t->offer(0x1234, static_cast<uint64_t>(g), 1, 4242, 0, set);
    return t;
  }();
  FdRequest req{};
  std::string why = decodeFdRequest(data, size, &req);
  if (why.empty()) {
    FUZZ_CHECK(size == sizeof(FdRequest) && req.magic == kFdMagic);
    size_t before = table->live();
    std::string refusal;
    auto set = table->take(req, 4242, 0, &refusal);
    if (set) {  // libFuzzer can learn a token from the comparisons: then it must match its entry exactly, once
      FUZZ_CHECK(req.bufferId == 0x1234 && req.generation < 4 && req.requesterRank == 1);
      FUZZ_CHECK(table->live() == before - 1);
      FUZZ_CHECK(table->take(req, 4242, 0, &refusal) == nullptr);
      table->offer(req.bufferId, req.generation, 1, 4242, 0, set);
    } else {
      FUZZ_CHECK(!refusal.empty() && table->live() == before);
    }
  }
  try {
    FdReply r = decodeFdReply(data, size, "fuzz");
    FUZZ_CHECK(size == sizeof(FdReply) && r.status == 0 && r.count <= kMaxExportPieces);
  } catch (const kvcomm::Error&) {
  }
  return 0;
}
