/* The Barrier object and fetch through the C ABI, 4 ranks on the host backend.
 *
 * Barrier: signal/wait order stores made through the peer mappings (each rank writes a stamp into every peer, signals,
 * waits, then reads every stamp), the fused form, lanes, the device handle query, bad lanes.
 *
 * Fetch: every rank registers its own layout (two regions, different offsets, strides and block counts per rank, with
 * guard bytes between blocks) over a buffer whose every byte has a known value; fetches from three sources (itself
 * included) through kvcommFetch, a reused plan, kvcommFetchDevice, a polled kvcommFetchStart (also paced, seen in
 * progress) and the collective kvcommFetchAll are each compared with an independent per-block oracle over the whole
 * buffer (guards, untouched blocks and the other region included). Bad input (an id outside the layout, a duplicate
 * destination, a bad path or rank, a stale plan after grow) returns the right code and message and writes nothing.
 * Source blocks are [0, kSrcBlocks) and destinations [kSrcBlocks, ...): no rank ever writes what another reads. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capi_test.h"

/* ---- barrier -------------------------------------------------------------------------------------------------- */

void testBarrier(kvcommComm_t world, int rank, int size) {
  kvcommBarrierOptions o;
  OK(kvcommBarrierOptionsInit(&o));
  CHECK(o.lanes == 2 && o.timeoutMs < 0 && o.kind == kvcommMemoryAuto, "defaults: lanes %d timeout %lld kind %d",
        o.lanes, (long long)o.timeoutMs, (int)o.kind);
  o.kind = kvcommMemoryHost;
  o.lanes = 3;
  o.timeoutMs = 60000;
  kvcommBarrier_t bar = NULL;
  o.lanes = 9;
  FAILS(kvcommBarrierCreate(world, &o, &bar), kvcommInvalidArgument, "lanes");
  CHECK(bar == NULL, "a failed create must not hand out a handle");
  o.lanes = 3;
  OK(kvcommBarrierCreate(world, &o, &bar));
  int lanes = 0;
  kvcommMemoryKind_t kind = kvcommMemoryAuto;
  OK(kvcommBarrierLanes(bar, &lanes));
  OK(kvcommBarrierKind(bar, &kind));
  CHECK(lanes == 3 && kind == kvcommMemoryHost, "lanes %d kind %d", lanes, (int)kind);
  kvcommComm_t group = NULL;
  int gs = 0;
  OK(kvcommBarrierComm(bar, &group));
  OK(kvcommCommSize(group, &gs));
  CHECK(gs == size, "barrier group size %d", gs);
  OK(kvcommCommDestroy(group));
  size_t needed = 0;
  OK(kvcommBarrierDeviceHandle(bar, NULL, 0, &needed));
  CHECK(needed > 0 && needed < 4096, "device handle of %zu bytes", needed);
  unsigned char small[8];
  FAILS(kvcommBarrierDeviceHandle(bar, small, sizeof(small), NULL), kvcommInvalidArgument, "handleBytes");
  unsigned char* handle = (unsigned char*)malloc(needed);
  OK(kvcommBarrierDeviceHandle(bar, handle, needed, NULL));
  free(handle);

  /* Stores into every peer's memory, ordered by signal/wait on lane 2 (and by Sync on lane 0 for the next round). */
  kvcommBuffer_t buf = NULL;
  OK(kvcommBufferCreate(world, 64 * 1024, 64 * 1024, kvcommMemoryHost, &buf));
  for (int round = 1; round <= 3; ++round) {
    for (int r = 0; r < size; ++r) {
      void* p = NULL;
      OK(kvcommBufferPeer(buf, r, &p));
      ((volatile int64_t*)p)[rank] = (int64_t)round * 1000 + rank;
    }
    if (round == 2) {
      OK(kvcommBarrierSync(bar, NULL, 1));
    } else {
      OK(kvcommBarrierSignal(bar, NULL, 2));
      OK(kvcommBarrierWait(bar, NULL, 2));
    }
    void* mine = NULL;
    OK(kvcommBufferLocal(buf, &mine));
    for (int r = 0; r < size; ++r)
      CHECK(((volatile int64_t*)mine)[r] == (int64_t)round * 1000 + r, "round %d: stamp of rank %d is %lld", round, r,
            (long long)((volatile int64_t*)mine)[r]);
    OK(kvcommBarrierSync(bar, NULL, 0)); /* everyone read before the next round overwrites */
  }
  FAILS(kvcommBarrierSync(bar, NULL, 3), kvcommInvalidArgument, "lane");
  FAILS(kvcommBarrierSignal(bar, NULL, -1), kvcommInvalidArgument, "lane");
  FAILS(kvcommBarrierWait(NULL, NULL, 0), kvcommInvalidArgument, "barrier");
  kvcommDeviceError e;
  OK(kvcommBarrierPollError(bar, &e));
  CHECK(e.kind == kvcommDeviceErrorNone, "device error %d", (int)e.kind);
  OK(kvcommBarrierCheckErrors(bar));
  OK(kvcommBufferDestroy(buf));
  OK(kvcommBarrierDestroy(bar));
  OK(kvcommBarrierDestroy(NULL));
}

