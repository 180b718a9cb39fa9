// publish + barrier against NCCL AllGather + insert, in one run (mpirun -np 2 on GPUs, -np 4 on host memory).
//
// GPU: every operation is timed two ways with CUDA graphs and events: (a) one operation per graph replay (what a
// standalone call costs) and (b) per operation in a graph of 20 back-to-back operations (what a step inside an
// engine's graph pays); medians after warm-up. Also: the barrier alone, an empty kernel (the launch floor), and
// copy-engine writes into the peer's memory (cudaMemcpy over the same mapping, what cudaMemcpyPeer does).
// Host: wall-clock medians of direct publish+barrier against gather+insert over kvcomm's bootstrap and over MPI.
//   mpirun -np 2 perf_publish [--tokens 1,16,256,4096,65536] [--row-bytes 656] [--reps 200] [--json out.jsonl]
//   (--help for every option)
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "cli/args.hpp"
#include "common/bench.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/device/publish.hpp"
#include "kvcomm/kvcomm.hpp"
#include "kvcomm/mpi_bootstrap.hpp"
#include "kvcomm/ops.hpp"
#include "kvcomm/symm.hpp"

#ifdef KVCOMM_HAVE_CUDA
#include <cuda_runtime.h>

#include "gpu_timer.hpp"
#include "platform/nccl.hpp"
#endif

