// kvcomm-demo: one decode step of a replicated KV cache, end to end. The ranks form TP x PCP groups; each PCP group
// keeps one replicated cache (Main-KV rows of 656 B and an Indexer-K split block layout, two tensors of one call).
// Every rank publishes its step's rows into every replica of its group, barriers, and checks its own replica byte
// for byte against gather-then-insert computed independently from every rank's inputs. Then a prefix-cache hit:
// every rank pulls blocks of a paged cache (K and V of 8 layers) out of the next rank's cache into its own slots
// with one fetch, and checks its whole cache against a per-block oracle.
//   mpirun -np 4 kvcomm-demo [--tokens 512]   (--help for the options)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "kvcomm/kvcomm.hpp"
#include "kvcomm/mpi_bootstrap.hpp"
#include "kvcomm/publish.hpp"
#include "verify/fetch_oracle.hpp"
#include "verify/memory.hpp"
#include "verify/publish_oracle.hpp"

int main(int argc, char** argv) {
  kvcli::Args args("kvcomm-demo", "mpirun -np N kvcomm-demo [--tokens T]   (N >= 2, e.g. mpirun -np 4)",
                   "Two steps of an inference engine's KV cache, each verified byte for byte across processes.\n"
                   "1. Publish: the ranks form TP x PCP groups (TP2 when the rank count is even and at least 4);\n"
                   "   every rank publishes T tokens of Main-KV and Indexer-K rows into every replica of its PCP\n"
                   "   group, barriers, and checks its replica against gather-then-insert.\n"
                   "2. Fetch (a prefix-cache hit): every rank pulls up to 48 blocks of a paged cache (K and V of 8\n"
                   "   layers, 16 KiB blocks) out of the next rank's cache into free blocks of its own with one\n"
                   "   fetch, and checks its whole cache against a per-block oracle.\n"
                   "Run it with several ranks: alone (1 rank) nothing crosses processes, and it says so.\n"
                   "Exits 1 on any mismatch.");
  args.option("--tokens", "T", "tokens each rank publishes, 1 to 65536", "512");
  size_t tokens = 0;
  int rc =
      kvcli::parseOrExit(args, argc, argv, [&] { tokens = static_cast<size_t>(args.integer("tokens", 1, 65536)); });
  if (rc >= 0) return rc;
  rc = 0;
  MPI_Init(&argc, &argv);
  try {
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    kvcomm::useLocalDevice(lr ? std::atoi(lr) : rank);
    auto world = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
    kvcomm::ParallelSpec spec;
    spec.tp = (size % 2 == 0 && size >= 4) ? 2 : 1;
    spec.pcp = size / spec.tp;
    auto layout = kvcomm::ParallelGroups::create(world, spec);
    kvcomm::Communicator& pcp = layout.pcp;

    // One layer of the cache: Main-KV (flat, 656-byte rows) then Indexer-K (blocks of 16: 128 data + 4 scale bytes).
    size_t slots = static_cast<size_t>(pcp.size()) * tokens + tokens / 4 + 16;
    auto mainKv = kvtest::makeGeometry(kvtest::CacheLayout::Flat, 656, slots, 0);
    auto indexK =
        kvtest::makeGeometry(kvtest::CacheLayout::BlockSplit, 128, slots, (mainKv.regionBytes + 4095) & ~4095ul);
    size_t bytes = indexK.regionBytes;
    auto cache = kvcomm::SymmetricBuffer::create(pcp, bytes, bytes);
    auto pub = kvcomm::Publisher::create(cache);
    kvcomm::MemoryKind kind = cache.kind();
    kvtest::fillMemory(kind, cache.local(), kvtest::kPoison, bytes);

    uint64_t seed = 0x5eed0000u + 1000u * static_cast<uint64_t>(layout.coord.tp);  // each PCP group its own data
    std::vector<std::unique_ptr<kvtest::Memory>> keep;
    auto stage = [&](const kvtest::Geometry& g, const kvtest::Inputs& in) {
      std::vector<kvcomm::CacheTensor> ts;
      for (size_t k = 0; k < g.tensors.size(); ++k) {
        keep.push_back(std::make_unique<kvtest::Memory>(kind, in.rows[k].size()));
        kvtest::toMemory(kind, keep.back()->data(), in.rows[k].data(), in.rows[k].size());
        kvcomm::CacheTensor t = g.tensors[k];
        t.src = keep.back()->data();
        t.srcStride = in.srcStride[k];
        ts.push_back(t);
      }
      keep.push_back(std::make_unique<kvtest::Memory>(kind, in.slots.size() * 8));
      kvtest::toMemory(kind, keep.back()->data(), in.slots.data(), in.slots.size() * 8);
      return ts;
    };
    auto inMain = kvtest::makeInputs(seed, pcp.rank(), pcp.size(), tokens, mainKv, 1);
    auto inIdx = kvtest::makeInputs(seed, pcp.rank(), pcp.size(), tokens, indexK, 2);
    auto tMain = stage(mainKv, inMain);
    const void* sMain = keep.back()->data();
    auto tIdx = stage(indexK, inIdx);
    const void* sIdx = keep.back()->data();
    world.barrier();

    // The step: Main-KV rows (one tensor), Indexer-K data + scales (two tensors of one call), one barrier.
    pub.publish({tMain[0]}, {sMain, kvcomm::SlotType::Int64, tokens}, tokens);
    pub.publish(tIdx, {sIdx, kvcomm::SlotType::Int64, tokens}, tokens);
    pub.barrier().sync();
    kvtest::synchronize(kind);
    pub.checkErrors();

    std::vector<uint8_t> want(bytes, kvtest::kPoison), got(bytes);
    kvcomm::CacheTensor mainOnly[] = {mainKv.tensors[0]};
    kvtest::Geometry mainGeom = mainKv;
    mainGeom.tensors.assign(mainOnly, mainOnly + 1);
    for (int r = 0; r < pcp.size(); ++r) {
      kvtest::applyOracle(want, mainGeom, kvtest::makeInputs(seed, r, pcp.size(), tokens, mainKv, 1));
      kvtest::applyOracle(want, indexK, kvtest::makeInputs(seed, r, pcp.size(), tokens, indexK, 2));
    }
    kvtest::fromMemory(kind, got.data(), cache.local(), bytes);
    size_t differ = 0;
    for (size_t i = 0; i < bytes; ++i) differ += got[i] != want[i];
    std::string group = "{";
    for (int r = 0; r < pcp.size(); ++r) group += (r ? "," : "") + std::to_string(pcp.worldRank(r));
    group += "}";
    char line[256];
    std::snprintf(line, sizeof(line), "  rank %d  PCP group %s  %s memory  %zu bytes checked, %zu differ  %s", rank,
                  group.c_str(), kvcomm::memoryKindName(kind), bytes, differ, differ ? "MISMATCH" : "verified");
    std::vector<char> all(256 * static_cast<size_t>(size));
    std::memcpy(all.data() + 256 * rank, line, 256);
    world.allgather(all.data(), 256);
    if (rank == 0) {
      if (size == 1)
        std::printf(
            "kvcomm demo: only 1 rank, so nothing crosses processes: the publish below fills this process's own\n"
            "  replica and the fetch copies within its own cache. To see kvcomm move KV between processes, run it\n"
            "  with several ranks: mpirun -np 4 kvcomm-demo (as root add --allow-run-as-root, and --oversubscribe\n"
            "  when there are fewer cores than ranks).\n");
      std::printf(
          "kvcomm demo: %d %s as TP%d x PCP%d; each rank publishes %zu tokens (Main-KV 656 B + Indexer-K "
          "128+4 B) into every replica of its PCP group, then one barrier\n  mode: %s (%s)\n",
          size, size == 1 ? "rank" : "ranks", spec.tp, spec.pcp, tokens, kvcomm::publishModeName(pub.mode()),
          pub.modeReason().c_str());
      for (int r = 0; r < size; ++r) std::printf("%s\n", all.data() + 256 * r);
    }
    // Step 2: a prefix-cache hit. Paged cache of 8 layers x (K, V) x 128 blocks of 16 KiB on every world rank;
    // rank r pulls up to 48 blocks (a few padded) from rank r + 1 into free slots of its own cache.
    const kvtest::FetchCase fc{16 << 10, 8, true, 128};
    const uint64_t fseed = 0xFE7C11u;
    std::vector<kvcomm::KvLayout> layouts;
    size_t most = 0, extent = 0;
    for (int r = 0; r < size; ++r) {
      size_t e = 0;
      layouts.push_back(kvtest::makeFetchLayout(fc, fseed, r, &e));
      most = std::max(most, e);
      if (r == rank) extent = e;
    }
    auto kv = kvcomm::SymmetricBuffer::create(world, most, most);
    auto image = kvtest::initialImage(layouts[static_cast<size_t>(rank)], fseed, rank, extent);
    kvtest::toMemory(kv.kind(), kv.local(), image.data(), extent);
    auto fetcher = kvcomm::Fetcher::create(kv, layouts[static_cast<size_t>(rank)]);
    auto batch = kvtest::makeFetchBatch(fseed, rank, size, fc.numBlocks, 48, 1);
    world.barrier();  // every cache is filled
    kvcomm::FetchPlanInfo info = fetcher.fetch(batch.requests());
    kvtest::synchronize(kv.kind());
    fetcher.checkErrors();
    std::vector<uint8_t> gotKv(extent);
    kvtest::fromMemory(kv.kind(), gotKv.data(), kv.local(), extent);
    kvtest::applyFetchOracle(image, layouts, rank, fseed, batch);
    std::string diff = kvtest::describeMismatch(gotKv, image, layouts[static_cast<size_t>(rank)]);
    const std::string from =
        batch.ranks[0] == rank ? "itself (a local copy)" : "rank " + std::to_string(batch.ranks[0]);
    std::snprintf(line, sizeof(line), "  rank %d  pulled from %s: %s  %s", rank, from.c_str(), info.toString().c_str(),
                  diff.empty() ? "verified (whole cache)" : ("MISMATCH " + diff).c_str());
    std::memcpy(all.data() + 256 * rank, line, 256);
    world.allgather(all.data(), 256);
    if (rank == 0) {
      std::printf(
          "kvcomm demo, step 2: prefix-cache hit; every rank fetches blocks of a %d-region paged cache "
          "(16 KiB blocks) from %s straight into its own slots\n",
          static_cast<int>(layouts[0].regions.size()), size == 1 ? "itself (no other rank)" : "the next rank");
      for (int r = 0; r < size; ++r) std::printf("%s\n", all.data() + 256 * r);
    }
    world.barrier();  // nobody frees a cache a peer still reads
    if (!diff.empty()) differ += 1;

    int bad = differ ? 1 : 0, anyBad = 0;
    MPI_Allreduce(&bad, &anyBad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    rc = anyBad;
  } catch (const std::exception& e) {  // kvcomm::Error, and std::bad_alloc or the like: reported, not a crash
    std::fprintf(stderr, "kvcomm-demo: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
