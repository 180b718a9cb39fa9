// kvcomm-info: under mpirun, prints the communicator, the TP/PCP/DP groups of a layout, topology and capabilities.
//   mpirun -np 4 kvcomm-info [--tp N] [--pcp N] [--pp N] [--dp N]   (--help for the options)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.hpp"
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
  kvcli::Args args("kvcomm-info", "mpirun -np N kvcomm-info [--tp N] [--pcp N] [--pp N] [--dp N]",
                   "Prints the machine's capabilities, the world communicator's topology and the TP/PCP/PP/DP groups\n"
                   "of a layout (world rank = ((dp*PP + pp)*PCP + pcp)*TP + tp). Sizes not given: pp and dp are 1,\n"
                   "tp is 2 when the ranks left by the given sizes are an even number (else 1), pcp takes the rest.");
  args.option("--tp", "N", "tensor-parallel group size");
  args.option("--pcp", "N", "prefill context-parallel group size");
  args.option("--pp", "N", "pipeline-parallel group size", "1");
  args.option("--dp", "N", "data-parallel group size", "1");
  constexpr long long kMaxGroup = 1 << 16;
  kvcomm::ParallelSpec spec;
  spec.tp = 0;
  spec.pcp = 0;
  int rc = kvcli::parseOrExit(args, argc, argv, [&] {
    if (args.given("tp")) spec.tp = static_cast<int>(args.integer("tp", 1, kMaxGroup));
    if (args.given("pcp")) spec.pcp = static_cast<int>(args.integer("pcp", 1, kMaxGroup));
    spec.pp = static_cast<int>(args.integer("pp", 1, kMaxGroup));
    spec.dp = static_cast<int>(args.integer("dp", 1, kMaxGroup));
  });
  if (rc >= 0) return rc;
  rc = 0;
  MPI_Init(&argc, &argv);
  try {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long long given = static_cast<long long>(spec.pp) * spec.dp * (spec.tp ? spec.tp : 1) * (spec.pcp ? spec.pcp : 1);
    if (size % given != 0 || (spec.tp && spec.pcp && given != size)) {
      if (kvcli::firstRank())
        std::fprintf(stderr,
                     "kvcomm-info: the layout tp=%s pcp=%s pp=%d dp=%d does not fit %d ranks (the sizes "
                     "must multiply to the rank count)\n",
                     spec.tp ? std::to_string(spec.tp).c_str() : "auto",
                     spec.pcp ? std::to_string(spec.pcp).c_str() : "auto", spec.pp, spec.dp, size);
      MPI_Finalize();
      return 2;
    }
    // Sizes not given: TP 2 where it divides what is left, PCP takes the rest.
    if (spec.tp == 0) spec.tp = (size / given) % 2 == 0 ? 2 : 1;
    if (spec.pcp == 0) spec.pcp = size / (spec.tp * spec.pp * spec.dp);
    int device = kvcomm::useLocalDevice(localRankFromEnv());
    auto world = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
    auto layout = kvcomm::ParallelGroups::create(world, spec);

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
  } catch (const std::exception& e) {  // kvcomm::Error, and std::bad_alloc or the like: reported, not a crash
    std::fprintf(stderr, "kvcomm-info: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
