// Communicator: phase 1, a TCP mesh over whatever bootstrap the engine gave (reused when it is a TcpBootstrap);
// phase 2, every member's identity (host, pid, GPU, RDMA devices) and its P2P row are allgathered into Topology.
// Splits compute membership locally from one allgather of (color, key) and talk over the same mesh.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

#include "comm/health.hpp"
#include "comm/tcp_mesh.hpp"
#include "comm/topology_build.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "kvcomm/comm.hpp"

namespace kvcomm {

using detail::cat;

struct Communicator::Impl {
  std::shared_ptr<Bootstrap> bootstrap;  // kept alive: an engine's callback may own the process group
  std::shared_ptr<detail::TcpMesh> mesh;
  std::shared_ptr<detail::GroupHealth> health;  // aborted, or a member died
  std::vector<int> members;                     // mesh rank of each member, in rank order
  int rank = 0;
  uint32_t group = 0;
  std::atomic<uint32_t> seq{0};
  uint32_t splits = 0;
  Topology topo;

  uint64_t nextTag() { return detail::makeTag(group, seq.fetch_add(1) & 0x7fffffffu); }
  void allgather(void* data, size_t bytes) { mesh->allgather(members, rank, data, bytes, nextTag(), health.get()); }
  void watch() {
    health = std::make_shared<detail::GroupHealth>(members);
    mesh->watchGroup(health);
  }
};

namespace {

uint32_t mix32(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x) | 0x80000000u;  // world groups use small ids; splits live above them
}

struct MeshEntry {
  std::array<uint8_t, 16> nonce;
  detail::SockAddr addr;
};

// Builds a mesh over a bootstrap that is not a TcpBootstrap: listen on the advertised interface only, allgather
// addresses through the bootstrap.
std::shared_ptr<detail::TcpMesh> meshOver(Bootstrap& b) {
  detail::SockAddr bound;
  detail::Fd listener = detail::listenTcp(detail::pickLocalAddress(), &bound);
  std::vector<MeshEntry> all(static_cast<size_t>(b.size()));
  MeshEntry& mine = all[static_cast<size_t>(b.rank())];
  detail::randomBytes(mine.nonce.data(), mine.nonce.size());
  mine.addr = bound;
  b.allgather(all.data(), sizeof(MeshEntry));
  std::vector<detail::SockAddr> addrs;
  for (auto& e : all) addrs.push_back(e.addr);
  auto mesh = std::make_shared<detail::TcpMesh>(b.rank(), b.size(), all[0].nonce, std::move(listener),
                                                env::bootstrapTimeoutMs());
  mesh->start(std::move(addrs));
  return mesh;
}

}  // namespace

Communicator Communicator::create(std::shared_ptr<Bootstrap> bootstrap) {
  KVCOMM_CHECK_ARG(bootstrap != nullptr, "Communicator::create", "bootstrap is null");
  detail::RankScope scope(bootstrap->rank());
  env::validate();  // a bad knob is an error here, on every rank that has it, before anyone waits on a collective
  auto impl = std::make_shared<Impl>();
  impl->bootstrap = bootstrap;
  if (auto* tcp = dynamic_cast<TcpBootstrap*>(bootstrap.get()))
    impl->mesh = tcp->mesh();
  else
    impl->mesh = meshOver(*bootstrap);
  impl->rank = bootstrap->rank();
  for (int r = 0; r < bootstrap->size(); ++r) impl->members.push_back(r);
  impl->group = impl->mesh->nextWorldGroupId();
  impl->watch();
  impl->topo =
      detail::gatherTopology(impl->rank, impl->members.size(), [&](void* d, size_t n) { impl->allgather(d, n); });
  return Communicator(std::move(impl));
}

namespace {
void requireImpl(const void* impl, const char* call) {
  KVCOMM_CHECK_ARG(impl != nullptr, call, "the communicator is empty (default-constructed)");
}
}  // namespace

namespace detail {
GroupHealth& healthOf(const Communicator& comm) {
  requireImpl(comm.impl_.get(), "healthOf");
  return *comm.impl_->health;
}
void checkHealthy(const Communicator& comm, const char* call) {
  healthOf(comm).check(call);
}
void explainPeerFailed(const Communicator& comm, int peer, const char* call) {
  healthOf(comm).check(call);
  healthOf(comm).checkPresent(call, peer);
}
}  // namespace detail

void Communicator::abort() {
  requireImpl(impl_.get(), "Communicator::abort");
  impl_->health->abort("Communicator::abort() was called");
  impl_->mesh->wakeAll();
}

bool Communicator::healthy() const {
  requireImpl(impl_.get(), "Communicator::healthy");
  return impl_->health->healthy();
}

int Communicator::failedRank() const {
  requireImpl(impl_.get(), "Communicator::failedRank");
  return impl_->health->deadRank();
}

