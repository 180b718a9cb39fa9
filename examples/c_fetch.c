/* kvcomm from C: pull KV blocks that another rank holds into this rank's own cache (a prefix-cache hit, or a request
 * that moves between ranks), the way a native engine would call it.
 *
 *   mpirun -np 4 ./example_c_fetch
 *
 * Each rank's paged KV cache has kLayers layers, each with a K and a V region of kBlocks blocks (kBlockTokens tokens of
 * kTokenBytes bytes each). Every rank registers its layout once (kvcommFetcherCreate); rank r then finds that the
 * prefix it needs, blocks {3, 4, 5, 9} on rank r + 1, should land in its free blocks {20, 21, 22, 23}: one kvcommFetch
 * names the block ids and kvcomm copies every layer's K and V blocks (the 3 consecutive ids coalesce into one copy
 * per region). A second, polled fetch (kvcommFetchStart + kvcommFetchOperationWait) pulls from rank r + 2 in the
 * background. A Barrier orders the sources' writes before the fetches. The cache is host memory here so that the
 * example runs anywhere; with kvcommMemoryCuda the same calls run as a gather kernel or on the copy engines, on the
 * engine's stream. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcomm/kvcomm.h"

#define CHECK_KV(call)                                                                               \
  do {                                                                                               \
    kvcommResult_t r_ = (call);                                                                      \
    if (r_ != kvcommSuccess) {                                                                       \
      fprintf(stderr, "%s failed: %s: %s\n", #call, kvcommGetErrorString(r_), kvcommGetLastError()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                  \
    }                                                                                                \
  } while (0)

static int allgatherOverMpi(const void* send, void* recv, size_t bytes, void* user) {
  MPI_Comm comm = *(MPI_Comm*)user;
  return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm) == MPI_SUCCESS ? 0 : 1;
}

enum { kLayers = 4, kBlocks = 32, kBlockTokens = 16, kTokenBytes = 64 };
enum { kBlockBytes = kBlockTokens * kTokenBytes, kRegionBytes = kBlocks * kBlockBytes };

/* Byte i of block b of region j (layer j / 2, K or V) as rank r computed it. */
static unsigned char kvByte(int r, int j, int b, int i) {
  return (unsigned char)(r * 59 + j * 31 + b * 7 + i * 3 + 1);
}

/* Counts bytes of this rank's destination blocks that differ from the source's blocks. */
static long verify(const unsigned char* cache, int src, const int64_t* srcIds, const int64_t* dstIds, int n) {
  long wrong = 0;
  for (int j = 0; j < 2 * kLayers; ++j)
    for (int p = 0; p < n; ++p)
      for (int i = 0; i < kBlockBytes; ++i)
        wrong +=
            cache[(size_t)j * kRegionBytes + (size_t)dstIds[p] * kBlockBytes + i] != kvByte(src, j, (int)srcIds[p], i);
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm world = MPI_COMM_WORLD;
  kvcommComm_t comm = NULL;
  CHECK_KV(kvcommCommInitCallback(&comm, rank, size, allgatherOverMpi, &world));

  /* The KV cache (one symmetric buffer) and its layout: region j = layer j / 2, K (even j) or V (odd j). */
  size_t cacheBytes = (size_t)2 * kLayers * kRegionBytes;
  kvcommBuffer_t cache = NULL;
  CHECK_KV(kvcommBufferCreate(comm, cacheBytes, cacheBytes, kvcommMemoryHost, &cache));
  kvcommKvRegion regions[2 * kLayers];
  for (int j = 0; j < 2 * kLayers; ++j) {
    regions[j].offset = (size_t)j * kRegionBytes;
    regions[j].blockBytes = kBlockBytes;
    regions[j].blockStride = 0; /* blocks back to back */
    regions[j].numBlocks = kBlocks;
  }
  kvcommFetcher_t fetcher = NULL;
  CHECK_KV(kvcommFetcherCreate(cache, regions, 2 * kLayers, /*version*/ 1, NULL, &fetcher));
  kvcommBarrierOptions bo;
  CHECK_KV(kvcommBarrierOptionsInit(&bo));
  bo.kind = kvcommMemoryHost;
  kvcommBarrier_t barrier = NULL;
  CHECK_KV(kvcommBarrierCreate(comm, &bo, &barrier));

  /* The engine computes its blocks (here: a pattern), then a barrier: every source is final before anyone reads. */
  void* local = NULL;
  CHECK_KV(kvcommBufferLocal(cache, &local));
  unsigned char* kv = local;
  for (int j = 0; j < 2 * kLayers; ++j)
    for (int b = 0; b < kBlocks; ++b)
      for (int i = 0; i < kBlockBytes; ++i)
        kv[(size_t)j * kRegionBytes + (size_t)b * kBlockBytes + i] = kvByte(rank, j, b, i);
  CHECK_KV(kvcommBarrierSync(barrier, NULL, 0));

  /* 1. The prefix on rank + 1 into free blocks, in every layer's K and V: one call, validated before anything moves. */
  int64_t prefixSrc[4] = {3, 4, 5, 9}, prefixDst[4] = {20, 21, 22, 23};
  kvcommFetchRequest prefix = {(rank + 1) % size, prefixSrc, prefixDst, 4, 0};
  kvcommFetchPlanInfo info;
  CHECK_KV(kvcommFetch(fetcher, &prefix, 1, NULL, NULL, &info));
  long wrong = verify(kv, prefix.srcRank, prefixSrc, prefixDst, 4);

  /* 2. A background fetch from rank + 2, polled (a -1 pair is padding, skipped). */
  int64_t bgSrc[3] = {0, 1, -1}, bgDst[3] = {28, 29, 30};
  kvcommFetchRequest background = {(rank + 2) % size, bgSrc, bgDst, 3, 0};
  kvcommFetchOperation_t op = NULL;
  CHECK_KV(kvcommFetchStart(fetcher, &background, 1, NULL, NULL, &op));
  kvcommFetchStatus status;
  CHECK_KV(kvcommFetchOperationWait(op, 10000, &status));
  if (status.state != kvcommFetchDone) {
    char why[256];
    CHECK_KV(kvcommFetchOperationError(op, why, sizeof(why), NULL));
    fprintf(stderr, "rank %d: background fetch state %d, %zu failed blocks: %s\n", rank, (int)status.state,
            status.numFailedBlocks, why);
    ++wrong;
  }
  CHECK_KV(kvcommFetchOperationDestroy(op));
  wrong += verify(kv, background.srcRank, bgSrc, bgDst, 2);

  printf(
      "rank %d: fetched %zu blocks from rank %d (%zu copies, %zu bytes, path %s) and 2 from rank %d (%zu bytes "
      "polled): %ld wrong bytes\n",
      rank, info.pairsIn - info.pairsSkipped, prefix.srcRank, info.runsOut, info.bytes, kvcommFetchPathName(info.path),
      background.srcRank, status.bytesDone, wrong);

  CHECK_KV(kvcommBarrierSync(barrier, NULL, 0)); /* nobody frees a source a peer still reads */
  CHECK_KV(kvcommBarrierDestroy(barrier));
  CHECK_KV(kvcommFetcherDestroy(fetcher));
  CHECK_KV(kvcommBufferDestroy(cache));
  CHECK_KV(kvcommCommDestroy(comm));
  long total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
