// fetch_probe: one rank of a TcpBootstrap group whose members live in network namespaces that stand for hosts
// (tests/scripts/netns_fetch.sh sets them up). Rank 0 writes the unique id to --id-file; the others read it.
//   fetch_probe --rank R --size N --id-file PATH --dir DIR --mode MODE [--ifname IF] [--kind host|cuda]
// Modes:
//   suite      every fetch form (fetch, plan + submit, polled start) between every member, against the per-block
//              oracle over each rank's whole buffer (guard bytes included), several layouts; members on other hosts
//              are reached over TCP, members on the same host over the peer mappings; the collective form is refused
//              across hosts
//   kill       rank 1 serves and is killed (kill -9, by the script) in the middle of rank 0's paced polled fetch
//   linkdown   as kill, but the script takes rank 1's link down instead
//              (both: rank 0 must see the failure within 5 s, naming source and failed blocks, every other block exact)
//   malformed  rank 2 sends 1,000 malformed requests to rank 0's server while rank 1 keeps fetching and checking;
//              rank 0's descriptor count and resident memory must stay flat
// Files in DIR: source.pid (rank 1, kill/linkdown), started (rank 0 began the fetch), done (rank 0 finished).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fetch/fetcher_internals.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "support/fetch_hostile.hpp"
#include "verify/fetch_oracle.hpp"
#include "verify/memory.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using kvcomm::FetchTransportKind;

struct Args {
  int rank = -1, size = 0;
  std::string idFile, dir, mode, ifname, kind = "host";
};

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void touch(const std::string& path, const std::string& text = "") {
  std::ofstream(path + ".tmp") << text;
  std::rename((path + ".tmp").c_str(), path.c_str());
}

bool exists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

size_t rssBytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

#define PROBE_CHECK(cond, ...)                                          \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::fprintf(stderr, "rank %d: check failed: %s: ", rank, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                \
      std::fprintf(stderr, "\n");                                       \
      return false;                                                     \
    }                                                                   \
  } while (0)

uint64_t sharedSeed(kvcomm::Communicator& comm) {
  std::vector<uint64_t> s(static_cast<size_t>(comm.size()));
  s[static_cast<size_t>(comm.rank())] = std::random_device{}() ^ static_cast<uint64_t>(time(nullptr));
  comm.allgather(s.data(), sizeof(uint64_t));
  return s[0];
}

