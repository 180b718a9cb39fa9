#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>

#include "comm/topology_build.hpp"
#include "common/check.hpp"
#include "platform/gpu_info.hpp"
#include "platform/ibverbs.hpp"

namespace kvcomm {

namespace {
void checkMember(const Topology& t, int r, const char* call) {
  KVCOMM_CHECK_ARG(r >= 0 && r < t.size(), call, "member ", r, " outside [0, ", t.size(), ")");
}
}  // namespace

bool Topology::sameHost(int a, int b) const {
  checkMember(*this, a, "Topology::sameHost");
  checkMember(*this, b, "Topology::sameHost");
  return members[static_cast<size_t>(a)].hostIndex == members[static_cast<size_t>(b)].hostIndex;
}

bool Topology::canAccessPeer(int a, int b) const {
  checkMember(*this, a, "Topology::canAccessPeer");
  checkMember(*this, b, "Topology::canAccessPeer");
  const size_t n = members.size();
  KVCOMM_CHECK_ARG(p2p.size() == n * n, "Topology::canAccessPeer", "p2p has ", p2p.size(), " entries for ", n,
                   " members (", n * n, " expected)");
  return p2p[static_cast<size_t>(a) * n + static_cast<size_t>(b)] != 0;
}

bool Topology::allPeerAccess() const {
  for (int a = 0; a < size(); ++a)
    for (int b = 0; b < size(); ++b)
      if (!canAccessPeer(a, b)) return false;
  return true;
}

std::pair<int, int> Topology::sharedGpu() const {
  for (int a = 0; a < size(); ++a)
    for (int b = a + 1; b < size(); ++b)
      if (sameHost(a, b) && !members[a].gpu.uuid.empty() && members[a].gpu.uuid == members[b].gpu.uuid) return {a, b};
  return {-1, -1};
}

std::vector<int> Topology::hostMembers(int hostIndex) const {
  std::vector<int> out;
  for (const auto& m : members)
    if (m.hostIndex == hostIndex) out.push_back(m.rank);
  return out;
}

std::string Topology::toString() const {
  std::ostringstream os;
  os << std::left << std::setw(6) << "rank" << std::setw(7) << "world" << std::setw(6) << "host" << std::setw(7)
     << "local" << std::setw(9) << "pid" << std::setw(18) << "hostname" << std::setw(12) << "netns" << std::setw(5)
     << "gpu" << std::setw(15) << "pci"
     << "rdma\n";
  bool anyGpu = false;
  for (const auto& m : members) {
    std::string rdma;
    for (const auto& r : m.rdmaDevices) rdma += (rdma.empty() ? "" : ",") + r;
    os << std::setw(6) << m.rank << std::setw(7) << m.worldRank << std::setw(6) << m.hostIndex << std::setw(7)
       << (std::to_string(m.localRank) + "/" + std::to_string(m.localSize)) << std::setw(9) << m.pid << std::setw(18)
       << m.hostname.substr(0, 17) << std::setw(12) << m.netns << std::setw(5)
       << (m.gpu.device >= 0 ? std::to_string(m.gpu.device) : "-") << std::setw(15)
       << (m.gpu.pciBusId.empty() ? "-" : m.gpu.pciBusId) << (rdma.empty() ? "-" : rdma) << "\n";
    anyGpu |= m.gpu.device >= 0;
  }
  if (anyGpu) {
    os << "P2P access (row can access column):\n      ";
    for (int b = 0; b < size(); ++b) os << std::setw(4) << b;
    os << "\n";
    for (int a = 0; a < size(); ++a) {
      os << std::setw(6) << a;
      for (int b = 0; b < size(); ++b) os << std::setw(4) << (canAccessPeer(a, b) ? "Y" : ".");
      os << "\n";
    }
  }
  return os.str();
}

namespace detail {

namespace {

struct MemberWire {
  int32_t worldRank;
  int32_t pid;
  uint32_t uid;
  int32_t gpuDevice;
  uint64_t netns;
  char hostname[64];
  char bootId[40];
  char uuid[48];
  char pci[24];
  int32_t numRdma;
  char rdma[8][24];
};

template <size_t N>
void put(char (&dst)[N], const std::string& s) {
  std::snprintf(dst, N, "%s", s.c_str());
}

std::string readFirstLine(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// Host index, local rank and local size from host identities, in rank order.
void finish(Topology& t) {
  std::map<std::string, int> hosts;
  std::map<int, int> seen;
  for (auto& m : t.members) {
    std::string key = cat(m.bootId, "/", m.netns, "/", m.hostname);
    auto it = hosts.find(key);
    if (it == hosts.end()) it = hosts.emplace(key, static_cast<int>(hosts.size())).first;
    m.hostIndex = it->second;
    m.localRank = seen[m.hostIndex]++;
  }
  for (auto& m : t.members) m.localSize = seen[m.hostIndex];
  t.numHosts = static_cast<int>(hosts.size());
}

}  // namespace

size_t memberWireBytes() {
  return sizeof(MemberWire);
}

std::vector<MemberInfo> decodeMembers(const void* bytes, size_t count) {
  // Text fields come from other processes: read at most their size, never up to a NUL that may be missing.
  auto text = [](const char* f, size_t n) { return std::string(f, strnlen(f, n)); };
  std::vector<MemberInfo> out;
  for (size_t r = 0; r < count; ++r) {
    MemberWire x;
    std::memcpy(&x, static_cast<const char*>(bytes) + r * sizeof(MemberWire), sizeof(x));
    MemberInfo m;
    m.rank = static_cast<int>(r);
    m.worldRank = x.worldRank;
    m.pid = x.pid;
    m.uid = x.uid;
    m.hostname = text(x.hostname, sizeof(x.hostname));
    m.bootId = text(x.bootId, sizeof(x.bootId));
    m.netns = x.netns;
    m.gpu.device = x.gpuDevice;
    m.gpu.uuid = text(x.uuid, sizeof(x.uuid));
    m.gpu.pciBusId = text(x.pci, sizeof(x.pci));
    for (int i = 0; i < x.numRdma && i < 8; ++i) m.rdmaDevices.push_back(text(x.rdma[i], sizeof(x.rdma[i])));
    out.push_back(std::move(m));
  }
  return out;
}

HostIdentity localHostIdentity() {
  HostIdentity h;
  h.bootId = readFirstLine("/proc/sys/kernel/random/boot_id");
  struct stat st {};
  if (stat("/proc/self/ns/net", &st) == 0) h.netns = static_cast<uint64_t>(st.st_ino);
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  h.hostname = name;
  return h;
}

Topology gatherTopology(int rank, size_t size, const std::function<void(void*, size_t)>& allgather) {
  std::vector<MemberWire> wires(size);
  MemberWire& w = wires[static_cast<size_t>(rank)];
  std::memset(&w, 0, sizeof(w));
  HostIdentity host = localHostIdentity();
  GpuInfo gpu = currentGpu();
  w.worldRank = rank;
  w.pid = static_cast<int32_t>(getpid());
  w.uid = getuid();
  w.gpuDevice = gpu.device;
  w.netns = host.netns;
  put(w.hostname, host.hostname);
  put(w.bootId, host.bootId);
  put(w.uuid, gpu.uuid);
  put(w.pci, gpu.pciBusId);
  auto rdma = listRdmaDevices(nullptr);
  for (const auto& d : rdma) {
    if (w.numRdma == 8) break;
    put(w.rdma[w.numRdma++], d.name);
  }
  allgather(wires.data(), sizeof(MemberWire));

  Topology t;
  t.members = decodeMembers(wires.data(), size);
  finish(t);

  // Each member computes its own row (only it can ask its driver), then the rows are allgathered.
  t.p2p.assign(size * size, 0);
  uint8_t* row = t.p2p.data() + static_cast<size_t>(rank) * size;
  for (size_t b = 0; b < size; ++b) {
    const MemberInfo& me = t.members[static_cast<size_t>(rank)];
    const MemberInfo& peer = t.members[b];
    row[b] = (me.hostIndex == peer.hostIndex && me.gpu.device >= 0 && peer.gpu.device >= 0 &&
              gpuPeerAccess(me.gpu, peer.gpu))
                 ? 1
                 : 0;
  }
  allgather(t.p2p.data(), size);
  return t;
}

Topology subTopology(const Topology& parent, const std::vector<int>& parentRanks) {
  Topology t;
  size_t n = parentRanks.size();
  for (size_t i = 0; i < n; ++i) {
    MemberInfo m = parent.members[static_cast<size_t>(parentRanks[i])];
    m.rank = static_cast<int>(i);
    t.members.push_back(std::move(m));
  }
  finish(t);
  t.p2p.assign(n * n, 0);
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b) t.p2p[a * n + b] = parent.canAccessPeer(parentRanks[a], parentRanks[b]) ? 1 : 0;
  return t;
}

}  // namespace detail
}  // namespace kvcomm