namespace {

using kvbench::fmt;

struct Options {
  size_t rowBytes = 656;
  std::vector<long long> tokens;
  int reps = 0;  // 0: the backend's default
  std::string json;
};
using kvcomm::CacheTensor;
using kvcomm::SlotType;

// Distinct slots across ranks: rank r owns [r * tokens, (r + 1) * tokens), shuffled within.
std::vector<int64_t> makeSlots(int rank, size_t tokens) {
  std::vector<int64_t> s(tokens);
  uint64_t x = 0x9E3779B97F4A7C15ull * (rank + 1);
  for (size_t i = 0; i < tokens; ++i) s[i] = static_cast<int64_t>(rank * tokens + i);
  for (size_t i = tokens; i > 1; --i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::swap(s[i - 1], s[x % i]);
  }
  return s;
}

double maxOverRanks(double v) {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

#ifdef KVCOMM_HAVE_CUDA

void runGpu(kvcomm::Communicator& world, const Options& o) {
  const size_t rowBytes = o.rowBytes;
  const auto& tokenList = o.tokens;
  const std::string& json = o.json;
  const int repsArg = o.reps ? o.reps : 200;  // batches of 10 replays
  const int n = world.size(), me = world.rank();
  size_t maxTokens = 0;
  for (long long t : tokenList) maxTokens = std::max<size_t>(maxTokens, static_cast<size_t>(t));
  const size_t region = static_cast<size_t>(n) * maxTokens * rowBytes + (4u << 20);
  auto buf = kvcomm::SymmetricBuffer::create(world, region, region, kvcomm::MemoryKind::Cuda);
  kvcomm::PublisherOptions dopts;
  dopts.lanes = 4;  // lanes 1-3 for the barrier probes
  auto direct = kvcomm::Publisher::create(buf, dopts);
  setenv("KVCOMM_DIRECT", "0", 1);
  kvcomm::PublisherOptions fo;
  fo.stagingTokens = maxTokens;
  fo.stagingBytesPerToken = rowBytes;
  auto fallback = kvcomm::Publisher::create(buf, fo);
  unsetenv("KVCOMM_DIRECT");
  CUstream_st* s = kvbench::makeStream();

  // The NCCL baseline: one AllGather of a pre-packed [slots | rows] record, then the insert kernel.
  const auto& nccl = kvcomm::detail::requireNccl("perf_publish");
  std::vector<ncclUniqueId> ids(static_cast<size_t>(n));
  if (me == 0) nccl.getUniqueId(&ids[0]);
  world.allgather(ids.data(), sizeof(ncclUniqueId));
  ncclComm_t nc;
  KVCOMM_CHECK_NCCL(nccl.commInitRank(&nc, n, ids[0], me));

  char *rows = nullptr, *send = nullptr, *recv = nullptr;
  int64_t* slots = nullptr;
  size_t recordMax = ((maxTokens * 8 + 15) & ~size_t(15)) + maxTokens * rowBytes;
  cudaMalloc(&rows, maxTokens * rowBytes);
  cudaMalloc(&slots, maxTokens * 8);
  cudaMalloc(&send, recordMax);
  cudaMalloc(&recv, recordMax * n);
  std::vector<char> hostRows(maxTokens * rowBytes);
  for (size_t i = 0; i < hostRows.size(); ++i) hostRows[i] = static_cast<char>(i * 131 + me);
  cudaMemcpy(rows, hostRows.data(), hostRows.size(), cudaMemcpyHostToDevice);

  kvbench::Report rep("publish (" + std::to_string(n) + " x GPU, rows of " + std::to_string(rowBytes) +
                          " B; per-op us: standalone = 1 op per graph replay, in20 = per op in a 20-op graph)",
                      {"tokens", "bytes_per_rank", "op", "standalone_us", "in20_us", "nccl_over_op_standalone",
                       "nccl_over_op_in20", "GBps_into_peer", "frac_of_memcpy_peer"});
  auto timeBoth = [&](const std::function<void(CUstream_st*)>& op, int reps) {
    MPI_Barrier(MPI_COMM_WORLD);
    double a = maxOverRanks(kvbench::graphMedianUs(op, 1, reps, 20, s));
    MPI_Barrier(MPI_COMM_WORLD);
    double b = maxOverRanks(kvbench::graphMedianUs(op, 20, std::max(10, reps / 4), 5, s));
    return std::pair<double, double>{a, b};
  };
  auto floor = timeBoth([](CUstream_st* st) { kvbench::launchEmpty(st); }, repsArg);
  rep.row({"-", "0", "empty kernel (launch floor)", fmt(floor.first), fmt(floor.second), "-", "-", "-", "-"});
  auto bar = timeBoth([&](CUstream_st* st) { direct.barrier(st, 0); }, repsArg);
  rep.row({"-", "0", "kvcomm barrier", fmt(bar.first), fmt(bar.second), "-", "-", "-", "-"});
  const char* probes[] = {"probe: barrierBlock in a bare kernel", "probe: relaxed signal+wait (no ordering)",
                          "probe: threadfence_system + relaxed signal"};
  for (int v = 0; v < 3; ++v) {
    auto h = direct.barrierHandle();
    auto pr = timeBoth([&](CUstream_st* st) { kvbench::launchBarrierProbe(h, 1 + v, v, st); }, repsArg);
    rep.row({"-", "0", probes[v], fmt(pr.first), fmt(pr.second), "-", "-", "-", "-"});
  }

  for (long long tl : tokenList) {
    size_t T = static_cast<size_t>(tl);
    int reps = T >= 65536 ? std::max(20, repsArg / 8) : repsArg;
    auto hs = makeSlots(me, T);
    cudaMemcpy(slots, hs.data(), T * 8, cudaMemcpyHostToDevice);
    CacheTensor t{rows, rowBytes, rowBytes, 0, 1, rowBytes, rowBytes};
    std::vector<CacheTensor> tensors{t};
    size_t bytes = T * rowBytes;
    auto pb = timeBoth(
        [&](CUstream_st* st) {
          direct.publish(tensors, slots, SlotType::Int64, T, st);
          direct.barrier(st, 0);
        },
        reps);
    auto fused =
        timeBoth([&](CUstream_st* st) { direct.publishAndBarrier(tensors, slots, SlotType::Int64, T, st, 0); }, reps);
    // The same rows with the slots in order (a prefill chunk's usual mapping): destinations are contiguous.
    std::vector<int64_t> seq(T);
    for (size_t i = 0; i < T; ++i) seq[i] = static_cast<int64_t>(me * T + i);
    int64_t* seqSlots = nullptr;
    cudaMalloc(&seqSlots, T * 8);
    cudaMemcpy(seqSlots, seq.data(), T * 8, cudaMemcpyHostToDevice);
    auto pbSeq = timeBoth(
        [&](CUstream_st* st) {
          direct.publish(tensors, seqSlots, SlotType::Int64, T, st);
          direct.barrier(st, 0);
        },
        reps);
    cudaFree(seqSlots);
    auto fb = timeBoth([&](CUstream_st* st) { fallback.publish(tensors, slots, SlotType::Int64, T, st); }, reps);
    // Baseline record: [int64 slots x T | rows], packed once outside the timing (an engine's rows are contiguous).
    size_t slotPart = (T * 8 + 15) & ~size_t(15);
    size_t record = slotPart + bytes;
    cudaMemcpy(send, slots, T * 8, cudaMemcpyDeviceToDevice);
    cudaMemcpy(send + slotPart, rows, bytes, cudaMemcpyDeviceToDevice);
    kvcomm::detail::PublishLaunch ins{};
    ins.t[0] = {recv + slotPart,
                rowBytes,
                rowBytes,
                0,
                1,
                rowBytes,
                rowBytes,
                buf.capacity(),
                kvcomm::commonAlignment(reinterpret_cast<uintptr_t>(recv + slotPart), record, rowBytes),
                0};
    ins.replicas = buf.deviceHandle();
    ins.replicas.mappedMask = 1ull << me;
    ins.backed = buf.backedBitmap();
    ins.capacity = buf.capacity();
    ins.granShift = static_cast<int32_t>(__builtin_ctzll(buf.granularity()));
    ins.slots = recv;
    ins.sourceStride = record;
    ins.numTokens = static_cast<int64_t>(T);
    ins.numSources = n;
    ins.slot64 = 1;
    ins.numTensors = 1;
    auto base = timeBoth(
        [&](CUstream_st* st) {
          KVCOMM_CHECK_NCCL(nccl.allGather(send, recv, record, ncclUint8, nc, st));
          kvcomm::detail::launchPublish(ins, st, nullptr, 0);
        },
        reps);
    // Copy-engine writes of the same bytes into the peer's memory, through the same mapping.
    char* peerDst = static_cast<char*>(buf.peer((me + 1) % n));
    auto cp =
        timeBoth([&](CUstream_st* st) { cudaMemcpyAsync(peerDst, rows, bytes, cudaMemcpyDeviceToDevice, st); }, reps);
    auto sm = timeBoth([&](CUstream_st* st) { kvbench::launchSmCopy(peerDst, rows, bytes & ~size_t(15), st); }, reps);
    double cpGBs = bytes / (cp.second * 1e3);
    auto row = [&](const char* name, std::pair<double, double> v, bool bw) {
      double gbs = bytes / (v.second * 1e3);
      rep.row({std::to_string(T), std::to_string(bytes), name, fmt(v.first), fmt(v.second), fmt(base.first / v.first),
               fmt(base.second / v.second), bw ? fmt(gbs, 1) : "-", bw ? fmt(gbs / cpGBs, 3) : "-"});
    };
    row("kvcomm publish+barrier", pb, true);
    row("kvcomm publishAndBarrier (fused)", fused, true);
    row("kvcomm publish+barrier, slots in order", pbSeq, true);
    row("kvcomm fallback (pack+nccl+insert)", fb, false);
    row("NCCL AllGather + insert (baseline)", base, false);
    rep.row({std::to_string(T), std::to_string(bytes), "cudaMemcpy into peer (copy engine)", fmt(cp.first),
             fmt(cp.second), "-", "-", fmt(cpGBs, 1), "1.000"});
    double smGBs = bytes / (sm.second * 1e3);
    rep.row({std::to_string(T), std::to_string(bytes), "probe: SM copy kernel into peer (contiguous)", fmt(sm.first),
             fmt(sm.second), "-", "-", fmt(smGBs, 1), fmt(smGBs / cpGBs, 3)});
  }
  direct.checkErrors();
  if (me == 0) rep.print(json);
  nccl.commDestroy(nc);
  cudaFree(rows);
  cudaFree(slots);
  cudaFree(send);
  cudaFree(recv);
}

#endif  // KVCOMM_HAVE_CUDA

double nowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
double hostMedianUs(F&& f, int reps) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) {
    double t0 = nowUs();
    f();
    v.push_back(nowUs() - t0);
  }
  return maxOverRanks(kvbench::median(v));
}