// Every fetch form between every member, against the oracle over the whole buffer.
bool suite(kvcomm::Communicator& comm, kvcomm::MemoryKind kind) {
  const int rank = comm.rank(), n = comm.size();
  const kvcomm::Topology& topo = comm.topology();
  const uint64_t seed = sharedSeed(comm);
  std::vector<kvtest::FetchCase> cases = {
      {4096, 4, true, 64}, {656 * 16, 3, false, 48}, {1 << 20, 1, false, 10}, {48, 32, true, 120}};
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 2; ++i)
    cases.push_back({16 * (1 + rng() % 512), 1 + static_cast<int>(rng() % 24), rng() % 2 == 0, 8 + rng() % 40});
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const kvtest::FetchCase& c = cases[ci];
    std::vector<kvcomm::KvLayout> layouts;
    size_t most = 0, extent = 0;
    for (int r = 0; r < n; ++r) {
      size_t e = 0;
      layouts.push_back(kvtest::makeFetchLayout(c, seed, r, &e));
      most = std::max(most, e);
      if (r == rank) extent = e;
    }
    const kvcomm::KvLayout& mine = layouts[static_cast<size_t>(rank)];
    auto buf = kvcomm::SymmetricBuffer::create(comm, most, most, kind);
    const std::vector<uint8_t> image = kvtest::initialImage(mine, seed, rank, extent);
    auto f = kvcomm::Fetcher::create(buf, mine);
    for (int r = 0; r < n; ++r) {
      FetchTransportKind want = r == rank                                   ? FetchTransportKind::Peer
                                : topo.sameHost(rank, r) && buf.isMapped(r) ? FetchTransportKind::Peer
                                                                            : FetchTransportKind::Tcp;
      PROBE_CHECK(f.transport(r) == want, "transport to rank %d is %s, not %s", r,
                  kvcomm::fetchTransportName(f.transport(r)), kvcomm::fetchTransportName(want));
    }
    kvtest::FetchBatch batch = kvtest::makeFetchBatch(seed + ci, rank, n, c.numBlocks, 400, n);
    std::vector<uint8_t> want = image;
    kvtest::applyFetchOracle(want, layouts, rank, seed, batch);
    size_t remote = 0;
    for (size_t k = 0; k < batch.ranks.size(); ++k)
      if (!topo.sameHost(rank, batch.ranks[k]))
        for (size_t i = 0; i < batch.src[k].size(); ++i) remote += batch.src[k][i] != -1 && batch.dst[k][i] != -1;
    const char* forms[] = {"fetch", "plan+submit", "start"};
    for (int form = 0; form < 3; ++form) {
      kvtest::toMemory(kind, buf.local(), image.data(), extent);  // poisoned destinations, fresh sources
      kvtest::synchronize(kind);
      comm.barrier();  // every source is in place before anyone reads it
      auto t0 = Clock::now();
      if (form == 0) {
        kvcomm::FetchPlanInfo info = f.fetch(batch.requests());
        PROBE_CHECK((info.tcpRuns > 0) == (remote > 0), "case %zu: %s", ci, info.toString().c_str());
      } else if (form == 1) {
        kvcomm::FetchPlan plan = f.plan(batch.requests());
        f.submit(plan);
      } else {
        kvcomm::FetchStatus s = f.start(batch.requests()).wait(30000);
        PROBE_CHECK(s.state == kvcomm::FetchState::Done && s.bytesDone == s.bytesTotal, "case %zu: %s", ci,
                    s.error.c_str());
      }
      kvtest::synchronize(kind);
      double ms = since(t0) * 1000;
      std::vector<uint8_t> got(extent);
      kvtest::fromMemory(kind, got.data(), buf.local(), extent);
      std::string diff = kvtest::describeMismatch(got, want, mine);
      PROBE_CHECK(diff.empty(), "case %zu (block %zu B x %d layers%s), %s: %s", ci, c.blockBytes, c.layers,
                  c.split ? " split" : "", forms[form], diff.c_str());
      comm.barrier();  // nobody refills a buffer a peer still reads
      if (rank == 0)
        std::printf("PASS case %zu (block %zu B, %d layers%s, %zu pairs, %zu from other hosts) %s in %.1f ms\n", ci,
                    c.blockBytes, c.layers, c.split ? ", split K/V" : "", batch.pairs(), remote, forms[form], ms);
    }
    if (topo.numHosts > 1) {
      try {
        f.fetchAll(batch.requests());
        PROBE_CHECK(false, "the collective form ran across hosts");
      } catch (const kvcomm::Error& e) {
        PROBE_CHECK(e.code() == kvcomm::ErrorCode::Unsupported, "%s", e.what());
      }
    }
    comm.barrier();
  }
  return true;
}

