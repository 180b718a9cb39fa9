// Validation of a TP/PCP/PP/DP layout spec, shared by ParallelGroups's functions and the C ABI's.
#pragma once

#include "kvcomm/comm.hpp"

namespace kvcomm::detail {

/// The number of ranks `s` spans, after checking that every size is positive and that their product fits an int
/// (ranks, colors and keys are ints: a product past INT_MAX would wrap into a small world). InvalidArgumentError
/// naming `call` otherwise.
int checkedWorldSize(const ParallelSpec& s, const char* call);

}  // namespace kvcomm::detail
