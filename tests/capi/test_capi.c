/* The C ABI from C11 (-std=c11 -Wall -Wextra -Werror), under mpirun -np 4 on the host backend: callback bootstrap
 * over MPI_Allgather, TCP bootstrap from a unique id, split, layout, symmetric buffer, and publish + barrier (and its
 * split signal/wait) checked byte for byte against an independent oracle (poisoned cache, every replica read through
 * the peer mappings), then bad input: the right result code, a message, and nothing written. The Barrier object and
 * fetch are in test_capi_fetch.c. */
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi_test.h"
#include "kvcomm/kvcomm.h"

int g_rank = -1;
int g_failures = 0;

/* ---- the engine's allgather: MPI ------------------------------------------------------------------------------ */

static int mpiAllgather(const void* send, void* recv, size_t bytes, void* user) {
  MPI_Comm comm = *(MPI_Comm*)user;
  return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm) == MPI_SUCCESS ? 0 : 1;
}

static int failingAllgather(const void* send, void* recv, size_t bytes, void* user) {
  (void)send;
  (void)recv;
  (void)bytes;
  (void)user;
  return 3;
}

/* ---- deterministic data and the oracle ------------------------------------------------------------------------ */

static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

enum { kRanks = 4, kTokens = 13, kSlots = 96, kBlock = 16, kMainRow = 656, kMainSrcStride = 704 };
enum { kKeyRow = 128, kScaleRow = 4, kIdxBlock = kBlock * (kKeyRow + kScaleRow) };
#define MAIN_OFFSET ((size_t)0)
#define IDX_OFFSET ((size_t)128 * 1024)
#define INITIAL_BYTES ((size_t)192 * 1024)
#define GROWN_BYTES ((size_t)320 * 1024)

/* Slot of token i of rank r in round `round`: a permutation of [0, kSlots), -1 for every 4th token (padding). */
static int64_t slotOf(int round, int r, int i) {
  if (i % 4 == 3) return -1;
  int idx = r * kTokens + i;
  /* 37 and kSlots are coprime: a bijection over [0, kSlots). */
  return (int64_t)((idx * 37 + round * 11) % kSlots);
}

static uint8_t byteOf(int round, int r, int tensor, int i, size_t b) {
  return (uint8_t)mix(((uint64_t)round << 48) ^ ((uint64_t)r << 40) ^ ((uint64_t)tensor << 32) ^ ((uint64_t)i << 16) ^
                      b);
}

/* Source rows of rank r (main rows padded to kMainSrcStride: the padding must never be copied). */
static void makeSources(int round, int r, uint8_t* mainSrc, uint8_t* keys, uint8_t* scales) {
  for (int i = 0; i < kTokens; ++i) {
    for (size_t b = 0; b < kMainSrcStride; ++b)
      mainSrc[(size_t)i * kMainSrcStride + b] = b < kMainRow ? byteOf(round, r, 0, i, b) : 0xEE;
    for (size_t b = 0; b < kKeyRow; ++b) keys[(size_t)i * kKeyRow + b] = byteOf(round, r, 1, i, b);
    for (size_t b = 0; b < kScaleRow; ++b) scales[(size_t)i * kScaleRow + b] = byteOf(round, r, 2, i, b);
  }
}

/* The three tensors of one call: Main-KV (656 B rows, blocks of 16), Indexer-K keys and scales (split regions). */
static void describe(kvcommCacheTensor t[3], const uint8_t* mainSrc, const uint8_t* keys, const uint8_t* scales) {
  for (int k = 0; k < 3; ++k) OK(kvcommCacheTensorInit(&t[k]));
  t[0].src = mainSrc;
  t[0].srcStride = kMainSrcStride;
  t[0].rowBytes = kMainRow;
  t[0].offset = MAIN_OFFSET;
  t[0].blockSize = kBlock;
  t[1].src = keys;
  t[1].rowBytes = kKeyRow;
  t[1].offset = IDX_OFFSET;
  t[1].blockSize = kBlock;
  t[1].blockStride = kIdxBlock;
  t[2].src = scales;
  t[2].rowBytes = kScaleRow;
  t[2].offset = IDX_OFFSET + kBlock * kKeyRow;
  t[2].blockSize = kBlock;
  t[2].blockStride = kIdxBlock;
}

