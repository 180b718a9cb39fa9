// fetch against what engines do today, in one run (mpirun -np 2 on GPUs, -np 2..4 on host memory).
//
// GPU: rank 0 pulls blocks out of rank 1's cache into its own (rank 1 stays idle); every variant moves the same
// bytes and is timed eagerly with CUDA events around the call (host planning included), medians after warm-up.
// Baselines: one contiguous copy-engine copy of the same bytes from the peer (the ceiling), a loop of one
// cudaMemcpyAsync per block (what engines write by hand), one cudaMemcpyBatchAsync of every block. Also: one
// block (latency), fetches while a compute-bound kernel runs (together vs alone), and the collective form
// (fetchAll, both ranks at once) against NCCL grouped send/recv of packed blocks + unpack.
// Host: rank 0 pulls from rank 1; kvcomm against a per-block memcpy loop over the same mapping and MPI send/recv of
// packed blocks; wall-clock medians.
// Across hosts (no MPI; perf/fetch_netns.sh runs it in two network namespaces): rank 0 pulls from rank 1 over TCP
// against one plain TCP connection carrying the same bytes; RDMA rows where both have a device (fetch_net.cpp).
//   mpirun -np 2 perf_fetch [--reps 20] [--quick] [--json out.jsonl]
//   perf_fetch --net-rank R --id-file F [--ifname IF] [--kind host|cuda]   (one process per host, R = 0 and 1)
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "bench/bench.hpp"
#include "cli/args.hpp"
#include "fetch_endpoint.hpp"
#include "fetch_net.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/kvcomm.hpp"
#include "kvcomm/mpi_bootstrap.hpp"

#ifdef KVCOMM_HAVE_CUDA
#include <cuda_runtime.h>

#include "fetch_kernels.hpp"
#ifdef KVCOMM_PERF_NCCL
#include <nccl.h>
#endif
#endif

namespace {

using kvbench::fmt;

struct Options {
  int reps = 20;
  bool quick = false;
  int computeIters = 20000;
  std::string json;
};

// One benchmark case: `pairs` block pairs of `blockBytes` in `regions` regions; sources in the first half of the
// blocks, destinations in the second; scattered ids, or runs of `run` consecutive blocks.
struct Case {
  std::string name;
  size_t blockBytes;
  int regions;
  size_t pairs;
  size_t run;  // 0: scattered
};

struct Ids {
  std::vector<int64_t> src, dst;
};

Ids makeIds(const Case& c, uint64_t seed) {
  Ids ids;
  const int64_t half = static_cast<int64_t>(c.pairs);
  std::mt19937_64 rng(seed);
  if (c.run > 0) {
    // Runs of c.run consecutive blocks on both sides; the runs land in a shuffled order, so they stay separate.
    const size_t runs = c.pairs / c.run;
    std::vector<size_t> order(runs);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t k = 0; k < runs; ++k)
      for (size_t b = 0; b < c.run; ++b) {
        ids.src.push_back(static_cast<int64_t>(k * c.run + b));
        ids.dst.push_back(half + static_cast<int64_t>(order[k] * c.run + b));
      }
    return ids;
  }
  std::vector<int64_t> s(static_cast<size_t>(half)), d(static_cast<size_t>(half));
  std::iota(s.begin(), s.end(), 0);
  std::iota(d.begin(), d.end(), half);
  std::shuffle(s.begin(), s.end(), rng);
  std::shuffle(d.begin(), d.end(), rng);
  ids.src = s;
  ids.dst = d;
  return ids;
}

kvcomm::KvLayout makeLayout(const Case& c) {
  kvcomm::KvLayout l;
  const size_t blocks = 2 * c.pairs;
  for (int j = 0; j < c.regions; ++j) l.regions.push_back({j * blocks * c.blockBytes, c.blockBytes, 0, blocks});
  return l;
}

#ifdef KVCOMM_HAVE_CUDA

#define CU(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::cerr << "perf_fetch: " << #x << ": " << cudaGetErrorString(e_) << std::endl; \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                     \
    }                                                                                   \
  } while (0)

// Microseconds of `op` on `s`, events around it (what follows it on the stream sees the bytes).
kvbench::Stats eventUs(const std::function<void()>& op, cudaStream_t s, int reps, int warmup) {
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) op();
  CU(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CU(cudaEventRecord(a, s));
    op();
    CU(cudaEventRecord(b, s));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return kvbench::stats(t);
}

// Copies of ids in pinned host memory (an engine's pinned id tensors).
struct PinnedIds {
  int64_t* src = nullptr;
  int64_t* dst = nullptr;
  explicit PinnedIds(const Ids& ids) {
    const size_t n = std::max<size_t>(ids.src.size(), 1) * sizeof(int64_t);
    CU(cudaHostAlloc(reinterpret_cast<void**>(&src), n, cudaHostAllocMapped | cudaHostAllocPortable));
    CU(cudaHostAlloc(reinterpret_cast<void**>(&dst), n, cudaHostAllocMapped | cudaHostAllocPortable));
    std::memcpy(src, ids.src.data(), ids.src.size() * sizeof(int64_t));
    std::memcpy(dst, ids.dst.data(), ids.dst.size() * sizeof(int64_t));
  }
  ~PinnedIds() {
    cudaFreeHost(src);
    cudaFreeHost(dst);
  }
  PinnedIds(const PinnedIds&) = delete;
  PinnedIds& operator=(const PinnedIds&) = delete;
};

