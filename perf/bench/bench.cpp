#include "bench/bench.hpp"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <vector>

#include "kvcomm/capabilities.hpp"

namespace kvbench {

void addCommonOptions(kvcli::Args& args, const std::string& sizeMeaning, const std::string& itersDefault,
                      const std::string& warmupDefault) {
  args.option("-b,--minbytes", "SIZE", "smallest size of the sweep: " + sizeMeaning + " (K, M, G suffixes)");
  args.option("-e,--maxbytes", "SIZE", "largest size of the sweep (default: the -b size)");
  args.option("-f,--stepfactor", "F", "multiply the size by F at each step, 1 < F <= 1024", "2");
  args.option("-n,--iters", "N", "timed iterations per measurement, 1 to 100000 (default " + itersDefault + ")");
  args.option("-w,--warmup_iters", "N",
              "untimed iterations before each measurement, 0 to 100000 (default " + warmupDefault + ")");
  args.option("--json", "FILE", "append one JSON line per table row to FILE");
}

Common readCommon(const kvcli::Args& args, long long minBytes) {
  Common c;
  constexpr long long kMax = 1ll << 40;
  if (args.given("minbytes") || args.given("maxbytes")) {
    long long lo = args.given("minbytes") ? args.bytes("minbytes", minBytes, kMax) : minBytes;
    long long hi = args.given("maxbytes") ? args.bytes("maxbytes", minBytes, kMax) : lo;
    if (hi < lo)
      throw kvcli::UsageError("-e " + args.text("maxbytes") + " is smaller than -b " + args.text("minbytes"));
    c.sizes = sweep(lo, hi, args.real("stepfactor", 1.0001, 1024));
  } else {
    args.real("stepfactor", 1.0001, 1024);  // checked even when unused
  }
  if (args.given("iters")) c.iters = static_cast<int>(args.integer("iters", 1, 100000));
  if (args.given("warmup_iters")) c.warmup = static_cast<int>(args.integer("warmup_iters", 0, 100000));
  c.json = args.text("json");
  return c;
}

std::vector<long long> sweep(long long lo, long long hi, double factor) {
  std::vector<long long> out;
  for (double s = static_cast<double>(lo); s < static_cast<double>(hi) * (1 - 1e-9); s *= factor) {
    auto v = static_cast<long long>(std::llround(s));
    if (out.empty() || v > out.back()) out.push_back(v);
  }
  if (out.empty() || out.back() != hi) out.push_back(hi);
  return out;
}

Stats stats(std::vector<double> v) {
  Stats s;
  s.reps = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  auto rank = [&](double p) {  // nearest rank: the smallest value with at least p of all values at or below it
    auto k = static_cast<size_t>(std::ceil(p * static_cast<double>(n)));
    return v[std::min(n, std::max<size_t>(k, 1)) - 1];
  };
  s.p10 = rank(0.1);
  s.p90 = rank(0.9);
  s.p99 = rank(0.99);
  return s;
}

Stats wallUs(const std::function<void()>& op, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) op();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    op();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  return stats(t);
}

double median(std::vector<double> v) {
  return stats(std::move(v)).median;
}

Stats maxOverRanks(const Stats& s) {
  double mine[4] = {s.median, s.p10, s.p90, s.p99}, worst[4] = {0, 0, 0, 0};
  MPI_Allreduce(mine, worst, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  Stats out = s;
  out.median = worst[0];
  out.p10 = worst[1];
  out.p90 = worst[2];
  out.p99 = worst[3];
  return out;
}

Placement placement() {
  Placement p;
  MPI_Comm_size(MPI_COMM_WORLD, &p.ranks);
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  int here = 0;
  MPI_Comm_size(host, &here);
  MPI_Comm_free(&host);
  cpu_set_t set;
  int cores =
      sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  // Every rank's (ranks on its host, its cores); the host where ranks most outnumber cores is reported.
  int mine[2] = {here, cores};
  std::vector<int> all(2 * static_cast<size_t>(p.ranks));
  MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, MPI_COMM_WORLD);
  p.ranksPerHost = all[0];
  p.cores = all[1];
  for (size_t r = 1; r < static_cast<size_t>(p.ranks); ++r)
    if (all[2 * r] - all[2 * r + 1] > p.ranksPerHost - p.cores) p.ranksPerHost = all[2 * r], p.cores = all[2 * r + 1];
  if (p.ranksPerHost > p.cores)
    p.warning = "WARNING: " + std::to_string(p.ranksPerHost) + " ranks share " + std::to_string(p.cores) +
                " cores on one host: ranks take turns on the cores, so the times include waiting for a core and are "
                "not what the operation costs with a core per rank";
  return p;
}

std::string fmt(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

Report::Report(std::string bench, std::vector<Column> columns, const Placement& where)
    : bench_(std::move(bench)), columns_(std::move(columns)), where_(where) {
  if (!where_.warning.empty()) notes_.push_back(where_.warning);
}

void Report::note(const std::string& line) {
  notes_.push_back(line);
}

void Report::row(const std::vector<std::string>& values) {
  if (values.size() != columns_.size()) {
    std::fprintf(stderr, "%s: a row has %zu cells for %zu columns\n", bench_.c_str(), values.size(), columns_.size());
    std::abort();
  }
  for (size_t c = 0; c < columns_.size(); ++c) {
    const std::string& v = values[c];
    if (columns_[c].kind == Kind::Text || v == "-") continue;
    char* end = nullptr;
    if (columns_[c].kind == Kind::Int)
      std::strtoll(v.c_str(), &end, 10);
    else
      std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0') {
      std::fprintf(stderr, "%s: column %s holds '%s', not a number\n", bench_.c_str(), columns_[c].name.c_str(),
                   v.c_str());
      std::abort();
    }
  }
  rows_.push_back(values);
}

namespace {
std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}
}  // namespace

void Report::print(const std::string& jsonPath) const {
  std::vector<size_t> w(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    w[c] = columns_[c].name.size();
    for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::string s = "| ";
    for (size_t c = 0; c < columns_.size(); ++c) s += r[c] + std::string(w[c] - r[c].size(), ' ') + " | ";
    return s;
  };
  std::cout << "\n" << bench_ << "\n";
  for (const auto& n : notes_) std::cout << "  " << n << "\n";
  std::cout << "Columns:\n";
  for (const auto& c : columns_) std::cout << "  " << c.name << ": " << c.meaning << "\n";
  std::vector<std::string> names;
  for (const auto& c : columns_) names.push_back(c.name);
  std::cout << "\n" << line(names) << "\n|";
  for (size_t c = 0; c < columns_.size(); ++c) std::cout << std::string(w[c] + 2, '-') << "|";
  std::cout << "\n";
  for (const auto& r : rows_) std::cout << line(r) << "\n";
  std::cout.flush();
  if (jsonPath.empty()) return;
  std::ofstream f(jsonPath, std::ios::app);
  for (const auto& r : rows_) {
    f << "{\"bench\":" << jsonString(bench_) << ",\"ranks\":" << where_.ranks
      << ",\"ranks_per_host\":" << where_.ranksPerHost << ",\"host_cores\":" << where_.cores;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const std::string& v = r[c];
      f << "," << jsonString(columns_[c].name) << ":";
      if (v == "-")
        f << "null";
      else if (columns_[c].kind == Kind::Text)
        f << jsonString(v);
      else
        f << v;
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
