// topo_probe: one rank of a TcpBootstrap group whose members may live in different network namespaces. Rank 0
// creates the unique id and writes it to a file; the others read it. Checks the host index every member reports.
//   topo_probe --rank R --size N --id-file PATH --expect 0,0,1,1 [--ifname IF]
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

int main(int argc, char** argv) {
  int rank = -1, size = 0;
  std::string idFile, expect, ifname;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank") rank = std::atoi(v.c_str());
    if (k == "--size") size = std::atoi(v.c_str());
    if (k == "--id-file") idFile = v;
    if (k == "--expect") expect = v;
    if (k == "--ifname") ifname = v;
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
    return ok ? 0 : 1;
  } catch (const kvcomm::Error& e) {
    std::fprintf(stderr, "topo_probe rank %d: %s\n", rank, e.what());
    return 2;
  }
}
