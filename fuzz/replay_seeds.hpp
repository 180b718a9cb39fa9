// The built-in seeds of a fuzz target's replay driver (replay_main.cpp): each replayed target's seeds file defines
// replaySeeds() (arena_seeds.cpp, capi_seeds.cpp).
#pragma once

#include <cstdint>
#include <vector>

std::vector<std::vector<uint8_t>> replaySeeds();
