// Progress of a network fetch: a plan's runs cut into slices (the unit a request or a group of RDMA READs moves),
// which slices landed, and the failed blocks an error names. Shared by the TCP and verbs transports.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/check.hpp"
#include "fetch/planner.hpp"

namespace kvcomm::detail {

/// `blocks` blocks of plan run `run`, from its block `offset`.
struct RunSlice {
  size_t run;
  int64_t offset;
  int64_t blocks;
};

/// The runs `runs` of `plan` in slices of at most `maxBlocks` blocks, in the order given.
inline std::vector<RunSlice> sliceRuns(const PlanOutput& plan, const std::vector<size_t>& runs, int64_t maxBlocks) {
  std::vector<RunSlice> out;
  for (size_t ri : runs)
    for (int64_t off = 0; off < plan.runs[ri].blocks; off += maxBlocks)
      out.push_back({ri, off, std::min(maxBlocks, plan.runs[ri].blocks - off)});
  return out;
}

/// Which slices landed; thread-safe.
class LandedBlocks {
 public:
  void add(const RunSlice& s) {
    std::lock_guard<std::mutex> lock(mu_);
    landed_[s.run].push_back({s.offset, s.blocks});
  }
  /// blocksDone[run] = the run's landed prefix, for every run with a landed slice.
  void fill(std::vector<int64_t>& blocksDone) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [ri, slices] : landed_) {
      std::sort(slices.begin(), slices.end());
      int64_t prefix = 0;
      for (auto& [off, n] : slices) {
        if (off > prefix) break;
        prefix = std::max(prefix, off + n);
      }
      blocksDone[ri] = prefix;
    }
  }

 private:
  std::mutex mu_;
  std::map<size_t, std::vector<std::pair<int64_t, int64_t>>> landed_;
};

/// "N destination blocks not known to have landed: a, b, ..." for the runs `runs` given their landed prefixes.
inline std::string describeFailedBlocks(const PlanOutput& plan, const std::vector<size_t>& runs,
                                        const std::vector<int64_t>& blocksDone) {
  size_t count = 0;
  std::string list;
  for (size_t ri : runs)
    for (int64_t b = blocksDone[ri]; b < plan.runs[ri].blocks; ++b, ++count)
      if (count < 16) list += cat(count ? ", " : "", plan.runs[ri].dst + b);
  if (count > 16) list += ", ...";
  return cat(count, " destination blocks not known to have landed: ", list);
}

}  // namespace kvcomm::detail
