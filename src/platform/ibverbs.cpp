#include "platform/ibverbs.hpp"

#include <dlfcn.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <vector>

#include "common/check.hpp"

namespace kvcomm::detail {

namespace {

// Minimal opaque view: only the entry points needed to enumerate devices.
struct IbvDevice;
using GetDeviceList = IbvDevice** (*)(int*);
using FreeDeviceList = void (*)(IbvDevice**);
using GetDeviceName = const char* (*)(IbvDevice*);

std::string readLine(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

struct Verbs {
  void* lib = nullptr;
  GetDeviceList getList = nullptr;
  FreeDeviceList freeList = nullptr;
  GetDeviceName getName = nullptr;
  std::string reason;
};

const Verbs& verbs() {
  static const Verbs v = [] {
    Verbs out;
    out.lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!out.lib) {
      const char* e = dlerror();
      out.reason = cat("rdma-core not installed: dlopen(libibverbs.so.1) failed: ", e ? e : "unknown");
      return out;
    }
    out.getList = reinterpret_cast<GetDeviceList>(dlsym(out.lib, "ibv_get_device_list"));
    out.freeList = reinterpret_cast<FreeDeviceList>(dlsym(out.lib, "ibv_free_device_list"));
    out.getName = reinterpret_cast<GetDeviceName>(dlsym(out.lib, "ibv_get_device_name"));
    if (!out.getList || !out.freeList || !out.getName) out.reason = "libibverbs.so.1 lacks device-list entry points";
    return out;
  }();
  return v;
}

}  // namespace

std::vector<RdmaDeviceDesc> listRdmaDevices(std::string* reason) {
  std::vector<RdmaDeviceDesc> out;
  const Verbs& v = verbs();
  if (!v.reason.empty()) {
    if (reason) *reason = v.reason;
    return out;
  }
  int n = 0;
  IbvDevice** list = v.getList(&n);
  if (!list) {
    if (reason) *reason = cat("no RDMA device: ibv_get_device_list failed: ", std::strerror(errno));
    return out;
  }
  for (int i = 0; i < n; ++i) {
    RdmaDeviceDesc d;
    d.name = v.getName(list[i]);
    std::string sys = "/sys/class/infiniband/" + d.name;
    d.linkLayer = readLine(sys + "/ports/1/link_layer");
    d.state = readLine(sys + "/ports/1/state");
    std::string numa = readLine(sys + "/device/numa_node");
    d.numaNode = numa.empty() ? -1 : std::atoi(numa.c_str());
    std::string uevent;
    std::ifstream f(sys + "/device/uevent");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("PCI_SLOT_NAME=", 0) == 0) d.pciBusId = line.substr(14);
    out.push_back(d);
  }
  v.freeList(list);
  if (out.empty() && reason) *reason = "libibverbs found no RDMA device (/sys/class/infiniband is empty)";
  return out;
}

}  // namespace kvcomm::detail