void runHost(kvcomm::Communicator& world, const Options& o) {
  const size_t rowBytes = o.rowBytes;
  const auto& tokenList = o.tokens;
  const std::string& json = o.json;
  const int repsArg = o.reps ? o.reps : 50;
  const int n = world.size(), me = world.rank();
  size_t maxTokens = 0;
  for (long long t : tokenList) maxTokens = std::max<size_t>(maxTokens, static_cast<size_t>(t));
  const size_t region = static_cast<size_t>(n) * maxTokens * rowBytes + (1u << 20);
  auto buf = kvcomm::SymmetricBuffer::create(world, region, region, kvcomm::MemoryKind::Host);
  auto direct = kvcomm::Publisher::create(buf);
  setenv("KVCOMM_DIRECT", "0", 1);
  auto fallback = kvcomm::Publisher::create(buf);
  unsetenv("KVCOMM_DIRECT");
  std::vector<char> rows(maxTokens * rowBytes);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<char>(i * 131 + me);
  kvbench::Report rep("publish (" + std::to_string(n) + " ranks, host memory, rows of " + std::to_string(rowBytes) +
                          " B; wall-clock median per op)",
                      {"tokens", "bytes_per_rank", "op", "us", "fallback_over_op", "mpi_over_op", "GBps_per_rank"});
  double bar = hostMedianUs([&] { direct.barrier(); }, repsArg * 4);
  rep.row({"-", "0", "kvcomm barrier (shared-memory atomics)", fmt(bar), "-", "-", "-"});
  for (long long tl : tokenList) {
    size_t T = static_cast<size_t>(tl);
    int reps = T >= 65536 ? std::max(5, repsArg / 5) : repsArg;
    auto slots = makeSlots(me, T);
    CacheTensor t{rows.data(), rowBytes, rowBytes, 0, 1, rowBytes, rowBytes};
    std::vector<CacheTensor> tensors{t};
    size_t bytes = T * rowBytes;
    double d = hostMedianUs(
        [&] {
          direct.publish(tensors, slots.data(), SlotType::Int64, T);
          direct.barrier();
        },
        reps);
    double f = hostMedianUs([&] { fallback.publish(tensors, slots.data(), SlotType::Int64, T); }, reps);
    // MPI on host memory: MPI_Allgather of [slots | rows], then insert.
    size_t record = T * 8 + bytes;
    std::vector<char> send(record), recv(record * static_cast<size_t>(n));
    double m = hostMedianUs(
        [&] {
          std::memcpy(send.data(), slots.data(), T * 8);
          std::memcpy(send.data() + T * 8, rows.data(), bytes);
          MPI_Allgather(send.data(), static_cast<int>(record), MPI_BYTE, recv.data(), static_cast<int>(record),
                        MPI_BYTE, MPI_COMM_WORLD);
          char* local = static_cast<char*>(buf.local());
          for (int r = 0; r < n; ++r) {
            const char* rec = recv.data() + record * static_cast<size_t>(r);
            const int64_t* sl = reinterpret_cast<const int64_t*>(rec);
            for (size_t i = 0; i < T; ++i)
              if (sl[i] >= 0) std::memcpy(local + sl[i] * rowBytes, rec + T * 8 + i * rowBytes, rowBytes);
          }
        },
        reps);
    std::string ts = std::to_string(T), bs = std::to_string(bytes);
    rep.row({ts, bs, "kvcomm publish+barrier", fmt(d), fmt(f / d), fmt(m / d), fmt(bytes / (d * 1e3), 2)});
    rep.row({ts, bs, "gather+insert (kvcomm fallback, bootstrap)", fmt(f), "1.00", fmt(m / f), "-"});
    rep.row({ts, bs, "MPI_Allgather + insert", fmt(m), fmt(f / m), "1.00", "-"});
  }
  if (me == 0) rep.print(json);
}

}  // namespace

