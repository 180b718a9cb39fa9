// publish + barrier against NCCL AllGather + insert, in one run (mpirun -np 2 on GPUs, -np 4 on host memory).
//
// GPU: every operation is timed two ways with CUDA graphs and events: (a) one operation per graph replay (what a
// standalone call costs) and (b) per operation in a graph of 20 back-to-back operations (what a step inside an
// engine's graph pays); medians after warm-up. Also: the barrier alone, an empty kernel (the launch floor), and
// copy-engine writes into the peer's memory (cudaMemcpy over the same mapping, what cudaMemcpyPeer does).
// Host: wall-clock medians of direct publish+barrier against gather+insert over kvcomm's bootstrap and over MPI.
// Every measurement reports its repetitions and spread (p10, p90) next to the median; the table's legend explains
// every column.
//   mpirun -np 2 perf_publish [--tokens 1,16,256,4096,65536 | -b 656 -e 42M -f 4] [-n 200] [-w 20] [--json out.jsonl]
//   (--help for every option)
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "cli/args.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/device/publish.hpp"
#include "kvcomm/kvcomm.hpp"
#include "kvcomm/mpi_bootstrap.hpp"
#include "kvcomm/publish.hpp"
#include "kvcomm/symm.hpp"

#ifdef KVBENCH_GPU
#include <cuda_runtime.h>

#include "gpu_timer.hpp"
#include "nccl_baseline.hpp"
#endif

namespace {

using kvbench::fmt;

struct Options {
  size_t rowBytes = 656;
  std::vector<long long> tokens;
  int reps = 0;     // -n; 0: the backend's default
  int warmup = -1;  // -w; -1: the backend's default
  std::string json;
};

// Column legends shared by both backends.
const kvbench::Column kTokens{"tokens", kvbench::Kind::Int,
                              "tokens each rank publishes per operation (null for rows that move no rows)"};
const kvbench::Column kBytes{"bytes_per_rank", kvbench::Kind::Int,
                             "tokens x row bytes: what each rank writes into each replica"};
const kvbench::Column kOp{"op", kvbench::Kind::Text, "the operation timed (docs/performance.md lists each)"};
using kvcomm::CacheTensor;
using kvcomm::SlotType;
constexpr size_t kIndexRowBytes = 132;  // an indexer cache's row: 128 FP8 key bytes and a 4-byte scale

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

using kvbench::Stats;

#ifdef KVBENCH_GPU

void runGpu(kvcomm::Communicator& world, const Options& o, const kvbench::Placement& where) {
  const size_t rowBytes = o.rowBytes;
  const auto& tokenList = o.tokens;
  const std::string& json = o.json;
  const int repsArg = o.reps ? o.reps : 200;  // batches of 10 replays
  const int warmup = o.warmup >= 0 ? o.warmup : 20;
  const int n = world.size(), me = world.rank();
  size_t maxTokens = 0;
  for (long long t : tokenList) maxTokens = std::max<size_t>(maxTokens, static_cast<size_t>(t));
  // A second tensor of 132-byte index keys (FP8 keys + a scale, 4-byte aligned) after the rows' region: a call with
  // two vector widths, as an engine with an indexer cache makes.
  const size_t idxOffset = (static_cast<size_t>(n) * maxTokens * rowBytes + 255) & ~size_t(255);
  const size_t idxLimit = static_cast<size_t>(n) * maxTokens * kIndexRowBytes;
  const size_t region = idxOffset + idxLimit + (4u << 20);
  auto buf = kvcomm::SymmetricBuffer::create(world, region, region, kvcomm::MemoryKind::Cuda);
  kvcomm::PublisherOptions dopts;
  dopts.lanes = 5;  // lanes 1-4 for the barrier probes
  auto direct = kvcomm::Publisher::create(buf, dopts);
  setenv("KVCOMM_DIRECT", "0", 1);
  kvcomm::PublisherOptions fo;
  fo.stagingTokens = maxTokens;
  fo.stagingBytesPerToken = rowBytes;
  // The fallback publishes through NCCL, which kvcomm refuses for members sharing a GPU (ranks on one GPU): its rows
  // are then left out, said in the notes, and the rest of the table is measured as always.
  std::optional<kvcomm::Publisher> fallback, fallbackInPlace;
  std::string noFallback;
  try {
    fallback = kvcomm::Publisher::create(buf, fo);
    setenv("KVCOMM_FALLBACK_PACK_MAX_BYTES", "0", 1);
    fallbackInPlace = kvcomm::Publisher::create(buf, fo);  // contiguous rows never packed: the group of gathers
  } catch (const kvcomm::Error& e) {
    if (e.code() != kvcomm::ErrorCode::Unsupported) throw;
    noFallback = e.what();
    fallback.reset();
  }
  unsetenv("KVCOMM_FALLBACK_PACK_MAX_BYTES");
  unsetenv("KVCOMM_DIRECT");
  CUstream_st* s = kvbench::makeStream();
  // A second stream for the overlapped split barrier: publish + signal there while the main stream runs other work.
  CUstream_st* side = kvbench::makeStream();
  cudaEvent_t fork, join;
  cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&join, cudaEventDisableTiming);

