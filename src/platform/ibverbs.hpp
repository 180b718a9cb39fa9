// libibverbs, loaded at run time, so that libkvcomm loads on machines without rdma-core or an RDMA device: the device
// list (capabilities, topology) and, where the build found rdma-core's headers (KVCOMM_HAVE_VERBS), the table of
// entry points the fetch layer's verbs transport calls.
#pragma once

#include <string>
#include <vector>

#if KVCOMM_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

namespace kvcomm::detail {

/// One RDMA device as sysfs and libibverbs describe it.
struct RdmaDeviceDesc {
  std::string name;       // e.g. mlx5_0
  std::string linkLayer;  // InfiniBand / Ethernet (port 1)
  std::string state;      // e.g. "4: ACTIVE" (port 1)
  std::string pciBusId;   // from sysfs, "" if unknown
  std::string sysfsPath;  // resolved /sys/class/infiniband/<name>/device ("" if unknown): PCIe placement
  int numaNode = -1;
};

/// RDMA devices present; `reason` says why the list is empty ("" when devices were found).
std::vector<RdmaDeviceDesc> listRdmaDevices(std::string* reason);

/// The RDMA device closest to a PCI device (a GPU): the one whose sysfs path shares the longest prefix with
/// `pciPath` (the PCIe switch they share), among `candidates` (sysfs device paths, "" when unknown); ties and an
/// empty `pciPath` go to the first candidate. Returns the index, or -1 when there are none.
int closestByPciPath(const std::string& pciPath, const std::vector<std::string>& candidates);
/// The resolved sysfs path of PCI device `busId` ("0000:18:00.0"), or "" when unknown.
std::string pciSysfsPath(const std::string& busId);

#if KVCOMM_HAVE_VERBS
/// The libibverbs entry points the verbs transport calls, as a table: the real library (loaded at run time) or a
/// stand-in (the unit tests' fake provider). ibv_post_send and ibv_poll_cq are inline in verbs.h (calls through the
/// context's ops): the real table wraps them. regDmabufMr is null where rdma-core predates dma-buf registration.
struct VerbsApi {
  ibv_device** (*getDeviceList)(int* num);
  void (*freeDeviceList)(ibv_device** list);
  const char* (*getDeviceName)(ibv_device* device);
  ibv_context* (*openDevice)(ibv_device* device);
  int (*closeDevice)(ibv_context* context);
  int (*queryDevice)(ibv_context* context, ibv_device_attr* attr);
  int (*queryPort)(ibv_context* context, uint8_t port, ibv_port_attr* attr);
  int (*queryGid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid);
  ibv_pd* (*allocPd)(ibv_context* context);
  int (*deallocPd)(ibv_pd* pd);
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, size_t length, int access);
  ibv_mr* (*regDmabufMr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access);
  int (*deregMr)(ibv_mr* mr);
  ibv_cq* (*createCq)(ibv_context* context, int cqe, void* cqContext, ibv_comp_channel* channel, int vector);
  int (*destroyCq)(ibv_cq* cq);
  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  int (*destroyQp)(ibv_qp* qp);
  int (*postSend)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
  int (*pollCq)(ibv_cq* cq, int num, ibv_wc* wc);
  const char* (*wcStatusStr)(ibv_wc_status status);
};

/// The real libibverbs, or nullptr with *why when it cannot be loaded (or lacks an entry point).
const VerbsApi* realVerbs(std::string* why);
#endif

}  // namespace kvcomm::detail
