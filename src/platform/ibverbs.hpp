// libibverbs, loaded at run time, so that libkvcomm loads on machines without rdma-core or an RDMA device.
#pragma once

#include <string>
#include <vector>

namespace kvcomm::detail {

/// One RDMA device as sysfs and libibverbs describe it.
struct RdmaDeviceDesc {
  std::string name;       // e.g. mlx5_0
  std::string linkLayer;  // InfiniBand / Ethernet (port 1)
  std::string state;      // e.g. "4: ACTIVE" (port 1)
  std::string pciBusId;   // from sysfs, "" if unknown
  int numaNode = -1;
};

/// RDMA devices present; `reason` says why the list is empty ("" when devices were found).
std::vector<RdmaDeviceDesc> listRdmaDevices(std::string* reason);

}  // namespace kvcomm::detail