// Rank 1 is killed or cut off by the script while rank 0 pulls from it.
bool fault(kvcomm::Communicator& comm, const Args& a) {
  const int rank = comm.rank();
  constexpr size_t kBlock = 1 << 20, kBlocks = 64;
  const uint64_t seed = sharedSeed(comm);
  auto buf = kvcomm::SymmetricBuffer::create(comm, kBlock * kBlocks, kBlock * kBlocks, kvcomm::MemoryKind::Host);
  kvcomm::KvLayout layout = kvtest::fillOneRegion(buf, seed, rank, kBlock, kBlocks);
  auto f = kvcomm::Fetcher::create(buf, layout);
  PROBE_CHECK(f.transport(1 - rank) == FetchTransportKind::Tcp, "not over TCP");
  comm.barrier();
  if (rank == 1) {
    touch(a.dir + "/source.pid", std::to_string(getpid()));
    // Killed (kill mode), or left alone behind a link that is down (linkdown mode) until rank 0 is done.
    for (auto t0 = Clock::now(); since(t0) < 60 && !exists(a.dir + "/done");)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return a.mode == "linkdown";
  }
  std::vector<int64_t> src, dst;
  for (int64_t b = 0; b < 32; ++b) src.push_back(b), dst.push_back(32 + b);
  kvcomm::FetchOptions o;
  o.maxBytesPerSecond = 12u << 20;  // about 2.7 s if the source stayed
  auto t0 = Clock::now();
  kvcomm::FetchOperation op = f.start({{1, src.data(), dst.data(), src.size(), 0}}, o);
  touch(a.dir + "/started");
  kvcomm::FetchStatus s = op.wait(15000);
  double sec = since(t0);
  std::printf(
      "%s: the requester saw state %d after %.3f s (the fault came about 0.4 s in): %s; %zu of %zu bytes, "
      "%zu failed blocks\n",
      a.mode.c_str(), static_cast<int>(s.state), sec, s.error.c_str(), s.bytesDone, s.bytesTotal,
      s.failedBlocks.size());
  touch(a.dir + "/done");
  PROBE_CHECK(s.state == kvcomm::FetchState::Failed, "state %d", static_cast<int>(s.state));
  PROBE_CHECK(sec < 5.4, "reported after %.3f s", sec);
  PROBE_CHECK(s.error.find("source rank 1") != std::string::npos, "%s", s.error.c_str());
  PROBE_CHECK(!s.failedBlocks.empty() && s.bytesDone < s.bytesTotal, "no failed block named");
  std::set<int64_t> failed(s.failedBlocks.begin(), s.failedBlocks.end());
  size_t verified = 0;
  for (size_t i = 0; i < dst.size(); ++i) {
    if (failed.count(dst[i])) continue;
    auto want = kvtest::blockContent(seed, 1, 0, src[i], kBlock);
    PROBE_CHECK(std::memcmp(static_cast<char*>(buf.local()) + dst[i] * kBlock, want.data(), kBlock) == 0,
                "block %lld reported landed but differs", static_cast<long long>(dst[i]));
    ++verified;
  }
  PROBE_CHECK(verified * kBlock == s.bytesDone && verified + failed.size() == dst.size(), "accounting");
  return true;
}

