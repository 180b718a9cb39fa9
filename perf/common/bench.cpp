#include "common/bench.hpp"

#include <mpi.h>

#include "kvcomm/capabilities.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

namespace kvbench {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fmt(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

Report::Report(std::string bench, std::vector<std::string> columns)
    : bench_(std::move(bench)), columns_(std::move(columns)) {}

void Report::row(const std::vector<std::string>& values) {
  rows_.push_back(values);
}

void Report::print(const std::string& jsonPath) const {
  std::vector<size_t> w(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    w[c] = columns_[c].size();
    for (const auto& r : rows_) w[c] = std::max(w[c], c < r.size() ? r[c].size() : 0);
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::string s = "| ";
    for (size_t c = 0; c < columns_.size(); ++c) {
      std::string v = c < r.size() ? r[c] : "";
      s += v + std::string(w[c] - v.size(), ' ') + " | ";
    }
    return s;
  };
  std::cout << "\n" << bench_ << "\n" << line(columns_) << "\n|";
  for (size_t c = 0; c < columns_.size(); ++c) std::cout << std::string(w[c] + 2, '-') << "|";
  std::cout << "\n";
  for (const auto& r : rows_) std::cout << line(r) << "\n";
  std::cout.flush();
  if (jsonPath.empty()) return;
  std::ofstream f(jsonPath, std::ios::app);
  for (const auto& r : rows_) {
    f << "{\"bench\":\"" << bench_ << "\"";
    for (size_t c = 0; c < columns_.size() && c < r.size(); ++c) {
      const std::string& v = r[c];
      char* end = nullptr;
      std::strtod(v.c_str(), &end);
      bool numeric = !v.empty() && end && *end == '\0';
      f << ",\"" << columns_[c] << "\":" << (numeric ? v : "\"" + v + "\"");
    }
    f << "}\n";
  }
}

int bindLocalDevice() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return kvcomm::useLocalDevice(local ? std::atoi(local) : rank);
}

}  // namespace kvbench
