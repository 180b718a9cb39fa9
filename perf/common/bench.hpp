// Shared benchmark plumbing: medians, a table printer and JSON lines (arguments: tools/cli/args.hpp).
#pragma once

#include <string>
#include <vector>

namespace kvbench {

double median(std::vector<double> v);

/// Rows of named columns, printed aligned; each row also becomes one JSON line.
class Report {
 public:
  Report(std::string bench, std::vector<std::string> columns);
  void row(const std::vector<std::string>& values);
  /// Prints the table to stdout and writes JSON lines to `jsonPath` (if not empty).
  void print(const std::string& jsonPath) const;

 private:
  std::string bench_;
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

std::string fmt(double v, int precision = 2);

/// Under mpirun: binds this rank to GPU (local rank % GPUs) where there is one; returns the device or -1.
int bindLocalDevice();

}  // namespace kvbench
