// Shared benchmark plumbing: argument parsing, medians, a table printer and JSON lines.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kvbench {

/// --key value pairs (and bare --flags as "1").
class Args {
 public:
  Args(int argc, char** argv);
  std::string get(const std::string& key, const std::string& fallback) const;
  long long getInt(const std::string& key, long long fallback) const;
  /// Comma-separated integers.
  std::vector<long long> getList(const std::string& key, const std::vector<long long>& fallback) const;

 private:
  std::map<std::string, std::string> kv_;
};

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
