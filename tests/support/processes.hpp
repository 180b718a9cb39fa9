// Real processes for tests that need them without MPI (fork + TCP bootstrap): deaths, hostile peers.
#pragma once

#include <functional>
#include <vector>

namespace kvtest {

/// Runs `body(rank)` in `n` forked processes; returns each exit code (0 = body returned true, 2 = false, 3 = it
/// threw, -signal = killed by that signal). Children that outlive `timeoutSec` are killed and reported as -9.
std::vector<int> runProcesses(int n, const std::function<bool(int)>& body, int timeoutSec = 60);

}  // namespace kvtest