/* ---- fetch: data, layouts and the oracle ---------------------------------------------------------------------- */

enum { kRegions = 2, kSrcBlocks = 16, kDstEnd = 56, kMaxPairs = 64 };
static const size_t kBlockBytes[kRegions] = {96, 200};
#define FETCH_CAPACITY ((size_t)1 << 20)
#define FETCH_INITIAL ((size_t)192 * 1024)

static uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Rank r's layout: offsets, strides (guards of 16..80 bytes between blocks) and block counts differ per rank. */
static void layoutOf(int r, kvcommKvRegion regions[kRegions]) {
  regions[0].offset = 4096 + (size_t)r * 64;
  regions[0].blockBytes = kBlockBytes[0];
  regions[0].blockStride = kBlockBytes[0] + 16 + (size_t)r * 16;
  regions[0].numBlocks = kDstEnd + (size_t)r;
  regions[1].offset = 64 * 1024 + (size_t)r * 256;
  regions[1].blockBytes = kBlockBytes[1];
  regions[1].blockStride = kBlockBytes[1] + 24 + (size_t)r * 8;
  regions[1].numBlocks = kDstEnd + (size_t)r;
}

/* Content of block b of region j on rank r at the start (ids are never rewritten on a source: sources stay put). */
static uint8_t blockByte(int r, int j, int64_t b, size_t i) {
  return (uint8_t)mix64(((uint64_t)r << 56) ^ ((uint64_t)j << 48) ^ ((uint64_t)b << 24) ^ i);
}

/* Every byte of rank `rank`'s buffer image: its blocks, and a guard pattern everywhere else. */
static void initialImage(int rank, uint8_t* image, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) image[i] = (uint8_t)(0xC0 ^ rank ^ (i * 7));
  kvcommKvRegion l[kRegions];
  layoutOf(rank, l);
  for (int j = 0; j < kRegions; ++j)
    for (size_t b = 0; b < l[j].numBlocks; ++b)
      for (size_t i = 0; i < l[j].blockBytes; ++i)
        image[l[j].offset + b * l[j].blockStride + i] = blockByte(rank, j, (int64_t)b, i);
}

/* The oracle: source block s of rank src (as it was at the start) lands in destination block d of `rank`, region by
 * region; -1 on either side skips the pair. */
static void oracleFetch(uint8_t* image, int rank, const kvcommFetchRequest* req, size_t n) {
  kvcommKvRegion l[kRegions];
  layoutOf(rank, l);
  for (size_t k = 0; k < n; ++k)
    for (size_t p = 0; p < req[k].count; ++p) {
      int64_t s = req[k].srcBlocks[p], d = req[k].dstBlocks[p];
      if (s == -1 || d == -1) continue;
      for (int j = 0; j < kRegions; ++j)
        for (size_t i = 0; i < l[j].blockBytes; ++i)
          image[l[j].offset + (size_t)d * l[j].blockStride + i] = blockByte(req[k].srcRank, j, s, i);
    }
}

static void checkImage(kvcommBuffer_t buf, const uint8_t* image, size_t bytes, const char* what) {
  void* p = NULL;
  OK(kvcommBufferLocal(buf, &p));
  const uint8_t* got = (const uint8_t*)p;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < bytes; ++i)
    if (got[i] != image[i] && bad++ == 0) first = i;
  CHECK(bad == 0, "%s: %zu bytes differ from the oracle, first at %zu (got 0x%02x, want 0x%02x)", what, bad, first,
        got[first], image[first]);
}

