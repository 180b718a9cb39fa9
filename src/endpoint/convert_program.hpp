// The host side of a converted copy (for converted reads): a conversion plan's runs (kvlayout/conversion_runs.hpp) made
// into the launch that the conversion kernel or the CPU executor runs (convert_launch.hpp): each run's memory, region
// offsets and strides, its chunks, and a vector width that divides every address.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/convert_launch.hpp"
#include "kvcomm/kv_layout.hpp"
#include "kvlayout/conversion_runs.hpp"

namespace kvcomm::detail {

/// Where a source of the plan is read: its memory here (null for a source the plan does not use), the layout that
/// memory has (its own, or a landing area's), and where its block table starts in the tables.
struct ConvertSource {
  const char* base = nullptr;
  const KvLayout* layout = nullptr;
  uint64_t table = 0;
};

/// A launch with the arrays it points to (set the pointers with bind() once they stay where they are).
struct ConvertProgram {
  ConvertLaunch launch{};
  std::vector<ConvertRun> runs;
  std::vector<uint32_t> chunkStart;
  std::vector<int64_t> tables;
  /// Points the launch at this program's own arrays (the CPU executor reads them there).
  void bind() {
    launch.runs = runs.data();
    launch.chunkStart = chunkStart.data();
    launch.tables = tables.data();
  }
};

/// The launch of `plan` (segmented) over `sources` into `dst` (laid out as `dstLayout`), tokens [firstToken, +
/// numTokens); `tables` holds every block table, the destination's at `dstTable`. Work items copy about
/// `chunkBytes` each.
ConvertProgram buildConvert(const KvRunPlan& plan, const std::vector<ConvertSource>& sources, const KvLayout& dstLayout,
                            char* dst, std::vector<int64_t> tables, uint64_t dstTable, uint64_t firstToken,
                            uint64_t numTokens, uint64_t chunkBytes = 64u << 10);

}  // namespace kvcomm::detail