  // The NCCL baseline: one AllGather of a pre-packed [slots | rows] record, then an insert kernel. NCCL refuses ranks
  // that share a GPU: the baseline's rows and the ratios to it are then left out (said in the notes).
  std::optional<kvbench::NcclBaseline> nccl;
  std::string noNccl;
  try {
    nccl.emplace();
  } catch (const std::exception& e) {
    noNccl = e.what();
  }

  char *rows = nullptr, *send = nullptr, *recv = nullptr;
  int64_t* slots = nullptr;
  size_t recordMax = ((maxTokens * 8 + 15) & ~size_t(15)) + maxTokens * rowBytes;
  cudaMalloc(&rows, maxTokens * rowBytes);
  char* strided = nullptr;  // the same rows every other row of a twice-as-wide source (a K half of fused K/V rows)
  cudaMalloc(&strided, maxTokens * 2 * rowBytes);
  cudaMemset(strided, 0x3c + me, maxTokens * 2 * rowBytes);
  char* indexRows = nullptr;
  cudaMalloc(&indexRows, maxTokens * kIndexRowBytes);
  cudaMemset(indexRows, 0x5a + me, maxTokens * kIndexRowBytes);
  cudaMalloc(&slots, maxTokens * 8);
  cudaMalloc(&send, recordMax);
  cudaMalloc(&recv, recordMax * n);
  std::vector<char> hostRows(maxTokens * rowBytes);
  for (size_t i = 0; i < hostRows.size(); ++i) hostRows[i] = static_cast<char>(i * 131 + me);
  cudaMemcpy(rows, hostRows.data(), hostRows.size(), cudaMemcpyHostToDevice);