/* Independent oracle: the byte image every replica must hold after `rounds` rounds from every rank. */
static void oracleApply(uint8_t* image, int round) {
  for (int r = 0; r < kRanks; ++r)
    for (int i = 0; i < kTokens; ++i) {
      int64_t s = slotOf(round, r, i);
      if (s < 0) continue;
      size_t blk = (size_t)s / kBlock, off = (size_t)s % kBlock;
      for (size_t b = 0; b < kMainRow; ++b)
        image[MAIN_OFFSET + blk * kBlock * kMainRow + off * kMainRow + b] = byteOf(round, r, 0, i, b);
      for (size_t b = 0; b < kKeyRow; ++b)
        image[IDX_OFFSET + blk * kIdxBlock + off * kKeyRow + b] = byteOf(round, r, 1, i, b);
      for (size_t b = 0; b < kScaleRow; ++b)
        image[IDX_OFFSET + blk * kIdxBlock + kBlock * kKeyRow + off * kScaleRow + b] = byteOf(round, r, 2, i, b);
    }
}

/* Every replica (own and peers', through this process's mappings) equals the oracle image. */
static void checkReplicas(kvcommBuffer_t buf, const uint8_t* image, size_t bytes, const char* what) {
  for (int r = 0; r < kRanks; ++r) {
    void* p = NULL;
    OK(kvcommBufferPeer(buf, r, &p));
    const uint8_t* got = (const uint8_t*)p;
    size_t bad = 0, first = 0;
    for (size_t b = 0; b < bytes; ++b)
      if (got[b] != image[b] && bad++ == 0) first = b;
    CHECK(bad == 0, "%s: replica %d differs from the oracle in %zu bytes, first at %zu (got 0x%02x, want 0x%02x)", what,
          r, bad, first, got[first], image[first]);
  }
}

/* ---- test sections -------------------------------------------------------------------------------------------- */

static void testBasics(void) {
  int v = 0;
  OK(kvcommGetVersion(&v));
  CHECK(v == KVCOMM_VERSION, "run-time version %d, headers %d", v, KVCOMM_VERSION);
  for (int r = 0; r < kvcommNumResults; ++r)
    CHECK(strcmp(kvcommGetErrorString((kvcommResult_t)r), "Unknown") != 0, "result %d has no name", r);
  CHECK(strcmp(kvcommGetErrorString(kvcommInvalidArgument), "InvalidArgument") == 0, "name");
  CHECK(strcmp(kvcommGetErrorString((kvcommResult_t)42), "Unknown") == 0, "unknown result");
  FAILS(kvcommGetVersion(NULL), kvcommInvalidArgument, "version");
  FAILS(kvcommCommRank(NULL, &v), kvcommInvalidArgument, "comm is NULL");
  kvcommUniqueId id;
  FAILS(kvcommUniqueIdFromString("zz", &id), kvcommInvalidArgument, "hex characters");
  kvcommParallelSpec spec = {2, 2, 1, 1};
  kvcommParallelCoord c;
  OK(kvcommParallelCoordOf(&spec, 3, &c));
  CHECK(c.tp == 1 && c.pcp == 1, "coordOf(3) = tp %d pcp %d", c.tp, c.pcp);
  FAILS(kvcommParallelCoordOf(&spec, 4, &c), kvcommInvalidArgument, "outside");
  int ranks[4], n = 0;
  OK(kvcommParallelGroupOf(&spec, 1, kvcommAxisPCP, ranks, 4, &n));
  CHECK(n == 2 && ranks[0] == 1 && ranks[1] == 3, "PCP group of 1: n %d {%d,%d}", n, ranks[0], ranks[1]);
  FAILS(kvcommParallelGroupOf(&spec, 1, (kvcommAxis_t)9, ranks, 4, &n), kvcommInvalidArgument, "axis");
  /* 3 * 1431655766 = 2^32 + 2: an int product would wrap to a 2-rank world. */
  kvcommParallelSpec wraps = {3, 1431655766, 1, 1};
  FAILS(kvcommParallelCoordOf(&wraps, 1, &c), kvcommInvalidArgument, "exceeds INT_MAX");
  FAILS(kvcommParallelGroupOf(&wraps, 1, kvcommAxisTP, ranks, 4, &n), kvcommInvalidArgument, "exceeds INT_MAX");
  int rank = -1;
  c.tp = 1;
  c.pcp = 0;
  OK(kvcommParallelRankOf(&spec, &c, &rank));
  CHECK(rank == 1, "rankOf(tp1, pcp0) = %d", rank);
  /* Stricter than C++ useLocalDevice (negative = 0): refused before any device is touched (docs/c-api.md). */
  int dev = 7;
  FAILS(kvcommUseLocalDevice(-1, &dev), kvcommInvalidArgument, "localRank -1 is negative");
  CHECK(dev == 7, "a refused kvcommUseLocalDevice wrote *device = %d", dev);
}

