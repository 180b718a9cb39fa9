// Seeds of the capi_calls fuzz target (capi_calls.c): one input per function of kvcomm.h with every argument byte 0
// (live handles, every value 0, outputs in the scratch), and sequences that call every function in turn with
// argument bytes 1 (NULL handles), 2 (handles kvcomm never returned), 3 (destroyed handles), 4 (every value 4: small
// valid sizes) and raw UINT64_MAX values. corpus/capi_calls/ holds them as files (fuzz_capi_calls_replay
// --write-seeds).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "replay_seeds.hpp"

namespace {
constexpr unsigned kNumOps = 112;  // the functions of kvcomm.h (capi_calls.c: kNumOps)
}  // namespace

std::vector<std::vector<uint8_t>> replaySeeds() {
  std::vector<std::vector<uint8_t>> seeds;
  for (unsigned f = 0; f < kNumOps; ++f) {
    std::vector<uint8_t> s(1, static_cast<uint8_t>(f));
    s.resize(200, 0);
    seeds.push_back(s);
  }
  for (int fill : {1, 2, 3, 4, 0xFF}) {
    std::vector<uint8_t> all;
    for (unsigned f = 0; f < kNumOps; ++f) {
      all.push_back(static_cast<uint8_t>(f));
      all.insert(all.end(), fill == 0xFF ? 96 : 24, static_cast<uint8_t>(fill));
    }
    // An input calls at most 64 functions: split the sequence where its 64th call would start.
    std::size_t per = all.size() / kNumOps, half = per * 56;
    seeds.emplace_back(all.begin(), all.begin() + static_cast<long>(half));
    seeds.emplace_back(all.begin() + static_cast<long>(half), all.end());
  }
  return seeds;
}
