// topo_probe: one rank of a TcpBootstrap group whose members may live in different network namespaces. Rank 0
// creates the unique id and writes it to a file; the others read it. Checks the host index every member reports.
// With --publish, it then publishes across the group on host memory: "force" (KVCOMM_DIRECT=1) must be refused with
// a clear error when members live on other hosts; "auto" must pick the gather+insert fallback there and give
// bytes equal to the gather-then-insert oracle.
//   topo_probe --rank R --size N --id-file PATH --expect 0,0,1,1 [--ifname IF] [--publish force|auto]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvcomm/bootstrap.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/publish.hpp"
#include "kvcomm/symm.hpp"
#include "verify/publish_oracle.hpp"

namespace {

bool publishAcrossHosts(kvcomm::Communicator& comm, const std::string& how) {
  const size_t tokens = 200;
  auto g = kvtest::makeGeometry(kvtest::CacheLayout::BlockSplit, 132, comm.size() * tokens + 64);
  auto buf = kvcomm::SymmetricBuffer::create(comm, g.regionBytes, g.regionBytes, kvcomm::MemoryKind::Host);
  bool crossHost = comm.topology().numHosts > 1;
  for (int r = 0; r < comm.size(); ++r)
    if (buf.isMapped(r) != comm.topology().sameHost(comm.rank(), r)) {
      std::fprintf(stderr, "rank %d: member %d mapped=%d on host %d\n", comm.rank(), r, buf.isMapped(r),
                   comm.topology().members[r].hostIndex);
      return false;
    }
  setenv("KVCOMM_DIRECT", how == "force" ? "1" : "auto", 1);
  if (how == "force") {
    try {
      auto pub = kvcomm::Publisher::create(buf);
      if (crossHost) std::fprintf(stderr, "rank %d: KVCOMM_DIRECT=1 was accepted across hosts\n", comm.rank());
      return !crossHost;
    } catch (const kvcomm::Error& e) {
      bool clear = e.code() == kvcomm::ErrorCode::Unsupported &&
                   std::string(e.what()).find("KVCOMM_DIRECT=1") != std::string::npos &&
                   std::string(e.what()).find("not mapped") != std::string::npos;
      if (!clear || !crossHost) std::fprintf(stderr, "rank %d: unexpected error: %s\n", comm.rank(), e.what());
      return clear && crossHost;
    }
  }
  auto pub = kvcomm::Publisher::create(buf);
  if ((pub.mode() == kvcomm::PublishMode::Fallback) != crossHost) return false;
  std::memset(buf.local(), kvtest::kPoison, g.regionBytes);
  comm.barrier();  // every replica poisoned before anyone publishes into it
  auto in = kvtest::makeInputs(77, comm.rank(), comm.size(), tokens, g);
  std::vector<kvcomm::CacheTensor> ts = g.tensors;
  for (size_t k = 0; k < ts.size(); ++k) {
    ts[k].src = in.rows[k].data();
    ts[k].srcStride = in.srcStride[k];
  }
  pub.publish(ts, {in.slots.data(), kvcomm::SlotType::Int64, tokens}, tokens);
  pub.barrier().sync();
  std::vector<uint8_t> want(g.regionBytes, kvtest::kPoison);
  for (int r = 0; r < comm.size(); ++r) kvtest::applyOracle(want, g, kvtest::makeInputs(77, r, comm.size(), tokens, g));
  bool same = std::memcmp(want.data(), buf.local(), g.regionBytes) == 0;
  if (!same) std::fprintf(stderr, "rank %d: replica differs from the oracle\n", comm.rank());
  comm.barrier();
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1, size = 0;
  std::string idFile, expect, ifname, publish;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank") rank = std::atoi(v.c_str());
    if (k == "--size") size = std::atoi(v.c_str());
    if (k == "--id-file") idFile = v;
    if (k == "--expect") expect = v;
    if (k == "--ifname") ifname = v;
    if (k == "--publish") publish = v;
  }
  try {
    kvcomm::UniqueId id;
    if (rank == 0) {
      id = kvcomm::TcpBootstrap::createUniqueId(ifname);
      std::ofstream(idFile + ".tmp") << id.toString();
      std::rename((idFile + ".tmp").c_str(), idFile.c_str());
    } else {
      std::string text;
      for (int i = 0; i < 2000 && text.empty(); ++i) {
        std::ifstream f(idFile);
        std::getline(f, text);
        if (text.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      id = kvcomm::UniqueId::fromString(text);
    }
    auto comm = kvcomm::Communicator::create(std::make_shared<kvcomm::TcpBootstrap>(id, rank, size, 20000));
    std::vector<int> want;
    std::stringstream ss(expect);
    for (std::string x; std::getline(ss, x, ',');) want.push_back(std::atoi(x.c_str()));
    const auto& t = comm.topology();
    bool ok = static_cast<int>(want.size()) == t.size();
    for (int r = 0; ok && r < t.size(); ++r) ok = t.members[r].hostIndex == want[static_cast<size_t>(r)];
    if (rank == 0) std::printf("%s", t.toString().c_str());
    // Members on one host must agree on local ranks; members apart must not share a host.
    comm.barrier();
    if (!ok) std::fprintf(stderr, "rank %d: host indices differ from --expect %s\n", rank, expect.c_str());
    if (ok && !publish.empty()) ok = publishAcrossHosts(comm, publish);
    return ok ? 0 : 1;
  } catch (const kvcomm::Error& e) {
    std::fprintf(stderr, "topo_probe rank %d: %s\n", rank, e.what());
    return 2;
  }
}
