#include "fetch_net.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "bench/bench.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/endpoint.hpp"
#include "kvcomm/fetch.hpp"

#ifdef KVCOMM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kvbench {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what + ": " + std::strerror(errno));
}

#ifdef KVCOMM_HAVE_CUDA
void cu(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

// The IPv4 address of `ifname` (the first non-loopback one when empty).
in_addr interfaceAddress(const std::string& ifname) {
  ifaddrs* list = nullptr;
  check(getifaddrs(&list) == 0, "getifaddrs");
  in_addr out{};
  out.s_addr = htonl(INADDR_LOOPBACK);
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
    bool match = ifname.empty() ? std::string(it->ifa_name) != "lo" : ifname == it->ifa_name;
    if (match) {
      out = reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr;
      break;
    }
  }
  freeifaddrs(list);
  return out;
}

void sendBytes(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    check(k > 0, "send (raw baseline)");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recvBytes(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    check(k > 0, "recv (raw baseline)");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void noDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The baseline's server (rank 1): answers each 8-byte size with that many bytes from a packed buffer; 0 ends it.
class RawServer {
 public:
  RawServer(in_addr addr, size_t most) : data_(most, 7) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    check(listener_ >= 0, "socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr = addr;
    check(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, "bind (raw baseline)");
    check(::listen(listener_, 4) == 0, "listen");
    socklen_t len = sizeof(addr_);
    check(getsockname(listener_, reinterpret_cast<sockaddr*>(&addr_), &len) == 0, "getsockname");
    thread_ = std::thread([this] {
      int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      noDelay(fd);
      for (;;) {
        uint64_t n = 0;
        if (::recv(fd, &n, sizeof(n), MSG_WAITALL) != sizeof(n) || n == 0 || n > data_.size()) break;
        sendBytes(fd, data_.data(), n);
      }
      ::close(fd);
    });
  }
  ~RawServer() {
    thread_.join();
    ::close(listener_);
  }
  sockaddr_in address() const { return addr_; }

 private:
  std::vector<char> data_;
  int listener_ = -1;
  sockaddr_in addr_{};
  std::thread thread_;
};

// Statistics of operations timed in rotation (a, b, c, a, b, c, ...): on a shared machine all see the same load.
std::vector<Stats> rotatedStatsUs(const std::vector<std::function<void()>>& ops, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i)
    for (auto& op : ops) op();
  std::vector<std::vector<double>> t(ops.size());
  for (int i = 0; i < reps; ++i)
    for (size_t k = 0; k < ops.size(); ++k) {
      auto t0 = std::chrono::steady_clock::now();
      ops[k]();
      t[k].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  std::vector<Stats> out;
  for (auto& v : t) out.push_back(stats(v));
  return out;
}

struct NetCase {
  std::string name;
  size_t blockBytes;
  int regions;
  size_t blocks;  // pairs
  bool scattered;
};

}  // namespace

int runNetwork(const NetOptions& o) {
  try {
    const bool cuda = o.kind == "cuda";
    if (cuda && kvcomm::useLocalDevice(o.rank) < 0) throw std::runtime_error("--kind cuda but no usable GPU");
    kvcomm::UniqueId id;
    if (o.rank == 0) {
      id = kvcomm::TcpBootstrap::createUniqueId(o.ifname);
      std::ofstream(o.idFile + ".tmp") << id.toString();
      std::rename((o.idFile + ".tmp").c_str(), o.idFile.c_str());
    } else {
      std::string text;
      for (int i = 0; i < 3000 && text.empty(); ++i) {
        std::ifstream f(o.idFile);
        std::getline(f, text);
        if (text.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      id = kvcomm::UniqueId::fromString(text);
    }
    auto comm = kvcomm::Communicator::create(std::make_shared<kvcomm::TcpBootstrap>(id, o.rank, o.size, 120000));
    if (comm.size() != 2) throw std::runtime_error("the cross-host mode runs with 2 ranks");
    const int me = comm.rank();
    const kvcomm::MemoryKind kind = cuda ? kvcomm::MemoryKind::Cuda : kvcomm::MemoryKind::Host;
    const size_t most = o.quick ? (8u << 20) : (64u << 20);
    std::vector<NetCase> cases = {
        {"one run of 1 MiB blocks", 1u << 20, 1, most >> 20, false},
        {"scattered 64 KiB", 64u << 10, 1, most >> 16, true},
        {"scattered 4 KiB x 2 regions", 4u << 10, 2, most >> 14, true},
        {"1 block of 4 KiB (latency)", 4u << 10, 1, 1, false},
    };
    if (o.sweep) {  // nixlbench's grid: block size x batch, scattered ids, up to `most` bytes a transfer
      cases.clear();
      for (size_t block : {size_t{4} << 10, size_t{64} << 10, size_t{512} << 10, size_t{2} << 20})
        for (size_t batch : {size_t{1}, size_t{16}, size_t{256}, size_t{4096}, size_t{16384}})
          if (block * batch <= most)
            cases.push_back({"sweep " + std::to_string(block >> 10) + " KiB x " + std::to_string(batch), block, 1,
                             batch, batch > 1});
    }
    // The baseline: one plain connection from rank 0 to rank 1, set up once.
    std::unique_ptr<RawServer> raw;
    std::vector<sockaddr_in> addrs(2);
    if (me == 1) {
      raw = std::make_unique<RawServer>(interfaceAddress(o.ifname), most);
      addrs[1] = raw->address();
    }
    comm.allgather(addrs.data(), sizeof(sockaddr_in));
    int rawFd = -1;
    if (me == 0) {
      rawFd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      check(rawFd >= 0 && ::connect(rawFd, reinterpret_cast<sockaddr*>(&addrs[1]), sizeof(sockaddr_in)) == 0,
            "connect (raw baseline)");
      noDelay(rawFd);
    }
    std::vector<char> hostStage;
    char* stage = nullptr;
    char* devStage = nullptr;
#ifdef KVCOMM_HAVE_CUDA
    cudaStream_t stream = nullptr;
    if (cuda) {
      cu(cudaHostAlloc(reinterpret_cast<void**>(&stage), most, cudaHostAllocDefault), "cudaHostAlloc");
      cu(cudaMalloc(reinterpret_cast<void**>(&devStage), most), "cudaMalloc");
      cu(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    }
#endif
    if (!cuda) {
      hostStage.resize(most);
      stage = hostStage.data();
    }
    // RDMA where both members have a device.
    std::vector<int32_t> rdma(2);
    rdma[static_cast<size_t>(me)] = kvcomm::capabilities().rdma ? 1 : 0;
    comm.allgather(rdma.data(), sizeof(int32_t));
    const bool withRdma = rdma[0] && rdma[1];
    // Two processes, one per host: no MPI to ask where they run.
    Placement where;
    where.ranks = 2;
    where.ranksPerHost = 1;
    cpu_set_t cpus;
    where.cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
    Report rep("fetch across hosts (" + std::string(cuda ? "GPU" : "host") +
                   " memory: rank 0 pulls from rank 1 on another host or network namespace, rank 1 serves)",
               {Column{"case", Kind::Text, "block sizes and how the ids are laid out"},
                Column{"block_bytes", Kind::Int, "bytes of one block in one region"},
                Column{"blocks", Kind::Int, "block copies: pairs x regions"},
                Column{"bytes", Kind::Int, "bytes moved per fetch"}, Column{"op", Kind::Text, "what was timed"},
                Column{"reps", Kind::Int, "timed fetches behind the statistics"},
                Column{"us", Kind::Num, "median wall-clock us per fetch until the bytes are in rank 0's memory"},
                Column{"p10_us", Kind::Num, "10th percentile"}, Column{"p90_us", Kind::Num, "90th percentile"},
                Column{"p99_us", Kind::Num, "99th percentile"}, Column{"GBps", Kind::Num, "bytes / median"},
                Column{"vs_raw", Kind::Num,
                       "raw_us / us: throughput as a fraction of one plain TCP connection carrying the same bytes"},
                Column{"vs_fetch", Kind::Num,
                       "fetch_us / us (endpoint rows): throughput as a fraction of the collective Fetcher's over TCP "
                       "on the same bytes"}},
               where);
    rep.note(
        "Every variant of a case is timed in rotation (kvcomm, kvcomm on one connection, raw, endpoint read, endpoint "
        "write, kvcomm, ...), so all see the same load.");
    rep.note(
        "Endpoint rows: two processes that meet through metadata (kvcomm::Endpoint, no communicator), the same "
        "buffers registered, the same pairs; 'host us' is the time read()/write() take to validate, plan and post.");
    rep.note(cuda ? "The baseline receives the bytes into pinned memory and cudaMemcpy's them into GPU memory."
                  : "The baseline receives the bytes into one host buffer.");
    for (const NetCase& c : cases) {
      kvcomm::KvLayout layout;
      const size_t perRegion = 2 * c.blocks * c.blockBytes;
      for (int j = 0; j < c.regions; ++j) layout.regions.push_back({j * perRegion, c.blockBytes, 0, 2 * c.blocks});
      const size_t bytesAll = perRegion * static_cast<size_t>(c.regions), bytes = c.blocks * c.blockBytes * c.regions;
      auto buf = kvcomm::SymmetricBuffer::create(comm, bytesAll, bytesAll, kind);
#ifdef KVCOMM_HAVE_CUDA
      if (cuda) cu(cudaMemset(buf.local(), me + 1, bytesAll), "cudaMemset");
#endif
      if (!cuda) std::memset(buf.local(), me + 1, bytesAll);
      std::vector<int64_t> src(c.blocks), dst(c.blocks);
      std::iota(src.begin(), src.end(), 0);
      std::iota(dst.begin(), dst.end(), static_cast<int64_t>(c.blocks));
      if (c.scattered) {
        std::mt19937_64 rng(42);
        std::shuffle(src.begin(), src.end(), rng);
        std::shuffle(dst.begin(), dst.end(), rng);
      }
      kvcomm::FetchRequest q{1, src.data(), dst.data(), c.blocks, 0};
      auto measure = [&](kvcomm::Fetcher& x) {
#ifdef KVCOMM_HAVE_CUDA
        x.fetch({q}, reinterpret_cast<kvcomm::Stream>(stream));
        if (cuda) cu(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
#else
        x.fetch({q});
#endif
      };
      auto f = kvcomm::Fetcher::create(buf, layout);
      // The same over one connection per source (the default opens up to KVCOMM_FETCH_TCP_CONNECTIONS).
      setenv("KVCOMM_FETCH_TCP_CONNECTIONS", "1", 1);
      auto f1 = kvcomm::Fetcher::create(buf, layout);
      unsetenv("KVCOMM_FETCH_TCP_CONNECTIONS");
      // Endpoints over the same memory: rank 1 registers its buffer and hands its metadata over (the communicator
      // stands in for the engine's own channel).
      kvcomm::EndpointOptions eo;
      char ip[INET_ADDRSTRLEN] = {0};
      in_addr at = interfaceAddress(o.ifname);
      inet_ntop(AF_INET, &at, ip, sizeof(ip));
      eo.tcpAddress = std::string(ip) + ":0";
      eo.name = "rank " + std::to_string(me);
      kvcomm::Endpoint ep = kvcomm::Endpoint::create(eo);
      kvcomm::Registration reg = ep.registerBuffer(buf, layout);
      std::vector<uint8_t> meta = reg.metadata();
      std::vector<uint64_t> metaSize(2);
      metaSize[static_cast<size_t>(me)] = meta.size();
      comm.allgather(metaSize.data(), sizeof(uint64_t));
      std::vector<uint8_t> metas(2 * std::max(metaSize[0], metaSize[1]));
      std::memcpy(metas.data() + static_cast<size_t>(me) * metas.size() / 2, meta.data(), meta.size());
      comm.allgather(metas.data(), metas.size() / 2);
      comm.barrier();
      if (me == 0) {
        kvcomm::RemoteMemory peer = ep.connect(metas.data() + metas.size() / 2, metaSize[1]);
        std::vector<double> postUs[2];
        auto endpointOnce = [&](bool push) {
          auto t0 = std::chrono::steady_clock::now();
          kvcomm::Transfer t = push ? ep.write(reg, peer, src.data(), dst.data(), c.blocks)
                                    : ep.read(reg, peer, src.data(), dst.data(), c.blocks);
          postUs[push].push_back(
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          kvcomm::FetchStatus st = t.wait();
          if (st.state != kvcomm::FetchState::Done) throw std::runtime_error("endpoint transfer: " + st.error);
        };
        if (f.transport(1) != kvcomm::FetchTransportKind::Tcp)
          throw std::runtime_error(std::string("rank 1 is reached by ") + kvcomm::fetchTransportName(f.transport(1)) +
                                   ", not tcp: run the two ranks on two hosts (or namespaces)");
        auto rawOnce = [&] {
          uint64_t n = bytes;
          sendBytes(rawFd, reinterpret_cast<const char*>(&n), sizeof(n));
          recvBytes(rawFd, stage, bytes);
#ifdef KVCOMM_HAVE_CUDA
          if (cuda) cu(cudaMemcpy(devStage, stage, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
#endif
        };
        std::vector<Stats> st = rotatedStatsUs({[&] { measure(f); }, [&] { measure(f1); }, rawOnce,
                                                [&] { endpointOnce(false); }, [&] { endpointOnce(true); }},
                                               o.reps, 2);
        const double base = st[2].median;
        auto row = [&](const std::string& op, const Stats& x, bool endpoint) {
          rep.row({c.name, std::to_string(c.blockBytes), std::to_string(c.blocks * c.regions), std::to_string(bytes),
                   op, std::to_string(x.reps), fmt(x.median), fmt(x.p10), fmt(x.p90), fmt(x.p99),
                   fmt(bytes / x.median / 1e3, 3), fmt(base / x.median, 2),
                   endpoint ? fmt(st[0].median / x.median, 2) : "-"});
        };
        row("kvcomm fetch over TCP", st[0], false);
        row("kvcomm fetch over TCP, one connection", st[1], false);
        row(cuda ? "baseline: plain TCP send/recv + cudaMemcpy" : "baseline: plain TCP send/recv", st[2], false);
        row("endpoint read (pull) over TCP", st[3], true);
        row("endpoint write (push) over TCP", st[4], true);
        for (int push = 0; push < 2; ++push) {
          postUs[push].erase(postUs[push].begin(), postUs[push].begin() + 2);  // the warm-up calls
          Stats h = stats(postUs[push]);
          rep.row({c.name, std::to_string(c.blockBytes), std::to_string(c.blocks * c.regions), std::to_string(bytes),
                   push ? "endpoint write: host us in write() (validate, plan, post)"
                        : "endpoint read: host us in read() (validate, plan, post)",
                   std::to_string(h.reps), fmt(h.median), fmt(h.p10), fmt(h.p90), fmt(h.p99), "-", "-", "-"});
        }
      }
      comm.barrier();
      if (withRdma) {
        setenv("KVCOMM_FETCH_TRANSPORT", "rdma", 1);
        auto fr = kvcomm::Fetcher::create(buf, layout);
        unsetenv("KVCOMM_FETCH_TRANSPORT");
        comm.barrier();
        if (me == 0) {
          Stats x = rotatedStatsUs({[&] { measure(fr); }}, o.reps, 2)[0];
          rep.row({c.name, std::to_string(c.blockBytes), std::to_string(c.blocks * c.regions), std::to_string(bytes),
                   "kvcomm fetch over RDMA READ", std::to_string(x.reps), fmt(x.median), fmt(x.p10), fmt(x.p90),
                   fmt(x.p99), fmt(bytes / x.median / 1e3, 3), "-", "-"});
        }
        comm.barrier();
      } else if (me == 0) {
        rep.row({c.name, std::to_string(c.blockBytes), std::to_string(c.blocks * c.regions), std::to_string(bytes),
                 "kvcomm fetch over RDMA READ: not run (no RDMA device)", "-", "-", "-", "-", "-", "-", "-", "-"});
      }
    }
    if (me == 0) {
      uint64_t end = 0;
      sendBytes(rawFd, reinterpret_cast<const char*>(&end), sizeof(end));
      ::close(rawFd);
      rep.print(o.json);
    }
#ifdef KVCOMM_HAVE_CUDA
    if (cuda) {
      cudaFreeHost(stage);
      cudaFree(devStage);
      cudaStreamDestroy(stream);
    }
#endif
    (void)devStage;
    comm.barrier();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "perf_fetch (rank " << o.rank << "): " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace kvbench
