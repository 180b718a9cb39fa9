// Rendezvous cost: SymmetricBuffer::create (allocate, exchange fds, map every same-host peer) for 1/16/64 GiB per
// rank, and grow time per GiB, against a baseline in the same run: named POSIX shared memory (host) or legacy CUDA IPC
// (cuMemAlloc + cuIpcGetMemHandle/cuIpcOpenMemHandle, kvcomm's own fallback) on GPUs.
//   mpirun -np 2 perf_symm_rendezvous --kind host|cuda [--sizes-gib 1,16,64 | -b 1G -e 64G -f 4] [-n 3] [-w 0]
//                                     [--json out.jsonl]
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

#include "bench/bench.hpp"
#include "cli/args.hpp"
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
                   "CUDA IPC (GPUs). Sizes: --sizes-gib, or a sweep of bytes per rank with -b/-e/-f. A table with a\n"
                   "legend of its columns on stdout (rank 0), JSON lines with --json.");
  args.option("--kind", "cuda|host", "memory to allocate (default: cuda where a GPU is bound, else host)");
  args.option("--sizes-gib", "G,G,...", "GiB per rank for each create, 1 to 1024 (default 1,16,64; not with -b/-e)");
  kvbench::addCommonOptions(args, "bytes each rank allocates", "3", "0");
  std::string kindArg;
  std::vector<long long> sizes;  // bytes per rank
  kvbench::Common common;
  const long long GiB = 1ll << 30;
  int rc = kvcli::parseOrExit(args, argc, argv, [&] {
    if (args.given("kind")) kindArg = args.choice("kind", {"cuda", "host"});
    common = kvbench::readCommon(args, 1 << 20);
    if (!common.sizes.empty() && args.given("sizes-gib"))
      throw kvcli::UsageError("give --sizes-gib or -b/-e, not both");
    sizes = common.sizes;
    if (sizes.empty())
      for (long long g :
           args.given("sizes-gib") ? args.integers("sizes-gib", 1, 1024) : std::vector<long long>{1, 16, 64})
        sizes.push_back(g * GiB);
  });
  if (rc >= 0) return rc;
  rc = 0;
  const int reps = common.iters ? common.iters : 3;
  const int warmup = common.warmup >= 0 ? common.warmup : 0;
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int device = kvbench::bindLocalDevice();
  std::string kindName = kindArg.empty() ? (device >= 0 ? "cuda" : "host") : kindArg;
  kvcomm::MemoryKind kind = kindName == "cuda" ? kvcomm::MemoryKind::Cuda : kvcomm::MemoryKind::Host;
  try {
    // The oversubscription warning, if any, is printed once: with the table (a note of the report).
    kvbench::Placement where = kvbench::placement();
    auto world = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
    using kvbench::Column;
    using kvbench::Kind;
    kvbench::Report rep(
        "symm_rendezvous (" + kindName + ", " + std::to_string(world.size()) + " ranks)",
        {Column{"op", Kind::Text, "create: SymmetricBuffer::create of the whole size; grow: one 1 GiB growth step"},
         Column{"bytes_per_rank", Kind::Int, "bytes each rank allocates (grow: bytes added per step)"},
         Column{"GiB_per_rank", Kind::Num, "the same in GiB"},
         Column{"reps", Kind::Int, "timed operations behind the statistics"},
         Column{"kvcomm_ms", Kind::Num, "median ms, the slowest rank's wall time per operation"},
         Column{"kvcomm_p10_ms", Kind::Num, "10th percentile"}, Column{"kvcomm_p90_ms", Kind::Num, "90th percentile"},
         Column{"baseline", Kind::Text,
                "what kvcomm is compared with: cuda_ipc (cuMemAlloc + cuIpcGetMemHandle/cuIpcOpenMemHandle) or "
                "posix_shm (shm_open + mmap, names exchanged with MPI); null for grow"},
         Column{"baseline_ms", Kind::Num, "median ms of the baseline"},
         Column{"baseline_p10_ms", Kind::Num, "10th percentile"},
         Column{"baseline_p90_ms", Kind::Num, "90th percentile"},
         Column{"ratio", Kind::Num, "baseline_ms / kvcomm_ms (above 1: kvcomm is faster)"}},
        where);
    rep.note("Warm-up: " + std::to_string(warmup) + " untimed creates per size.");
    auto ms = [](const kvbench::Stats& v) {
      return std::vector<std::string>{kvbench::fmt(v.median), kvbench::fmt(v.p10), kvbench::fmt(v.p90)};
    };
    for (long long s : sizes) {
      size_t bytes = static_cast<size_t>(s);
      std::vector<double> tk, tb;
      for (int i = -warmup; i < reps; ++i) {
        kvcomm::SymmetricBuffer buf;
        double k = timed([&] { buf = kvcomm::SymmetricBuffer::create(world, bytes, bytes, kind); });
        buf.close();
        double b = 0;
        if (kind == kvcomm::MemoryKind::Cuda) {
          setenv("KVCOMM_HANDLE_TYPE", "ipc", 1);
          kvcomm::SymmetricBuffer ipc;
          b = timed([&] { ipc = kvcomm::SymmetricBuffer::create(world, bytes, bytes, kind); });
          unsetenv("KVCOMM_HANDLE_TYPE");
        } else {
          // The classic way: named POSIX shared memory, names exchanged with MPI, every peer opened and mapped.
          std::vector<void*> maps;
          char mine[64];
          std::snprintf(mine, sizeof(mine), "/kvbench-%d-%d", static_cast<int>(getpid()), i + warmup);
          b = timed([&] {
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
          });
          MPI_Barrier(MPI_COMM_WORLD);
          for (void* m : maps) munmap(m, bytes);
          shm_unlink(mine);
        }
        if (i >= 0) tk.push_back(k), tb.push_back(b);
      }
      kvbench::Stats k = kvbench::stats(tk), b = kvbench::stats(tb);
      std::vector<std::string> row{"create", std::to_string(s), kvbench::fmt(static_cast<double>(s) / GiB, 3),
                                   std::to_string(k.reps)};
      for (auto& c : ms(k)) row.push_back(c);
      row.push_back(kind == kvcomm::MemoryKind::Cuda ? "cuda_ipc" : "posix_shm");
      for (auto& c : ms(b)) row.push_back(c);
      row.push_back(kvbench::fmt(b.median / k.median));
      rep.row(row);
    }
    // Growth: 8 steps of 1 GiB into a 16 GiB reservation; time per step.
    {
      auto buf = kvcomm::SymmetricBuffer::create(world, 16 * GiB, GiB, kind);
      std::vector<double> t;
      for (int step = 2; step <= 9; ++step) t.push_back(timed([&] { buf.grow(step * GiB); }));
      kvbench::Stats g = kvbench::stats(t);
      std::vector<std::string> row{"grow", std::to_string(GiB), "1.000", std::to_string(g.reps)};
      for (auto& c : ms(g)) row.push_back(c);
      row.insert(row.end(), {"-", "-", "-", "-", "-"});
      rep.row(row);
    }
    if (rank == 0) rep.print(common.json);
  } catch (const std::exception& e) {  // kvcomm::Error, and std::bad_alloc or the like: reported, not a crash
    std::cerr << "perf_symm_rendezvous: " << e.what() << "\n";
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
