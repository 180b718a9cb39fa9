// kvcomm-info: under mpirun, prints the communicator, the TP/PCP/DP groups of a layout, topology and capabilities.
//   mpirun -np 4 kvcomm-info [--tp N] [--pcp N] [--pp N] [--dp N]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kvcomm/capabilities.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/mpi_bootstrap.hpp"

namespace {

std::string groupText(kvcomm::Communicator& c) {
  std::string s = "{";
  for (int r = 0; r < c.size(); ++r) s += (r ? "," : "") + std::to_string(c.worldRank(r));
  return s + "}";
}

int localRankFromEnv() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"})
    if (const char* x = std::getenv(v)) return std::atoi(x);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    kvcomm::LayoutSpec spec;
    spec.tp = 0;
    spec.pcp = 0;
    for (int i = 1; i < argc; i += 2) {
      int v = i + 1 < argc ? std::atoi(argv[i + 1]) : 0;
      if (!std::strcmp(argv[i], "--tp")) {
        spec.tp = v;
      } else if (!std::strcmp(argv[i], "--pcp")) {
        spec.pcp = v;
      } else if (!std::strcmp(argv[i], "--pp")) {
        spec.pp = v;
      } else if (!std::strcmp(argv[i], "--dp")) {
        spec.dp = v;
      } else {
        throw kvcomm::InvalidArgumentError(std::string("unknown option ") + argv[i] +
                                           " (use --tp N --pcp N --pp N --dp N)");
      }
    }
    // Unset sizes: TP 2 where it divides, PCP takes what is left.
    if (spec.tp == 0) spec.tp = (size / (spec.pp * spec.dp * (spec.pcp ? spec.pcp : 1))) % 2 == 0 ? 2 : 1;
    if (spec.pcp == 0) spec.pcp = std::max(1, size / (spec.tp * spec.pp * spec.dp));
    int device = kvcomm::useLocalDevice(localRankFromEnv());
    auto world = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
    auto layout = kvcomm::Layout::create(world, spec);

    std::ostringstream line;
    line << "  " << world.rank() << "\t(tp " << layout.coord.tp << ", pcp " << layout.coord.pcp << ", pp "
         << layout.coord.pp << ", dp " << layout.coord.dp << ")\tTP " << groupText(layout.tp) << "\tPCP "
         << groupText(layout.pcp) << "\tPP " << groupText(layout.pp) << "\tDP " << groupText(layout.dp) << "\tgpu "
         << device;
    std::string mine = line.str();
    mine.resize(200, ' ');
    std::vector<char> all(static_cast<size_t>(world.size()) * 200);
    std::memcpy(all.data() + static_cast<size_t>(world.rank()) * 200, mine.data(), 200);
    world.allgather(all.data(), 200);
    if (world.rank() == 0) {
      std::cout << kvcomm::capabilities().toString() << "\n";
      std::cout << "communicator: " << world.size() << " ranks on " << world.topology().numHosts << " host(s)\n\n";
      std::cout << world.topology().toString() << "\n";
      std::cout << "layout tp=" << spec.tp << " pcp=" << spec.pcp << " pp=" << spec.pp << " dp=" << spec.dp
                << " (world rank = ((dp*PP + pp)*PCP + pcp)*TP + tp)\n";
      for (int r = 0; r < world.size(); ++r) {
        std::string s(all.data() + static_cast<size_t>(r) * 200, 200);
        s.erase(s.find_last_not_of(' ') + 1);
        std::cout << s << "\n";
      }
      std::cout.flush();
    }
    world.barrier();
  } catch (const kvcomm::Error& e) {
    std::fprintf(stderr, "kvcomm-info: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