  using kvbench::Column;
  using kvbench::Kind;
  kvbench::Report rep(
      "publish (" + std::to_string(n) + " x GPU, rows of " + std::to_string(rowBytes) + " B)",
      {kTokens, kBytes, kOp,
       Column{"reps", Kind::Int,
              "timed batches of 10 back-to-back graph replays behind each standalone statistic (in20: a quarter "
              "of them, at least 10)"},
       Column{"standalone_us", Kind::Num,
              "median us per operation with one operation per graph (a standalone call, graph launch included)"},
       Column{"standalone_p10_us", Kind::Num, "10th percentile of the standalone batches"},
       Column{"standalone_p90_us", Kind::Num, "90th percentile of the standalone batches"},
       Column{"in20_us", Kind::Num, "median us per operation in a graph of 20 operations (a step inside a graph)"},
       Column{"in20_p10_us", Kind::Num, "10th percentile of the in20 batches"},
       Column{"in20_p90_us", Kind::Num, "90th percentile of the in20 batches"},
       Column{"nccl_over_op_standalone", Kind::Num,
              "baseline time / this row's time, standalone medians (baseline = NCCL AllGather + insert of the same "
              "tokens; above 1: this row is faster)"},
       Column{"nccl_over_op_in20", Kind::Num, "the same ratio of the in20 medians"},
       Column{"GBps_into_peer", Kind::Num, "bytes_per_rank / in20 median, in GB/s"},
       Column{"frac_of_memcpy_peer", Kind::Num,
              "GBps_into_peer / the copy engine's (cudaMemcpy into the peer) at the same size"}},
      where);
  rep.note("Every statistic is the maximum over the ranks (the slowest rank counts). Warm-up: " +
           std::to_string(warmup) + " replays standalone, " + std::to_string(std::max(1, warmup / 4)) + " in20.");
  if (!fallback) rep.note("The kvcomm fallback rows are not run here: " + noFallback);
  if (!nccl) rep.note("The NCCL baseline (and the ratios to it) is not run here: " + noNccl);
  auto timeBoth = [&](const std::function<void(CUstream_st*)>& op, int reps) {
    MPI_Barrier(MPI_COMM_WORLD);
    Stats a = kvbench::maxOverRanks(kvbench::graphTimeUs(op, 1, reps, warmup, s));
    MPI_Barrier(MPI_COMM_WORLD);
    Stats b = kvbench::maxOverRanks(kvbench::graphTimeUs(op, 20, std::max(10, reps / 4), std::max(1, warmup / 4), s));
    return std::pair<Stats, Stats>{a, b};
  };
  // tokens, bytes, op, then the two measurements; the ratio and bandwidth cells follow.
  auto cells = [&](const std::string& t, const std::string& b, const std::string& op, std::pair<Stats, Stats> v) {
    return std::vector<std::string>{t,
                                    b,
                                    op,
                                    std::to_string(v.first.reps),
                                    fmt(v.first.median),
                                    fmt(v.first.p10),
                                    fmt(v.first.p90),
                                    fmt(v.second.median),
                                    fmt(v.second.p10),
                                    fmt(v.second.p90)};
  };
  auto noData = [&](const char* op, std::pair<Stats, Stats> v) {
    auto c = cells("-", "0", op, v);
    for (int i = 0; i < 4; ++i) c.push_back("-");
    rep.row(c);
  };
  noData("empty kernel (launch floor)", timeBoth([](CUstream_st* st) { kvbench::launchEmpty(st); }, repsArg));
  noData("kvcomm barrier", timeBoth([&](CUstream_st* st) { direct.barrier().sync(st, 0); }, repsArg));
  // The split barrier's halves: signal alone (every rank signals, nobody waits), and signal then wait; wait alone
  // is their difference (the peers' flags have arrived by then).
  noData("kvcomm signal alone", timeBoth([&](CUstream_st* st) { direct.barrier().signal(st, 0); }, repsArg));
  noData("kvcomm signal + wait (two kernels)", timeBoth(
                                                   [&](CUstream_st* st) {
                                                     direct.barrier().signal(st, 0);
                                                     direct.barrier().wait(st, 0);
                                                   },
                                                   repsArg));
  const char* probes[] = {"probe: barrierBlock in a bare kernel", "probe: relaxed signal+wait (no ordering)",
                          "probe: threadfence_system + relaxed signal"};
  for (int v = 0; v < 3; ++v) {
    auto h = direct.barrier().deviceHandle();
    noData(probes[v], timeBoth([&](CUstream_st* st) { kvbench::launchBarrierProbe(h, 1 + v, v, st); }, repsArg));
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
          direct.publish(tensors, {slots, SlotType::Int64, T}, T, st);
          direct.barrier().sync(st, 0);
        },
        reps);
    auto fused = timeBoth(
        [&](CUstream_st* st) {
          direct.publish(tensors, {slots, SlotType::Int64, T}, T, st, kvcomm::PublishThen::Barrier);
        },
        reps);
    // The same rows with the slots in order (a prefill chunk's usual mapping): destinations are contiguous.
    std::vector<int64_t> seq(T);
    for (size_t i = 0; i < T; ++i) seq[i] = static_cast<int64_t>(me * T + i);
    int64_t* seqSlots = nullptr;
    cudaMalloc(&seqSlots, T * 8);
    cudaMemcpy(seqSlots, seq.data(), T * 8, cudaMemcpyHostToDevice);
    auto pbSeq = timeBoth(
        [&](CUstream_st* st) {
          direct.publish(tensors, {seqSlots, SlotType::Int64, T}, T, st);
          direct.barrier().sync(st, 0);
        },
        reps);
    cudaFree(seqSlots);
    std::pair<Stats, Stats> fb, fbInPlace, fbPack;
    if (fallback) {
      fb = timeBoth([&](CUstream_st* st) { fallback->publish(tensors, {slots, SlotType::Int64, T}, T, st); }, reps);
      fbInPlace = timeBoth(
          [&](CUstream_st* st) {
            fallbackInPlace->publish(tensors, {slots, SlotType::Int64, T}, T, st);
          },
          reps);
      std::vector<CacheTensor> stridedTensors{CacheTensor{strided, 2 * rowBytes, rowBytes, 0, 1, rowBytes, rowBytes}};
      fbPack = timeBoth(
          [&](CUstream_st* st) {
            fallback->publish(stridedTensors, {slots, SlotType::Int64, T}, T, st);
          },
          reps);
    }
    // Baseline record: [int64 slots x T | rows], packed once outside the timing (an engine's rows are contiguous).
    size_t slotPart = (T * 8 + 15) & ~size_t(15);
    size_t record = slotPart + bytes;
    cudaMemcpy(send, slots, T * 8, cudaMemcpyDeviceToDevice);
    cudaMemcpy(send + slotPart, rows, bytes, cudaMemcpyDeviceToDevice);
    kvbench::InsertArgs ins{};
    ins.records = recv;
    ins.recordBytes = record;
    ins.rowsAt = slotPart;
    ins.tokens = static_cast<int64_t>(T);
    ins.sources = n;
    ins.rowBytes = rowBytes;
    ins.replica = static_cast<char*>(buf.local());
    ins.backed = buf.backedBitmap();
    ins.granShift = static_cast<int32_t>(__builtin_ctzll(buf.granularity()));
    ins.capacity = buf.capacity();
    std::pair<Stats, Stats> base, ncclRecord, ncclPair;
    if (nccl) {
      base = timeBoth(
          [&](CUstream_st* st) {
            nccl->allGather(send, recv, record, st);
            kvbench::launchInsert(ins, st);
          },
          reps);
      // What each moves through NCCL, without the insert: the baseline's one packed record, and the fallback's two
      // gathers (the caller's slots and rows are separate buffers; the baseline packed them outside the timing).
      ncclRecord = timeBoth([&](CUstream_st* st) { nccl->allGather(send, recv, record, st); }, reps);
      ncclPair = timeBoth(
          [&](CUstream_st* st) { nccl->allGatherPair(slots, recv, T * 8, rows, recv + n * slotPart, bytes, st); },
          reps);
    }
    // Copy-engine writes of the same bytes into the peer's memory, through the same mapping.
    char* peerDst = static_cast<char*>(buf.peer((me + 1) % n));
    auto cp =
        timeBoth([&](CUstream_st* st) { cudaMemcpyAsync(peerDst, rows, bytes, cudaMemcpyDeviceToDevice, st); }, reps);
    auto sm = timeBoth([&](CUstream_st* st) { kvbench::launchSmCopy(peerDst, rows, bytes & ~size_t(15), st); }, reps);
    // The same rows to the same shuffled slots by a bare scatter kernel (no checks): what the scatter itself costs.
    auto scatter = timeBoth(
        [&](CUstream_st* st) {
          kvbench::launchScatterProbe(peerDst, rows, slots, static_cast<int64_t>(T), rowBytes, st);
        },
        reps);
    auto publishOnly = timeBoth(
        [&](CUstream_st* st) {
          direct.publish(tensors, {slots, SlotType::Int64, T}, T, st);
        },
        reps);
    std::vector<CacheTensor> withIndex{
        t, CacheTensor{indexRows, kIndexRowBytes, kIndexRowBytes, idxOffset, 1, 0, 0, idxLimit, 0}};
    auto publishTwo = timeBoth(
        [&](CUstream_st* st) {
          direct.publish(withIndex, {slots, SlotType::Int64, T}, T, st);
        },
        reps);
    auto fusedTwo = timeBoth(
        [&](CUstream_st* st) {
          direct.publish(withIndex, {slots, SlotType::Int64, T}, T, st, kvcomm::PublishThen::Barrier);
        },
        reps);
    double cpGBs = bytes / (cp.second.median * 1e3);
    // ratio: against the baseline; bw: bandwidth into the peer and its fraction of the copy engine's.
    auto row = [&](const char* name, std::pair<Stats, Stats> v, bool ratio, bool bw) {
      double gbs = bytes / (v.second.median * 1e3);
      auto c = cells(std::to_string(T), std::to_string(bytes), name, v);
      c.push_back(ratio && nccl ? fmt(base.first.median / v.first.median) : "-");
      c.push_back(ratio && nccl ? fmt(base.second.median / v.second.median) : "-");
      c.push_back(bw ? fmt(gbs, 1) : "-");
      c.push_back(bw ? fmt(gbs / cpGBs, 3) : "-");
      rep.row(c);
    };
    row("kvcomm publish+barrier", pb, true, true);
    row("kvcomm publish then barrier (fused)", fused, true, true);
    row("kvcomm publish+barrier, slots in order", pbSeq, true, true);
    if (fallback) {
      row("kvcomm fallback (pack+nccl+insert)", fb, true, false);
      row("kvcomm fallback, strided source rows (pack+nccl+insert)", fbPack, true, false);
      row("kvcomm fallback, never packed (KVCOMM_FALLBACK_PACK_MAX_BYTES=0)", fbInPlace, true, false);
    }
    if (nccl) {
      row("NCCL AllGather + insert (baseline)", base, true, false);
      row("probe: NCCL AllGather of the packed record alone", ncclRecord, true, false);
      row("probe: NCCL group of AllGathers, slots and rows", ncclPair, true, false);
    }
    row("cudaMemcpy into peer (copy engine)", cp, false, true);
    row("probe: SM copy kernel into peer (contiguous)", sm, false, true);
    row("probe: bare scatter kernel into peer (same slots)", scatter, false, true);
    row("kvcomm publish alone (no barrier)", publishOnly, false, true);
    row("kvcomm publish alone, + 132 B index keys (two widths)", publishTwo, false, false);
    row("kvcomm publish then barrier, + 132 B index keys (two widths)", fusedTwo, false, false);
    if (T == 1) {
      auto h = direct.barrier().deviceHandle();
      for (bool dependent : {false, true})
        row(dependent ? "probe: one block loads the slot, stores the row, barrierBlock (dependent launch)"
                      : "probe: one block loads the slot, stores the row, barrierBlock",
            timeBoth(
                [&](CUstream_st* st) {
                  kvbench::launchStoreThenBarrier(h, 4, peerDst, rows, slots, rowBytes & ~size_t(15), dependent, st);
                },
                reps),
            false, false);
      const char* ladder[] = {"probe: ... + 1 KB launch arguments", "probe: ... + 256 threads",
                              "probe: ... + own replica", "probe: ... + checked destination"};
      for (int step = 0; step < 4; ++step)
        row(ladder[step],
            timeBoth(
                [&](CUstream_st* st) {
                  kvbench::launchLadderProbe(h, 4, peerDst, buf.local(), rows, slots, rowBytes & ~size_t(15), step, st);
                },
                reps),
            false, false);
    }
    // The split barrier with other work between the halves, against the fused publish+barrier followed by the same
    // work, and the work alone: what the exchange adds to a step when it overlaps.
    if (T <= 4096) {
      for (unsigned long long w : {0ull, 5000ull, 20000ull}) {
        std::string us = std::to_string(w / 1000);
        auto split = timeBoth(
            [&](CUstream_st* st) {
              direct.publish(tensors, {slots, SlotType::Int64, T}, T, st);
              direct.barrier().signal(st, 0);
              kvbench::launchSpin(w, st);
              direct.barrier().wait(st, 0);
            },
            reps);
        auto fusedSplit = timeBoth(
            [&](CUstream_st* st) {
              direct.publish(tensors, {slots, SlotType::Int64, T}, T, st, kvcomm::PublishThen::Signal);
              kvbench::launchSpin(w, st);
              direct.barrier().wait(st, 0);
            },
            reps);
        // The engine's shape: the rows and the signal on a side stream, beside work that does not read them, then
        // the wait just before the reads (events fork and join the streams; captured, they are graph edges).
        auto overlapped = timeBoth(
            [&](CUstream_st* st) {
              cudaEventRecord(fork, st);
              cudaStreamWaitEvent(side, fork, 0);
              direct.publish(tensors, {slots, SlotType::Int64, T}, T, side, kvcomm::PublishThen::Signal);
              cudaEventRecord(join, side);
              kvbench::launchSpin(w, st);
              cudaStreamWaitEvent(st, join, 0);
              direct.barrier().wait(st, 0);
            },
            reps);
        auto unsynced = timeBoth(
            [&](CUstream_st* st) {
              direct.publish(tensors, {slots, SlotType::Int64, T}, T, st);
              kvbench::launchSpin(w, st);
            },
            reps);
        auto fusedThen = timeBoth(
            [&](CUstream_st* st) {
              direct.publish(tensors, {slots, SlotType::Int64, T}, T, st, kvcomm::PublishThen::Barrier);
              kvbench::launchSpin(w, st);
            },
            reps);
        auto alone = timeBoth([&](CUstream_st* st) { kvbench::launchSpin(w, st); }, reps);
        row(("publish + signal, " + us + " us of work, wait").c_str(), split, false, false);
        row(("publish then signal, " + us + " us of work, wait").c_str(), fusedSplit, false, false);
        row(("publish then signal on a side stream beside " + us + " us of work, wait").c_str(), overlapped, false,
            false);
        row(("publish (no barrier), then " + us + " us of work").c_str(), unsynced, false, false);
        row(("publish then barrier, then " + us + " us of work").c_str(), fusedThen, false, false);
        row((us + " us of work alone").c_str(), alone, false, false);
      }
    }
  }
  // Host CPU time of an eager publish() call (what an engine that does not capture pays per layer): 256 tokens, or
  // the most the run allocated for.
  {
    size_t T = std::min<size_t>(256, maxTokens);
    auto hs = makeSlots(me, T);
    cudaMemcpy(slots, hs.data(), T * 8, cudaMemcpyHostToDevice);
    std::vector<CacheTensor> tensors{CacheTensor{rows, rowBytes, rowBytes, 0, 1, rowBytes, rowBytes}};
    std::vector<double> cpu;
    for (int i = 0; i < 2200; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      direct.publish(tensors, {slots, SlotType::Int64, T}, T, s);
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 200) cpu.push_back(us);
      if (i % 100 == 99) direct.barrier().sync(s, 0);
    }
    direct.barrier().sync(s, 0);
    kvbench::syncDevice();
    Stats c = kvbench::maxOverRanks(kvbench::stats(cpu));
    rep.note("Host CPU time per eager publish() call (" + std::to_string(T) +
             " tokens, 2000 calls after 200 warm-up): median " + fmt(c.median) + " us, p10 " + fmt(c.p10) + ", p90 " +
             fmt(c.p90) + " (slowest rank).");
  }
  direct.checkErrors();
  if (me == 0) rep.print(json);
  cudaFree(rows);
  cudaFree(indexRows);
  cudaFree(strided);
  cudaFree(slots);
  cudaFree(send);
  cudaFree(recv);
}

