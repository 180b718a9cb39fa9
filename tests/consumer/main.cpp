// Uses kvcomm::kvcomm from an installed package, from outside the library, the way an engine does: a one-rank
// communicator, a layout, host symmetric memory with a publish and a barrier, capabilities, the version, and an
// exception thrown inside libkvcomm caught by its base class here (its type information must cross the boundary).
#include <kvcomm/kvcomm.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

int main() {
  auto id = kvcomm::TcpBootstrap::createUniqueId();
  auto comm = kvcomm::Communicator::create(std::make_shared<kvcomm::TcpBootstrap>(id, 0, 1));
  int v = 42;
  comm.allgather(&v, sizeof(v));
  std::printf("consumer: rank %d of %d, %d host(s), value %d\n", comm.rank(), comm.size(), comm.topology().numHosts, v);
  bool ok = comm.size() == 1 && v == 42;

  auto layout = kvcomm::ParallelGroups::create(comm, {1, 1, 1, 1});
  ok = ok && layout.tp.size() == 1 && kvcomm::ParallelGroups::rankOf(layout.spec, layout.coord) == 0;

  auto buf = kvcomm::SymmetricBuffer::create(comm, 1 << 20, 1 << 20, kvcomm::MemoryKind::Host);
  auto pub = kvcomm::Publisher::create(buf);
  std::vector<char> row(64, 'k');
  int64_t slot = 3;
  kvcomm::CacheTensor t;
  t.src = row.data();
  t.rowBytes = row.size();
  pub.publish({t}, {&slot, kvcomm::SlotType::Int64, 1}, 1);
  pub.barrier().sync();
  pub.checkErrors();
  ok = ok && std::memcmp(static_cast<char*>(buf.local()) + 3 * 64, row.data(), row.size()) == 0;

  try {
    kvcomm::UniqueId::fromString("not an id");
    ok = false;
  } catch (const kvcomm::Error& e) {
    ok = ok && e.code() == kvcomm::ErrorCode::InvalidArgument;
  }
  ok = ok && kvcomm::version() == kvcomm::kVersion && kvcomm::capabilities().hostBackend;
  std::printf("consumer: layout, publish, error across the library boundary, version %d: %s\n", kvcomm::version(),
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
