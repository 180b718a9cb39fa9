// Rendezvous cost: SymmetricBuffer::create (allocate, exchange fds, map every same-host peer) for 1/16/64 GiB per
// rank, and grow time per GiB, against a baseline in the same run: named POSIX shared memory (host) or legacy CUDA IPC
// (cuMemAlloc + cuIpcGetMemHandle/cuIpcOpenMemHandle, kvcomm's own fallback) on GPUs.
//   mpirun -np 2 perf_symm_rendezvous --kind host|cuda [--sizes-gib 1,16,64] [--reps 3] [--json out.jsonl]
//   (--help for every option)
#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "cli/args.hpp"
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
  kvcli::Args args("perf_symm_rendezvous", "mpirun -np N perf_symm_rendezvous [options]",
                   "SymmetricBuffer::create (allocate, exchange handles, map every same-host peer) per size, and grow\n"
                   "time per GiB, against a baseline in the same run: named POSIX shared memory (host) or legacy\n"
                   "CUDA IPC (GPUs). A table on stdout (rank 0), JSON lines with --json.");
  args.option("--kind", "cuda|host", "memory to allocate (default: cuda where a GPU is bound, else host)");
  args.option("--sizes-gib", "G,G,...", "GiB per rank for each create, 1 to 1024", "1,16,64");
  args.option("--reps", "N", "creates per size (the median counts), 1 to 1000", "3");
  args.option("--json", "FILE", "append one JSON line per table row to FILE");
  std::string kindArg, json;
  std::vector<long long> sizes;
  int reps = 0;
  int rc = kvcli::parseOrExit(args, argc, argv, [&] {
    if (args.given("kind")) kindArg = args.choice("kind", {"cuda", "host"});
    sizes = args.integers("sizes-gib", 1, 1024);
    reps = static_cast<int>(args.integer("reps", 1, 1000));
    json = args.text("json");
  });
  if (rc >= 0) return rc;
  rc = 0;
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int device = kvbench::bindLocalDevice();
  std::string kindName = kindArg.empty() ? (device >= 0 ? "cuda" : "host") : kindArg;
  kvcomm::MemoryKind kind = kindName == "cuda" ? kvcomm::MemoryKind::Cuda : kvcomm::MemoryKind::Host;
  const size_t GiB = 1ull << 30;
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
  } catch (const std::exception& e) {  // kvcomm::Error, and std::bad_alloc or the like: reported, not a crash
    std::cerr << "perf_symm_rendezvous: " << e.what() << "\n";
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