int main(int argc, char** argv) {
  kvcli::Args args("perf_publish", "mpirun -np N perf_publish [options]",
                   "publish + barrier against gather+insert in the same run: NCCL AllGather + insert on GPUs,\n"
                   "MPI_Allgather + insert and kvcomm's own fallback on host memory. A table on stdout (rank 0),\n"
                   "JSON lines with --json.");
  args.option("--kind", "cuda|host", "memory to publish into (default: cuda where a GPU is bound, else host)");
  args.option("--tokens", "T,T,...", "tokens each rank publishes per operation, 1 to 16777216", "1,16,256,4096,65536");
  args.option("--row-bytes", "B", "bytes per row, 1 to 65536", "656");
  args.option("--reps", "N", "timed repetitions, 1 to 100000 (default: 200 batches on GPUs, 50 on host)");
  args.option("--json", "FILE", "append one JSON line per table row to FILE");
  Options o;
  std::string kindArg;
  int rc = kvcli::parseOrExit(args, argc, argv, [&] {
    if (args.given("kind")) kindArg = args.choice("kind", {"cuda", "host"});
    o.tokens = args.integers("tokens", 1, 1 << 24);
    o.rowBytes = static_cast<size_t>(args.integer("row-bytes", 1, 65536));
    if (args.given("reps")) o.reps = static_cast<int>(args.integer("reps", 1, 100000));
    o.json = args.text("json");
  });
  if (rc >= 0) return rc;
  rc = 0;
  MPI_Init(&argc, &argv);
  int device = kvbench::bindLocalDevice();
  std::string kind = kindArg.empty() ? (device >= 0 ? "cuda" : "host") : kindArg;
  try {
    auto world = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
    if (kind == "cuda") {
#ifdef KVCOMM_HAVE_CUDA
      runGpu(world, o);
#else
      throw kvcomm::Error(kvcomm::ErrorCode::Unsupported, "perf_publish: built without CUDA");
#endif
    } else {
      runHost(world, o);
    }
  } catch (const std::exception& e) {  // kvcomm::Error, and std::bad_alloc or the like: reported, not a crash
    std::cerr << "perf_publish: " << e.what() << "\n";
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
