// C ABI: what polled work reports, shared by fetch operations and endpoint transfers: the plan info, and the status of
// the last test()/wait() kept on the handle so that its failed blocks and error text are read by separate calls.
#include <algorithm>

#include "capi/capi.hpp"
#include "capi/enums.hpp"
#include "common/check.hpp"

namespace kvcomm::capi {

void toC(const FetchPlanInfo& i, kvcommFetchPlanInfo* out) {
  kvcommFetchPlanInfo c{};
  c.pairsIn = i.pairsIn;
  c.pairsSkipped = i.pairsSkipped;
  c.runsOut = i.runsOut;
  c.kernelRuns = i.kernelRuns;
  c.copyEngineRuns = i.copyEngineRuns;
  c.hostRuns = i.hostRuns;
  c.bytes = i.bytes;
  c.path = toC<kvcommFetchPath_t>(i.path);
  c.planMicros = i.planMicros;
  c.tcpRuns = i.tcpRuns;
  c.rdmaRuns = i.rdmaRuns;
  *out = c;
}

void PolledStatus::record(FetchStatus s, kvcommFetchStatus* out) {
  kvcommFetchStatus c{};
  c.state = toC<kvcommFetchState_t>(s.state);
  c.bytesDone = s.bytesDone;
  c.bytesTotal = s.bytesTotal;
  c.numFailedBlocks = s.failedBlocks.size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = std::move(s);
  }
  *out = c;
}

void PolledStatus::failedBlocks(int64_t* blocks, size_t capacity, size_t* count, const char* call) {
  requireNonNull(count, call, "count");
  KVCOMM_CHECK_ARG(blocks != nullptr || capacity == 0, call, "blocks is NULL but capacity is ", capacity);
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<int64_t>& f = last_.failedBlocks;
  std::copy_n(f.begin(), std::min(capacity, f.size()), blocks);
  *count = f.size();
}

void PolledStatus::error(char* text, size_t textBytes, size_t* needed, const char* call) {
  std::string e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = last_.error;
  }
  copyString(e, text, textBytes, needed, call);
}

}  // namespace kvcomm::capi
