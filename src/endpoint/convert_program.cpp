#include "endpoint/convert_program.hpp"

#include <algorithm>
#include <utility>

#include "kvcomm/device/vector.hpp"

namespace kvcomm::detail {

ConvertProgram buildConvert(const KvRunPlan& plan, const std::vector<ConvertSource>& sources, const KvLayout& dstLayout,
                            char* dst, std::vector<int64_t> tables, uint64_t dstTable, uint64_t firstToken,
                            uint64_t numTokens, uint64_t chunkBytes) {
  ConvertProgram p;
  p.tables = std::move(tables);
  p.chunkStart.push_back(0);
  const uint64_t seg = std::min(plan.sT, plan.dT);
  uint64_t bits = reinterpret_cast<uintptr_t>(dst);
  for (const KvRunSpec& r : plan.runs) {
    const ConvertSource& from = sources[r.source];
    if (!plan.used[r.source] || !from.base) continue;
    const KvRegion& sr = from.layout->regions[r.region];
    const KvRegion& dr = dstLayout.regions[r.region];
    ConvertRun c{};
    c.src = from.base;
    c.srcTable = from.table;
    c.srcOffset = sr.offset, c.srcStride = sr.blockStride ? sr.blockStride : sr.blockBytes;
    c.dstOffset = dr.offset, c.dstStride = dr.blockStride ? dr.blockStride : dr.blockBytes;
    c.srcHead0 = r.srcHead0, c.dstHead0 = r.dstHead0, c.srcTok = r.srcTok, c.dstTok = r.dstTok;
    c.srcHead = r.srcHead, c.dstHead = r.dstHead, c.unit = r.unit, c.heads = r.heads, c.mode = r.mode;
    uint64_t rows = 0, rowBytes = 0;
    convertRows(c, seg, &rows, &rowBytes);
    c.rowsPerChunk = static_cast<uint32_t>(std::min<uint64_t>(rows, std::max<uint64_t>(1, chunkBytes / rowBytes)));
    c.chunks = static_cast<uint32_t>((rows + c.rowsPerChunk - 1) / c.rowsPerChunk);
    p.chunkStart.push_back(p.chunkStart.back() + c.chunks);
    bits |= reinterpret_cast<uintptr_t>(c.src) | c.srcOffset | c.srcStride | c.dstOffset | c.dstStride | c.srcHead0 |
            c.dstHead0 | c.srcTok | c.dstTok | c.srcHead | c.dstHead | c.unit;
    p.runs.push_back(c);
  }
  ConvertLaunch& l = p.launch;
  l.numRuns = static_cast<int32_t>(p.runs.size());
  l.itemsPerSegment = p.chunkStart.back();
  l.dstTable = dstTable;
  l.dst = dst;
  l.first = firstToken, l.end = firstToken + numTokens;
  l.sT = plan.sT, l.dT = plan.dT, l.seg = seg;
  l.firstSegment = l.first / seg;
  l.numSegments = p.runs.empty() || numTokens == 0 ? 0 : static_cast<int64_t>((l.end + seg - 1) / seg - l.firstSegment);
  l.vec = commonAlignment(bits);
  return p;
}

}  // namespace kvcomm::detail
