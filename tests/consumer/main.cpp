// Links kvcomm::kvcomm from an installed package and builds a one-rank communicator.
#include <kvcomm/kvcomm.hpp>

#include <cstdio>
#include <memory>

int main() {
  auto id = kvcomm::TcpBootstrap::createUniqueId();
  auto comm = kvcomm::Communicator::create(std::make_shared<kvcomm::TcpBootstrap>(id, 0, 1));
  int v = 42;
  comm.allgather(&v, sizeof(v));
  std::printf("consumer: rank %d of %d, %d host(s), value %d\n", comm.rank(), comm.size(), comm.topology().numHosts, v);
  return (comm.size() == 1 && v == 42) ? 0 : 1;
}
