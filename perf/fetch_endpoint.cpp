#include "fetch_endpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "kvcomm/endpoint.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/symm.hpp"

#ifdef KVCOMM_HAVE_CUDA
#include <cuda_runtime.h>
#define CU(x)                                                                                         \
  do {                                                                                                \
    cudaError_t e_ = (x);                                                                             \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#endif

namespace kvbench {

namespace {

#ifdef KVCOMM_HAVE_CUDA
// us between events around `op` on `s` (host work in the call included), and the host us spent in the call.
struct Timed {
  Stats gpu, host;
};
Timed events(const std::function<void()>& op, cudaStream_t s, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) op();
  CU(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  std::vector<double> g, h;
  for (int i = 0; i < reps; ++i) {
    CU(cudaEventRecord(a, s));
    auto t0 = std::chrono::steady_clock::now();
    op();
    h.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    CU(cudaEventRecord(b, s));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    g.push_back(ms * 1000.0);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return {stats(g), stats(h)};
}
#endif

}  // namespace

void runEndpointPeer(kvcomm::Communicator& world, const EndpointPeerOptions& o, const Placement& where) {
  const int me = world.rank();
  const bool cuda = o.kind == "cuda";
#ifndef KVCOMM_HAVE_CUDA
  if (cuda) throw std::runtime_error("perf_fetch --endpoint --kind cuda: built without CUDA");
#endif
  const kvcomm::MemoryKind kind = cuda ? kvcomm::MemoryKind::Cuda : kvcomm::MemoryKind::Host;
  Report rep(std::string("endpoint on one host (") + o.kind +
                 " memory): rank 0 pulls from and pushes to rank 1 through the peer mapping, beside the Fetcher",
             {Column{"block_bytes", Kind::Int, "bytes of one block"},
              Column{"blocks", Kind::Int, "block pairs per transfer (scattered ids: no two coalesce)"},
              Column{"op", Kind::Text, "what was timed"}, Column{"reps", Kind::Int, "timed calls"},
              Column{"us", Kind::Num, "median us per transfer (polled: call to wait's return; device: CUDA events)"},
              Column{"p99_us", Kind::Num, "99th percentile"}, Column{"GBps", Kind::Num, "bytes / median"},
              Column{"vs_fetcher", Kind::Num,
                     "the Fetcher's median / this median on the same bytes and path (1 = as fast; target >= 0.95)"},
              Column{"host_us", Kind::Num,
                     "device ids: median host us spent in the call (flat in the batch: the ids "
                     "stay on the GPU)"}},
             where);
  rep.note(
      "Both sides register the ranks' SymmetricBuffer memory: rank 0's Fetcher and rank 0's endpoint read the "
      "same peer bytes over the same mapping kind; every variant in the same run; warm-up 3 calls.");
  std::vector<size_t> blockSizes = {4u << 10, 64u << 10, 512u << 10, 2u << 20};
  std::vector<size_t> batches =
      o.quick ? std::vector<size_t>{1, 64, 4096} : std::vector<size_t>{1, 16, 256, 4096, 16384};
  const size_t cap = o.quick ? (64u << 20) : (512u << 20);
  for (size_t bb : blockSizes)
    for (size_t n : batches) {
      if (bb * n > cap) continue;
      kvcomm::KvLayout layout;
      layout.regions.push_back({0, bb, bb, 2 * n});
      const size_t bytesAll = 2 * n * bb;
      auto buf = kvcomm::SymmetricBuffer::create(world, bytesAll, bytesAll, kind);
#ifdef KVCOMM_HAVE_CUDA
      if (cuda) CU(cudaMemset(buf.local(), me + 1, bytesAll));
#endif
      if (!cuda) std::memset(buf.local(), me + 1, bytesAll);
      auto f = kvcomm::Fetcher::create(buf, layout);
      kvcomm::Endpoint ep = kvcomm::Endpoint::create();
      kvcomm::Registration reg = ep.registerBuffer(buf, layout);
      std::vector<uint8_t> meta = reg.metadata();
      const size_t slot = 4096;
      if (meta.size() + 8 > slot) throw std::runtime_error("metadata larger than its slot");
      std::vector<uint8_t> all(2 * slot);
      uint64_t len = meta.size();
      std::memcpy(all.data() + me * slot, &len, 8);
      std::memcpy(all.data() + me * slot + 8, meta.data(), meta.size());
      world.allgather(all.data(), slot);
      if (me == 0) {
        uint64_t rl = 0;
        std::memcpy(&rl, all.data() + slot, 8);
        kvcomm::RemoteMemory remote = ep.connect(all.data() + slot + 8, rl);
        std::vector<int64_t> src(n), dst(n);
        std::iota(src.begin(), src.end(), static_cast<int64_t>(n));
        std::iota(dst.begin(), dst.end(), 0);
        std::mt19937_64 rng(bb * 131 + n);
        std::shuffle(src.begin(), src.end(), rng);
        std::shuffle(dst.begin(), dst.end(), rng);
        const double bytes = static_cast<double>(n * bb);
        const int reps = n * bb > (64u << 20) ? std::max(5, o.reps / 4) : o.reps;
        kvcomm::FetchRequest q{1, src.data(), dst.data(), n, 0};
        Stats fetcher = wallUs([&] { f.start({q}).wait(); }, reps, 3);
        auto row = [&](const std::string& op, const Stats& s, const std::string& vs, const std::string& host) {
          rep.row({std::to_string(bb), std::to_string(n), op, std::to_string(s.reps), fmt(s.median), fmt(s.p99),
                   fmt(bytes / s.median / 1e3, 2), vs, host});
        };
        row("Fetcher start + wait (polled)", fetcher, "1", "-");
        kvcomm::FetchTransportKind path = kvcomm::FetchTransportKind::None;
        Stats rd = wallUs(
            [&] {
              kvcomm::Transfer t = ep.read(reg, remote, src.data(), dst.data(), n);
              path = t.transport();
              if (t.wait().state != kvcomm::FetchState::Done) throw std::runtime_error("endpoint read failed");
            },
            reps, 3);
        const std::string via = std::string(" [") + kvcomm::fetchTransportName(path) + "]";
        row("endpoint read + wait (polled)" + via, rd, fmt(fetcher.median / rd.median, 3), "-");
        Stats wr = wallUs(
            [&] {
              kvcomm::Transfer t = ep.write(reg, remote, src.data(), dst.data(), n);
              if (t.wait().state != kvcomm::FetchState::Done) throw std::runtime_error("endpoint write failed");
            },
            reps, 3);
        row("endpoint write + wait (polled)" + via, wr, fmt(fetcher.median / wr.median, 3), "-");
        if (!cuda && n <= 4096) {
          char* local = static_cast<char*>(buf.local());
          char* peer = static_cast<char*>(buf.peer(1));
          Stats mc = wallUs(
              [&] {
                for (size_t i = 0; i < n; ++i)
                  std::memcpy(local + static_cast<size_t>(dst[i]) * bb, peer + static_cast<size_t>(src[i]) * bb, bb);
              },
              reps, 3);
          row("baseline: memcpy per block (one thread)", mc, fmt(fetcher.median / mc.median, 3), "-");
        }
#ifdef KVCOMM_HAVE_CUDA
        if (cuda) {
          cudaStream_t s;
          CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
          auto ks = reinterpret_cast<kvcomm::Stream>(s);
          int64_t *dSrc = nullptr, *dDst = nullptr;
          CU(cudaMalloc(reinterpret_cast<void**>(&dSrc), n * 8));
          CU(cudaMalloc(reinterpret_cast<void**>(&dDst), n * 8));
          CU(cudaMemcpy(dSrc, src.data(), n * 8, cudaMemcpyHostToDevice));
          CU(cudaMemcpy(dDst, dst.data(), n * 8, cudaMemcpyHostToDevice));
          kvcomm::DeviceFetchBatch db{dSrc, dDst, nullptr, 1, n};
          Timed fd = events([&] { f.fetchDevice(db, ks); }, s, reps, 3);
          row("Fetcher fetchDevice (ids on the GPU)", fd.gpu, "1", fmt(fd.host.median));
          Timed ed = events([&] { ep.readDevice(reg, remote, {dSrc, dDst, n}, ks); }, s, reps, 3);
          row("endpoint readDevice (ids on the GPU)", ed.gpu, fmt(fd.gpu.median / ed.gpu.median, 3),
              fmt(ed.host.median));
          if (n <= 4096) {
            char* local = static_cast<char*>(buf.local());
            char* peer = static_cast<char*>(buf.peer(1));
            Timed pb = events(
                [&] {
                  for (size_t i = 0; i < n; ++i)
                    CU(cudaMemcpyAsync(local + static_cast<size_t>(dst[i]) * bb,
                                       peer + static_cast<size_t>(src[i]) * bb, bb, cudaMemcpyDeviceToDevice, s));
                },
                s, std::max(3, reps / 2), 2);
            row("baseline: cudaMemcpyAsync per block", pb.gpu, fmt(fd.gpu.median / pb.gpu.median, 3),
                fmt(pb.host.median));
          }
          if (ep.pollError(reg, remote).kind != kvcomm::DeviceErrorKind::None)
            throw std::runtime_error("endpoint readDevice recorded an error");
          cudaFree(dSrc);
          cudaFree(dDst);
          cudaStreamDestroy(s);
        }
#endif
      }
      world.barrier();  // rank 1 serves until rank 0 is done
      ep.close();
    }
  if (me == 0) rep.print(o.json);
}

}  // namespace kvbench
