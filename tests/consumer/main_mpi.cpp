// Links kvcomm::mpi from an installed package (compile and link check).
#include <kvcomm/mpi_bootstrap.hpp>

int main() {
  return sizeof(kvcomm::MpiBootstrap) > 0 ? 0 : 1;
}