static kvcommComm_t testCallbackBootstrap(int rank, int size) {
  MPI_Comm world = MPI_COMM_WORLD;
  kvcommComm_t comm = NULL;
  FAILS(kvcommCommInitCallback(&comm, rank, size, failingAllgather, NULL), kvcommRemoteError, "returned 3");
  CHECK(comm == NULL, "a failed init must not hand out a handle");
  FAILS(kvcommCommInitCallback(&comm, rank, size, NULL, NULL), kvcommInvalidArgument, "allgather is NULL");
  OK(kvcommCommInitCallback(&comm, rank, size, mpiAllgather, &world));
  int r = -1, s = -1;
  OK(kvcommCommRank(comm, &r));
  OK(kvcommCommSize(comm, &s));
  CHECK(r == rank && s == size, "rank %d size %d", r, s);
  int hosts = 0;
  OK(kvcommCommNumHosts(comm, &hosts));
  CHECK(hosts == 1, "one host expected, got %d", hosts);
  kvcommMemberInfo info;
  OK(kvcommCommMember(comm, (rank + 1) % size, &info));
  CHECK(info.rank == (rank + 1) % size && info.localSize == size && info.hostname[0] != '\0', "member info");
  FAILS(kvcommCommMember(comm, size, &info), kvcommInvalidArgument, "outside");
  int same = 0;
  OK(kvcommCommSameHost(comm, 0, size - 1, &same));
  CHECK(same == 1, "same host");
  size_t needed = 0;
  OK(kvcommCommTopologyString(comm, NULL, 0, &needed));
  char* text = (char*)malloc(needed);
  OK(kvcommCommTopologyString(comm, text, needed, NULL));
  CHECK(strlen(text) + 1 == needed, "topology text length");
  free(text);
  return comm;
}