using kvbench::Column;
using kvbench::Kind;

// Host time of each fetch form against the pair count (rank 0 pulls 4 KiB blocks from rank 1): the call alone, on
// the host's clock; the stream is drained between calls (untimed), so no call waits for the GPU.
void hostCostTable(kvcomm::Communicator& world, const Options& opt, const kvbench::Placement& where, cudaStream_t s) {
  const int me = world.rank();
  auto ks = reinterpret_cast<kvcomm::Stream>(s);
  kvbench::Report rep(
      "fetch host cost (rank 0's call, host clock; the GPU drained between calls)",
      {Column{"pairs", Kind::Int, "block pairs per call (4 KiB blocks, one region, scattered)"},
       Column{"op", Kind::Text, "the call timed"}, Column{"reps", Kind::Int, "timed calls"},
       Column{"p50_us", Kind::Num, "median host us per call"}, Column{"p99_us", Kind::Num, "99th percentile"},
       Column{"ns_per_pair", Kind::Num, "(p50 - 5 us) / pairs, in ns"},
       Column{"target", Kind::Text,
              "issue target: p50 <= 5 us + 1 ns per pair (ids in pinned or device memory; pageable "
              "ids add one copy, reported apart)"}},
      where);
  for (size_t n : {size_t{1}, size_t{100}, size_t{1000}, size_t{10000}, size_t{100000}}) {
    if (opt.quick && n > 10000) continue;
    Case c{"host cost", 4u << 10, 1, n, 0};
    kvcomm::KvLayout layout = makeLayout(c);
    const size_t bytesAll = 2 * n * c.blockBytes;
    auto buf = kvcomm::SymmetricBuffer::create(world, bytesAll, bytesAll, kvcomm::MemoryKind::Cuda);
    auto f = kvcomm::Fetcher::create(buf, layout);
    Ids ids = makeIds(c, 11);
    world.barrier();
    if (me == 0) {
      const int reps = n >= 100000 ? 50 : n >= 10000 ? 200 : 1000;
      PinnedIds pinned(ids);
      int64_t *dSrc = nullptr, *dDst = nullptr;
      CU(cudaMalloc(&dSrc, n * 8));
      CU(cudaMalloc(&dDst, n * 8));
      CU(cudaMemcpy(dSrc, ids.src.data(), n * 8, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(dDst, ids.dst.data(), n * 8, cudaMemcpyHostToDevice));
      kvcomm::FetchRequest pageable{1, ids.src.data(), ids.dst.data(), n, 0};
      kvcomm::FetchRequest pin{1, pinned.src, pinned.dst, n, 0};
      kvcomm::FetchRequest dev{1, dSrc, dDst, n, 0};
      kvcomm::FetchOptions hostCheck, deviceCheck;
      hostCheck.path = kvcomm::FetchPath::Kernel;
      deviceCheck.validation = kvcomm::FetchValidation::Device;
      kvcomm::FetchPlan plan = f.plan({pageable}, hostCheck);
      kvcomm::DeviceFetchBatch db{dSrc, dDst, nullptr, 1, n};
      auto timed = [&](const std::string& op, const std::function<void()>& call, bool targeted) {
        std::vector<double> t;
        for (int i = 0; i < reps + 3; ++i) {
          CU(cudaStreamSynchronize(s));
          auto t0 = std::chrono::steady_clock::now();
          call();
          auto t1 = std::chrono::steady_clock::now();
          if (i >= 3) t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
        CU(cudaStreamSynchronize(s));
        kvbench::Stats st = kvbench::stats(t);
        const double limit = 5.0 + 0.001 * static_cast<double>(n);
        std::string verdict = !targeted            ? "reported apart"
                              : st.median <= limit ? "met"
                                                   : "missed by " + fmt(st.median / limit, 2) + " x";
        rep.row({std::to_string(n), op, std::to_string(st.reps), fmt(st.median), fmt(st.p99),
                 fmt(std::max(0.0, st.median - 5.0) * 1000.0 / static_cast<double>(n)), verdict});
      };
      timed(
          "fetch, checked on the host (pageable ids)", [&] { f.fetch({pageable}, ks, hostCheck); }, false);
      timed(
          "fetch, checked on the host (pinned ids)", [&] { f.fetch({pin}, ks, hostCheck); }, true);
      timed(
          "fetch, checked on the device (pageable ids)", [&] { f.fetch({pageable}, ks, deviceCheck); }, false);
      timed(
          "fetch, checked on the device (pinned ids)", [&] { f.fetch({pin}, ks, deviceCheck); }, true);
      timed(
          "fetch, checked on the device (device ids)", [&] { f.fetch({dev}, ks, deviceCheck); }, true);
      timed(
          "submit (plan reused)", [&] { f.submit(plan, ks); }, true);
      timed(
          "fetchDevice (device ids)", [&] { f.fetchDevice(db, ks); }, true);
      f.checkErrors();
      cudaFree(dSrc);
      cudaFree(dDst);
    }
    world.barrier();
  }
  if (me == 0) rep.print(opt.json);
}

// An engine loop: 1,000 fetches of 4,096 x 16 KiB pairs, fresh host ids each time (16 id sets in turn), back to
// back on one stream; GPU busy = 1,000 x one fetch's GPU time (fetchDevice, ids already there) / the loop's time.
void backToBackTable(kvcomm::Communicator& world, const Options& opt, const kvbench::Placement& where, cudaStream_t s) {
  const int me = world.rank();
  auto ks = reinterpret_cast<kvcomm::Stream>(s);
  kvbench::Report rep(
      "fetch back to back (rank 0: 1,000 fetches of 4,096 x 16 KiB, fresh host ids each)",
      {Column{"op", Kind::Text, "the loop's form"}, Column{"loop_us", Kind::Num, "events around the whole loop"},
       Column{"gpu_us", Kind::Num, "1,000 x the median GPU time of one fetchDevice of the same pairs"},
       Column{"gpu_busy", Kind::Num, "gpu_us / loop_us (target >= 0.9)"},
       Column{"target", Kind::Text, "met or missed"}},
      where);
  const size_t n = 4096, iters = opt.quick ? 100 : 1000;
  Case c{"back to back", 16u << 10, 1, n, 0};
  kvcomm::KvLayout layout = makeLayout(c);
  const size_t bytesAll = 2 * n * c.blockBytes;
  auto buf = kvcomm::SymmetricBuffer::create(world, bytesAll, bytesAll, kvcomm::MemoryKind::Cuda);
  auto f = kvcomm::Fetcher::create(buf, layout);
  world.barrier();
  if (me == 0) {
    std::vector<Ids> sets;
    std::vector<std::unique_ptr<PinnedIds>> pinned;
    for (uint64_t k = 0; k < 16; ++k) {
      sets.push_back(makeIds(c, 100 + k));
      pinned.push_back(std::make_unique<PinnedIds>(sets.back()));
    }
    int64_t *dSrc = nullptr, *dDst = nullptr;
    CU(cudaMalloc(&dSrc, n * 8));
    CU(cudaMalloc(&dDst, n * 8));
    CU(cudaMemcpy(dSrc, sets[0].src.data(), n * 8, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dDst, sets[0].dst.data(), n * 8, cudaMemcpyHostToDevice));
    kvcomm::DeviceFetchBatch db{dSrc, dDst, nullptr, 1, n};
    const double gpu = eventUs([&] { f.fetchDevice(db, ks); }, s, opt.reps, 3).median * static_cast<double>(iters);
    auto loop = [&](const std::string& op, const std::function<void(size_t)>& call) {
      const double us = eventUs(
                            [&] {
                              for (size_t i = 0; i < iters; ++i) call(i % 16);
                            },
                            s, 3, 1)
                            .median;
      const double busy = gpu / us;
      rep.row({op, fmt(us), fmt(gpu), fmt(busy, 3), busy >= 0.9 ? "met" : "missed by " + fmt(0.9 / busy, 2) + " x"});
    };
    kvcomm::FetchOptions hostCheck, deviceCheck;
    hostCheck.path = kvcomm::FetchPath::Kernel;
    deviceCheck.validation = kvcomm::FetchValidation::Device;
    loop("fetch, checked on the host (pageable ids)", [&](size_t k) {
      f.fetch({kvcomm::FetchRequest{1, sets[k].src.data(), sets[k].dst.data(), n, 0}}, ks, hostCheck);
    });
    loop("fetch, checked on the device (pageable ids)", [&](size_t k) {
      f.fetch({kvcomm::FetchRequest{1, sets[k].src.data(), sets[k].dst.data(), n, 0}}, ks, deviceCheck);
    });
    loop("fetch, checked on the device (pinned ids)", [&](size_t k) {
      f.fetch({kvcomm::FetchRequest{1, pinned[k]->src, pinned[k]->dst, n, 0}}, ks, deviceCheck);
    });
    f.checkErrors();
    cudaFree(dSrc);
    cudaFree(dDst);
  }
  world.barrier();
  if (me == 0) rep.print(opt.json);
}

// The GPU table's columns.
std::vector<Column> gpuColumns() {
  return {Column{"case", Kind::Text, "block sizes and how the ids are laid out"},
          Column{"block_bytes", Kind::Int, "bytes of one block in one region"},
          Column{"descriptors_in", Kind::Int, "block copies the request names: pairs x regions"},
          Column{"runs_out", Kind::Int, "copies after coalescing (runs x regions); - where the path needs none"},
          Column{"bytes", Kind::Int, "bytes moved per call"},
          Column{"op", Kind::Text, "what was timed"},
          Column{"reps", Kind::Int, "timed calls behind the statistics"},
          Column{"us", Kind::Num, "median us per call, CUDA events around the call (host planning included)"},
          Column{"p10_us", Kind::Num, "10th percentile"},
          Column{"p90_us", Kind::Num, "90th percentile"},
          Column{"GBps", Kind::Num, "bytes / median"},
          Column{"frac_of_ceiling", Kind::Num,
                 "ceiling median / this median; the ceiling is one contiguous copy-engine copy of the same bytes "
                 "from the peer"},
          Column{"plan_us", Kind::Num, "median host time kvcomm spent validating and coalescing"},
          Column{"overlap", Kind::Num, "(fetch alone + compute alone) / both together: 2 = perfect overlap, 1 = none"}};
}

void runGpu(kvcomm::Communicator& world, const Options& opt, const kvbench::Placement& where) {
  const std::string& json = opt.json;
  const int me = world.rank();
  const int reps = opt.reps;
  const bool quick = opt.quick;
  cudaStream_t s;
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto ks = reinterpret_cast<kvcomm::Stream>(s);
  kvbench::Report rep("fetch (2 x GPU: rank 0 pulls blocks from rank 1 over NVLink, rank 1 idle)", gpuColumns(), where);
  rep.note(
      "Every variant moves the same bytes in the same run; warm-up 2-3 calls; the per-block baselines and the "
      "100k-piece cases use a quarter of the repetitions.");
  std::vector<Case> cases = {
      {"contiguous runs of 1 MiB", 64u << 10, 1, quick ? 256u : 4096u, 16},
      {"scattered 64 KiB", 64u << 10, 1, quick ? 256u : 4096u, 0},
      {"scattered 16 KiB x 100k", 16u << 10, 4, quick ? 2500u : 25000u, 0},
      {"scattered 4 KiB x 100k", 4u << 10, 4, quick ? 2500u : 25000u, 0},
      {"scattered 2 MiB", 2u << 20, 1, quick ? 16u : 128u, 0},
      {"1 block of 4 KiB (latency)", 4u << 10, 1, 1, 0},
      {"1 block of 64 KiB (latency)", 64u << 10, 1, 1, 0},
  };
  float* sink = nullptr;
  CU(cudaMalloc(&sink, 4096));
  for (const Case& c : cases) {
    kvcomm::KvLayout layout = makeLayout(c);
    const size_t blocks = 2 * c.pairs, bytesAll = blocks * c.blockBytes * c.regions;
    auto buf = kvcomm::SymmetricBuffer::create(world, bytesAll, bytesAll, kvcomm::MemoryKind::Cuda);
    CU(cudaMemset(buf.local(), me + 1, bytesAll));
    auto f = kvcomm::Fetcher::create(buf, layout);
    Ids ids = makeIds(c, 42);
    const size_t pieces = c.pairs * c.regions, bytes = pieces * c.blockBytes;
    world.barrier();
    if (me == 0) {
      char* peer = static_cast<char*>(buf.peer(1));
      char* local = static_cast<char*>(buf.local());
      kvcomm::FetchRequest q{1, ids.src.data(), ids.dst.data(), ids.src.size(), 0};
      const int r = c.pairs * c.regions > 20000 ? std::max(3, reps / 4) : reps;
      kvbench::Stats ceilingStats = eventUs(
          [&] { CU(cudaMemcpyAsync(local + bytesAll / 2, peer, bytes, cudaMemcpyDeviceToDevice, s)); }, s, r, 3);
      const double ceiling = ceilingStats.median;
      auto row = [&](const std::string& op, const kvbench::Stats& t, const std::string& runs, const std::string& plan,
                     const std::string& overlap = "-") {
        rep.row({c.name, std::to_string(c.blockBytes), std::to_string(pieces), runs, std::to_string(bytes), op,
                 std::to_string(t.reps), fmt(t.median), fmt(t.p10), fmt(t.p90), fmt(bytes / t.median / 1e3, 1),
                 fmt(ceiling / t.median, 3), plan, overlap});
      };
      row("ceiling: one contiguous cudaMemcpyAsync from the peer", ceilingStats, "1", "-");
      std::vector<void*> dsts;
      std::vector<const void*> srcs;
      std::vector<size_t> sizes;
      for (size_t i = 0; i < c.pairs; ++i)
        for (int j = 0; j < c.regions; ++j) {
          const kvcomm::KvRegion& g = layout.regions[static_cast<size_t>(j)];
          dsts.push_back(local + g.offset + static_cast<size_t>(ids.dst[i]) * c.blockBytes);
          srcs.push_back(peer + g.offset + static_cast<size_t>(ids.src[i]) * c.blockBytes);
          sizes.push_back(c.blockBytes);
        }
      row("baseline: cudaMemcpyAsync per block",
          eventUs(
              [&] {
                for (size_t k = 0; k < dsts.size(); ++k)
                  CU(cudaMemcpyAsync(dsts[k], srcs[k], sizes[k], cudaMemcpyDeviceToDevice, s));
              },
              s, std::max(3, r / 4), 1),
          std::to_string(pieces), "-");
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t zero = 0;
      row("baseline: one cudaMemcpyBatchAsync",
          eventUs(
              [&] {
                CU(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &zero, 1, s));
              },
              s, r, 2),
          std::to_string(pieces), "-");
      for (kvcomm::FetchPath path :
           {kvcomm::FetchPath::Kernel, kvcomm::FetchPath::CopyEngine, kvcomm::FetchPath::Auto}) {
        kvcomm::FetchOptions o;
        o.path = path;
        std::vector<double> plans;
        size_t runsOut = 0;
        kvbench::Stats us = eventUs(
            [&] {
              auto info = f.fetch({q}, ks, o);
              plans.push_back(info.planMicros);
              runsOut = info.runsOut;
            },
            s, r, 2);
        row(std::string("kvcomm fetch (") + kvcomm::fetchPathName(path) + ")", us, std::to_string(runsOut),
            fmt(kvbench::median(plans)));
      }
      kvcomm::FetchPlan plan = f.plan({q});
      row(std::string("kvcomm submit (plan reused, ") + kvcomm::fetchPathName(plan.info().path) + ")",
          eventUs([&] { f.submit(plan, ks); }, s, r, 2), std::to_string(plan.info().runsOut), "0");
      int64_t *dSrc = nullptr, *dDst = nullptr;
      CU(cudaMalloc(&dSrc, c.pairs * 8));
      CU(cudaMalloc(&dDst, c.pairs * 8));
      CU(cudaMemcpy(dSrc, ids.src.data(), c.pairs * 8, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(dDst, ids.dst.data(), c.pairs * 8, cudaMemcpyHostToDevice));
      kvcomm::DeviceFetchBatch db{dSrc, dDst, nullptr, 1, c.pairs};
      row("kvcomm fetchDevice (ids on the GPU)", eventUs([&] { f.fetchDevice(db, ks); }, s, r, 2), "-", "-");
      {
        kvcomm::FetchOptions o;
        o.validation = kvcomm::FetchValidation::Device;
        std::vector<double> plans;
        row("kvcomm fetch (checked on the device, pageable ids)",
            eventUs([&] { plans.push_back(f.fetch({q}, ks, o).planMicros); }, s, r, 2), "-",
            fmt(kvbench::median(plans)));
        PinnedIds pinned(ids);
        kvcomm::FetchRequest pq{1, pinned.src, pinned.dst, c.pairs, 0};
        plans.clear();
        row("kvcomm fetch (checked on the device, pinned ids)",
            eventUs([&] { plans.push_back(f.fetch({pq}, ks, o).planMicros); }, s, r, 2), "-",
            fmt(kvbench::median(plans)));
      }
      // Overlap with a compute-bound kernel on another stream (the engine's work).
      if (c.name == "scattered 64 KiB") {
        cudaStream_t cs;
        CU(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
        cudaEvent_t fork, join;
        CU(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
        CU(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
        const int iters = opt.computeIters;
        kvbench::Stats computeStats = eventUs([&] { kvbench::launchCompute(sink, iters, s); }, s, r, 2);
        const double computeUs = computeStats.median;
        row("compute kernel alone (the engine's work)", computeStats, "-", "-");
        for (kvcomm::FetchPath path : {kvcomm::FetchPath::Kernel, kvcomm::FetchPath::CopyEngine}) {
          kvcomm::FetchOptions o;
          o.path = path;
          const double alone = eventUs([&] { f.fetch({q}, ks, o); }, s, r, 2).median;
          kvbench::Stats both = eventUs(
              [&] {
                CU(cudaEventRecord(fork, s));
                CU(cudaStreamWaitEvent(cs, fork));
                kvbench::launchCompute(sink, iters, reinterpret_cast<CUstream_st*>(cs));
                f.fetch({q}, ks, o);
                CU(cudaEventRecord(join, cs));
                CU(cudaStreamWaitEvent(s, join));
              },
              s, r, 2);
          row(std::string("fetch (") + kvcomm::fetchPathName(path) + ") + compute together (alone: fetch " +
                  fmt(alone) + " us, compute " + fmt(computeUs) + " us)",
              both, "-", "-", fmt((alone + computeUs) / both.median, 3));
        }
        cudaEventDestroy(fork);
        cudaEventDestroy(join);
        cudaStreamDestroy(cs);
      }
      cudaFree(dSrc);
      cudaFree(dDst);
      f.checkErrors();
    }
    world.barrier();
  }

  // The collective form: both ranks pull `pairs` scattered blocks from each other at once.
  kvbench::Report coll(
      "fetchAll (2 x GPU pull from each other at once) vs NCCL grouped send/recv of packed blocks",
      {Column{"block_bytes", Kind::Int, "bytes of one block"},
       Column{"blocks_per_rank", Kind::Int, "blocks each rank pulls (scattered ids)"},
       Column{"op", Kind::Text, "what was timed"}, Column{"reps", Kind::Int, "timed calls behind the statistics"},
       Column{"us", Kind::Num,
              "median us per call, the slowest rank's (events; ranks aligned by an "
              "MPI barrier before each call)"},
       Column{"p10_us", Kind::Num, "10th percentile"}, Column{"p90_us", Kind::Num, "90th percentile"},
       Column{"GBps_per_rank", Kind::Num, "bytes each rank receives / median"},
       Column{"speedup", Kind::Num, "NCCL median / kvcomm median"}},
      where);
  coll.note(
      "NCCL: the source packs the blocks its peer asked for (ids exchanged ahead), ncclSend/ncclRecv grouped, "
      "the receiver unpacks into its slots; kvcomm: fetchAll = barrier, pull, barrier.");
  for (size_t bb : {16u << 10, 64u << 10}) {
    Case c{"all-to-all", bb, 1, quick ? 256u : 2048u, 0};
    kvcomm::KvLayout layout = makeLayout(c);
    const size_t blocks = 2 * c.pairs, bytesAll = blocks * bb;
    auto buf = kvcomm::SymmetricBuffer::create(world, bytesAll, bytesAll, kvcomm::MemoryKind::Cuda);
    CU(cudaMemset(buf.local(), me + 1, bytesAll));
    auto f = kvcomm::Fetcher::create(buf, layout);
    Ids ids = makeIds(c, 7 + static_cast<uint64_t>(me));
    const int peerRank = 1 - me;
    kvcomm::FetchRequest q{peerRank, ids.src.data(), ids.dst.data(), ids.src.size(), 0};
    world.barrier();
    auto timed = [&](const std::function<void()>& op) -> kvbench::Stats {
      std::vector<double> t;
      cudaEvent_t a, b;
      CU(cudaEventCreate(&a));
      CU(cudaEventCreate(&b));
      for (int i = 0; i < reps + 3; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        CU(cudaEventRecord(a, s));
        op();
        CU(cudaEventRecord(b, s));
        CU(cudaEventSynchronize(b));
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, a, b));
        if (i >= 3) t.push_back(ms * 1000.0);
      }
      cudaEventDestroy(a);
      cudaEventDestroy(b);
      return kvbench::maxOverRanks(kvbench::stats(t));
    };
    kvbench::Stats kv = timed([&] { f.fetchAll({q}, ks); });
    const double bytes = static_cast<double>(c.pairs * bb);
    auto crow = [&](const std::string& op, const kvbench::Stats& t, const std::string& speedup) {
      if (me == 0)
        coll.row({std::to_string(bb), std::to_string(c.pairs), op, std::to_string(t.reps), fmt(t.median), fmt(t.p10),
                  fmt(t.p90), fmt(bytes / t.median / 1e3, 1), speedup});
    };
    crow("kvcomm fetchAll", kv, "-");
    // The bound of this traffic: both ranks copy the same bytes from each other at once, one contiguous copy-engine
    // copy each (no blocks, no barriers).
    char* mine = static_cast<char*>(buf.local());
    char* theirs = static_cast<char*>(buf.peer(peerRank));
    crow("bound: both ranks one contiguous cudaMemcpyAsync from the peer at once",
         timed([&] { CU(cudaMemcpyAsync(mine + bytesAll / 2, theirs, c.pairs * bb, cudaMemcpyDeviceToDevice, s)); }),
         "-");
#ifdef KVCOMM_PERF_NCCL
    ncclUniqueId id;
    if (me == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t nc;
    ncclCommInitRank(&nc, 2, id, me);
    // The peer's requested ids are known here (exchanged ahead, as an engine's scheduler would).
    std::vector<int64_t> peerSrc(c.pairs);
    MPI_Sendrecv(ids.src.data(), static_cast<int>(c.pairs), MPI_INT64_T, peerRank, 0, peerSrc.data(),
                 static_cast<int>(c.pairs), MPI_INT64_T, peerRank, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    int64_t *dPeerSrc = nullptr, *dDst = nullptr;
    char *sendBuf = nullptr, *recvBuf = nullptr;
    CU(cudaMalloc(&dPeerSrc, c.pairs * 8));
    CU(cudaMalloc(&dDst, c.pairs * 8));
    CU(cudaMalloc(&sendBuf, c.pairs * bb));
    CU(cudaMalloc(&recvBuf, c.pairs * bb));
    CU(cudaMemcpy(dPeerSrc, peerSrc.data(), c.pairs * 8, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dDst, ids.dst.data(), c.pairs * 8, cudaMemcpyHostToDevice));
    char* local = static_cast<char*>(buf.local());
    kvbench::Stats nccl = timed([&] {
      kvbench::launchPackBlocks(sendBuf, local, dPeerSrc, c.pairs, bb, bb, reinterpret_cast<CUstream_st*>(s));
      ncclGroupStart();
      ncclSend(sendBuf, c.pairs * bb, ncclUint8, peerRank, nc, s);
      ncclRecv(recvBuf, c.pairs * bb, ncclUint8, peerRank, nc, s);
      ncclGroupEnd();
      kvbench::launchUnpackBlocks(local, recvBuf, dDst, c.pairs, bb, bb, reinterpret_cast<CUstream_st*>(s));
    });
    crow("NCCL grouped send/recv + pack/unpack", nccl, fmt(nccl.median / kv.median, 2));
    ncclCommDestroy(nc);
    cudaFree(dPeerSrc);
    cudaFree(dDst);
    cudaFree(sendBuf);
    cudaFree(recvBuf);
#else
    if (me == 0)
      coll.row({std::to_string(bb), std::to_string(c.pairs), "NCCL baseline", "not built (no libnccl)", "-", "-"});
#endif
    f.checkErrors();
    world.barrier();
  }
  cudaFree(sink);
  if (me == 0) {
    rep.print(json);
    coll.print(json);
  }
  hostCostTable(world, opt, where, s);
  backToBackTable(world, opt, where, s);
  cudaStreamDestroy(s);
}

#endif  // KVCOMM_HAVE_CUDA

void runHost(kvcomm::Communicator& world, const Options& opt, const kvbench::Placement& where) {
  const std::string& json = opt.json;
  const int me = world.rank();
  const int reps = opt.reps;
  using kvbench::Column;
  using kvbench::Kind;
  kvbench::Report rep(
      "fetch (" + std::to_string(world.size()) + " ranks, host memory: rank 0 pulls from rank 1)",
      {Column{"case", Kind::Text, "block sizes and how the ids are laid out"},
       Column{"block_bytes", Kind::Int, "bytes of one block in one region"},
       Column{"blocks", Kind::Int, "block copies: pairs x regions"}, Column{"bytes", Kind::Int, "bytes moved per call"},
       Column{"op", Kind::Text, "what was timed"}, Column{"reps", Kind::Int, "timed calls behind the statistics"},
       Column{"us", Kind::Num, "median wall-clock us per call"}, Column{"p10_us", Kind::Num, "10th percentile"},
       Column{"p90_us", Kind::Num, "90th percentile"}, Column{"GBps", Kind::Num, "bytes / median"},
       Column{"speedup", Kind::Num, "this baseline's median / kvcomm's median"},
       Column{"plan_us", Kind::Num, "median host time kvcomm spent validating and coalescing"}},
      where);
  for (const Case& c :
       {Case{"scattered 4 KiB", 4u << 10, 2, 2048, 0}, Case{"scattered 64 KiB", 64u << 10, 1, 1024, 0},
        Case{"runs of 16 x 64 KiB", 64u << 10, 1, 1024, 16}, Case{"1 block of 4 KiB", 4u << 10, 1, 1, 0}}) {
    kvcomm::KvLayout layout = makeLayout(c);
    const size_t blocks = 2 * c.pairs, bytesAll = blocks * c.blockBytes * c.regions;
    auto buf = kvcomm::SymmetricBuffer::create(world, bytesAll, bytesAll, kvcomm::MemoryKind::Host);
    std::memset(buf.local(), me + 1, bytesAll);
    auto f = kvcomm::Fetcher::create(buf, layout);
    Ids ids = makeIds(c, 42);
    const size_t bytes = c.pairs * c.regions * c.blockBytes;
    world.barrier();
    // MPI baseline: rank 1 packs the blocks rank 0 wants and sends them; rank 0 receives and unpacks.
    std::vector<char> pack(bytes);
    char* local = static_cast<char*>(buf.local());
    auto mpi = [&] {
      if (me == 1) {
        size_t at = 0;
        for (size_t i = 0; i < c.pairs; ++i)
          for (int j = 0; j < c.regions; ++j, at += c.blockBytes)
            std::memcpy(pack.data() + at, local + layout.regions[j].offset + ids.src[i] * c.blockBytes, c.blockBytes);
        MPI_Send(pack.data(), static_cast<int>(bytes), MPI_BYTE, 0, 9, MPI_COMM_WORLD);
      } else if (me == 0) {
        MPI_Recv(pack.data(), static_cast<int>(bytes), MPI_BYTE, 1, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        size_t at = 0;
        for (size_t i = 0; i < c.pairs; ++i)
          for (int j = 0; j < c.regions; ++j, at += c.blockBytes)
            std::memcpy(local + layout.regions[j].offset + ids.dst[i] * c.blockBytes, pack.data() + at, c.blockBytes);
      }
    };
    kvbench::Stats mpiUs;
    {
      for (int i = 0; i < 2; ++i) mpi();
      std::vector<double> t;
      for (int i = 0; i < reps; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        auto a = std::chrono::steady_clock::now();
        mpi();
        t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
      }
      mpiUs = kvbench::stats(t);
    }
    if (me == 0) {
      char* peer = static_cast<char*>(buf.peer(1));
      kvcomm::FetchRequest q{1, ids.src.data(), ids.dst.data(), ids.src.size(), 0};
      std::vector<double> plans;
      kvbench::Stats kv = kvbench::wallUs([&] { plans.push_back(f.fetch({q}).planMicros); }, reps, 2);
      kvbench::Stats loop = kvbench::wallUs(
          [&] {
            for (size_t i = 0; i < c.pairs; ++i)
              for (int j = 0; j < c.regions; ++j)
                std::memcpy(local + layout.regions[j].offset + ids.dst[i] * c.blockBytes,
                            peer + layout.regions[j].offset + ids.src[i] * c.blockBytes, c.blockBytes);
          },
          reps, 2);
      auto row = [&](const std::string& op, const kvbench::Stats& t, const std::string& speedup,
                     const std::string& plan) {
        rep.row({c.name, std::to_string(c.blockBytes), std::to_string(c.pairs * c.regions), std::to_string(bytes), op,
                 std::to_string(t.reps), fmt(t.median), fmt(t.p10), fmt(t.p90), fmt(bytes / t.median / 1e3, 2), speedup,
                 plan});
      };
      row("kvcomm fetch (host)", kv, "-", fmt(kvbench::median(plans)));
      row("baseline: memcpy per block over the same mapping", loop, fmt(loop.median / kv.median, 2), "-");
      row("baseline: MPI send/recv of packed blocks (rank 1 packs, rank 0 unpacks)", mpiUs,
          fmt(mpiUs.median / kv.median, 2), "-");
    }
    world.barrier();
  }
  if (me == 0) rep.print(json);
}

}  // namespace

int main(int argc, char** argv) {
  kvcli::Args args("perf_fetch", "mpirun -np N perf_fetch [options]",
                   "fetch against what engines do today, in the same run: on GPUs rank 0 pulls blocks from rank 1\n"
                   "(kernel, copy-engine and auto paths, device ids) against one contiguous copy-engine copy (the\n"
                   "ceiling), a cudaMemcpyAsync per block and one cudaMemcpyBatchAsync; the collective form against\n"
                   "NCCL grouped send/recv + pack/unpack. On host memory against a memcpy loop and MPI send/recv.");
  args.option("--kind", "cuda|host", "memory to fetch in (default: cuda where each rank has its own GPU, else host)");
  args.option("--reps", "N", "timed repetitions per variant, 1 to 100000", "20");
  args.flag("--quick", "smaller cases (a tenth of the bytes)");
  args.option("--compute-iters", "N", "loop trips of the compute-bound kernel, 1 to 10000000", "20000");
  args.option("--json", "FILE", "append one JSON line per table row to FILE");
  // The cases are fixed shapes (block sizes x layouts), so the -b/-e/-f size sweep of the other benchmarks does
  // not apply; --reps plays -n's part.
  args.option("--net-rank", "R", "cross-host mode without MPI: this process is rank R (0 pulls, 1 serves) of two");
  args.option("--id-file", "FILE", "cross-host mode: rank 0 writes the bootstrap id to FILE, rank 1 reads it");
  args.option("--ifname", "IF", "cross-host mode: the network interface to use (default: the first one that is up)");
  args.flag("--sweep",
            "cross-host mode: block sizes 4 KiB-2 MiB x batches 1-16k (endpoint pull/push beside the "
            "Fetcher and a raw socket) instead of the fixed cases");
  args.flag("--endpoint",
            "same-host endpoint sweep (2 ranks on one host): block sizes 4 KiB-2 MiB x batches 1-16k, the endpoint's "
            "read, write and readDevice through the peer mapping beside the Fetcher's start and fetchDevice");
  Options o;
  kvbench::NetOptions net;
  bool endpoint = false;
  std::string kindArg;
  int rc = kvcli::parseOrExit(args, argc, argv, [&] {
    if (args.given("kind")) kindArg = args.choice("kind", {"cuda", "host"});
    o.reps = static_cast<int>(args.integer("reps", 1, 100000));
    o.quick = args.given("quick");
    o.computeIters = static_cast<int>(args.integer("compute-iters", 1, 10000000));
    o.json = args.text("json");
    endpoint = args.given("endpoint");
    if (args.given("net-rank")) {
      net.rank = static_cast<int>(args.integer("net-rank", 0, 1));
      net.idFile = args.text("id-file");
      if (net.idFile.empty()) throw kvcli::UsageError("--net-rank needs --id-file");
      net.ifname = args.text("ifname");
      net.kind = kindArg.empty() ? "host" : kindArg;
      net.reps = o.reps;
      net.quick = o.quick;
      net.sweep = args.given("sweep");
      net.json = o.json;
    }
  });
  if (rc >= 0) return rc;
  if (net.rank >= 0) return kvbench::runNetwork(net);
  rc = 0;
  MPI_Init(&argc, &argv);
  try {
    const int dev = kvbench::bindLocalDevice();
    auto world = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
    if (world.size() < 2) throw std::runtime_error("perf_fetch needs at least 2 ranks");
    const bool ownGpus = dev >= 0 && world.topology().sharedGpu().first < 0;
    kvbench::Placement where = kvbench::placement();
    const std::string kind = kindArg.empty() ? (ownGpus ? "cuda" : "host") : kindArg;
    if (endpoint) {
      kvbench::EndpointPeerOptions eo;
      eo.kind = kind;
      eo.reps = o.reps;
      eo.quick = o.quick;
      eo.json = o.json;
      kvbench::runEndpointPeer(world, eo, where);
    } else if (kind == "cuda") {
#ifdef KVCOMM_HAVE_CUDA
      runGpu(world, o, where);
#else
      throw std::runtime_error("perf_fetch: built without CUDA");
#endif
    } else {
      runHost(world, o, where);
    }
  } catch (const std::exception& e) {
    std::cerr << "perf_fetch: " << e.what() << std::endl;
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