#endif  // KVBENCH_GPU

double nowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Wall-clock microseconds of `f` over `reps` calls after `warmup` untimed ones; the slowest rank's statistics.
template <typename F>
Stats hostTimeUs(F&& f, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) {
    double t0 = nowUs();
    f();
    v.push_back(nowUs() - t0);
  }
  return kvbench::maxOverRanks(kvbench::stats(v));
}

void runHost(kvcomm::Communicator& world, const Options& o, const kvbench::Placement& where) {
  const size_t rowBytes = o.rowBytes;
  const auto& tokenList = o.tokens;
  const std::string& json = o.json;
  const int repsArg = o.reps ? o.reps : 50;
  const int warmup = o.warmup >= 0 ? o.warmup : 3;
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
  using kvbench::Column;
  using kvbench::Kind;
  kvbench::Report rep(
      "publish (" + std::to_string(n) + " ranks, host memory, rows of " + std::to_string(rowBytes) + " B)",
      {kTokens, kBytes, kOp, Column{"reps", Kind::Int, "timed calls behind the statistics"},
       Column{"us", Kind::Num, "median wall-clock us per operation"}, Column{"p10_us", Kind::Num, "10th percentile"},
       Column{"p90_us", Kind::Num, "90th percentile"},
       Column{"fallback_over_op", Kind::Num,
              "kvcomm fallback (gather+insert over kvcomm's bootstrap) median / this row's median (above 1: this row "
              "is faster)"},
       Column{"mpi_over_op", Kind::Num, "MPI_Allgather + insert median / this row's median"},
       Column{"GBps_per_rank", Kind::Num, "bytes_per_rank / median, in GB/s"}},
      where);
  rep.note("Every statistic is the maximum over the ranks (the slowest rank counts). Warm-up: " +
           std::to_string(warmup) + " untimed calls per measurement.");
  auto cells = [&](const std::string& t, const std::string& b, const std::string& op, const Stats& v) {
    return std::vector<std::string>{t, b, op, std::to_string(v.reps), fmt(v.median), fmt(v.p10), fmt(v.p90)};
  };
  auto bar = hostTimeUs([&] { direct.barrier().sync(); }, repsArg * 4, warmup);
  auto barRow = cells("-", "0", "kvcomm barrier (shared-memory atomics)", bar);
  barRow.insert(barRow.end(), {"-", "-", "-"});
  rep.row(barRow);
  for (long long tl : tokenList) {
    size_t T = static_cast<size_t>(tl);
    int reps = T >= 65536 ? std::max(5, repsArg / 5) : repsArg;
    auto slots = makeSlots(me, T);
    CacheTensor t{rows.data(), rowBytes, rowBytes, 0, 1, rowBytes, rowBytes};
    std::vector<CacheTensor> tensors{t};
    size_t bytes = T * rowBytes;
    Stats d = hostTimeUs(
        [&] {
          direct.publish(tensors, {slots.data(), SlotType::Int64, T}, T);
          direct.barrier().sync();
        },
        reps, warmup);
    Stats f = hostTimeUs([&] { fallback.publish(tensors, {slots.data(), SlotType::Int64, T}, T); }, reps, warmup);
    // MPI on host memory: MPI_Allgather of [slots | rows], then insert.
    size_t record = T * 8 + bytes;
    std::vector<char> send(record), recv(record * static_cast<size_t>(n));
    Stats m = hostTimeUs(
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
        reps, warmup);
    std::string ts = std::to_string(T), bs = std::to_string(bytes);
    auto row = [&](const char* op, const Stats& v, bool bw) {
      auto c = cells(ts, bs, op, v);
      c.insert(c.end(),
               {fmt(f.median / v.median), fmt(m.median / v.median), bw ? fmt(bytes / (v.median * 1e3), 2) : "-"});
      rep.row(c);
    };
    row("kvcomm publish+barrier", d, true);
    row("gather+insert (kvcomm fallback, bootstrap)", f, false);
    row("MPI_Allgather + insert", m, false);
  }
  if (me == 0) rep.print(json);
}

}  // namespace