static void testCollectives(kvcommComm_t world, int rank, int size) {
  int all[kRanks];
  all[rank] = 100 + rank;
  OK(kvcommCommAllgather(world, all, sizeof(int)));
  for (int r = 0; r < size; ++r) CHECK(all[r] == 100 + r, "allgather[%d] = %d", r, all[r]);
  OK(kvcommCommBarrier(world));

  /* Split: even/odd, reversed by key. */
  kvcommComm_t half = NULL;
  OK(kvcommCommSplit(world, rank % 2, -rank, &half));
  int hr = -1, hs = -1, wr = -1;
  OK(kvcommCommRank(half, &hr));
  OK(kvcommCommSize(half, &hs));
  CHECK(hs == size / 2, "split size %d", hs);
  int expect = rank >= 2 ? 0 : 1; /* keys -rank: the higher world rank comes first */
  CHECK(hr == expect, "split rank %d, expected %d", hr, expect);
  OK(kvcommCommWorldRank(half, 0, &wr));
  CHECK(wr == (rank % 2) + 2, "split rank 0 is world %d", wr);
  kvcommComm_t none = (kvcommComm_t)1;
  OK(kvcommCommSplit(world, rank == 0 ? -1 : 1, 0, &none));
  CHECK((rank == 0) == (none == NULL), "negative color gets no communicator");
  OK(kvcommCommDestroy(none));
  OK(kvcommCommDestroy(half));

  /* TCP bootstrap: rank 0 makes the id, the callback world hands it out. */
  kvcommUniqueId ids[kRanks];
  memset(ids, 0, sizeof(ids));
  if (rank == 0) OK(kvcommGetUniqueId(&ids[0], NULL));
  OK(kvcommCommAllgather(world, ids, sizeof(kvcommUniqueId)));
  char text[KVCOMM_UNIQUE_ID_STRING_LEN + 1];
  OK(kvcommUniqueIdToString(&ids[0], text, sizeof(text)));
  FAILS(kvcommUniqueIdToString(&ids[0], text, 10), kvcommInvalidArgument, "textBytes");
  kvcommUniqueId parsed;
  OK(kvcommUniqueIdFromString(text, &parsed));
  CHECK(memcmp(&parsed, &ids[0], sizeof(parsed)) == 0, "id text round trip");
  kvcommComm_t tcp = NULL;
  OK(kvcommCommInitTcp(&tcp, &parsed, rank, size, 60000));
  int tr = -1;
  OK(kvcommCommRank(tcp, &tr));
  CHECK(tr == rank, "tcp rank %d", tr);
  int64_t vals[kRanks];
  vals[rank] = (int64_t)rank * 1000003;
  OK(kvcommCommAllgather(tcp, vals, sizeof(int64_t)));
  for (int r = 0; r < size; ++r) CHECK(vals[r] == (int64_t)r * 1000003, "tcp allgather[%d]", r);
  /* Point to point on the TCP world: a ring. */
  int token = rank * 7, got = -1;
  OK(kvcommCommSend(tcp, &token, sizeof(token), (rank + 1) % size, 5));
  OK(kvcommCommRecv(tcp, &got, sizeof(got), (rank + size - 1) % size, 5));
  CHECK(got == ((rank + size - 1) % size) * 7, "ring recv %d", got);
  /* Health and abort: healthy while every member lives; after an abort (local) every call returns kvcommAborted. */
  int healthy = -1, failed = -2;
  OK(kvcommCommHealth(tcp, &healthy, &failed));
  CHECK(healthy == 1 && failed == -1, "health %d, failed rank %d", healthy, failed);
  kvcommComm_t doomed = NULL;
  OK(kvcommCommSplit(tcp, 0, rank, &doomed));
  OK(kvcommCommAbort(doomed));
  OK(kvcommCommHealth(doomed, &healthy, NULL));
  CHECK(healthy == 0, "an aborted communicator says it is healthy");
  FAILS(kvcommCommBarrier(doomed), kvcommAborted, "aborted");
  OK(kvcommCommDestroy(doomed));
  OK(kvcommCommBarrier(tcp)); /* the parent is not aborted */
  OK(kvcommCommDestroy(tcp));
}

