// Rendezvous cost: SymmetricBuffer::create (allocate, exchange fds, map every same-host peer) for 1/16/64 GiB per
// rank, and grow time per GiB, against a baseline in the same run: named POSIX shared memory (host) or legacy CUDA IPC
// (cuMemAlloc + cuIpcGetMemHandle/cuIpcOpenMemHandle, kvcomm's own fallback) on GPUs.
//   mpirun -np 2 perf_symm_rendezvous --kind host|cuda [--sizes-gib 1,16,64] [--reps 3] [--json out.jsonl]
#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "common/bench.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/kvcomm.hpp"
#include "kvcomm/mpi_bootstrap.hpp"
#include "kvcomm/symm.hpp"

namespace {

double nowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Collective timing: every rank starts together; the slowest rank's time counts.
template <typename F>
double timed(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = nowMs();
  f();
  double dt = nowMs() - t0, worst = 0;
  MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  kvbench::Args args(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int device = kvbench::bindLocalDevice();
  std::string kindName = args.get("kind", device >= 0 ? "cuda" : "host");
  kvcomm::MemoryKind kind = kindName == "cuda" ? kvcomm::MemoryKind::Cuda : kvcomm::MemoryKind::Host;
  auto sizes = args.getList("sizes-gib", {1, 16, 64});
  int reps = static_cast<int>(args.getInt("reps", 3));
  std::string json = args.get("json", "");
  const size_t GiB = 1ull << 30;
  int rc = 0;
  try {
    auto world = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
    kvbench::Report rep("symm_rendezvous (" + kindName + ", " + std::to_string(world.size()) + " ranks)",
                        {"op", "GiB_per_rank", "kvcomm_ms", "baseline", "baseline_ms", "ratio"});
    for (long long s : sizes) {
      size_t bytes = static_cast<size_t>(s) * GiB;
      std::vector<double> tk, tb;
      for (int i = 0; i < reps; ++i) {
        kvcomm::SymmetricBuffer buf;
        tk.push_back(timed([&] { buf = kvcomm::SymmetricBuffer::create(world, bytes, bytes, kind); }));
        buf.close();
        if (kind == kvcomm::MemoryKind::Cuda) {
          setenv("KVCOMM_HANDLE_TYPE", "ipc", 1);
          kvcomm::SymmetricBuffer ipc;
          tb.push_back(timed([&] { ipc = kvcomm::SymmetricBuffer::create(world, bytes, bytes, kind); }));
          unsetenv("KVCOMM_HANDLE_TYPE");
        } else {
          // The classic way: named POSIX shared memory, names exchanged with MPI, every peer opened and mapped.
          std::vector<void*> maps;
          char mine[64];
          std::snprintf(mine, sizeof(mine), "/kvbench-%d-%d", static_cast<int>(getpid()), i);
          tb.push_back(timed([&] {
            int fd = shm_open(mine, O_CREAT | O_RDWR, 0600);
            if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) std::abort();
            maps.push_back(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
            close(fd);
            std::vector<char> names(64 * static_cast<size_t>(world.size()));
            MPI_Allgather(mine, 64, MPI_CHAR, names.data(), 64, MPI_CHAR, MPI_COMM_WORLD);
            for (int r = 0; r < world.size(); ++r) {
              if (r == world.rank()) continue;
              int pfd = shm_open(names.data() + 64 * r, O_RDWR, 0600);
              if (pfd < 0) std::abort();
              maps.push_back(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0));
              close(pfd);
            }
          }));
          MPI_Barrier(MPI_COMM_WORLD);
          for (void* m : maps) munmap(m, bytes);
          shm_unlink(mine);
        }
      }
      double k = kvbench::median(tk), b = kvbench::median(tb);
      rep.row({"create", std::to_string(s), kvbench::fmt(k),
               kind == kvcomm::MemoryKind::Cuda ? "cuda_ipc" : "posix_shm", kvbench::fmt(b), kvbench::fmt(b / k)});
    }
    // Growth: 8 steps of 1 GiB into a 16 GiB reservation; time per GiB.
    {
      auto buf = kvcomm::SymmetricBuffer::create(world, 16 * GiB, GiB, kind);
      std::vector<double> t;
      for (int step = 2; step <= 9; ++step) t.push_back(timed([&] { buf.grow(step * GiB); }));
      rep.row({"grow", "1", kvbench::fmt(kvbench::median(t)), "-", "-", "-"});
    }
    if (rank == 0) rep.print(json);
  } catch (const kvcomm::Error& e) {
    std::cerr << "perf_symm_rendezvous: " << e.what() << "\n";
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