/* A batch of pairs from three sources (itself, the next rank, the one after): runs of consecutive ids (coalesced),
 * scattered ids and -1 padding on either side; destinations unique, all in [kSrcBlocks, kDstEnd), shifted by
 * `round`. */
typedef struct {
  int64_t src[3][kMaxPairs];
  int64_t dst[3][kMaxPairs];
  kvcommFetchRequest req[3];
} Batch;

static void makeBatch(Batch* b, int rank, int size, int round) {
  uint64_t seed = mix64((uint64_t)round * 977 + (uint64_t)rank);
  int next = kSrcBlocks + round % 5; /* next free destination */
  for (int k = 0; k < 3; ++k) {
    size_t n = 0;
    int src = (rank + k) % size;
    int first = (int)(mix64(seed + (uint64_t)k) % 8);
    for (int i = 0; i < 4; ++i) { /* a run: 4 consecutive on both sides */
      b->src[k][n] = first + i;
      b->dst[k][n++] = next++;
    }
    for (int i = 0; i < 3; ++i) { /* scattered, each pair its own run */
      b->src[k][n] = (int64_t)(mix64(seed ^ (uint64_t)(k * 31 + i)) % kSrcBlocks);
      b->dst[k][n++] = next;
      next += 2;
    }
    b->src[k][n] = -1;            /* padding on either side */
    b->dst[k][n++] = kDstEnd - 1; /* above every real destination (at most kSrcBlocks + 4 + 30) */
    b->src[k][n] = 3;
    b->dst[k][n++] = -1;
    b->req[k].srcRank = src;
    b->req[k].srcBlocks = b->src[k];
    b->req[k].dstBlocks = b->dst[k];
    b->req[k].count = n;
    b->req[k].srcLayoutHash = 0;
  }
}

static size_t pairsOf(const kvcommFetchRequest* r, size_t n, size_t* skipped) {
  size_t all = 0;
  *skipped = 0;
  for (size_t k = 0; k < n; ++k)
    for (size_t i = 0; i < r[k].count; ++i) {
      ++all;
      *skipped += r[k].srcBlocks[i] == -1 || r[k].dstBlocks[i] == -1;
    }
  return all;
}

static const size_t kPairBytes = 96 + 200; /* one block pair over both regions */

/* ---- fetch ---------------------------------------------------------------------------------------------------- */

static void testFetchCreate(kvcommComm_t world, kvcommBuffer_t buf, int rank) {
  /* A layout whose region 1 has another blockBytes on rank 1 is refused on every rank, naming rank 1. */
  kvcommKvRegion l[kRegions];
  layoutOf(rank, l);
  if (rank == 1) l[1].blockBytes = 208;
  kvcommFetcher_t f = NULL;
  FAILS(kvcommFetcherCreate(buf, l, kRegions, 0, NULL, &f), kvcommInvalidArgument, "rank 1");
  CHECK(f == NULL, "a failed create must not hand out a handle");
  /* A region beyond the backed part, on rank 2 only: every rank refuses. */
  layoutOf(rank, l);
  if (rank == 2) l[1].offset = FETCH_INITIAL + 4096;
  FAILS(kvcommFetcherCreate(buf, l, kRegions, 0, NULL, &f), kvcommInvalidArgument, "backed");
  /* No regions on rank 3 (NULL): every rank refuses together, nobody is left waiting. */
  layoutOf(rank, l);
  FAILS(kvcommFetcherCreate(buf, rank == 3 ? NULL : l, kRegions, 0, NULL, &f), kvcommInvalidArgument, "regions");
  OK(kvcommCommBarrier(world));
}