static void testParallelGroups(kvcommComm_t world, int rank) {
  kvcommParallelSpec bad = {3, 1, 1, 1};
  kvcommParallelGroups_t layout = NULL;
  FAILS(kvcommParallelGroupsCreate(world, &bad, &layout), kvcommInvalidArgument, "");
  /* 4 * 1073741825 = 2^32 + 4 wraps to this 4-rank world in int arithmetic. */
  kvcommParallelSpec wraps = {4, 1073741825, 1, 1};
  FAILS(kvcommParallelGroupsCreate(world, &wraps, &layout), kvcommInvalidArgument, "exceeds INT_MAX");
  CHECK(layout == NULL, "a refused layout must not hand out a handle");
  kvcommParallelSpec spec = {2, 2, 1, 1};
  OK(kvcommParallelGroupsCreate(world, &spec, &layout));
  kvcommParallelCoord c;
  OK(kvcommParallelGroupsGetCoord(layout, &c));
  CHECK(c.tp == rank % 2 && c.pcp == rank / 2 && c.pp == 0 && c.dp == 0, "coords of %d", rank);
  const kvcommAxis_t axes[2] = {kvcommAxisTP, kvcommAxisPCP};
  for (int a = 0; a < 2; ++a) {
    kvcommComm_t g = NULL;
    OK(kvcommParallelGroupsComm(layout, axes[a], &g));
    int gr = -1, gs = -1, expected[4], n = 0;
    OK(kvcommCommRank(g, &gr));
    OK(kvcommCommSize(g, &gs));
    OK(kvcommParallelGroupOf(&spec, rank, axes[a], expected, 4, &n));
    CHECK(gs == n && gs == 2, "axis %d size %d", a, gs);
    CHECK(gr == (a == 0 ? c.tp : c.pcp), "axis %d rank %d", a, gr);
    for (int i = 0; i < gs; ++i) {
      int w = -1;
      OK(kvcommCommWorldRank(g, i, &w));
      CHECK(w == expected[i], "axis %d member %d is world %d, expected %d", a, i, w, expected[i]);
    }
    OK(kvcommCommDestroy(g));
  }
  FAILS(kvcommParallelGroupsComm(layout, (kvcommAxis_t)7, NULL), kvcommInvalidArgument, "NULL");
  OK(kvcommParallelGroupsDestroy(layout));
}