int main(int argc, char** argv) {
  kvcli::Args args("perf_publish", "mpirun -np N perf_publish [options]",
                   "publish + barrier against gather+insert in the same run: NCCL AllGather + insert on GPUs,\n"
                   "MPI_Allgather + insert and kvcomm's own fallback on host memory. Sizes: --tokens, or a sweep of\n"
                   "bytes per rank with -b/-e/-f (tokens = bytes / row bytes). A table with a legend of its columns\n"
                   "on stdout (rank 0), JSON lines with --json.");
  args.option("--kind", "cuda|host", "memory to publish into (default: cuda where a GPU is bound, else host)");
  args.option("--tokens", "T,T,...",
              "tokens each rank publishes per operation, 1 to 16777216 (default "
              "1,16,256,4096,65536; not with -b/-e)");
  args.option("--row-bytes", "B", "bytes per row, 1 to 65536", "656");
  kvbench::addCommonOptions(args, "bytes each rank publishes per operation", "200 batches on GPUs, 50 on host",
                            "20 on GPUs, 3 on host");
  Options o;
  std::string kindArg;
  int rc = kvcli::parseOrExit(args, argc, argv, [&] {
    if (args.given("kind")) kindArg = args.choice("kind", {"cuda", "host"});
    o.rowBytes = static_cast<size_t>(args.integer("row-bytes", 1, 65536));
    kvbench::Common c = kvbench::readCommon(args, 1);
    if (!c.sizes.empty() && args.given("tokens")) throw kvcli::UsageError("give --tokens or -b/-e, not both");
    if (!c.sizes.empty()) {
      for (long long b : c.sizes) {
        long long t = std::max<long long>(1, b / static_cast<long long>(o.rowBytes));
        if (t > (1 << 24)) throw kvcli::UsageError("-e " + args.text("maxbytes") + " makes more than 16777216 tokens");
        if (o.tokens.empty() || t > o.tokens.back()) o.tokens.push_back(t);
      }
    } else {
      o.tokens =
          args.given("tokens") ? args.integers("tokens", 1, 1 << 24) : std::vector<long long>{1, 16, 256, 4096, 65536};
    }
    o.reps = c.iters;
    o.warmup = c.warmup;
    o.json = c.json;
  });
  if (rc >= 0) return rc;
  rc = 0;
  MPI_Init(&argc, &argv);
  int device = kvbench::bindLocalDevice();
  std::string kind = kindArg.empty() ? (device >= 0 ? "cuda" : "host") : kindArg;
  try {
    // The oversubscription warning, if any, is printed once: with the table (a note of the report).
    kvbench::Placement where = kvbench::placement();
    auto world = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
    if (kind == "cuda") {
#ifdef KVBENCH_GPU
      runGpu(world, o, where);
#else
      throw kvcomm::Error(kvcomm::ErrorCode::Unsupported, "perf_publish: built without CUDA");
#endif
    } else {
      runHost(world, o, where);
    }
  } catch (const std::exception& e) {  // kvcomm::Error, and std::bad_alloc or the like: reported, not a crash
    std::cerr << "perf_publish: " << e.what() << "\n";
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
