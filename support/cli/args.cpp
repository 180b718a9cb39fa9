#include "cli/args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace kvcli {

namespace {

std::string acceptedRange(long long lo, long long hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

}  // namespace

long long parseInteger(const std::string& what, const std::string& number, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(number.c_str(), &end, 10);
  if (number.empty() || *end != '\0' || end == number.c_str())
    throw UsageError(what + " '" + number + "' is not an integer (accepted: " + acceptedRange(lo, hi) + ")");
  if (errno == ERANGE || v < lo || v > hi)
    throw UsageError(what + " " + number + " is out of range (accepted: " + acceptedRange(lo, hi) + ")");
  return v;
}

long long parseBytes(const std::string& what, const std::string& text, long long lo, long long hi) {
  std::string digits = text;
  long long scale = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'k':
      case 'K':
        scale = 1ll << 10;
        break;
      case 'm':
      case 'M':
        scale = 1ll << 20;
        break;
      case 'g':
      case 'G':
        scale = 1ll << 30;
        break;
      default:
        break;
    }
    if (scale != 1) digits.pop_back();
  }
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(digits.c_str(), &end, 10);
  std::string accepted = " (accepted: " + acceptedRange(lo, hi) + " bytes, suffix K, M or G allowed)";
  if (digits.empty() || *end != '\0' || end == digits.c_str())
    throw UsageError(what + " '" + text + "' is not a byte count" + accepted);
  if (errno == ERANGE || v < 0 || v > hi / scale || v * scale < lo)
    throw UsageError(what + " " + text + " is out of range" + accepted);
  return v * scale;
}

Args::Args(std::string program, std::string synopsis, std::string about)
    : program_(std::move(program)), synopsis_(std::move(synopsis)), about_(std::move(about)) {}

void Args::option(const std::string& names, const std::string& metavar, const std::string& help,
                  const std::string& fallback) {
  Opt o;
  auto comma = names.find(',');
  o.shortName = comma == std::string::npos ? "" : names.substr(0, comma);
  o.longName = comma == std::string::npos ? names : names.substr(comma + 1);
  o.metavar = metavar.empty() ? "VALUE" : metavar;
  o.help = help;
  o.fallback = fallback;
  opts_.push_back(o);
}

void Args::flag(const std::string& names, const std::string& help) {
  option(names, "", help);
  opts_.back().metavar.clear();
}

Args::Opt* Args::match(const std::string& arg) {
  for (auto& o : opts_)
    if (arg == o.longName || (!o.shortName.empty() && arg == o.shortName)) return &o;
  return nullptr;
}

const Args::Opt& Args::find(const std::string& name) const {
  for (const auto& o : opts_)
    if (o.longName == "--" + name) return o;
  // A lookup of an undeclared name is a bug in the program, not in its command line.
  std::fprintf(stderr, "%s: internal error: option --%s is not declared\n", program_.c_str(), name.c_str());
  std::abort();
}

bool Args::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return false;
    std::string value;
    bool inlineValue = false;
    auto eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inlineValue = true;
    }
    if (arg.empty() || arg[0] != '-') throw UsageError("unexpected argument '" + arg + "' (options start with -)");
    Opt* o = match(arg);
    if (!o) throw UsageError("unknown option " + arg);
    if (o->given) throw UsageError("option " + o->longName + " is given twice");
    o->given = true;
    if (o->metavar.empty()) {
      if (inlineValue) throw UsageError("option " + o->longName + " takes no value");
      o->value = "1";
      continue;
    }
    if (!inlineValue) {
      if (i + 1 >= argc) throw UsageError("option " + arg + " needs a value (" + o->metavar + ")");
      value = argv[++i];
    }
    o->value = value;
  }
  return true;
}

bool Args::given(const std::string& name) const {
  return find(name).given;
}

std::string Args::text(const std::string& name) const {
  const Opt& o = find(name);
  return o.given ? o.value : o.fallback;
}

std::string Args::require(const std::string& name) const {
  const Opt& o = find(name);
  if (!o.given && o.fallback.empty()) throw UsageError("option " + o.longName + " is required");
  return o.given ? o.value : o.fallback;
}

long long Args::integer(const std::string& name, long long lo, long long hi) const {
  return parseInteger("--" + name, require(name), lo, hi);
}

double Args::real(const std::string& name, double lo, double hi) const {
  std::string t = require(name);
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(t.c_str(), &end);
  std::ostringstream range;
  range << "[" << lo << ", " << hi << "]";
  if (t.empty() || *end != '\0' || !std::isfinite(v))
    throw UsageError("--" + name + " '" + t + "' is not a number (accepted: " + range.str() + ")");
  if (errno == ERANGE || v < lo || v > hi)
    throw UsageError("--" + name + " " + t + " is out of range (accepted: " + range.str() + ")");
  return v;
}

long long Args::bytes(const std::string& name, long long lo, long long hi) const {
  return parseBytes("--" + name, require(name), lo, hi);
}

std::vector<long long> Args::integers(const std::string& name, long long lo, long long hi) const {
  std::string t = require(name);
  std::vector<long long> out;
  std::stringstream ss(t);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(parseInteger("--" + name + " item", item, lo, hi));
  if (out.empty() || t.back() == ',') throw UsageError("--" + name + " '" + t + "' is not a comma-separated list");
  return out;
}

std::string Args::choice(const std::string& name, const std::vector<std::string>& choices) const {
  std::string t = require(name);
  std::string list;
  for (const auto& c : choices) {
    if (t == c) return t;
    list += (list.empty() ? "" : ", ") + c;
  }
  throw UsageError("--" + name + " '" + t + "' is not one of: " + list);
}

std::string Args::usage() const {
  std::ostringstream os;
  os << "usage: " << synopsis_ << "\n\n" << about_ << "\n\noptions:\n";
  auto line = [&](const std::string& shortName, const std::string& longName, const std::string& metavar,
                  const std::string& help, const std::string& fallback) {
    std::string names = (shortName.empty() ? "    " : shortName + ", ") + longName;
    if (!metavar.empty()) names += " " + metavar;
    os << "  " << names << std::string(names.size() < 28 ? 28 - names.size() : 1, ' ') << help;
    if (!fallback.empty()) os << " (default " << fallback << ")";
    os << "\n";
  };
  for (const auto& o : opts_) line(o.shortName, o.longName, o.metavar, o.help, o.fallback);
  line("-h", "--help", "", "this text", "");
  return os.str();
}

bool firstRank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* r = std::getenv(v)) return std::string(r) == "0";
  return true;
}

int parseOrExit(Args& args, int argc, char** argv, const std::function<void()>& read) {
  try {
    if (args.parse(argc, argv)) {
      if (read) read();
      return -1;
    }
    if (firstRank()) std::fputs(args.usage().c_str(), stdout);
    return 0;
  } catch (const UsageError& e) {
    if (firstRank())
      std::fprintf(stderr, "%s: %s\n(run %s --help for the options)\n", args.program().c_str(), e.what(),
                   args.program().c_str());
    return 2;
  }
}

}  // namespace kvcli
