/* The C ABI's entry points with fuzzed arguments, called from C (a C++ caller passing an out-of-range enum would
 * itself be undefined behaviour). A pool of handles is created once (a 1-rank communicator from a TCP unique id on
 * loopback, a layout, a host buffer, a publisher, a barrier, a fetcher, a plan and a finished polled fetch) plus one
 * destroyed handle of each type; an input is a sequence of calls: one byte picks the function, the next bytes its
 * arguments (each integer a special value: 0, small numbers, every enum's and KVCOMM_MAX_* limit's neighbours, the
 * edges of int, unsigned, int64 and uint64; or 8 raw bytes), each handle live, NULL, never returned (zeroed memory)
 * or destroyed, each output pointer NULL or a poisoned scratch area.
 * Invariants (an abort, kept as a crash by libFuzzer): no sanitizer report; the result is a kvcommResult_t and never
 * kvcommInternalError; a failed call leaves a "kvcomm ..." message; a call refused with kvcommInvalidArgument writes
 * nothing (the scratch stays poisoned and, for calls that write memory, the buffer's bytes are unchanged).
 * Arguments that describe the caller's own memory (array counts, byte sizes) stay within the arrays passed, or past
 * the documented limit (refused before anything is read): anything else would be the caller's undefined behaviour.
 * Calls that would wait for a peer that never comes (a receive, a bootstrap of more ranks) get arguments that fail
 * fast. Replay without libFuzzer: fuzz_capi_calls_replay (replay_main.cpp, seeds capi_seeds.cpp). */
#define _DEFAULT_SOURCE 1 /* MAP_ANONYMOUS, MAP_NORESERVE */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kvcomm/kvcomm.h"

enum { kScratch = 8192, kMapped = 256 * 1024, kCapacity = 1 << 20, kRegionOffset = 128 * 1024 };
static const unsigned char kPoison = 0xA7;

/* ---- the input ------------------------------------------------------------------------------------------------ */

typedef struct {
  const uint8_t* p;
  size_t n, at;
} In;

static uint8_t u8(In* in) {
  return in->at < in->n ? in->p[in->at++] : 0;
}

static const uint64_t kSpecial[] = {0,
                                    1,
                                    2,
                                    3,
                                    4,
                                    5,
                                    7,
                                    8,
                                    9,
                                    16,
                                    31,
                                    32,
                                    33,
                                    42,
                                    128,
                                    255,
                                    256,
                                    4095,
                                    4096,
                                    4097,
                                    65535,
                                    65536,
                                    65537,
                                    (1u << 24) - 1,
                                    1u << 24,
                                    (1u << 24) + 1,
                                    (uint64_t)INT_MAX,
                                    (uint64_t)INT_MAX + 1,
                                    (uint64_t)UINT_MAX,
                                    (uint64_t)UINT_MAX + 1,
                                    (uint64_t)INT64_MAX,
                                    (uint64_t)INT64_MIN,
                                    UINT64_MAX,
                                    UINT64_MAX - 1,
                                    (uint64_t)(int64_t)-65537,
                                    (uint64_t)(int64_t)INT_MIN,
                                    (uint64_t)1 << 40,
                                    UINT64_MAX / 2 + 1};
enum { kNumSpecial = sizeof(kSpecial) / sizeof(kSpecial[0]) };

/* One byte below 0xC0 picks a special value; from 0xC0, 8 raw bytes follow. */
static uint64_t val(In* in) {
  uint8_t b = u8(in);
  if (b < 0xC0) return kSpecial[b % kNumSpecial];
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= (uint64_t)u8(in) << (8 * i);
  return v;
}
/* A value whose byte 0 (or the end of the input) stands for `def`, a valid default: all-zero inputs make valid calls.
 */
static uint64_t valOr(In* in, uint64_t def) {
  if (in->at >= in->n || in->p[in->at] == 0) {
    ++in->at;
    return def;
  }
  return val(in);
}
static int asInt(uint64_t v) {
  uint32_t low = (uint32_t)v;
  return low <= (uint32_t)INT_MAX ? (int)low : (int)((int64_t)low - ((int64_t)1 << 32));
}
static int ival(In* in) {
  return asInt(val(in));
}
static int ivalOr(In* in, int def) {
  return asInt(valOr(in, (uint64_t)(uint32_t)def));
}
/* A count of elements of an array of `cap`: within it, or past `limit` (refused before the array is read). */
static size_t count(In* in, size_t cap, size_t limit, size_t def) {
  uint64_t v = valOr(in, def);
  return v <= cap || v > limit ? (size_t)v : (size_t)(v % (cap + 1));
}

/* ---- the pool ------------------------------------------------------------------------------------------------- */

typedef struct {
  kvcommComm_t comm;
  kvcommParallelGroups_t layout;
  kvcommBuffer_t buffer;
  kvcommPublisher_t publisher;
  kvcommBarrier_t barrier;
  kvcommFetcher_t fetcher;
  kvcommFetchPlan_t plan;
  kvcommFetchOperation_t op;
} Handles;

static Handles g_live, g_dead;
static uint64_t g_zeroed[64]; /* memory kvcomm never returned */
static unsigned char* g_scratch;
static unsigned char* g_image;
static void* g_reservation; /* a PROT_NONE range an adopt may name */
static kvcommKvRegion g_region = {kRegionOffset, 256, 0, 64};
static kvcommUniqueId g_id;

