// Strict command-line parsing shared by kvcomm's tools (tools/) and benchmarks (perf/). Every option is declared
// with its help text; --help prints them. An unknown option, a missing or malformed value, or a value out of range is
// a UsageError naming the option, the value and what is accepted, so a typo never runs with a default.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvcli {

/// A command line this program does not accept; what() says which option and why.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Args {
 public:
  /// `program`: the name in messages; `synopsis`: how it is run (after "usage: "); `about`: one paragraph on what
  /// it does.
  Args(std::string program, std::string synopsis, std::string about);

  /// Declares an option that takes a value. `names`: "--long" or "-s,--long" (look it up by "long"). `fallback`: its
  /// value when absent ("" = none). Given as `--long V`, `--long=V` or `-s V`; a value may start with '-' (so
  /// `--tokens -1` is range-checked, not taken for an option).
  void option(const std::string& names, const std::string& metavar, const std::string& help,
              const std::string& fallback = "");
  /// Declares a flag without a value.
  void flag(const std::string& names, const std::string& help);

  /// Parses argv[1..]. Returns false when -h/--help was given (the caller prints usage() and exits 0). Throws
  /// UsageError for an unknown option, a missing value, a repeated option or a stray positional argument.
  bool parse(int argc, char** argv);

  /// Whether the option or flag was on the command line.
  bool given(const std::string& name) const;
  /// The option's value as given, else its fallback.
  std::string text(const std::string& name) const;
  /// A decimal integer in [lo, hi].
  long long integer(const std::string& name, long long lo, long long hi) const;
  /// A decimal number in [lo, hi].
  double real(const std::string& name, double lo, double hi) const;
  /// A byte count with an optional suffix K, M or G (powers of 1024), in [lo, hi]: "8", "64K", "128M".
  long long bytes(const std::string& name, long long lo, long long hi) const;
  /// Comma-separated decimal integers (at least one), each in [lo, hi].
  std::vector<long long> integers(const std::string& name, long long lo, long long hi) const;
  /// One of `choices`.
  std::string choice(const std::string& name, const std::vector<std::string>& choices) const;

  /// The usage text: synopsis, about, every option with its help and default.
  std::string usage() const;
  const std::string& program() const { return program_; }

 private:
  struct Opt {
    std::string shortName;  // "-b" or ""
    std::string longName;   // "--begin"
    std::string metavar;    // "" for a flag
    std::string help;
    std::string fallback;
    std::string value;
    bool given = false;
  };
  const Opt& find(const std::string& name) const;
  Opt* match(const std::string& arg);
  std::string require(const std::string& name) const;

  std::string program_;
  std::string synopsis_;
  std::string about_;
  std::vector<Opt> opts_;
};

/// Parses `number` as the value of option `what`: a decimal integer in [lo, hi] (also used for list items).
long long parseInteger(const std::string& what, const std::string& number, long long lo, long long hi);
/// Parses a byte count with an optional K/M/G suffix, in [lo, hi].
long long parseBytes(const std::string& what, const std::string& text, long long lo, long long hi);

/// Whether this process is the one that should print: not started by a launcher, or rank 0 of one (read from the
/// launcher's environment, so it works before MPI_Init).
bool firstRank();

/// Parses the command line for a program's main(), then runs `read` (which reads and range-checks the values):
/// returns -1 to go on, 0 after printing usage for --help, 2 after printing "program: error" and a hint to stderr for
/// a UsageError from either. Only the first rank prints (firstRank()), so a bad command line under mpirun -np 8 is
/// reported once; every rank returns the same code.
int parseOrExit(Args& args, int argc, char** argv, const std::function<void()>& read = {});

}  // namespace kvcli
