#include "platform/ibverbs.hpp"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <mutex>
#include <type_traits>
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
    char resolved[PATH_MAX];
    if (realpath((sys + "/device").c_str(), resolved)) d.sysfsPath = resolved;
    std::ifstream f(sys + "/device/uevent");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("PCI_SLOT_NAME=", 0) == 0) d.pciBusId = line.substr(14);
    out.push_back(d);
  }
  v.freeList(list);
  if (out.empty() && reason) *reason = "libibverbs found no RDMA device (/sys/class/infiniband is empty)";
  return out;
}

std::string pciSysfsPath(const std::string& busId) {
  if (busId.empty()) return "";
  char buf[PATH_MAX];
  std::string lower = busId;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!realpath(("/sys/bus/pci/devices/" + lower).c_str(), buf)) return "";
  return buf;
}

int closestByPciPath(const std::string& pciPath, const std::vector<std::string>& candidates) {
  int best = -1;
  size_t bestDepth = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    // Shared path components ("/sys/devices/pci0000:17/0000:17:00.0/..."): devices under one switch share more.
    const std::string& c = candidates[i];
    size_t depth = 0, k = 0;
    while (k < c.size() && k < pciPath.size() && c[k] == pciPath[k]) {
      if (c[k] == '/') ++depth;
      ++k;
    }
    if ((k == c.size() || c[k] == '/') && (k == pciPath.size() || pciPath[k] == '/')) ++depth;
    if (best < 0 || depth > bestDepth) {
      best = static_cast<int>(i);
      bestDepth = depth;
    }
  }
  return best;
}

#if KVCOMM_HAVE_VERBS
namespace {

// ibv_post_send and ibv_poll_cq are inline in verbs.h: the provider's ops, reached through the context.
int postSendInline(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return ibv_post_send(qp, wr, bad);
}
int pollCqInline(ibv_cq* cq, int num, ibv_wc* wc) {
  return ibv_poll_cq(cq, num, wc);
}

}  // namespace

const VerbsApi* realVerbs(std::string* why) {
  static const std::pair<VerbsApi, std::string> table = []() -> std::pair<VerbsApi, std::string> {
    VerbsApi api{};
    const Verbs& v = verbs();
    if (!v.reason.empty()) return {api, v.reason};
    std::string missing;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(v.lib, name));
      if (!fn) missing += cat(missing.empty() ? "" : ", ", name);
    };
    get(api.getDeviceList, "ibv_get_device_list");
    get(api.freeDeviceList, "ibv_free_device_list");
    get(api.getDeviceName, "ibv_get_device_name");
    get(api.openDevice, "ibv_open_device");
    get(api.closeDevice, "ibv_close_device");
    get(api.queryDevice, "ibv_query_device");
    get(api.queryPort, "ibv_query_port");
    get(api.queryGid, "ibv_query_gid");
    get(api.allocPd, "ibv_alloc_pd");
    get(api.deallocPd, "ibv_dealloc_pd");
    get(api.regMr, "ibv_reg_mr");
    get(api.deregMr, "ibv_dereg_mr");
    get(api.createCq, "ibv_create_cq");
    get(api.destroyCq, "ibv_destroy_cq");
    get(api.createQp, "ibv_create_qp");
    get(api.modifyQp, "ibv_modify_qp");
    get(api.destroyQp, "ibv_destroy_qp");
    get(api.wcStatusStr, "ibv_wc_status_str");
    if (!missing.empty()) return {api, cat("libibverbs.so.1 lacks ", missing)};
    // Optional: dma-buf registration (rdma-core 34+); GPU memory needs it.
    api.regDmabufMr = reinterpret_cast<decltype(api.regDmabufMr)>(dlsym(v.lib, "ibv_reg_dmabuf_mr"));
    api.postSend = postSendInline;
    api.pollCq = pollCqInline;
    return {api, ""};
  }();
  if (!table.second.empty()) {
    if (why) *why = table.second;
    return nullptr;
  }
  return &table.first;
}
#endif

}  // namespace kvcomm::detail