int Communicator::rank() const {
  requireImpl(impl_.get(), "Communicator::rank");
  return impl_->rank;
}
int Communicator::size() const {
  requireImpl(impl_.get(), "Communicator::size");
  return static_cast<int>(impl_->members.size());
}
int Communicator::worldRank(int r) const {
  requireImpl(impl_.get(), "Communicator::worldRank");
  KVCOMM_CHECK_ARG(r >= 0 && r < size(), "Communicator::worldRank", "rank ", r, " out of range [0, ", size(), ")");
  return impl_->topo.members[static_cast<size_t>(r)].worldRank;
}
const Topology& Communicator::topology() const {
  requireImpl(impl_.get(), "Communicator::topology");
  return impl_->topo;
}
uint64_t Communicator::id() const {
  requireImpl(impl_.get(), "Communicator::id");
  return impl_->group;
}

std::optional<Communicator> Communicator::split(int color, int key) {
  requireImpl(impl_.get(), "Communicator::split");
  detail::RankScope scope(impl_->rank);
  impl_->health->check("Communicator::split");
  struct Entry {
    int32_t color, key;
  };
  std::vector<Entry> all(static_cast<size_t>(size()));
  all[static_cast<size_t>(impl_->rank)] = {color, key};
  impl_->allgather(all.data(), sizeof(Entry));
  uint32_t splitSeq = impl_->splits++;
  if (color < 0) return std::nullopt;
  std::vector<int> chosen;  // parent ranks
  for (int r = 0; r < size(); ++r)
    if (all[static_cast<size_t>(r)].color == color) chosen.push_back(r);
  std::stable_sort(chosen.begin(), chosen.end(), [&](int a, int b) {
    return all[static_cast<size_t>(a)].key != all[static_cast<size_t>(b)].key
               ? all[static_cast<size_t>(a)].key < all[static_cast<size_t>(b)].key
               : a < b;
  });
  auto child = std::make_shared<Impl>();
  child->bootstrap = impl_->bootstrap;
  child->mesh = impl_->mesh;
  child->group = mix32(impl_->group, splitSeq, static_cast<uint32_t>(color));
  for (size_t i = 0; i < chosen.size(); ++i) {
    child->members.push_back(impl_->members[static_cast<size_t>(chosen[i])]);
    if (chosen[i] == impl_->rank) child->rank = static_cast<int>(i);
  }
  child->topo = detail::subTopology(impl_->topo, chosen);
  child->watch();
  impl_->health->addChild(child->health);
  if (impl_->health->state() == detail::kAborted) child->health->abort("the parent communicator was aborted");
  return Communicator(std::move(child));
}

void Communicator::allgather(void* data, size_t bytesPerRank) {
  requireImpl(impl_.get(), "Communicator::allgather");
  detail::RankScope scope(impl_->rank);
  KVCOMM_CHECK_ARG(data != nullptr || bytesPerRank == 0, "Communicator::allgather", "data is null but bytesPerRank is ",
                   bytesPerRank);
  impl_->health->check("Communicator::allgather");
  impl_->allgather(data, bytesPerRank);
}

void Communicator::barrier() {
  requireImpl(impl_.get(), "Communicator::barrier");
  detail::RankScope scope(impl_->rank);
  impl_->health->check("Communicator::barrier");
  std::vector<char> bytes(static_cast<size_t>(size()));
  impl_->allgather(bytes.data(), 1);
}

void Communicator::send(const void* data, size_t bytes, int peer, uint32_t tag) {
  requireImpl(impl_.get(), "Communicator::send");
  detail::RankScope scope(impl_->rank);
  KVCOMM_CHECK_ARG(peer >= 0 && peer < size(), "Communicator::send", "peer ", peer, " out of range");
  KVCOMM_CHECK_ARG(tag < 0x80000000u, "Communicator::send", "tag must be below 2^31");
  KVCOMM_CHECK_ARG(data != nullptr || bytes == 0, "Communicator::send", "data is null but bytes is ", bytes);
  impl_->health->check("Communicator::send");
  impl_->mesh->send(impl_->members[static_cast<size_t>(peer)], detail::makeTag(impl_->group, 0x80000000u | tag), data,
                    bytes, impl_->health.get());
}

void Communicator::recv(void* data, size_t bytes, int peer, uint32_t tag) {
  requireImpl(impl_.get(), "Communicator::recv");
  detail::RankScope scope(impl_->rank);
  KVCOMM_CHECK_ARG(peer >= 0 && peer < size(), "Communicator::recv", "peer ", peer, " out of range");
  KVCOMM_CHECK_ARG(tag < 0x80000000u, "Communicator::recv", "tag must be below 2^31");
  KVCOMM_CHECK_ARG(data != nullptr || bytes == 0, "Communicator::recv", "data is null but bytes is ", bytes);
  impl_->health->check("Communicator::recv");
  impl_->mesh->recv(impl_->members[static_cast<size_t>(peer)], detail::makeTag(impl_->group, 0x80000000u | tag), data,
                    bytes, impl_->health.get());
}

}  // namespace kvcomm