void testFetch(kvcommComm_t world, int rank, int size) {
  CHECK(strcmp(kvcommFetchPathName(kvcommFetchPathCopyEngine), "copy") == 0, "path name");
  CHECK(strcmp(kvcommFetchPathName((kvcommFetchPath_t)17), "unknown") == 0, "unknown path name");
  kvcommFetcherOptions fo;
  kvcommFetchOptions opt;
  OK(kvcommFetcherOptionsInit(&fo));
  OK(kvcommFetchOptionsInit(&opt));
  CHECK(fo.lanes == 1 && fo.barrierTimeoutMs < 0, "fetcher defaults");
  CHECK(opt.path == kvcommFetchPathAuto && opt.copyEngineMinRunBytes == 0 && opt.maxBytesPerSecond == 0,
        "fetch defaults");
  fo.barrierTimeoutMs = 60000;

  kvcommBuffer_t buf = NULL;
  OK(kvcommBufferCreate(world, FETCH_CAPACITY, FETCH_INITIAL, kvcommMemoryHost, &buf));
  size_t mapped = 0;
  OK(kvcommBufferMappedBytes(buf, &mapped));
  uint8_t* image = (uint8_t*)malloc(mapped);
  void* local = NULL;
  OK(kvcommBufferLocal(buf, &local));
  initialImage(rank, image, mapped);
  memcpy(local, image, mapped);
  testFetchCreate(world, buf, rank);

  kvcommKvRegion mine[kRegions];
  layoutOf(rank, mine);
  kvcommFetcher_t f = NULL;
  OK(kvcommFetcherCreate(buf, mine, kRegions, 7, &fo, &f));
  for (int r = 0; r < size; ++r) {
    kvcommKvRegion theirs[kRegions], got[kRegions + 1];
    layoutOf(r, theirs);
    uint64_t want = 0, hash = 0, version = 0;
    OK(kvcommKvLayoutHash(theirs, kRegions, 7, &want));
    OK(kvcommFetcherLayoutHash(f, r, &hash));
    CHECK(hash == want, "layout hash of rank %d", r);
    size_t count = 0;
    OK(kvcommFetcherLayout(f, r, NULL, 0, &count, NULL));
    CHECK(count == kRegions, "rank %d has %zu regions", r, count);
    OK(kvcommFetcherLayout(f, r, got, kRegions + 1, &count, &version));
    CHECK(version == 7 && memcmp(got, theirs, sizeof(theirs)) == 0, "layout of rank %d", r);
  }
  uint64_t other = 0, want = 0;
  OK(kvcommKvLayoutHash(mine, kRegions, 8, &other));
  OK(kvcommFetcherLayoutHash(f, rank, &want));
  CHECK(other != want, "the version is part of the hash");
  FAILS(kvcommFetcherLayoutHash(f, size, &want), kvcommInvalidArgument, "rank");
  OK(kvcommCommBarrier(world)); /* every source is filled */

  /* 1. plan + submit in one call. */
  Batch b;
  makeBatch(&b, rank, size, 0);
  kvcommFetchPlanInfo info;
  OK(kvcommFetch(f, b.req, 3, NULL, &opt, &info));
  size_t skipped = 0, pairs = pairsOf(b.req, 3, &skipped);
  CHECK(info.pairsIn == pairs && info.pairsSkipped == skipped, "info: pairs %zu/%zu skipped %zu/%zu", info.pairsIn,
        pairs, info.pairsSkipped, skipped);
  CHECK(info.bytes == (pairs - skipped) * kPairBytes, "info: %zu bytes", info.bytes);
  CHECK(info.path == kvcommFetchPathHost && info.hostRuns == info.runsOut, "info: path %s",
        kvcommFetchPathName(info.path));
  CHECK(info.runsOut < (pairs - skipped) * kRegions, "runs of consecutive blocks coalesce: %zu runs for %zu pairs",
        info.runsOut, pairs - skipped);
  oracleFetch(image, rank, b.req, 3);
  checkImage(buf, image, mapped, "kvcommFetch");

  /* 2. One plan, submitted twice (the second time over bytes already there), and its info. */
  makeBatch(&b, rank, size, 1);
  kvcommFetchPlan_t plan = NULL;
  OK(kvcommFetchPlanCreate(f, b.req, 3, NULL, &plan));
  uint64_t pgen = 0, fgen = 0;
  OK(kvcommFetchPlanGeneration(plan, &pgen));
  OK(kvcommFetcherGeneration(f, &fgen));
  CHECK(pgen == fgen, "plan generation %llu, fetcher %llu", (unsigned long long)pgen, (unsigned long long)fgen);
  OK(kvcommFetchPlanGetInfo(plan, &info));
  CHECK(info.pairsIn == pairsOf(b.req, 3, &skipped), "plan info");
  OK(kvcommFetchSubmit(f, plan, NULL));
  OK(kvcommFetchSubmit(f, plan, NULL));
  oracleFetch(image, rank, b.req, 3);
  checkImage(buf, image, mapped, "plan submitted twice");

  /* 3. Ids "in device memory" (host memory for host buffers): one source per pair through srcRanks. */
  makeBatch(&b, rank, size, 2);
  {
    int64_t src[3 * kMaxPairs], dst[3 * kMaxPairs];
    int32_t ranks[3 * kMaxPairs];
    size_t n = 0;
    for (int k = 0; k < 3; ++k)
      for (size_t i = 0; i < b.req[k].count; ++i) {
        src[n] = b.src[k][i];
        dst[n] = b.dst[k][i];
        ranks[n++] = b.req[k].srcRank;
      }
    kvcommDeviceFetchBatch db = {src, dst, ranks, -1, n};
    OK(kvcommFetchDevice(f, &db, NULL));
    OK(kvcommFetcherCheckErrors(f));
  }
  oracleFetch(image, rank, b.req, 3);
  checkImage(buf, image, mapped, "kvcommFetchDevice");

  /* 4. Polled: Test until done, then Wait; nothing failed. */
  makeBatch(&b, rank, size, 3);
  kvcommFetchOperation_t op = NULL;
  OK(kvcommFetchStart(f, b.req, 3, NULL, NULL, &op));
  kvcommFetchStatus st;
  memset(&st, 0xff, sizeof(st));
  for (int polls = 0; polls < 200000; ++polls) {
    OK(kvcommFetchOperationTest(op, &st));
    if (st.state != kvcommFetchInProgress) break;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  CHECK(st.state == kvcommFetchDone, "polled state %d", (int)st.state);
  OK(kvcommFetchOperationWait(op, -1, &st));
  pairs = pairsOf(b.req, 3, &skipped);
  CHECK(st.state == kvcommFetchDone && st.bytesDone == st.bytesTotal && st.bytesTotal == (pairs - skipped) * kPairBytes,
        "done %zu of %zu bytes", st.bytesDone, st.bytesTotal);
  size_t nfailed = 99;
  OK(kvcommFetchOperationFailedBlocks(op, NULL, 0, &nfailed));
  CHECK(nfailed == 0 && st.numFailedBlocks == 0, "%zu failed blocks", nfailed);
  char err[64] = "x";
  size_t needed = 0;
  OK(kvcommFetchOperationError(op, err, sizeof(err), &needed));
  CHECK(err[0] == '\0' && needed == 1, "error of a done fetch: '%s'", err);
  OK(kvcommFetchOperationDestroy(op));
  oracleFetch(image, rank, b.req, 3);
  checkImage(buf, image, mapped, "polled fetch");

  /* 5. Paced: 8 pairs that do not coalesce (8 runs), 2368 bytes at 2000 B/s, about 1.2 s: seen in progress after
   *    the first run or two (with room for a loaded machine's stalls), then done. */
  {
    int64_t src[8], dst[8];
    for (int i = 0; i < 8; ++i) src[i] = 2 * i, dst[i] = 30 + 2 * i;
    kvcommFetchRequest q = {(rank + 1) % size, src, dst, 8, 0};
    kvcommFetchOptions paced = opt;
    paced.maxBytesPerSecond = 2000;
    OK(kvcommFetchStart(f, &q, 1, &paced, NULL, &op));
    OK(kvcommFetchOperationWait(op, 20, &st));
    CHECK(st.state == kvcommFetchInProgress && st.bytesDone < st.bytesTotal && st.bytesTotal == 8 * kPairBytes,
          "paced fetch after 20 ms: state %d, %zu of %zu bytes", (int)st.state, st.bytesDone, st.bytesTotal);
    OK(kvcommFetchOperationWait(op, 10000, &st));
    CHECK(st.state == kvcommFetchDone && st.bytesDone == 8 * kPairBytes, "paced fetch: state %d", (int)st.state);
    OK(kvcommFetchOperationDestroy(op));
    oracleFetch(image, rank, &q, 1);
    checkImage(buf, image, mapped, "paced polled fetch");
  }

  /* 6. The collective form: every rank's batch at once, twice (sources never change). */
  makeBatch(&b, rank, size, 4);
  OK(kvcommFetchAll(f, b.req, 3, NULL, NULL, &info));
  OK(kvcommFetchAll(f, b.req, 3, NULL, NULL, NULL));
  CHECK(info.pairsIn == pairsOf(b.req, 3, &skipped), "fetchAll info");
  oracleFetch(image, rank, b.req, 3);
  checkImage(buf, image, mapped, "kvcommFetchAll");
  OK(kvcommFetcherCheckErrors(f));

  /* 7. Bad input: the right code and message, and not one byte written (the good requests in the same call
   *    included). */
  OK(kvcommCommBarrier(world));
  makeBatch(&b, rank, size, 5);
  b.src[1][2] = 999; /* request 1, pair 2: outside every layout */
  FAILS(kvcommFetch(f, b.req, 3, NULL, NULL, NULL), kvcommInvalidArgument, "source block 999");
  FAILS(kvcommFetch(f, b.req, 3, NULL, NULL, NULL), kvcommInvalidArgument, "request 1, pair 2");
  FAILS(kvcommFetchStart(f, b.req, 3, NULL, NULL, &op), kvcommInvalidArgument, "999");
  FAILS(kvcommFetchPlanCreate(f, b.req, 3, NULL, &plan), kvcommInvalidArgument, "999");
  makeBatch(&b, rank, size, 5);
  b.dst[2][1] = b.dst[0][0]; /* duplicate destination */
  FAILS(kvcommFetch(f, b.req, 3, NULL, NULL, NULL), kvcommInvalidArgument, "duplicate");
  makeBatch(&b, rank, size, 5);
  b.dst[0][3] = -2;
  FAILS(kvcommFetch(f, b.req, 3, NULL, NULL, NULL), kvcommInvalidArgument, "destination block -2");
  makeBatch(&b, rank, size, 5);
  b.req[2].srcRank = size;
  FAILS(kvcommFetch(f, b.req, 3, NULL, NULL, NULL), kvcommInvalidArgument, "source rank");
  makeBatch(&b, rank, size, 5);
  b.req[0].srcLayoutHash = 12345;
  FAILS(kvcommFetch(f, b.req, 3, NULL, NULL, NULL), kvcommInvalidArgument, "layout hash");
  makeBatch(&b, rank, size, 5);
  kvcommFetchOptions bad = opt;
  bad.path = kvcommFetchPathKernel; /* host memory has only the host path: refused, never substituted */
  FAILS(kvcommFetch(f, b.req, 3, NULL, &bad, NULL), kvcommUnsupported, "path");
  bad.path = (kvcommFetchPath_t)9;
  FAILS(kvcommFetch(f, b.req, 3, NULL, &bad, NULL), kvcommInvalidArgument, "kvcommFetchPath_t");
  FAILS(kvcommFetch(f, NULL, 3, NULL, NULL, NULL), kvcommInvalidArgument, "requests is NULL");
  b.req[1].dstBlocks = NULL;
  FAILS(kvcommFetch(f, b.req, 3, NULL, NULL, NULL), kvcommInvalidArgument, "NULL");
  makeBatch(&b, rank, size, 5);
  {
    int64_t src[3] = {1, 2, 999}, dst[3] = {30, 31, 32};
    kvcommDeviceFetchBatch db = {src, dst, NULL, (rank + 1) % size, 3};
    FAILS(kvcommFetchDevice(f, &db, NULL), kvcommInvalidArgument, "pair 2");
    db.srcRank = -3;
    FAILS(kvcommFetchDevice(f, &db, NULL), kvcommInvalidArgument, "srcRank");
    FAILS(kvcommFetchDevice(f, NULL, NULL), kvcommInvalidArgument, "batch");
  }
  /* A bad request on one rank fails the collective form on that rank only; the others' blocks land. */
  makeBatch(&b, rank, size, 6);
  if (rank == 2) b.src[0][0] = 999;
  kvcommResult_t r = kvcommFetchAll(f, b.req, 3, NULL, NULL, NULL);
  if (rank == 2) {
    CHECK(r == kvcommInvalidArgument && strstr(kvcommGetLastError(), "999") != NULL, "fetchAll on rank 2: %s: %s",
          kvcommGetErrorString(r), kvcommGetLastError());
  } else {
    CHECK(r == kvcommSuccess, "fetchAll: %s: %s", kvcommGetErrorString(r), kvcommGetLastError());
    oracleFetch(image, rank, b.req, 3);
  }
  FAILS(kvcommFetchAll(f, NULL, 2, NULL, NULL, NULL), kvcommInvalidArgument, "requests is NULL"); /* every rank */
  checkImage(buf, image, mapped, "after refused calls");

  /* 8. Growth makes plans stale until refresh; plans made before stay stale. A paced polled fetch running while the
   *    buffer grows fails at its next slice, and its error names this rank (the thread that copies is not the one
   *    that started it); its blocks are fetched again after the refresh. */
  OK(kvcommCommBarrier(world));
  int64_t pacedSrc[8], pacedDst[8];
  for (int i = 0; i < 8; ++i) pacedSrc[i] = 2 * i, pacedDst[i] = 30 + 2 * i;
  kvcommFetchRequest paced = {(rank + 1) % size, pacedSrc, pacedDst, 8, 0};
  kvcommFetchOptions slow = opt;
  slow.maxBytesPerSecond = 2000;
  OK(kvcommFetchStart(f, &paced, 1, &slow, NULL, &op));
  OK(kvcommBufferGrow(buf, FETCH_INITIAL + 256 * 1024));
  OK(kvcommFetchOperationWait(op, 20000, &st));
  {
    char why[512] = "", want[32];
    snprintf(want, sizeof(want), "[rank %d]", rank);
    OK(kvcommFetchOperationError(op, why, sizeof(why), NULL));
    CHECK(st.state == kvcommFetchFailed && strstr(why, "buffer changed") != NULL && strstr(why, want) != NULL,
          "a polled fetch across a grow: state %d, error '%s' (expected to name %s)", (int)st.state, why, want);
  }
  OK(kvcommFetchOperationDestroy(op));
  makeBatch(&b, rank, size, 7);
  FAILS(kvcommFetchSubmit(f, plan, NULL), kvcommInvalidArgument, "stale");
  FAILS(kvcommFetch(f, b.req, 3, NULL, NULL, NULL), kvcommInvalidArgument, "refresh");
  OK(kvcommFetcherRefresh(f));
  uint64_t bgen = 0;
  OK(kvcommFetcherGeneration(f, &fgen));
  OK(kvcommBufferGeneration(buf, &bgen));
  CHECK(fgen == bgen && fgen > pgen, "generation after refresh %llu (buffer %llu)", (unsigned long long)fgen,
        (unsigned long long)bgen);
  FAILS(kvcommFetchSubmit(f, plan, NULL), kvcommInvalidArgument, "stale");
  OK(kvcommFetch(f, &paced, 1, NULL, NULL, NULL)); /* the failed polled fetch's blocks, now whole */
  oracleFetch(image, rank, &paced, 1);
  OK(kvcommFetch(f, b.req, 3, NULL, NULL, NULL));
  oracleFetch(image, rank, b.req, 3);
  checkImage(buf, image, mapped, "after refresh");

  /* Handles go in any order: an operation and a plan outlive their fetcher, the fetcher its buffer handle. */
  makeBatch(&b, rank, size, 8);
  OK(kvcommFetchStart(f, b.req, 3, NULL, NULL, &op));
  OK(kvcommCommBarrier(world));
  OK(kvcommFetcherDestroy(f));
  OK(kvcommFetchOperationWait(op, -1, &st));
  CHECK(st.state == kvcommFetchDone, "operation after its fetcher: state %d", (int)st.state);
  OK(kvcommFetchOperationDestroy(op));
  OK(kvcommFetchPlanGetInfo(plan, &info));
  OK(kvcommFetchPlanDestroy(plan));
  oracleFetch(image, rank, b.req, 3);
  checkImage(buf, image, mapped, "operation outliving its fetcher");
  OK(kvcommFetcherDestroy(NULL));
  OK(kvcommFetchPlanDestroy(NULL));
  OK(kvcommFetchOperationDestroy(NULL));
  OK(kvcommCommBarrier(world)); /* nobody unmaps a source a peer still reads */
  OK(kvcommBufferDestroy(buf));
  free(image);
}
