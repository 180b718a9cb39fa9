// Well-formed inputs of the arena_protocol fuzz target (descriptor-count byte + datagram): one per message type.
#pragma once

#include <cstdint>
#include <vector>

std::vector<std::vector<uint8_t>> arenaProtocolSeeds();
