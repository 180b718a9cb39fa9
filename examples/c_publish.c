/* kvcomm from C: one PCP publish step, the way a native engine would call it.
 *
 *   mpirun -np 4 ./example_c_publish [tp]        (default tp = 2: TP {0,1},{2,3}, PCP {0,2},{1,3})
 *
 * The engine's own process group (here MPI) bootstraps kvcomm through kvcommCommInitCallback; the layout splits the
 * world into TP and PCP groups; each PCP group shares a replicated KV cache (a symmetric buffer); every rank publishes
 * its tokens' Main-KV rows (656 bytes) into every replica of its group, then one barrier; each rank then checks that
 * its replica holds every member's rows. The cache is host memory (kvcommMemoryHost) so that the example runs on
 * any machine; an engine passes kvcommMemoryCuda (or Auto), device pointers and its CUDA stream instead. */
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

/* The engine's allgather (any process group works: torch.distributed, NCCL bootstrap, a key-value store). */
static int allgatherOverMpi(const void* send, void* recv, size_t bytes, void* user) {
  MPI_Comm comm = *(MPI_Comm*)user;
  return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm) == MPI_SUCCESS ? 0 : 1;
}

enum { kRowBytes = 656, kTokensPerRank = 8, kBlockSize = 16 };

static unsigned char rowByte(int pcpRank, int token, int b) {
  return (unsigned char)(pcpRank * 131 + token * 17 + b * 7 + 1);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int tp = argc > 1 ? atoi(argv[1]) : (size % 2 == 0 ? 2 : 1);
  if (tp <= 0 || size % tp != 0) {
    if (rank == 0) fprintf(stderr, "tp %d does not divide %d ranks\n", tp, size);
    MPI_Finalize();
    return 2;
  }

  int version = 0;
  CHECK_KV(kvcommGetVersion(&version));
  MPI_Comm world = MPI_COMM_WORLD;
  kvcommComm_t comm = NULL;
  CHECK_KV(kvcommCommInitCallback(&comm, rank, size, allgatherOverMpi, &world));

  kvcommParallelSpec spec = {tp, size / tp, 1, 1};
  kvcommParallelGroups_t layout = NULL;
  kvcommComm_t pcp = NULL;
  kvcommParallelCoord coord;
  CHECK_KV(kvcommParallelGroupsCreate(comm, &spec, &layout));
  CHECK_KV(kvcommParallelGroupsComm(layout, kvcommAxisPCP, &pcp));
  CHECK_KV(kvcommParallelGroupsGetCoord(layout, &coord));
  int pcpRank = 0, pcpSize = 0;
  CHECK_KV(kvcommCommRank(pcp, &pcpRank));
  CHECK_KV(kvcommCommSize(pcp, &pcpSize));

  /* The replicated cache of this PCP group: room for every member's tokens, rounded up to whole blocks. */
  size_t slots = (size_t)pcpSize * kTokensPerRank;
  size_t blocks = (slots + kBlockSize - 1) / kBlockSize;
  size_t cacheBytes = blocks * kBlockSize * kRowBytes;
  kvcommBuffer_t cache = NULL;
  CHECK_KV(kvcommBufferCreate(pcp, cacheBytes * 2, cacheBytes, kvcommMemoryHost, &cache));
  kvcommPublisher_t pub = NULL;
  CHECK_KV(kvcommPublisherCreate(cache, NULL, &pub));

  /* This rank's final rows and their slots (token t of PCP rank p goes to slot t * pcpSize + p; -1 = padding). */
  unsigned char* rows = calloc((size_t)kTokensPerRank + 1, kRowBytes);
  int64_t slotMapping[kTokensPerRank + 1];
  for (int t = 0; t < kTokensPerRank; ++t) {
    for (int b = 0; b < kRowBytes; ++b) rows[(size_t)t * kRowBytes + b] = rowByte(pcpRank, t, b);
    slotMapping[t] = (int64_t)t * pcpSize + pcpRank;
  }
  slotMapping[kTokensPerRank] = -1; /* a padded token: skipped */
  kvcommCacheTensor mainKv;
  CHECK_KV(kvcommCacheTensorInit(&mainKv));
  mainKv.src = rows;
  mainKv.rowBytes = kRowBytes;
  mainKv.blockSize = kBlockSize;
  mainKv.srcBytes = (size_t)(kTokensPerRank + 1) * kRowBytes;
  kvcommSlotMapping mapping = {slotMapping, kvcommSlotInt64, kTokensPerRank + 1};
  /* the rows, then the barrier (one kernel in Direct mode on CUDA): every member's rows are in every replica */
  CHECK_KV(kvcommPublish(pub, &mainKv, 1, &mapping, kTokensPerRank + 1, NULL, kvcommPublishThenBarrier, 0));
  CHECK_KV(kvcommPublisherCheckErrors(pub));

  /* Every member's rows are now in this rank's replica. */
  void* local = NULL;
  CHECK_KV(kvcommBufferLocal(cache, &local));
  const unsigned char* replica = local;
  long wrong = 0;
  for (int p = 0; p < pcpSize; ++p)
    for (int t = 0; t < kTokensPerRank; ++t) {
      size_t slot = (size_t)t * pcpSize + p;
      for (int b = 0; b < kRowBytes; ++b) wrong += replica[slot * kRowBytes + b] != rowByte(p, t, b);
    }
  kvcommPublishMode_t mode;
  CHECK_KV(kvcommPublisherMode(pub, &mode));
  /* kvcommGetVersion encodes MAJOR * 10000 + MINOR * 100 + PATCH, like KVCOMM_VERSION. */
  printf("rank %d (tp %d, pcp %d of %d): kvcomm %d.%d.%d, %s publish, %d rows from %d members, %ld wrong bytes\n", rank,
         coord.tp, pcpRank, pcpSize, version / 10000, version / 100 % 100, version % 100,
         mode == kvcommPublishDirect ? "direct" : "fallback", pcpSize * kTokensPerRank, pcpSize, wrong);

  CHECK_KV(kvcommPublisherDestroy(pub));
  CHECK_KV(kvcommBufferDestroy(cache));
  CHECK_KV(kvcommCommDestroy(pcp));
  CHECK_KV(kvcommParallelGroupsDestroy(layout));
  CHECK_KV(kvcommCommDestroy(comm));
  free(rows);
  long total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
