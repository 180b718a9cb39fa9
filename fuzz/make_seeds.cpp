// Writes well-formed inputs for every fuzz target into <dir>/<target>/ (the checked-in seeds under fuzz/corpus).
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "comm/topology_build.hpp"
#include "comm/wire.hpp"
#include "endpoint/metadata.hpp"
#include "endpoint/notify_wire.hpp"
#include "symm/fd_exchange.hpp"
#include "symm/rendezvous.hpp"

using namespace kvcomm::detail;

namespace {

std::string root;

void write(const std::string& target, const std::string& name, const std::vector<char>& bytes) {
  std::string dir = root + "/" + target;
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/" + name, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void append(std::vector<char>& out, const T& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

Hello hello(HelloKind kind, int rank, int size) {
  Hello h{};
  h.magic = kWireMagic;
  h.version = kProtocolVersionWire;
  h.kind = static_cast<uint32_t>(kind);
  h.rank = rank;
  h.size = size;
  for (size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = static_cast<uint8_t>(i * 17 + 3);
  h.listenAddr = SockAddr::parse("127.0.0.1:40123");
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 1;
  }
  root = argv[1];
  mkdir(root.c_str(), 0755);

  {  // root_hello: hello + [group size byte][joined bits]
    std::vector<char> v;
    append(v, hello(HelloKind::Root, 1, 4));
    v.push_back(3);
    v.push_back(1);
    write("root_hello", "valid", v);
    Hello old = hello(HelloKind::Root, 2, 4);
    old.version = 0;
    v.clear();
    append(v, old);
    v.push_back(3);
    v.push_back(0);
    write("root_hello", "old_version", v);
  }
  {  // mesh_stream: a data connection with three frames, a watch connection with two notices
    std::vector<char> v;
    append(v, hello(HelloKind::Mesh, 2, 4));
    for (uint64_t len : {0, 5, 64}) {
      append(v, FrameHeader{makeTag(1, static_cast<uint32_t>(len)), len});
      for (uint64_t i = 0; i < len; ++i) v.push_back(static_cast<char>(i));
    }
    write("mesh_stream", "frames", v);
    v.clear();
    append(v, hello(HelloKind::Watch, 3, 4));
    append(v, makeWatch(WatchKind::Gone, 2, true, "its process died"));
    append(v, makeWatch(WatchKind::Bye, 3, false, ""));
    write("mesh_stream", "watch", v);
  }
  {  // fd_exchange: a request, a grant, a refusal
    std::vector<char> v;
    FdRequest req{kFdMagic, kvcomm::kProtocolVersion, {}, 0x1234, 2, 1, 0};
    append(v, req);
    write("fd_exchange", "request", v);
    v.clear();
    FdReply grant{};
    grant.magic = kFdMagic;
    grant.count = 2;
    append(v, grant);
    write("fd_exchange", "grant", v);
    v.clear();
    FdReply no{};
    no.magic = kFdMagic;
    no.status = 1;
    std::snprintf(no.message, sizeof(no.message), "token refused");
    append(v, no);
    write("fd_exchange", "refusal", v);
  }
  {  // unique_id: an id's text, address texts
    IdWire w{};
    w.magic = kWireMagic;
    w.version = kvcomm::kProtocolVersion;
    w.family = AF_INET;
    w.port = 40123;
    w.addr[0] = 127;
    w.addr[3] = 1;
    kvcomm::UniqueId id;
    std::memcpy(id.bytes.data(), &w, sizeof(w));
    std::string text = id.toString();
    write("unique_id", "id", std::vector<char>(text.begin(), text.end()));
    for (std::string a : {"10.1.2.3:29500", "[::1]:80"})
      write("unique_id", a == "[::1]:80" ? "v6" : "v4", {a.begin(), a.end()});
  }
  {  // topology: this machine's own record, twice
    std::vector<char> mine;
    gatherTopology(0, 1, [&](void* d, size_t n) {
      if (mine.empty()) mine.assign(static_cast<char*>(d), static_cast<char*>(d) + n);
    });
    std::vector<char> two = mine;
    two.insert(two.end(), mine.begin(), mine.end());
    write("topology", "two_members", two);
  }
  {  // symm_request: two members agreeing on a grow
    SymmRequest r{};
    r.version = kvcomm::kProtocolVersion;
    r.op = static_cast<uint32_t>(SymmOp::Grow);
    r.bufferId = 7;
    r.generation = 3;
    r.capacity = 1u << 30;
    r.opBytes = 1u << 21;
    r.granularity = 1u << 21;
    r.memKind = 2;
    r.handleKind = 1;
    std::snprintf(r.socketName, sizeof(r.socketName), "kvcomm-1234-0011223344556677");
    std::vector<char> v;
    append(v, r);
    append(v, r);
    write("symm_request", "grow", v);
  }
  {  // an endpoint registration's metadata: two regions, a TCP address
    EndpointMetadata m;
    m.endpointId = 0x1111;
    m.regionId = 0x2222;
    m.generation = 3;
    m.memoryKind = 1;
    m.tcp = SockAddr::parse("127.0.0.1:4242");
    m.name = "prefill-0";
    m.layout.regions = {{0, 4096, 8192, 16}, {4096, 4096, 8192, 16}};
    m.layoutHash = kvcomm::layoutHash(m.layout);
    std::vector<uint8_t> b = encodeMetadata(m);
    write("endpoint_metadata", "two_regions", std::vector<char>(b.begin(), b.end()));
    // The same with its contents (version 2): K and V of TP rank 1 of 2, 16 tokens x 4 of 8 heads x 32 x 2 bytes.
    m.contents.regions.assign(2, {2, 32, 16, 8, 4, 8, kvcomm::KvOrder::TokensHeadsDim, false});
    b = encodeMetadata(m);
    write("endpoint_metadata", "two_regions_described", std::vector<char>(b.begin(), b.end()));
  }
  {  // a notification: a named sender, its third message
    NotifyMessage m;
    m.sender = 0x3333;
    m.sequence = 3;
    m.senderName = "prefill-0";
    m.message = "request 17: blocks 40-47 in place";
    std::vector<uint8_t> b = encodeNotify(m);
    write("endpoint_notify", "named", std::vector<char>(b.begin(), b.end()));
  }
  return 0;
}
