#include "comm/health.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include "common/check.hpp"
#include "common/log.hpp"

#ifdef KVCOMM_HAVE_CUDA
#include "platform/cuda_driver.hpp"
#endif

namespace kvcomm::detail {

namespace {
size_t pageBytes() {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<size_t>(p) : 4096;
}
}  // namespace

GroupHealth::GroupHealth(std::vector<int> meshMembers)
    : members_(std::move(meshMembers)), deaths_(members_.size()), gone_(members_.size()) {
  // A page of its own: cuMemHostRegister works on whole pages and refuses a page registered twice.
  void* p = mmap(nullptr, pageBytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throwSystem("mmap(health flag page)", errno, __FILE__, __LINE__);
  flag_ = static_cast<uint32_t*>(p);
}

GroupHealth::~GroupHealth() {
#ifdef KVCOMM_HAVE_CUDA
  if (registered_) {
    CUresult r = cudaDriver().cuMemHostUnregister(flag_);  // registered_: the entry point exists
    if (r != CUDA_SUCCESS) KVCOMM_WARN("health flag: cuMemHostUnregister: ", cuResultText(r));
  }
#endif
  munmap(flag_, pageBytes());
}

uint64_t GroupHealth::deviceFlag() {
  std::lock_guard<std::mutex> lock(mu_);
  if (registered_) return deviceFlag_;
#ifdef KVCOMM_HAVE_CUDA
  const CudaDriver& d = requireCudaDriver("health flag (device mapping)", CudaFeature::HostRegister);
  KVCOMM_CHECK_CU(d.cuMemHostRegister(flag_, pageBytes(), CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
  registered_ = true;
  CUdeviceptr dp = 0;
  KVCOMM_CHECK_CU(d.cuMemHostGetDevicePointer(&dp, flag_, 0));
  deviceFlag_ = static_cast<uint64_t>(dp);
  return deviceFlag_;
#else
  return 0;
#endif
}

void GroupHealth::abort(const std::string& why) {
  std::vector<std::shared_ptr<GroupHealth>> kids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state() != kAborted) reason_ = why;
    __atomic_store_n(flag_, static_cast<uint32_t>(kAborted), __ATOMIC_RELEASE);
    for (auto& w : children_)
      if (auto c = w.lock()) kids.push_back(std::move(c));
  }
  for (auto& c : kids) c->abort(why);
}

void GroupHealth::memberDied(int meshRank, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  int groupRank = -1;
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i] == meshRank) groupRank = static_cast<int>(i);
  if (groupRank < 0 || !deaths_[static_cast<size_t>(groupRank)].empty()) return;
  deaths_[static_cast<size_t>(groupRank)] = why.empty() ? "its process died" : why;
  markGoneLocked(groupRank, deaths_[static_cast<size_t>(groupRank)]);
  if (deadRank_ >= 0) return;  // the flag and reason name the first death
  deadRank_ = groupRank;
  if (state() == kHealthy) {
    reason_ = cat("rank ", groupRank, " is gone: ", why);
    if (goneOrder_.front() != groupRank)
      reason_ +=
          cat(" (after rank ", goneOrder_.front(), " left: ", gone_[static_cast<size_t>(goneOrder_.front())], ")");
    __atomic_store_n(flag_, static_cast<uint32_t>(kPeerDied), __ATOMIC_RELEASE);
  }
}

void GroupHealth::memberLeft(int meshRank, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i] == meshRank) markGoneLocked(static_cast<int>(i), why.empty() ? "it left the group" : why);
}

void GroupHealth::markGoneLocked(int groupRank, const std::string& why) {
  std::string& g = gone_[static_cast<size_t>(groupRank)];
  if (!g.empty()) return;
  g = why;
  goneOrder_.push_back(groupRank);
  if (static_cast<size_t>(groupRank) < departedCapacity())
    __atomic_store_n(flag_ + kHealthDepartedWord + groupRank, 1u, __ATOMIC_RELEASE);
}

size_t GroupHealth::departedCapacity() {
  return pageBytes() / sizeof(uint32_t) - kHealthDepartedWord;
}

std::string GroupHealth::firstGoneText() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (goneOrder_.empty()) return "";
  int g = goneOrder_.front();
  return cat("rank ", g, " is gone: ", gone_[static_cast<size_t>(g)]);
}

void GroupHealth::checkPresent(const char* call, int waitedFor) const {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waitedFor < 0 || static_cast<size_t>(waitedFor) >= gone_.size() ||
        gone_[static_cast<size_t>(waitedFor)].empty())
      return;
    int first = goneOrder_.front();  // not empty: waitedFor is in it
    text = cat("rank ", first, " is gone: ", gone_[static_cast<size_t>(first)]);
    if (first != waitedFor)
      text += cat(" (the first to go; rank ", waitedFor,
                  ", waited for here, is gone too: ", gone_[static_cast<size_t>(waitedFor)], ")");
  }
  throwError(ErrorCode::NetworkError, call, text, __FILE__, __LINE__);
}

void GroupHealth::checkNoneGone(const char* call, const std::string& context) const {
  std::string text = firstGoneText();
  if (text.empty()) return;
  throwError(ErrorCode::NetworkError, call, context.empty() ? text : cat(text, " (", context, ")"), __FILE__, __LINE__);
}

void GroupHealth::addChild(const std::shared_ptr<GroupHealth>& child) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(children_, [](const std::weak_ptr<GroupHealth>& w) { return w.expired(); });
  children_.push_back(child);
}

bool GroupHealth::containsMeshRank(int meshRank) const {
  for (int m : members_)
    if (m == meshRank) return true;
  return false;
}

int GroupHealth::deadRank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return deadRank_;
}

std::string GroupHealth::deathOf(int groupRank) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (groupRank < 0 || static_cast<size_t>(groupRank) >= deaths_.size()) return "";
  return deaths_[static_cast<size_t>(groupRank)];
}

std::string GroupHealth::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

void GroupHealth::check(const char* call) const {
  HealthState s = state();
  if (s == kHealthy) return;
  std::string why = reason();
  if (s == kAborted)
    throwError(ErrorCode::Aborted, call, cat("the communicator was aborted (", why, ")"), __FILE__, __LINE__);
  throwError(ErrorCode::NetworkError, call, why, __FILE__, __LINE__);
}

}  // namespace kvcomm::detail