static void testPublish(kvcommComm_t world, int rank, int size) {
  kvcommBuffer_t buf = NULL;
  FAILS(kvcommBufferCreate(world, 1 << 20, INITIAL_BYTES, (kvcommMemoryKind_t)5, &buf), kvcommInvalidArgument, "kind");
  OK(kvcommBufferCreate(world, (size_t)1 << 20, INITIAL_BYTES, kvcommMemoryHost, &buf));
  kvcommMemoryKind_t kind;
  OK(kvcommBufferKind(buf, &kind));
  CHECK(kind == kvcommMemoryHost, "kind %d", (int)kind);
  size_t mapped = 0, gran = 0, cap = 0;
  OK(kvcommBufferMappedBytes(buf, &mapped));
  OK(kvcommBufferGranularity(buf, &gran));
  OK(kvcommBufferCapacity(buf, &cap));
  CHECK(mapped >= INITIAL_BYTES && cap == (size_t)1 << 20 && gran > 0, "mapped %zu cap %zu", mapped, cap);
  char handleType[32];
  OK(kvcommBufferHandleType(buf, handleType, sizeof(handleType), NULL));
  CHECK(strcmp(handleType, "memfd") == 0, "handle type %s", handleType);

  /* Grow: addresses stay, generation moves, the peer table and bitmap follow. */
  void* before = NULL;
  OK(kvcommBufferLocal(buf, &before));
  uint64_t gen0 = 0, gen1 = 0;
  OK(kvcommBufferGeneration(buf, &gen0));
  OK(kvcommBufferGrow(buf, GROWN_BYTES));
  OK(kvcommBufferGeneration(buf, &gen1));
  void* after = NULL;
  OK(kvcommBufferLocal(buf, &after));
  CHECK(before == after && gen1 > gen0, "grow moved the base or kept the generation");
  OK(kvcommBufferMappedBytes(buf, &mapped));
  CHECK(mapped >= GROWN_BYTES, "mapped %zu after grow", mapped);
  const uint64_t* table = NULL;
  const uint64_t* bitmap = NULL;
  OK(kvcommBufferPeerTable(buf, &table));
  OK(kvcommBufferBackedBitmap(buf, &bitmap));
  for (int r = 0; r < size; ++r) {
    void* p = NULL;
    int m = 0;
    OK(kvcommBufferPeer(buf, r, &p));
    OK(kvcommBufferIsMapped(buf, r, &m));
    CHECK(m == 1 && p != NULL && table[r] == (uint64_t)(uintptr_t)p, "peer %d: table 0x%llx, peer %p", r,
          (unsigned long long)table[r], p);
  }
  size_t granules = mapped / gran;
  for (size_t g = 0; g < granules + 2; ++g) {
    int bit = (int)((bitmap[g / 64] >> (g % 64)) & 1u);
    CHECK(bit == (g < granules), "bitmap bit %zu = %d", g, bit);
  }
  kvcommRange ranges[4];
  size_t nranges = 0;
  OK(kvcommBufferBackedRanges(buf, ranges, 4, &nranges));
  CHECK(nranges == 1 && ranges[0].offset == 0 && ranges[0].bytes == mapped, "backed ranges");
  int backed = 1;
  OK(kvcommBufferIsBacked(buf, mapped - 8, 16, &backed));
  CHECK(backed == 0, "bytes past the mapped prefix are not backed");
  backed = 1;
  OK(kvcommBufferIsBacked(buf, 4096, SIZE_MAX - 100, &backed));
  CHECK(backed == 0, "a length that wraps offset + bytes round to 3995 is not backed");
  FAILS(kvcommBufferCommit(buf, ranges, 1), kvcommInvalidArgument, "");

  /* Poison every replica (each rank its own), then two publish rounds. */
  void* local = NULL;
  OK(kvcommBufferLocal(buf, &local));
  memset(local, 0xA5, mapped);
  OK(kvcommCommBarrier(world));
  kvcommPublisherOptions opts;
  OK(kvcommPublisherOptionsInit(&opts));
  CHECK(opts.lanes == 2 && opts.stagingTokens > 0, "default options");
  opts.barrierTimeoutMs = 60000;
  kvcommPublisher_t pub = NULL;
  OK(kvcommPublisherCreate(buf, &opts, &pub));
  kvcommBarrier_t pbar = NULL; /* the publisher's barrier: a new handle, destroyed on its own */
  OK(kvcommPublisherBarrier(pub, &pbar));
  FAILS(kvcommPublisherBarrier(pub, NULL), kvcommInvalidArgument, "barrier");
  kvcommPublishMode_t mode;
  const char* reason = NULL;
  OK(kvcommPublisherMode(pub, &mode));
  OK(kvcommPublisherModeReason(pub, &reason));
  CHECK(reason != NULL && reason[0] != '\0', "mode reason");
  if (rank == 0) printf("publisher mode: %s (%s)\n", mode == kvcommPublishDirect ? "direct" : "fallback", reason);

  uint8_t* image = (uint8_t*)malloc(mapped);
  memset(image, 0xA5, mapped);
  uint8_t* mainSrc = (uint8_t*)malloc((size_t)kTokens * kMainSrcStride);
  uint8_t keys[kTokens * kKeyRow], scales[kTokens * kScaleRow];
  kvcommCacheTensor t[3];

  /* Round 0: int64 slots, publish then barrier. */
  int64_t slots64[kTokens];
  for (int i = 0; i < kTokens; ++i) slots64[i] = slotOf(0, rank, i);
  makeSources(0, rank, mainSrc, keys, scales);
  describe(t, mainSrc, keys, scales);
  OK(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){slots64, kvcommSlotInt64, kTokens}, kTokens, NULL,
                   kvcommPublishThenNothing, 0));
  OK(kvcommBarrierSync(pbar, NULL, 0));
  oracleApply(image, 0);
  checkReplicas(buf, image, mapped, "round 0 (int64, publish + barrier)");
  OK(kvcommCommBarrier(world)); /* everyone read before round 1 overwrites */

  /* Round 1: int32 slots, fused publish + barrier on lane 1. */
  int32_t slots32[kTokens];
  for (int i = 0; i < kTokens; ++i) slots32[i] = (int32_t)slotOf(1, rank, i);
  makeSources(1, rank, mainSrc, keys, scales);
  describe(t, mainSrc, keys, scales);
  OK(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){slots32, kvcommSlotInt32, kTokens}, kTokens, NULL,
                   kvcommPublishThenBarrier, 1));
  oracleApply(image, 1);
  checkReplicas(buf, image, mapped, "round 1 (int32, publish then barrier, fused)");
  OK(kvcommCommBarrier(world));

  /* Round 3: int64 slots, publish then the split barrier (signal right after the stores, wait before the reads). */
  for (int i = 0; i < kTokens; ++i) slots64[i] = slotOf(3, rank, i);
  makeSources(3, rank, mainSrc, keys, scales);
  describe(t, mainSrc, keys, scales);
  OK(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){slots64, kvcommSlotInt64, kTokens}, kTokens, NULL,
                   kvcommPublishThenNothing, 0));
  OK(kvcommBarrierSignal(pbar, NULL, 0));
  OK(kvcommBarrierWait(pbar, NULL, 0));
  oracleApply(image, 3);
  checkReplicas(buf, image, mapped, "round 3 (publish + signal/wait)");
  OK(kvcommCommBarrier(world));

  /* Round 4: int32 slots, the fused publish + signal on lane 1, then the wait. */
  for (int i = 0; i < kTokens; ++i) slots32[i] = (int32_t)slotOf(4, rank, i);
  makeSources(4, rank, mainSrc, keys, scales);
  describe(t, mainSrc, keys, scales);
  OK(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){slots32, kvcommSlotInt32, kTokens}, kTokens, NULL,
                   kvcommPublishThenSignal, 1));
  OK(kvcommBarrierWait(pbar, NULL, 1));
  oracleApply(image, 4);
  checkReplicas(buf, image, mapped, "round 4 (int32, publish then signal, fused, + wait)");
  FAILS(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){slots32, kvcommSlotInt32, kTokens}, kTokens, NULL,
                      kvcommPublishThenSignal, 7),
        kvcommInvalidArgument, "lane");
  FAILS(kvcommBarrierSignal(pbar, NULL, 2), kvcommInvalidArgument, "lane");
  FAILS(kvcommBarrierWait(NULL, NULL, 0), kvcommInvalidArgument, "barrier");
  FAILS(kvcommPublisherBarrier(NULL, &pbar), kvcommInvalidArgument, "publisher");
  kvcommDeviceError derr;
  OK(kvcommPublisherPollError(pub, &derr));
  CHECK(derr.kind == kvcommDeviceErrorNone, "device error %d", (int)derr.kind);
  OK(kvcommPublisherCheckErrors(pub));
  OK(kvcommCommBarrier(world));

  /* Bad input: the right code and message, and not one byte written anywhere. */
  makeSources(2, rank, mainSrc, keys, scales);
  describe(t, mainSrc, keys, scales);
  int64_t badSlots[kTokens];
  for (int i = 0; i < kTokens; ++i) badSlots[i] = slotOf(2, rank, i);
  badSlots[kTokens - 1] = (int64_t)1 << 40; /* the last token lands far outside the buffer */
  FAILS(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){badSlots, kvcommSlotInt64, kTokens}, kTokens, NULL,
                      kvcommPublishThenNothing, 0),
        kvcommInvalidArgument, "slot");
  FAILS(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){slots64, (kvcommSlotType_t)9, kTokens}, kTokens, NULL,
                      kvcommPublishThenNothing, 0),
        kvcommInvalidArgument, "slots->type 9");
  FAILS(kvcommPublish(pub, NULL, 0, &(kvcommSlotMapping){slots64, kvcommSlotInt64, kTokens}, kTokens, NULL,
                      kvcommPublishThenNothing, 0),
        kvcommInvalidArgument, "numTensors");
  FAILS(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){NULL, kvcommSlotInt64, kTokens}, kTokens, NULL,
                      kvcommPublishThenNothing, 0),
        kvcommInvalidArgument, "slotMapping");
  FAILS(kvcommPublish(pub, t, 3, NULL, kTokens, NULL, kvcommPublishThenNothing, 0), kvcommInvalidArgument, "slots");
  FAILS(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){slots64, kvcommSlotInt64, kTokens - 1}, kTokens, NULL,
                      kvcommPublishThenNothing, 0),
        kvcommInvalidArgument, "exceeds the slot mapping");
  FAILS(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){slots64, kvcommSlotInt64, kTokens}, kTokens, NULL,
                      (kvcommPublishThen_t)5, 0),
        kvcommInvalidArgument, "then 5");
  FAILS(kvcommBarrierSync(pbar, NULL, 5), kvcommInvalidArgument, "lane");
  FAILS(kvcommPublish(pub, t, 3, &(kvcommSlotMapping){slots64, kvcommSlotInt64, kTokens}, kTokens, NULL,
                      kvcommPublishThenBarrier, -1),
        kvcommInvalidArgument, "lane");
  kvcommCacheTensor broken = t[0];
  broken.rowBytes = 0;
  FAILS(kvcommPublish(pub, &broken, 1, &(kvcommSlotMapping){slots64, kvcommSlotInt64, kTokens}, kTokens, NULL,
                      kvcommPublishThenNothing, 0),
        kvcommInvalidArgument, "rowBytes");
  broken = t[0];
  broken.offset = mapped; /* beyond the backed range */
  FAILS(kvcommPublish(pub, &broken, 1, &(kvcommSlotMapping){slots64, kvcommSlotInt64, kTokens}, kTokens, NULL,
                      kvcommPublishThenNothing, 0),
        kvcommInvalidArgument, "backed");
  broken = t[0];
  broken.blockSize = 0;
  FAILS(kvcommPublish(pub, &broken, 1, &(kvcommSlotMapping){slots64, kvcommSlotInt64, kTokens}, kTokens, NULL,
                      kvcommPublishThenNothing, 0),
        kvcommInvalidArgument, "blockSize");
  FAILS(kvcommPublisherCreate(NULL, NULL, &pub), kvcommInvalidArgument, "buffer");
  OK(kvcommCommBarrier(world));
  checkReplicas(buf, image, mapped, "after refused calls");

  /* Handles outlive each other in any order: the publisher keeps the buffer's memory. */
  kvcommComm_t group = NULL;
  OK(kvcommBufferComm(buf, &group));
  int gs = 0;
  OK(kvcommCommSize(group, &gs));
  CHECK(gs == size, "buffer group size %d", gs);
  OK(kvcommCommDestroy(group));
  OK(kvcommBufferDestroy(buf));
  OK(kvcommBarrierSync(pbar, NULL, 0));
  OK(kvcommPublisherDestroy(pub));
  OK(kvcommBarrierSync(pbar, NULL, 0)); /* the barrier's handle keeps the publisher's barrier */
  OK(kvcommBarrierDestroy(pbar));
  free(mainSrc);
  free(image);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  g_rank = rank;
  if (size != kRanks) {
    if (rank == 0) fprintf(stderr, "test_capi needs exactly %d ranks (got %d)\n", kRanks, size);
    MPI_Finalize();
    return 2;
  }
  testBasics();
  kvcommComm_t world = testCallbackBootstrap(rank, size);
  testCollectives(world, rank, size);
  testParallelGroups(world, rank);
  testPublish(world, rank, size);
  testBarrier(world, rank, size);
  testFetch(world, rank, size);
  OK(kvcommCommDestroy(world));

  int total = 0;
  MPI_Allreduce(&g_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("test_capi: %s (%d failed checks over %d ranks)\n", total ? "FAILED" : "passed", total, size);
  MPI_Finalize();
  return total ? 1 : 0;
}