// Rank 2 attacks rank 0's server while rank 1 keeps fetching from it.
bool malformed(kvcomm::Communicator& comm) {
  const int rank = comm.rank();
  constexpr size_t kBlock = 64 << 10, kBlocks = 64;
  const uint64_t seed = sharedSeed(comm);
  auto buf = kvcomm::SymmetricBuffer::create(comm, kBlock * kBlocks, kBlock * kBlocks, kvcomm::MemoryKind::Host);
  kvcomm::KvLayout layout = kvtest::fillOneRegion(buf, seed, rank, kBlock, kBlocks);
  auto f = kvcomm::Fetcher::create(buf, layout);
  kvtest::FetchTarget t;
  const kvcomm::detail::RemoteDescriptor d = kvcomm::detail::FetcherInternals::descriptor(f, 0);
  t.addr = d.tcp;
  t.regionId = d.regionId;
  t.groupId = comm.id();
  t.generation = f.generation();
  t.layoutHash = f.layoutHash(0);
  t.minBlocks = kBlocks;
  t.blockBytesSum = kBlock;
  std::vector<int64_t> src, dst;
  for (int64_t b = 0; b < 16; ++b) src.push_back(3 * b % 32), dst.push_back(32 + b);
  auto validFetch = [&] {  // rank 1: one fetch from rank 0, checked
    std::memset(static_cast<char*>(buf.local()) + 32 * kBlock, 0, 32 * kBlock);
    f.fetch({{0, src.data(), dst.data(), src.size(), 0}});
    for (size_t i = 0; i < src.size(); ++i) {
      auto want = kvtest::blockContent(seed, 0, 0, src[i], kBlock);
      if (std::memcmp(static_cast<char*>(buf.local()) + dst[i] * kBlock, want.data(), kBlock) != 0) return false;
    }
    return true;
  };
  auto attack = [&](int count, int offset) {  // rank 2
    int bad = 0;
    for (int i = 0; i < count; ++i) {
      int k = (i + offset) % 100 == 99 ? 14 : (i + offset) % 14;
      std::string why = kvtest::sendMalformed(t, k, 5000);
      if (!why.empty() && bad++ < 5) std::fprintf(stderr, "rank 2: %s\n", why.c_str());
    }
    return bad;
  };
  auto openConnections = [&](int keep) {  // rank 0: wait until the server's handlers for closed connections exit
    for (int i = 0; i < 500 && kvcomm::detail::FetcherInternals::serverStats(f).open > keep; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  bool ok = true;
  // Warm-up: rank 1's connection and thread stacks, rank 2's first attacks.
  if (rank == 1) ok = validFetch();
  if (rank == 2) ok = attack(100, 0) == 0;
  comm.barrier();
  int fds0 = 0;
  size_t rss0 = 0;
  if (rank == 0) {
    openConnections(1);
    fds0 = kvtest::countFds();
    rss0 = rssBytes();
  }
  comm.barrier();
  std::atomic<bool> stop{false};
  std::atomic<int> valid{0}, invalid{0};
  std::thread fetcher;
  if (rank == 1)
    fetcher = std::thread([&] {
      while (!stop) (validFetch() ? valid : invalid)++;
    });
  int bad = 0;
  auto t0 = Clock::now();
  try {
    if (rank == 2) bad = attack(1000, 100);
    comm.barrier();  // rank 2 is done
  } catch (...) {
    stop = true;
    if (fetcher.joinable()) fetcher.join();
    throw;
  }
  stop = true;
  if (fetcher.joinable()) fetcher.join();
  if (rank == 0) {
    openConnections(1);
    const int fds1 = kvtest::countFds();
    const size_t rss1 = rssBytes();
    auto s = kvcomm::detail::FetcherInternals::serverStats(f);
    std::printf(
        "malformed: server fds %d -> %d, RSS %.1f -> %.1f MiB after 1,000 malformed requests; %llu rejected, "
        "%llu served\n",
        fds0, fds1, rss0 / 1048576.0, rss1 / 1048576.0, static_cast<unsigned long long>(s.rejected),
        static_cast<unsigned long long>(s.served));
    ok = fds1 == fds0 && rss1 < rss0 + (2u << 20) && s.rejected >= 1000 * 11 / 14;
  }
  if (rank == 1) {
    std::printf("malformed: rank 1 fetched and checked %d times meanwhile, %d wrong\n", valid.load(), invalid.load());
    ok = ok && valid > 0 && invalid == 0;
  }
  if (rank == 2) {
    std::printf("malformed: 1,000 malformed requests answered as they must in %.1f s (%d not)\n", since(t0), bad);
    ok = ok && bad == 0;
  }
  comm.barrier();
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank") a.rank = std::atoi(v.c_str());
    if (k == "--size") a.size = std::atoi(v.c_str());
    if (k == "--id-file") a.idFile = v;
    if (k == "--dir") a.dir = v;
    if (k == "--mode") a.mode = v;
    if (k == "--ifname") a.ifname = v;
    if (k == "--kind") a.kind = v;
  }
  const int rank = a.rank;
  try {
    if (a.kind == "cuda" && kvcomm::useLocalDevice(a.rank) < 0) {
      std::fprintf(stderr, "fetch_probe rank %d: --kind cuda but no usable GPU\n", rank);
      return 2;
    }
    kvcomm::UniqueId id;
    if (rank == 0) {
      id = kvcomm::TcpBootstrap::createUniqueId(a.ifname);
      touch(a.idFile, id.toString());
    } else {
      std::string text;
      for (int i = 0; i < 3000 && text.empty(); ++i) {
        std::ifstream f(a.idFile);
        std::getline(f, text);
        if (text.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      id = kvcomm::UniqueId::fromString(text);
    }
    auto comm = kvcomm::Communicator::create(std::make_shared<kvcomm::TcpBootstrap>(id, rank, a.size, 120000));
    if (rank == 0) std::printf("%s", comm.topology().toString().c_str());
    bool ok = false;
    if (a.mode == "suite")
      ok = suite(comm, a.kind == "cuda" ? kvcomm::MemoryKind::Cuda : kvcomm::MemoryKind::Host);
    else if (a.mode == "kill" || a.mode == "linkdown")
      ok = fault(comm, a);
    else if (a.mode == "malformed")
      ok = malformed(comm);
    else
      std::fprintf(stderr, "fetch_probe: unknown --mode '%s'\n", a.mode.c_str());
    std::fflush(stdout);
    return ok ? 0 : 1;
  } catch (const kvcomm::Error& e) {
    std::fprintf(stderr, "fetch_probe rank %d: %s\n", rank, e.what());
    return 2;
  }
}
