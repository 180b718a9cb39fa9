// Runs a fuzz target without libFuzzer (any compiler; CTest runs it in every build with tests): the built-in seeds,
// every file of the directories given, and a fixed number of deterministic mutations of the seeds.
//   fuzz_<name>_replay [--write-seeds DIR] [--mutations N] [DIR...]
// --write-seeds writes the seeds as files (the corpus libFuzzer starts from) and exits.
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "replay_seeds.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  std::vector<std::vector<uint8_t>> seeds = replaySeeds();
  long mutations = 200000;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--write-seeds" && i + 1 < argc) {
      std::string dir = argv[++i];
      mkdir(dir.c_str(), 0755);  // the directory may exist
      for (size_t s = 0; s < seeds.size(); ++s) {
        std::ofstream f(dir + "/seed" + std::to_string(s), std::ios::binary);
        f.write(reinterpret_cast<const char*>(seeds[s].data()), static_cast<std::streamsize>(seeds[s].size()));
        if (!f) {
          std::fprintf(stderr, "cannot write the seeds into %s\n", dir.c_str());
          return 1;
        }
      }
      std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
      return 0;
    }
    if (a == "--mutations" && i + 1 < argc) {
      mutations = std::stol(argv[++i]);
      continue;
    }
    dirs.push_back(a);
  }
  size_t files = 0;
  for (const std::string& d : dirs) {
    DIR* dir = opendir(d.c_str());
    if (!dir) {
      std::fprintf(stderr, "cannot open %s\n", d.c_str());
      return 1;
    }
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(d + "/" + e->d_name, std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++files;
    }
    closedir(dir);
  }
  for (const auto& s : seeds) LLVMFuzzerTestOneInput(s.data(), s.size());
  std::mt19937_64 rng(20261201);
  for (long i = 0; i < mutations; ++i) {
    std::vector<uint8_t> b = seeds[rng() % seeds.size()];
    int flips = 1 + static_cast<int>(rng() % 6);
    for (int f = 0; f < flips; ++f) {
      size_t at = rng() % b.size();
      switch (rng() % 4) {
        case 0:
          b[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1:
          b[at] = static_cast<uint8_t>(rng());
          break;
        case 2:
          b.resize(at + 1);
          break;
        default:
          b.insert(b.begin() + static_cast<long>(at), static_cast<uint8_t>(rng()));
      }
    }
    LLVMFuzzerTestOneInput(b.data(), b.size());
  }
  std::printf("replayed %zu seeds, %zu corpus files and %ld mutations: no invariant failed\n", seeds.size(), files,
              mutations);
  return 0;
}