#define POOL_OK(call)                                                                                           \
  do {                                                                                                          \
    kvcommResult_t r_ = (call);                                                                                 \
    if (r_ != kvcommSuccess) {                                                                                  \
      fprintf(stderr, "capi_calls: pool: %s: %s: %s\n", #call, kvcommGetErrorString(r_), kvcommGetLastError()); \
      abort();                                                                                                  \
    }                                                                                                           \
  } while (0)

static void makeHandles(Handles* h, kvcommComm_t comm, kvcommBuffer_t buffer, kvcommFetcher_t fetcher) {
  kvcommParallelSpec spec = {1, 1, 1, 1};
  POOL_OK(kvcommParallelGroupsCreate(comm, &spec, &h->layout));
  POOL_OK(kvcommBufferCreate(comm, kCapacity, kMapped, kvcommMemoryHost, &h->buffer));
  kvcommPublisherOptions po;
  POOL_OK(kvcommPublisherOptionsInit(&po));
  po.barrierTimeoutMs = 100;
  POOL_OK(kvcommPublisherCreate(buffer ? buffer : h->buffer, &po, &h->publisher));
  kvcommBarrierOptions bo;
  POOL_OK(kvcommBarrierOptionsInit(&bo));
  bo.kind = kvcommMemoryHost;
  bo.timeoutMs = 100;
  POOL_OK(kvcommBarrierCreate(comm, &bo, &h->barrier));
  kvcommFetcherOptions fo;
  POOL_OK(kvcommFetcherOptionsInit(&fo));
  fo.barrierTimeoutMs = 100;
  POOL_OK(kvcommFetcherCreate(buffer ? buffer : h->buffer, &g_region, 1, 1, &fo, &h->fetcher));
  int64_t src[2] = {0, 1}, dst[2] = {32, 33};
  kvcommFetchRequest q = {0, src, dst, 2, 0};
  kvcommFetcher_t f = fetcher ? fetcher : h->fetcher;
  POOL_OK(kvcommFetchPlanCreate(f, &q, 1, NULL, &h->plan));
  POOL_OK(kvcommFetchStart(f, &q, 1, NULL, NULL, &h->op));
  kvcommFetchStatus st;
  POOL_OK(kvcommFetchOperationWait(h->op, -1, &st));
}

static void setUp(void) {
  POOL_OK(kvcommGetUniqueId(&g_id, "lo"));
  POOL_OK(kvcommCommInitTcp(&g_live.comm, &g_id, 0, 1, 10000));
  makeHandles(&g_live, g_live.comm, NULL, NULL);
  /* One destroyed handle of each type (made after the pool: no pool handle can sit at one of their addresses). */
  POOL_OK(kvcommCommSplit(g_live.comm, 0, 0, &g_dead.comm));
  makeHandles(&g_dead, g_live.comm, g_live.buffer, g_live.fetcher);
  POOL_OK(kvcommFetchOperationDestroy(g_dead.op));
  POOL_OK(kvcommFetchPlanDestroy(g_dead.plan));
  POOL_OK(kvcommFetcherDestroy(g_dead.fetcher));
  POOL_OK(kvcommBarrierDestroy(g_dead.barrier));
  POOL_OK(kvcommPublisherDestroy(g_dead.publisher));
  POOL_OK(kvcommBufferDestroy(g_dead.buffer));
  POOL_OK(kvcommParallelGroupsDestroy(g_dead.layout));
  POOL_OK(kvcommCommDestroy(g_dead.comm));
  g_scratch = (unsigned char*)malloc(kScratch);
  g_image = (unsigned char*)malloc(kMapped);
  g_reservation = mmap(NULL, 1 << 16, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* local = NULL;
  POOL_OK(kvcommBufferLocal(g_live.buffer, &local));
  for (size_t i = 0; i < kMapped; ++i) ((unsigned char*)local)[i] = (unsigned char)(i * 13);
}

/* A handle argument: live, NULL, never returned, or destroyed. */
static void* pick(In* in, void* live, void* dead) {
  switch (u8(in) % 4) {
    case 0:
      return live;
    case 1:
      return NULL;
    case 2:
      return g_zeroed;
    default:
      return dead;
  }
}
#define PICK(field) pick(in, (void*)g_live.field, (void*)g_dead.field)
/* Whether an optional argument is given: yes unless its byte is 7 mod 8 (all-zero inputs pass everything). */
#define SOME(in) (u8(in) % 8 != 7)
/* An output pointer: the poisoned scratch, or (1 in 8) NULL. */
#define OUT(type) (SOME(in) ? (type)(void*)g_scratch : (type)NULL)

/* ---- the invariants ------------------------------------------------------------------------------------------- */

static void fail(const char* what, const char* fn, kvcommResult_t r) {
  fprintf(stderr, "capi_calls: invariant failed: %s: %s returned %s: %s\n", what, fn, kvcommGetErrorString(r),
          kvcommGetLastError());
  abort();
}

/* Results per function (KVCOMM_FUZZ_STATS=1 prints them at exit): success, refused, any other code. */
static unsigned long g_stats[128][3];
static unsigned g_code;

static void printStats(void) {
  for (unsigned f = 0; f < 128; ++f)
    if (g_stats[f][0] + g_stats[f][1] + g_stats[f][2])
      fprintf(stderr, "capi_calls: function %3u: %8lu succeeded, %8lu refused, %8lu other\n", f, g_stats[f][0],
              g_stats[f][1], g_stats[f][2]);
}

static void checkResult(const char* fn, kvcommResult_t r, int writesMemory) {
  ++g_stats[g_code][r == kvcommSuccess ? 0 : r == kvcommInvalidArgument ? 1 : 2];
  if ((unsigned)r >= (unsigned)kvcommNumResults) fail("a result outside kvcommResult_t", fn, r);
  if (r == kvcommInternalError) fail("kvcommInternalError (a bug, or an exception the C ABI did not expect)", fn, r);
  if (r == kvcommSuccess) return;
  if (strncmp(kvcommGetLastError(), "kvcomm", 6) != 0) fail("a failure without its message", fn, r);
  if (r != kvcommInvalidArgument) return;
  for (size_t i = 0; i < kScratch; ++i)
    if (g_scratch[i] != kPoison) fail("a refused call wrote its output", fn, r);
  if (writesMemory) {
    void* local = NULL;
    if (kvcommBufferLocal(g_live.buffer, &local) != kvcommSuccess || memcmp(local, g_image, kMapped) != 0)
      fail("a refused call changed the buffer", fn, r);
  }
}

static void prepare(int writesMemory) {
  memset(g_scratch, kPoison, kScratch);
  if (writesMemory) {
    void* local = NULL;
    if (kvcommBufferLocal(g_live.buffer, &local) == kvcommSuccess) memcpy(g_image, local, kMapped);
  }
}

/* A handle a successful call returned in the scratch: destroyed so that the pool stays as it is. */
static kvcommComm_t outComm(kvcommResult_t r, kvcommComm_t* out) {
  kvcommComm_t c = NULL;
  if (r == kvcommSuccess && out) memcpy(&c, out, sizeof(c));
  return c;
}

static int failingAllgather(const void* send, void* recv, size_t bytes, void* user) {
  (void)send;
  (void)recv;
  (void)bytes;
  (void)user;
  return 3;
}

/* ---- argument structs ----------------------------------------------------------------------------------------- */

enum { kIds = 16, kSlots = 4096, kRequests = 4, kRegions = 8, kTensors = KVCOMM_MAX_PUBLISH_TENSORS + 1 };

typedef struct {
  int64_t src[kRequests][kIds], dst[kRequests][kIds];
  kvcommFetchRequest q[kRequests];
  kvcommFetchOptions o;
} Requests;

static const kvcommFetchRequest* requests(In* in, Requests* r, size_t* n, int polled) {
  for (int k = 0; k < kRequests; ++k) {
    for (int i = 0; i < kIds; ++i) {
      r->src[k][i] = (int64_t)valOr(in, (uint64_t)i);
      r->dst[k][i] = (int64_t)valOr(in, (uint64_t)(32 + 16 * (k % 2) + i));
    }
    r->q[k].srcRank = ival(in);
    r->q[k].srcBlocks = SOME(in) ? r->src[k] : NULL;
    r->q[k].dstBlocks = SOME(in) ? r->dst[k] : NULL;
    r->q[k].count = count(in, kIds, KVCOMM_MAX_FETCH_PAIRS, 2);
    r->q[k].srcLayoutHash = u8(in) % 4 ? 0 : val(in);
  }
  *n = count(in, kRequests, KVCOMM_MAX_FETCH_REQUESTS, 1);
  kvcommFetchOptionsInit(&r->o);
  r->o.path = (kvcommFetchPath_t)val(in);
  r->o.copyEngineMinRunBytes = (size_t)val(in);
  r->o.maxBytesPerSecond = val(in);
  if (polled && r->o.maxBytesPerSecond != 0 && r->o.maxBytesPerSecond < ((uint64_t)1 << 30))
    r->o.maxBytesPerSecond = (uint64_t)1 << 30; /* a paced fetch must end within the run */
  return SOME(in) ? r->q : NULL;
}

static void regions(In* in, kvcommKvRegion* r) {
  for (int k = 0; k < kRegions; ++k) {
    r[k].offset = (size_t)valOr(in, g_region.offset + (size_t)k * 16384);
    r[k].blockBytes = (size_t)valOr(in, g_region.blockBytes);
    r[k].blockStride = (size_t)val(in);
    r[k].numBlocks = (size_t)valOr(in, g_region.numBlocks);
  }
}

typedef struct {
  uint8_t rows[kSlots];
  int64_t slots[kSlots];
  kvcommCacheTensor t[kTensors];
} Publish;

static void publishArgs(In* in, Publish* p) {
  for (int i = 0; i < 64; ++i) p->slots[i] = (int64_t)valOr(in, (uint64_t)i);
  for (int i = 64; i < kSlots; ++i) p->slots[i] = i % 1000;
  memset(p->rows, 0x5A, sizeof(p->rows));
  for (int k = 0; k < kTensors; ++k) {
    kvcommCacheTensor* t = &p->t[k];
    kvcommCacheTensorInit(t);
    t->src = SOME(in) ? p->rows : NULL;
    t->srcStride = (size_t)val(in);
    t->rowBytes = (size_t)valOr(in, 16);
    t->offset = (size_t)valOr(in, (uint64_t)k * 16);
    t->blockSize = (size_t)valOr(in, 1);
    t->blockStride = (size_t)val(in);
    t->rowStride = (size_t)valOr(in, 64);
    t->limitBytes = (size_t)val(in);
    t->srcBytes = (size_t)val(in);
    if (t->srcBytes == 0 || t->srcBytes > sizeof(p->rows)) t->srcBytes = sizeof(p->rows); /* rows read: inside */
  }
}

/* The text of a string argument: up to 200 bytes of the input, NUL-terminated (or NULL). */
static const char* text(In* in, char* buf) {
  size_t n = u8(in);
  if (n == 255) return NULL;
  n %= 200;
  for (size_t i = 0; i < n; ++i) buf[i] = (char)u8(in);
  buf[n] = '\0';
  return buf;
}

/* A text output: the scratch with a size it holds, or NULL with any size. */
#define TEXT_OUT(ptr, bytes)                            \
  do {                                                  \
    ptr = OUT(char*);                                   \
    bytes = (size_t)val(in);                            \
    if (ptr && bytes > kScratch) bytes %= kScratch + 1; \
  } while (0)

#define CALL(writes, expr)          \
  do {                              \
    prepare(writes);                \
    kvcommResult_t r_ = (expr);     \
    checkResult(#expr, r_, writes); \
  } while (0)
/* A call that hands out a communicator through `out`: checked, then its handle destroyed. */
#define CALL_COMM(expr, out)                                     \
  do {                                                           \
    prepare(0);                                                  \
    kvcommResult_t r_ = (expr);                                  \
    checkResult(#expr, r_, 0);                                   \
    kvcommCommDestroy(outComm(r_, (kvcommComm_t*)(void*)(out))); \
  } while (0)
/* The same for any handle type. */
#define CALL_HANDLE(type, destroy, expr, out) \
  do {                                        \
    prepare(0);                               \
    kvcommResult_t r_ = (expr);               \
    checkResult(#expr, r_, 0);                \
    if (r_ == kvcommSuccess && (out)) {       \
      type h_;                                \
      memcpy(&h_, (out), sizeof(h_));         \
      destroy(h_);                            \
    }                                         \
  } while (0)

/* A handle for a *Destroy: NULL, never returned, destroyed, or (selector 0) a fresh one made by `make`. */
static int destroyChoice(In* in) {
  return u8(in) % 4;
}
static void* notLive(int choice, void* dead) {
  return choice == 1 ? NULL : choice == 2 ? (void*)g_zeroed : dead;
}

enum { kNumOps = 112 };

static void op(In* in) {
  char buf[256];
  kvcommParallelSpec spec;
  kvcommParallelCoord coord;
  size_t bytes = 0;
  char* txt = NULL;
  const unsigned code = u8(in) % kNumOps;
  g_code = code;
  switch (code) {
    case 0: {
      const char* s = kvcommGetErrorString((kvcommResult_t)val(in));
      if (!s) fail("kvcommGetErrorString returned NULL", "kvcommGetErrorString", kvcommSuccess);
      break;
    }
    case 1:
      if (!kvcommGetLastError()) fail("kvcommGetLastError returned NULL", "kvcommGetLastError", kvcommSuccess);
      break;
    case 2:
      CALL(0, kvcommGetVersion(OUT(int*)));
      break;
    case 3: {
      const char* name = text(in, buf);
      if (name && name[0] != '\0') CALL(0, kvcommGetUniqueId(OUT(kvcommUniqueId*), name));
      break;
    }
    case 4:
      CALL(0, kvcommUniqueIdToString(SOME(in) ? &g_id : NULL, OUT(char*), (size_t)val(in)));
      break;
    case 5:
      CALL(0, kvcommUniqueIdFromString(text(in, buf), OUT(kvcommUniqueId*)));
      break;
    case 6: {
      int rank = ival(in), size = ival(in);
      if (size <= 0 || size > KVCOMM_MAX_RANKS || rank < 0 || rank >= size) /* a valid pair would bootstrap */
        CALL_COMM(kvcommCommInitTcp(OUT(kvcommComm_t*), SOME(in) ? &g_id : NULL, rank, size, (int64_t)val(in)),
                  g_scratch);
      break;
    }
    case 7:
      CALL_COMM(kvcommCommInitCallback(OUT(kvcommComm_t*), ival(in), ivalOr(in, 1) % (KVCOMM_MAX_RANKS + 2),
                                       SOME(in) ? failingAllgather : NULL, NULL),
                g_scratch);
      break;
    case 8: {
      int ch = destroyChoice(in);
      kvcommComm_t c = NULL;
      if (ch == 0) kvcommCommSplit(g_live.comm, 0, 0, &c);
      CALL(0, kvcommCommDestroy(ch == 0 ? c : (kvcommComm_t)notLive(ch, g_dead.comm)));
      break;
    }
    case 9:
      CALL(0, kvcommCommRank(PICK(comm), OUT(int*)));
      break;
    case 10:
      CALL(0, kvcommCommSize(PICK(comm), OUT(int*)));
      break;
    case 11:
      CALL(0, kvcommCommWorldRank(PICK(comm), ival(in), OUT(int*)));
      break;
    case 12:
      CALL(0, kvcommCommId(PICK(comm), OUT(uint64_t*)));
      break;
    case 13: {
      int ch = destroyChoice(in);
      kvcommComm_t c = NULL;
      if (ch == 0) kvcommCommSplit(g_live.comm, 0, 0, &c);
      CALL(0, kvcommCommAbort(ch == 0 ? c : (kvcommComm_t)notLive(ch, g_dead.comm)));
      kvcommCommDestroy(c);
      break;
    }
    case 14:
      CALL(0, kvcommCommHealth(PICK(comm), OUT(int*), OUT(int*)));
      break;
    case 15:
      CALL_COMM(kvcommCommSplit(PICK(comm), ival(in), ival(in), OUT(kvcommComm_t*)), g_scratch);
      break;
    case 16: {
      void* data = OUT(void*);
      bytes = (size_t)val(in);
      if (data && bytes > kScratch) bytes %= kScratch + 1; /* one member: bytesPerRank bytes */
      CALL(0, kvcommCommAllgather(PICK(comm), data, bytes));
      break;
    }
    case 17:
      CALL(0, kvcommCommBarrier(PICK(comm)));
      break;
    case 18:
    case 19: {
      kvcommComm_t c = (kvcommComm_t)PICK(comm);
      void* data = OUT(void*);
      int peer = ival(in);
      uint32_t tag = (uint32_t)val(in);
      bytes = (size_t)val(in);
      if (data && bytes > kScratch) bytes %= kScratch + 1;
      if (c == g_live.comm && peer == 0 && tag < 0x80000000u && (data || bytes == 0)) break; /* would wait */
      if (u8(in) % 2)
        CALL(0, kvcommCommSend(c, data, bytes, peer, tag));
      else
        CALL(0, kvcommCommRecv(c, data, bytes, peer, tag));
      break;
    }
    case 20:
      CALL(0, kvcommCommNumHosts(PICK(comm), OUT(int*)));
      break;
    case 21:
      CALL(0, kvcommCommMember(PICK(comm), ival(in), OUT(kvcommMemberInfo*)));
      break;
    case 22:
      CALL(0, kvcommCommSameHost(PICK(comm), ival(in), ival(in), OUT(int*)));
      break;
    case 23:
      CALL(0, kvcommCommCanAccessPeer(PICK(comm), ival(in), ival(in), OUT(int*)));
      break;
    case 24:
      TEXT_OUT(txt, bytes);
      CALL(0, kvcommCommTopologyString(PICK(comm), txt, bytes, OUT(size_t*)));
      break;
    case 25:
      spec.tp = ivalOr(in, 1), spec.pcp = ivalOr(in, 1), spec.pp = ivalOr(in, 1), spec.dp = ivalOr(in, 1);
      CALL_HANDLE(kvcommParallelGroups_t, kvcommParallelGroupsDestroy,
                  kvcommParallelGroupsCreate(PICK(comm), SOME(in) ? &spec : NULL, OUT(kvcommParallelGroups_t*)),
                  g_scratch);
      break;
    case 26: {
      int ch = destroyChoice(in);
      kvcommParallelGroups_t l = NULL;
      spec.tp = spec.pcp = spec.pp = spec.dp = 1;
      if (ch == 0) kvcommParallelGroupsCreate(g_live.comm, &spec, &l);
      CALL(0, kvcommParallelGroupsDestroy(ch == 0 ? l : (kvcommParallelGroups_t)notLive(ch, g_dead.layout)));
      break;
    }
    case 27:
      CALL_COMM(kvcommParallelGroupsComm(PICK(layout), (kvcommAxis_t)val(in), OUT(kvcommComm_t*)), g_scratch);
      break;
    case 28:
      CALL(0, kvcommParallelGroupsGetSpec(PICK(layout), OUT(kvcommParallelSpec*)));
      break;
    case 29:
      CALL(0, kvcommParallelGroupsGetCoord(PICK(layout), OUT(kvcommParallelCoord*)));
      break;
    case 30:
      spec.tp = ivalOr(in, 1), spec.pcp = ivalOr(in, 1), spec.pp = ivalOr(in, 1), spec.dp = ivalOr(in, 1);
      CALL(0, kvcommParallelCoordOf(SOME(in) ? &spec : NULL, ival(in), OUT(kvcommParallelCoord*)));
      break;
    case 31:
      spec.tp = ivalOr(in, 1), spec.pcp = ivalOr(in, 1), spec.pp = ivalOr(in, 1), spec.dp = ivalOr(in, 1);
      coord.tp = ival(in), coord.pcp = ival(in), coord.pp = ival(in), coord.dp = ival(in);
      CALL(0, kvcommParallelRankOf(SOME(in) ? &spec : NULL, SOME(in) ? &coord : NULL, OUT(int*)));
      break;
    case 32: {
      spec.tp = ivalOr(in, 1), spec.pcp = ivalOr(in, 1), spec.pp = ivalOr(in, 1), spec.dp = ivalOr(in, 1);
      int* ranks = OUT(int*);
      int cap = ival(in);
      if (ranks && cap > (int)(kScratch / sizeof(int))) cap %= (int)(kScratch / sizeof(int)) + 1;
      CALL(0, kvcommParallelGroupOf(SOME(in) ? &spec : NULL, ival(in), (kvcommAxis_t)val(in), ranks, cap, OUT(int*)));
      break;
    }
    case 33: {
      size_t cap = (size_t)valOr(in, 65536), init = (size_t)valOr(in, 4096);
      if (cap > ((size_t)16 << 20) && cap <= ((size_t)1 << 47)) cap = (size_t)16 << 20; /* real memory: bounded */
      if (init > ((size_t)16 << 20) && init <= cap) init = (size_t)16 << 20;
      CALL_HANDLE(kvcommBuffer_t, kvcommBufferDestroy,
                  kvcommBufferCreate(PICK(comm), cap, init, (kvcommMemoryKind_t)valOr(in, kvcommMemoryHost),
                                     OUT(kvcommBuffer_t*)),
                  g_scratch);
      break;
    }
    case 34: {
      uint8_t b = u8(in) % 4;
      void* base = b == 3 ? NULL : b == 0 ? g_reservation : b == 2 ? (char*)g_reservation + 1 : (void*)(g_scratch + 1);
      size_t reserved = (size_t)valOr(in, 65536);
      if (reserved % 4096 == 0 && reserved > (1 << 16)) reserved = 1 << 16; /* within the reservation */
      CALL_HANDLE(kvcommBuffer_t, kvcommBufferDestroy,
                  kvcommBufferAdopt(PICK(comm), base, reserved, (kvcommMemoryKind_t)valOr(in, kvcommMemoryHost),
                                    OUT(kvcommBuffer_t*)),
                  g_scratch);
      break;
    }
    case 35: {
      int ch = destroyChoice(in);
      kvcommBuffer_t b = NULL;
      if (ch == 0) kvcommBufferCreate(g_live.comm, 65536, 4096, kvcommMemoryHost, &b);
      CALL(0, kvcommBufferDestroy(ch == 0 ? b : (kvcommBuffer_t)notLive(ch, g_dead.buffer)));
      break;
    }
    case 36:
      CALL(1, kvcommBufferGrow(PICK(buffer), (size_t)val(in)));
      break;
    case 37:
      CALL(1, kvcommBufferCommit(PICK(buffer), OUT(kvcommRange*),
                                 count(in, kScratch / sizeof(kvcommRange), KVCOMM_MAX_BUFFER_RANGES, 0)));
      break;
    case 38:
      CALL(1, kvcommBufferRelease(PICK(buffer), OUT(kvcommRange*),
                                  count(in, kScratch / sizeof(kvcommRange), KVCOMM_MAX_BUFFER_RANGES, 0)));
      break;
    case 39: {
      int ch = destroyChoice(in);
      kvcommBuffer_t b = NULL;
      if (ch == 0) kvcommBufferCreate(g_live.comm, 65536, 4096, kvcommMemoryHost, &b);
      CALL(0, kvcommBufferClose(ch == 0 ? b : (kvcommBuffer_t)notLive(ch, g_dead.buffer)));
      kvcommBufferDestroy(b);
      break;
    }
    case 40:
      CALL(0, kvcommBufferLocal(PICK(buffer), OUT(void**)));
      break;
    case 41:
      CALL(0, kvcommBufferPeer(PICK(buffer), ival(in), OUT(void**)));
      break;
    case 42:
      CALL(0, kvcommBufferIsMapped(PICK(buffer), ival(in), OUT(int*)));
      break;
    case 43:
      CALL(0, kvcommBufferRank(PICK(buffer), OUT(int*)));
      break;
    case 44:
      CALL(0, kvcommBufferSize(PICK(buffer), OUT(int*)));
      break;
    case 45:
      CALL(0, kvcommBufferCapacity(PICK(buffer), OUT(size_t*)));
      break;
    case 46:
      CALL(0, kvcommBufferMappedBytes(PICK(buffer), OUT(size_t*)));
      break;
    case 47:
      CALL(0, kvcommBufferIsBacked(PICK(buffer), (size_t)val(in), (size_t)val(in), OUT(int*)));
      break;
    case 48:
      CALL(0, kvcommBufferBackedRanges(PICK(buffer), OUT(kvcommRange*), (size_t)val(in), OUT(size_t*)));
      break;
    case 49:
      CALL(0, kvcommBufferGeneration(PICK(buffer), OUT(uint64_t*)));
      break;
    case 50:
      CALL(0, kvcommBufferGranularity(PICK(buffer), OUT(size_t*)));
      break;
    case 51:
      CALL(0, kvcommBufferKind(PICK(buffer), OUT(kvcommMemoryKind_t*)));
      break;
    case 52:
      CALL(0, kvcommBufferAdopted(PICK(buffer), OUT(int*)));
      break;
    case 53:
      TEXT_OUT(txt, bytes);
      CALL(0, kvcommBufferHandleType(PICK(buffer), txt, bytes, OUT(size_t*)));
      break;
    case 54:
      CALL_COMM(kvcommBufferComm(PICK(buffer), OUT(kvcommComm_t*)), g_scratch);
      break;
    case 55:
      CALL(0, kvcommBufferPeerTable(PICK(buffer), OUT(const uint64_t**)));
      break;
    case 56:
      CALL(0, kvcommBufferBackedBitmap(PICK(buffer), OUT(const uint64_t**)));
      break;
    case 57:
      CALL(0, kvcommCacheTensorInit(OUT(kvcommCacheTensor*)));
      break;
    case 58:
      CALL(0, kvcommPublisherOptionsInit(OUT(kvcommPublisherOptions*)));
      break;
    case 59: {
      kvcommPublisherOptions o;
      kvcommPublisherOptionsInit(&o);
      o.lanes = ivalOr(in, 2);
      o.barrierTimeoutMs = (int64_t)(val(in) % 200);
      o.stagingTokens = (size_t)val(in);
      o.stagingBytesPerToken = (size_t)val(in);
      CALL_HANDLE(kvcommPublisher_t, kvcommPublisherDestroy,
                  kvcommPublisherCreate(PICK(buffer), u8(in) % 4 != 3 ? &o : NULL, OUT(kvcommPublisher_t*)), g_scratch);
      break;
    }
    case 60: {
      int ch = destroyChoice(in);
      kvcommPublisher_t p = NULL;
      if (ch == 0) kvcommPublisherCreate(g_live.buffer, NULL, &p);
      CALL(0, kvcommPublisherDestroy(ch == 0 ? p : (kvcommPublisher_t)notLive(ch, g_dead.publisher)));
      break;
    }
    case 61:
    case 65:
    case 66: {
      static Publish p;
      publishArgs(in, &p);
      kvcommPublisher_t pub = (kvcommPublisher_t)PICK(publisher);
      size_t n = (size_t)valOr(in, 1);
      int lane = ival(in);
      /* the slot mapping's count never claims more than the array holds: numTokens past it is refused */
      kvcommSlotMapping m = {SOME(in) ? (const void*)p.slots : NULL, (kvcommSlotType_t)val(in),
                             (size_t)valOr(in, kSlots)};
      if (m.count > kSlots) m.count = kSlots;
      size_t tokens = count(in, kSlots, (size_t)INT64_MAX, 8);
      const kvcommCacheTensor* t = SOME(in) ? p.t : NULL;
      kvcommPublishThen_t then = (kvcommPublishThen_t)(code == 61 ? val(in) : code == 65 ? 1 : 2);
      CALL(1, kvcommPublish(pub, t, n, SOME(in) ? &m : NULL, tokens, NULL, then, lane));
      break;
    }
    case 62:
      CALL_HANDLE(kvcommBarrier_t, kvcommBarrierDestroy, kvcommPublisherBarrier(PICK(publisher), OUT(kvcommBarrier_t*)),
                  g_scratch);
      break;
    case 63:
    case 64: {
      /* the publisher's barrier, signalled or waited on, through a handle of its own */
      kvcommBarrier_t b = NULL;
      if (kvcommPublisherBarrier((kvcommPublisher_t)PICK(publisher), &b) == kvcommSuccess) {
        if (code == 63)
          CALL(0, kvcommBarrierSignal(b, NULL, ival(in)));
        else
          CALL(0, kvcommBarrierWait(b, NULL, ival(in)));
        kvcommBarrierDestroy(b);
      }
      break;
    }
    case 67:
      CALL(0, kvcommPublisherMode(PICK(publisher), OUT(kvcommPublishMode_t*)));
      break;
    case 68:
      CALL(0, kvcommPublisherModeReason(PICK(publisher), OUT(const char**)));
      break;
    case 69:
      CALL(0, kvcommPublisherPollError(PICK(publisher), OUT(kvcommDeviceError*)));
      break;
    case 70:
      CALL(0, kvcommPublisherCheckErrors(PICK(publisher)));
      break;
    case 71:
      CALL(0, kvcommBarrierOptionsInit(OUT(kvcommBarrierOptions*)));
      break;
    case 72: {
      kvcommBarrierOptions o;
      kvcommBarrierOptionsInit(&o);
      o.lanes = ivalOr(in, 2);
      o.timeoutMs = (int64_t)(val(in) % 200);
      o.kind = (kvcommMemoryKind_t)valOr(in, kvcommMemoryHost);
      CALL_HANDLE(kvcommBarrier_t, kvcommBarrierDestroy,
                  kvcommBarrierCreate(PICK(comm), u8(in) % 4 != 3 ? &o : NULL, OUT(kvcommBarrier_t*)), g_scratch);
      break;
    }
    case 73: {
      int ch = destroyChoice(in);
      kvcommBarrier_t b = NULL;
      kvcommBarrierOptions o;
      kvcommBarrierOptionsInit(&o);
      o.kind = kvcommMemoryHost;
      if (ch == 0) kvcommBarrierCreate(g_live.comm, &o, &b);
      CALL(0, kvcommBarrierDestroy(ch == 0 ? b : (kvcommBarrier_t)notLive(ch, g_dead.barrier)));
      break;
    }
    case 74:
      CALL(0, kvcommBarrierSync(PICK(barrier), NULL, ival(in)));
      break;
    case 75:
      CALL(0, kvcommBarrierSignal(PICK(barrier), NULL, ival(in)));
      break;
    case 76:
      CALL(0, kvcommBarrierWait(PICK(barrier), NULL, ival(in)));
      break;
    case 77:
      CALL(0, kvcommBarrierLanes(PICK(barrier), OUT(int*)));
      break;
    case 78:
      CALL(0, kvcommBarrierKind(PICK(barrier), OUT(kvcommMemoryKind_t*)));
      break;
    case 79:
      CALL_COMM(kvcommBarrierComm(PICK(barrier), OUT(kvcommComm_t*)), g_scratch);
      break;
    case 80: {
      void* h = OUT(void*);
      bytes = (size_t)valOr(in, 4096);
      if (h && bytes > kScratch) bytes %= kScratch + 1;
      CALL(0, kvcommBarrierDeviceHandle(PICK(barrier), h, bytes, OUT(size_t*)));
      break;
    }
    case 81:
      CALL(0, kvcommBarrierPollError(PICK(barrier), OUT(kvcommDeviceError*)));
      break;
    case 82:
      CALL(0, kvcommBarrierCheckErrors(PICK(barrier)));
      break;
    case 83:
      CALL(0, kvcommFetcherOptionsInit(OUT(kvcommFetcherOptions*)));
      break;
    case 84:
      CALL(0, kvcommFetchOptionsInit(OUT(kvcommFetchOptions*)));
      break;
    case 85:
      if (!kvcommFetchPathName((kvcommFetchPath_t)val(in)))
        fail("kvcommFetchPathName returned NULL", "kvcommFetchPathName", kvcommSuccess);
      break;
    case 86: {
      kvcommKvRegion r[kRegions];
      regions(in, r);
      CALL(0, kvcommKvLayoutHash(SOME(in) ? r : NULL, count(in, kRegions, KVCOMM_MAX_FETCH_REGIONS, 1), val(in),
                                 OUT(uint64_t*)));
      break;
    }
    case 87: {
      kvcommKvRegion r[kRegions];
      regions(in, r);
      kvcommFetcherOptions o;
      kvcommFetcherOptionsInit(&o);
      o.lanes = ivalOr(in, 1);
      o.barrierTimeoutMs = (int64_t)(val(in) % 200);
      CALL_HANDLE(
          kvcommFetcher_t, kvcommFetcherDestroy,
          kvcommFetcherCreate(PICK(buffer), SOME(in) ? r : NULL, count(in, kRegions, KVCOMM_MAX_FETCH_REGIONS, 1),
                              val(in), u8(in) % 4 != 3 ? &o : NULL, OUT(kvcommFetcher_t*)),
          g_scratch);
      break;
    }
    case 88: {
      int ch = destroyChoice(in);
      kvcommFetcher_t f = NULL;
      if (ch == 0) kvcommFetcherCreate(g_live.buffer, &g_region, 1, 1, NULL, &f);
      CALL(0, kvcommFetcherDestroy(ch == 0 ? f : (kvcommFetcher_t)notLive(ch, g_dead.fetcher)));
      break;
    }
    case 89: {
      static Requests r;
      size_t n = 0;
      const kvcommFetchRequest* q = requests(in, &r, &n, 0);
      CALL_HANDLE(kvcommFetchPlan_t, kvcommFetchPlanDestroy,
                  kvcommFetchPlanCreate(PICK(fetcher), q, n, u8(in) % 4 != 3 ? &r.o : NULL, OUT(kvcommFetchPlan_t*)),
                  g_scratch);
      break;
    }
    case 90: {
      int ch = destroyChoice(in);
      kvcommFetchPlan_t p = NULL;
      kvcommFetchRequest q = {0, NULL, NULL, 0, 0};
      if (ch == 0) kvcommFetchPlanCreate(g_live.fetcher, &q, 1, NULL, &p);
      CALL(0, kvcommFetchPlanDestroy(ch == 0 ? p : (kvcommFetchPlan_t)notLive(ch, g_dead.plan)));
      break;
    }
    case 91:
      CALL(0, kvcommFetchPlanGetInfo(PICK(plan), OUT(kvcommFetchPlanInfo*)));
      break;
    case 92:
      CALL(0, kvcommFetchPlanGeneration(PICK(plan), OUT(uint64_t*)));
      break;
    case 93:
      CALL(1, kvcommFetchSubmit(PICK(fetcher), PICK(plan), NULL));
      break;
    case 94: {
      static Requests r;
      size_t n = 0;
      const kvcommFetchRequest* q = requests(in, &r, &n, 0);
      CALL(1, kvcommFetch(PICK(fetcher), q, n, NULL, u8(in) % 4 != 3 ? &r.o : NULL, OUT(kvcommFetchPlanInfo*)));
      break;
    }
    case 95: {
      static Requests r;
      size_t n = 0;
      requests(in, &r, &n, 0);
      int32_t ranks[kIds];
      for (int i = 0; i < kIds; ++i) ranks[i] = ival(in);
      kvcommDeviceFetchBatch b = {SOME(in) ? r.src[0] : NULL, SOME(in) ? r.dst[0] : NULL, u8(in) % 2 ? NULL : ranks,
                                  ival(in), count(in, kIds, KVCOMM_MAX_FETCH_PAIRS, 2)};
      CALL(1, kvcommFetchDevice(PICK(fetcher), SOME(in) ? &b : NULL, NULL));
      break;
    }
    case 96: {
      static Requests r;
      size_t n = 0;
      const kvcommFetchRequest* q = requests(in, &r, &n, 1);
      CALL_HANDLE(
          kvcommFetchOperation_t, kvcommFetchOperationDestroy,
          kvcommFetchStart(PICK(fetcher), q, n, u8(in) % 4 != 3 ? &r.o : NULL, NULL, OUT(kvcommFetchOperation_t*)),
          g_scratch);
      break;
    }
    case 97:
      CALL(0, kvcommFetchOperationTest(PICK(op), OUT(kvcommFetchStatus*)));
      break;
    case 98:
      CALL(0, kvcommFetchOperationWait(PICK(op), (int64_t)val(in), OUT(kvcommFetchStatus*)));
      break;
    case 99:
      CALL(0, kvcommFetchOperationFailedBlocks(PICK(op), OUT(int64_t*), (size_t)val(in), OUT(size_t*)));
      break;
    case 100:
      TEXT_OUT(txt, bytes);
      CALL(0, kvcommFetchOperationError(PICK(op), txt, bytes, OUT(size_t*)));
      break;
    case 101: {
      int ch = destroyChoice(in);
      kvcommFetchOperation_t o = NULL;
      kvcommFetchRequest q = {0, NULL, NULL, 0, 0};
      if (ch == 0) kvcommFetchStart(g_live.fetcher, &q, 1, NULL, NULL, &o);
      CALL(0, kvcommFetchOperationDestroy(ch == 0 ? o : (kvcommFetchOperation_t)notLive(ch, g_dead.op)));
      break;
    }
    case 102: {
      static Requests r;
      size_t n = 0;
      const kvcommFetchRequest* q = requests(in, &r, &n, 0);
      CALL(1, kvcommFetchAll(PICK(fetcher), q, n, NULL, u8(in) % 4 != 3 ? &r.o : NULL, OUT(kvcommFetchPlanInfo*)));
      break;
    }
    case 103:
      CALL(0, kvcommFetcherRefresh(PICK(fetcher)));
      break;
    case 104:
      CALL(0, kvcommFetcherLayout(PICK(fetcher), ival(in), OUT(kvcommKvRegion*), (size_t)val(in), OUT(size_t*),
                                  OUT(uint64_t*)));
      break;
    case 105:
      CALL(0, kvcommFetcherLayoutHash(PICK(fetcher), ival(in), OUT(uint64_t*)));
      break;
    case 106:
      CALL(0, kvcommFetcherGeneration(PICK(fetcher), OUT(uint64_t*)));
      break;
    case 107: {
      void* h = OUT(void*);
      bytes = (size_t)valOr(in, 4096);
      if (h && bytes > kScratch) bytes %= kScratch + 1;
      CALL(0, kvcommFetcherDeviceHandle(PICK(fetcher), h, bytes, OUT(size_t*)));
      break;
    }
    case 108:
      CALL(0, kvcommFetcherPollError(PICK(fetcher), OUT(kvcommDeviceError*)));
      break;
    case 109:
      CALL(0, kvcommFetcherCheckErrors(PICK(fetcher)));
      break;
    case 110:
      TEXT_OUT(txt, bytes);
      CALL(0, kvcommCapabilitiesString(txt, bytes, OUT(size_t*)));
      break;
    default:
      CALL(0, kvcommUseLocalDevice(ival(in), OUT(int*)));
      break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int ready = 0;
  if (!ready) {
    setUp();
    ready = 1;
    if (getenv("KVCOMM_FUZZ_STATS")) atexit(printStats);
  }
  In in = {data, size, 0};
  for (int calls = 0; calls < 64 && in.at < in.n; ++calls) op(&in);
  return 0;
}
