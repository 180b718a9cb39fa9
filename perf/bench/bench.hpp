// Shared benchmark plumbing: the nccl-tests-style options every benchmark takes, repetition statistics, where the
// ranks run, and the report (a legend and a table on stdout, JSON lines with --json). Arguments are parsed by
// support/cli/args.hpp.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cli/args.hpp"

namespace kvbench {

/// The options every benchmark shares, nccl-tests style: -b/-e/-f (a size sweep in bytes, K/M/G allowed), -n (timed
/// iterations), -w (warm-up iterations), --json FILE. `sizeMeaning` says what a size measures ("bytes each rank
/// publishes", ...).
void addCommonOptions(kvcli::Args& args, const std::string& sizeMeaning, const std::string& itersDefault,
                      const std::string& warmupDefault);

struct Common {
  std::vector<long long> sizes;  ///< the -b/-e/-f sweep in bytes; empty when neither -b nor -e was given
  int iters = 0;                 ///< -n; 0 when not given (the benchmark's default applies)
  int warmup = -1;               ///< -w; -1 when not given
  std::string json;              ///< --json
};
/// Reads and checks the common options (throws kvcli::UsageError). `minBytes`: the smallest size that makes sense.
Common readCommon(const kvcli::Args& args, long long minBytes);

/// lo, lo*f, lo*f^2, ... up to hi (hi itself is the last size when the steps do not land on it), nccl-tests style.
std::vector<long long> sweep(long long lo, long long hi, double factor);

/// Repetition statistics of one measurement (in the caller's unit).
struct Stats {
  double median = 0;
  double p10 = 0;  ///< 10th percentile (nearest rank)
  double p90 = 0;  ///< 90th percentile (nearest rank)
  double p99 = 0;  ///< 99th percentile (nearest rank)
  int reps = 0;    ///< how many values
};
Stats stats(std::vector<double> values);
/// Host wall-clock us of `op` (steady clock), `warmup` untimed calls first.
Stats wallUs(const std::function<void()>& op, int reps, int warmup);
double median(std::vector<double> values);
/// Each statistic's maximum over the ranks of MPI_COMM_WORLD: the slowest rank counts. Collective.
Stats maxOverRanks(const Stats& s);

/// Where the ranks run: how many share the busiest host and how many cores it has. Collective.
struct Placement {
  int ranks = 0;         ///< ranks in MPI_COMM_WORLD
  int ranksPerHost = 0;  ///< on the host with the most ranks
  int cores = 0;         ///< cores this process may run on there (its affinity mask)
  /// Non-empty when ranks outnumber cores: timings then include time slicing between ranks.
  std::string warning;
};
Placement placement();

/// A column's type: what its cells are in JSON (a "-" cell, meaning "no value", is null there whatever the type).
enum class Kind { Int, Num, Text };
struct Column {
  std::string name;
  Kind kind;
  std::string meaning;  ///< printed in the legend above the table
};

/// Rows of typed columns, printed as a Markdown table under a legend that explains every column; each row also
/// becomes one JSON line with the same type per key in every line (its column's type, or null where a cell is "-").
class Report {
 public:
  Report(std::string bench, std::vector<Column> columns, const Placement& where);
  /// Adds a line to the notes printed above the legend (how it was measured, warnings).
  void note(const std::string& line);
  /// One row: a value per column. A cell that is not a number in an Int/Num column (other than "-") is a bug in the
  /// benchmark: it aborts.
  void row(const std::vector<std::string>& values);
  /// Prints to stdout and appends the JSON lines to `jsonPath` (if not empty). Each JSON line also carries "bench",
  /// "ranks", "ranks_per_host" and "host_cores".
  void print(const std::string& jsonPath) const;

 private:
  std::string bench_;
  std::vector<Column> columns_;
  Placement where_;
  std::vector<std::string> notes_;
  std::vector<std::vector<std::string>> rows_;
};

std::string fmt(double v, int precision = 2);

/// Under mpirun: binds this rank to GPU (local rank % GPUs) where there is one; returns the device or -1.
int bindLocalDevice();

}  // namespace kvbench
