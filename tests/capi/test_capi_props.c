/* Property test of the C ABI, driven from C (a C++ caller passing 9 as a C enum would itself be undefined behaviour):
 * every function kvcomm.h declares has an entry in the table of test_capi_props_calls.c, and this driver fails when
 * one has none (it parses the header) or when an entry names a function the header lacks. For every entry:
 *  1. the handle phase: each handle argument in turn is NULL, a handle destroyed just before, a pointer kvcomm never
 *     returned (zeroed memory), and a live handle of another type; the call must be refused with
 *     kvcommInvalidArgument naming the argument (a *Destroy of NULL succeeds), writing nothing;
 *  2. the entry's generated arguments: integers from INT64_MIN to UINT64_MAX including every enum's neighbours and
 *     the counts around every KVCOMM_MAX_* limit, NULL pointers, then valid calls. Each call either succeeds as
 *     documented or returns the documented code with a message naming the argument and nothing written: the output
 *     scratch is poisoned before each call and compared after it, and for calls that write memory every replica of
 *     the fixture's symmetric buffer too.
 * Run under mpirun -np 4 (CTest capi.props.np4; scripts/sanitize.sh runs it under UBSan with -fno-sanitize-recover).
 *   kvcomm_capi_props [path/to/kvcomm.h] */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capi_props.h"
#include "kvcomm/kvcomm.h"

#ifndef KVCOMM_HEADER
#define KVCOMM_HEADER "include/kvcomm/kvcomm.h"
#endif

static const unsigned char kPoison = 0xA7;

/* ---- generated values ----------------------------------------------------------------------------------------- */

static uint64_t s_values[160];
const uint64_t* g_values = s_values;
size_t g_numValues = 0;

static void addValue(uint64_t v) {
  for (size_t i = 0; i < g_numValues; ++i)
    if (s_values[i] == v) return;
  if (g_numValues < sizeof(s_values) / sizeof(s_values[0])) s_values[g_numValues++] = v;
}

static void makeValues(void) {
  for (uint64_t v = 0; v <= 12; ++v) addValue(v);
  const uint64_t edges[] = {15,
                            16,
                            17,
                            31,
                            32,
                            33,
                            42,
                            63,
                            64,
                            65,
                            127,
                            128,
                            129,
                            255,
                            256,
                            257,
                            (uint64_t)INT_MAX - 1,
                            (uint64_t)INT_MAX,
                            (uint64_t)INT_MAX + 1,
                            (uint64_t)UINT_MAX - 1,
                            (uint64_t)UINT_MAX,
                            (uint64_t)UINT_MAX + 1,
                            (uint64_t)1 << 40,
                            (uint64_t)INT64_MAX - 1,
                            (uint64_t)INT64_MAX,
                            (uint64_t)INT64_MIN,
                            (uint64_t)INT64_MIN + 1,
                            (uint64_t)(int64_t)INT_MIN,
                            (uint64_t)((int64_t)INT_MIN - 1),
                            (uint64_t)(int64_t)-65537,
                            (uint64_t)(int64_t)-3,
                            (uint64_t)(int64_t)-2,
                            UINT64_MAX,
                            UINT64_MAX / 2 + 1,
                            (uint64_t)SIZE_MAX / 4 + 1};
  for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); ++i) addValue(edges[i]);
  const uint64_t limits[] = {KVCOMM_MAX_FETCH_REGIONS,      KVCOMM_MAX_FETCH_REQUESTS,   KVCOMM_MAX_FETCH_PAIRS,
                             KVCOMM_MAX_PUBLISH_TENSORS,    KVCOMM_MAX_BARRIER_LANES,    KVCOMM_MAX_HANDLE_PEERS,
                             KVCOMM_MAX_BUFFER_RANGES,      KVCOMM_UNIQUE_ID_STRING_LEN, KVCOMM_MAX_ARENA_REGIONS,
                             KVCOMM_ARENA_MAX_MESSAGE_BYTES};
  for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); ++i) {
    addValue(limits[i] - 1);
    addValue(limits[i]);
    addValue(limits[i] + 1);
  }
}

kvcommKvContents fetchContents(void) {
  kvcommKvContents k = {2, 32, 4, 1, 0, 0, kvcommKvOrderTokensHeadsDim, 0};
  return k;
}

size_t enumValues(unsigned n, unsigned out[24]) {
  size_t k = 0;
  for (unsigned v = 0; v < n; ++v) out[k++] = v;
  const unsigned bad[] = {UINT_MAX, n, n + 1, 42, (unsigned)INT_MAX, (unsigned)INT_MAX + 1u, UINT_MAX - 1};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) out[k++] = bad[i];
  return k;
}

int asInt(uint64_t v) {
  uint32_t low = (uint32_t)v;
  return low <= (uint32_t)INT_MAX ? (int)low : (int)(int64_t)((int64_t)low - ((int64_t)1 << 32));
}

/* ---- checks --------------------------------------------------------------------------------------------------- */

void check(Ctx* c, int cond, const char* what, int line) {
  if (cond) return;
  ++c->failures;
  fprintf(stderr, "[rank %d] %s (line %d): check failed: %s\n", c->rank, c->entry, line, what);
}

static void snapshot(Ctx* c, unsigned char* to) {
  for (int r = 0; r < c->size; ++r) {
    void* p = NULL;
    if (kvcommBufferPeer(c->h.buffer, r, &p) != kvcommSuccess || p == NULL) {
      check(c, 0, "every replica is mapped", __LINE__);
      return;
    }
    memcpy(to + (size_t)r * kMapped, p, kMapped);
  }
}

void prepare(Ctx* c) {
  memset(c->scratch, kPoison, kScratchBytes);
  if (c->watchBuffer) snapshot(c, c->image);
}

static int noRank(const char* entry) {
  const char* prefixes[] = {"kvcommEndpoint", "kvcommRegistration", "kvcommRemoteMemory", "kvcommTransfer"};
  for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); ++i)
    if (strncmp(entry, prefixes[i], strlen(prefixes[i])) == 0) return 1;
  return 0;
}

void refused(Ctx* c, const char* what, kvcommResult_t r, kvcommResult_t expected, const char* word, int line) {
  ++c->cases;
  const char* msg = kvcommGetLastError();
  if (r != expected) {
    ++c->failures;
    fprintf(stderr, "[rank %d] %s (line %d): %s returned %s, expected %s (%s)\n", c->rank, c->entry, line, what,
            kvcommGetErrorString(r), kvcommGetErrorString(expected), msg);
    return;
  }
  if (word && strstr(msg, word) == NULL) {
    ++c->failures;
    fprintf(stderr, "[rank %d] %s (line %d): %s: message '%s' lacks '%s'\n", c->rank, c->entry, line, what, msg, word);
  }
  /* (arenas and endpoints belong to no communicator: their messages say "[rank ?]") */
  if (expected == kvcommInvalidArgument && strstr(msg, "[rank ?]") != NULL && c->h.comm != NULL &&
      strncmp(c->entry, "kvcommArena", 11) != 0 && !noRank(c->entry) && strstr(what, "c->h.") != NULL && strstr(msg, "is NULL") == NULL &&
      strstr(msg, "not a live") == NULL && strstr(msg, ", not a ") == NULL) {
    ++c->failures;
    fprintf(stderr, "[rank %d] %s (line %d): %s: message '%s' does not name the rank of its handle\n", c->rank,
            c->entry, line, what, msg);
  }
  for (size_t i = 0; i < kScratchBytes; ++i)
    if (c->scratch[i] != kPoison) {
      ++c->failures;
      fprintf(stderr, "[rank %d] %s (line %d): refused %s wrote its output (byte %zu)\n", c->rank, c->entry, line, what,
              i);
      break;
    }
  if (c->watchBuffer) {
    unsigned char* now = (unsigned char*)malloc((size_t)c->size * kMapped);
    snapshot(c, now);
    if (memcmp(now, c->image, (size_t)c->size * kMapped) != 0) {
      ++c->failures;
      fprintf(stderr, "[rank %d] %s (line %d): refused %s changed a replica of the buffer\n", c->rank, c->entry, line,
              what);
    }
    free(now);
  }
}

void succeeded(Ctx* c, const char* what, kvcommResult_t r, int line) {
  ++c->cases;
  if (r == kvcommSuccess) return;
  ++c->failures;
  fprintf(stderr, "[rank %d] %s (line %d): %s returned %s: %s\n", c->rank, c->entry, line, what,
          kvcommGetErrorString(r), kvcommGetLastError());
}

void sync(Ctx* c) {
  (void)c;
  MPI_Barrier(MPI_COMM_WORLD);
}

/* ---- the table: g_entries, g_arenaEntries, then g_endpointEntries ------------------------------------------------------------------ */

static const Entry* s_table[512];
static size_t s_numTable = 0;

static void makeTable(void) {
  for (size_t e = 0; e < g_numEntries && s_numTable < 512; ++e) s_table[s_numTable++] = &g_entries[e];
  for (size_t e = 0; e < g_numArenaEntries && s_numTable < 512; ++e) s_table[s_numTable++] = &g_arenaEntries[e];
  for (size_t e = 0; e < g_numEndpointEntries && s_numTable < 512; ++e) s_table[s_numTable++] = &g_endpointEntries[e];
}

/* ---- the header: every function it declares ------------------------------------------------------------------- */

static int isalnumOrUnderscore(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

/* Names of the functions declared in `path`: an identifier kvcomm... followed by '(' and preceded by a type (its
 * previous non-blank character is a letter, a digit, '_' or '*'), outside comments and preprocessor lines. */
static size_t headerFunctions(const char* path, char names[][64], size_t max) {
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  static char text[1 << 17];
  size_t n = fread(text, 1, sizeof(text) - 1, f);
  fclose(f);
  text[n] = '\0';
  /* blank comments and preprocessor lines */
  for (size_t i = 0; i < n; ++i) {
    if (text[i] == '/' && text[i + 1] == '*') {
      while (i < n && !(text[i] == '*' && text[i + 1] == '/')) text[i++] = ' ';
      if (i < n) text[i] = text[i + 1] = ' ';
    } else if (text[i] == '/' && text[i + 1] == '/') {
      while (i < n && text[i] != '\n') text[i++] = ' ';
    } else if (text[i] == '#' && (i == 0 || text[i - 1] == '\n')) {
      while (i < n && text[i] != '\n') {
        int cont = text[i] == '\\' && text[i + 1] == '\n';
        text[i++] = ' ';
        if (cont) text[i++] = ' ';
      }
    }
  }
  size_t count = 0;
  for (size_t i = 0; i + 6 < n; ++i) {
    if (strncmp(text + i, "kvcomm", 6) != 0) continue;
    if (i > 0 && (isalnumOrUnderscore(text[i - 1]))) continue;
    size_t e = i;
    while (e < n && isalnumOrUnderscore(text[e])) ++e;
    size_t p = e;
    while (p < n && (text[p] == ' ' || text[p] == '\n')) ++p;
    if (text[p] != '(') continue;
    size_t b = i;
    while (b > 0 && (text[b - 1] == ' ' || text[b - 1] == '\n')) --b;
    if (b == 0 || !(isalnumOrUnderscore(text[b - 1]) || text[b - 1] == '*')) continue;
    if (count < max && e - i < 64) {
      memcpy(names[count], text + i, e - i);
      names[count][e - i] = '\0';
      ++count;
    }
    i = e;
  }
  return count;
}

/* ---- the fixture ---------------------------------------------------------------------------------------------- */

static int mpiAllgather(const void* send, void* recv, size_t bytes, void* user) {
  MPI_Comm comm = *(MPI_Comm*)user;
  return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm) == MPI_SUCCESS ? 0 : 1;
}

#define FIXTURE_OK(call)                                                                             \
  do {                                                                                               \
    kvcommResult_t r_ = (call);                                                                      \
    if (r_ != kvcommSuccess) {                                                                       \
      fprintf(stderr, "[rank %d] fixture: %s -> %s: %s\n", c->rank, #call, kvcommGetErrorString(r_), \
              kvcommGetLastError());                                                                 \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                  \
    }                                                                                                \
  } while (0)

/* The fetch request of the fixture: 4 source blocks of the next rank into 4 destination blocks here. */
static int64_t s_src[4] = {0, 1, 2, 5},
               s_dst[4] = {kFetchBlocks / 2, kFetchBlocks / 2 + 1, kFetchBlocks / 2 + 2, kFetchBlocks / 2 + 7};

static kvcommFetchRequest fixtureRequest(const Ctx* c) {
  kvcommFetchRequest q;
  q.srcRank = (c->rank + 1) % c->size;
  q.srcBlocks = s_src;
  q.dstBlocks = s_dst;
  q.count = 4;
  q.srcLayoutHash = 0;
  return q;
}

static kvcommResult_t waitDone(kvcommFetchOperation_t op) {
  kvcommFetchStatus st;
  kvcommResult_t r = kvcommFetchOperationWait(op, -1, &st);
  if (r == kvcommSuccess && st.state != kvcommFetchDone) return kvcommInternalError;
  return r;
}

/* Creates a handle of each type in `types` (collective where the create is). */
static void makeHandles(Ctx* c, unsigned types, Handles* out) {
  if (types & kHComm) FIXTURE_OK(kvcommCommSplit(c->h.comm, 0, c->rank, &out->comm));
  if (types & kHLayout) {
    kvcommParallelSpec spec = {c->size, 1, 1, 1};
    FIXTURE_OK(kvcommParallelGroupsCreate(c->h.comm, &spec, &out->layout));
  }
  if (types & kHBuffer) FIXTURE_OK(kvcommBufferCreate(c->h.comm, kCapacity, kMapped, kvcommMemoryHost, &out->buffer));
  kvcommBuffer_t buf = out->buffer ? out->buffer : c->h.buffer;
  if (types & kHPublisher) {
    kvcommPublisherOptions o;
    FIXTURE_OK(kvcommPublisherOptionsInit(&o));
    o.barrierTimeoutMs = 60000;
    FIXTURE_OK(kvcommPublisherCreate(buf, &o, &out->publisher));
  }
  if (types & kHBarrier) {
    kvcommBarrierOptions o;
    FIXTURE_OK(kvcommBarrierOptionsInit(&o));
    o.kind = kvcommMemoryHost;
    o.timeoutMs = 60000;
    FIXTURE_OK(kvcommBarrierCreate(c->h.comm, &o, &out->barrier));
  }
  if (types & kHFetcher) {
    kvcommFetcherOptions o;
    FIXTURE_OK(kvcommFetcherOptionsInit(&o));
    o.barrierTimeoutMs = 60000;
    FIXTURE_OK(kvcommFetcherCreate(buf, &c->region, 1, 1, &o, &out->fetcher));
  }
  if (types & kHConverted) {
    kvcommKvContents k = fetchContents();
    FIXTURE_OK(kvcommConvertedFetcherCreate(buf, &c->region, 1, &k, 1, "127.0.0.1:0", &out->converted));
  }
  kvcommFetcher_t f = out->fetcher ? out->fetcher : c->h.fetcher;
  kvcommFetchRequest q = fixtureRequest(c);
  if (types & kHPlan) FIXTURE_OK(kvcommFetchPlanCreate(f, &q, 1, NULL, &out->plan));
  if (types & kHOp) {
    FIXTURE_OK(kvcommFetchStart(f, &q, 1, NULL, NULL, &out->op));
    FIXTURE_OK(waitDone(out->op));
  }
  /* Arenas: an import gets an arena of its own (so that the fixture arena's lease count stays 1). */
  if (types & (kHArena | kHImport)) out->arena = arenaMake(c);
  if (types & kHPin)
    FIXTURE_OK(kvcommArenaPinCreate(out->arena ? out->arena : c->h.arena, kArenaPinOffset, kArenaPinBytes, &out->pin));
  if (types & kHServer) FIXTURE_OK(kvcommArenaServerListen(NULL, NULL, &out->server));
  if (types & kHSession) out->session = arenaConnect(c, out->server ? out->server : c->h.server);
  if (types & kHImport) out->import = arenaImportOf(c, out->arena, out->session ? out->session : c->h.session);
  endpointMake(c, types, out);
}

static void destroyHandles(Ctx* c, Handles* h) {
  endpointDestroy(c, h);
  FIXTURE_OK(kvcommArenaPinDestroy(h->pin));
  FIXTURE_OK(kvcommArenaImportDestroy(h->import));
  FIXTURE_OK(kvcommArenaSessionDestroy(h->session));
  FIXTURE_OK(kvcommArenaServerDestroy(h->server));
  FIXTURE_OK(kvcommArenaDestroy(h->arena));
  FIXTURE_OK(kvcommFetchOperationDestroy(h->op));
  FIXTURE_OK(kvcommFetchPlanDestroy(h->plan));
  FIXTURE_OK(kvcommConvertedFetcherDestroy(h->converted));
  FIXTURE_OK(kvcommFetcherDestroy(h->fetcher));
  FIXTURE_OK(kvcommBarrierDestroy(h->barrier));
  FIXTURE_OK(kvcommPublisherDestroy(h->publisher));
  FIXTURE_OK(kvcommBufferDestroy(h->buffer));
  FIXTURE_OK(kvcommParallelGroupsDestroy(h->layout));
  FIXTURE_OK(kvcommCommDestroy(h->comm));
  memset(h, 0, sizeof(*h));
}

static void setUp(Ctx* c) {
  MPI_Comm world = MPI_COMM_WORLD;
  FIXTURE_OK(kvcommCommInitCallback(&c->h.comm, c->rank, c->size, mpiAllgather, &world));
  c->region.offset = kFetchOffset;
  c->region.blockBytes = kFetchBlockBytes;
  c->region.blockStride = 0;
  c->region.numBlocks = kFetchBlocks;
  Handles made;
  memset(&made, 0, sizeof(made));
  makeHandles(c, kHLayout | kHBuffer | kHPublisher | kHBarrier | kHFetcher | kHPlan | kHOp | kHArena | kHServer | kHConverted,
              &made);
  made.comm = c->h.comm;
  c->h = made;
  /* The arena fixture: a session to this process's own server (its other end accepted), an import of the fixture
   * arena over it, and a pin of the arena. */
  c->h.session = arenaConnect(c, c->h.server);
  FIXTURE_OK(kvcommArenaServerAccept(c->h.server, 10000, &c->peerSession));
  c->h.import = arenaImportOf(c, c->h.arena, c->h.session);
  FIXTURE_OK(kvcommArenaPinCreate(c->h.arena, kArenaPinOffset, kArenaPinBytes, &c->h.pin));
  endpointSetUp(c);
  void* local = NULL;
  FIXTURE_OK(kvcommBufferLocal(c->h.buffer, &local));
  for (size_t i = 0; i < kMapped; ++i) ((unsigned char*)local)[i] = (unsigned char)(i * 13 + (size_t)c->rank * 101);
  memset(&c->id, 0, sizeof(c->id));
  if (c->rank == 0) FIXTURE_OK(kvcommGetUniqueId(&c->id, "lo"));
  MPI_Bcast(&c->id, sizeof(c->id), MPI_BYTE, 0, MPI_COMM_WORLD);
  c->scratch = (unsigned char*)malloc(kScratchBytes);
  c->image = (unsigned char*)malloc((size_t)c->size * kMapped);
  MPI_Barrier(MPI_COMM_WORLD);
}

/* ---- the handle phase ----------------------------------------------------------------------------------------- */

static kvcommComm_t* slotOf(Handles* h, unsigned type) {
  switch (type) {
    case kHComm:
      return (kvcommComm_t*)(void*)&h->comm;
    case kHLayout:
      return (kvcommComm_t*)(void*)&h->layout;
    case kHBuffer:
      return (kvcommComm_t*)(void*)&h->buffer;
    case kHPublisher:
      return (kvcommComm_t*)(void*)&h->publisher;
    case kHBarrier:
      return (kvcommComm_t*)(void*)&h->barrier;
    case kHFetcher:
      return (kvcommComm_t*)(void*)&h->fetcher;
    case kHPlan:
      return (kvcommComm_t*)(void*)&h->plan;
    case kHArena:
      return (kvcommComm_t*)(void*)&h->arena;
    case kHPin:
      return (kvcommComm_t*)(void*)&h->pin;
    case kHImport:
      return (kvcommComm_t*)(void*)&h->import;
    case kHSession:
      return (kvcommComm_t*)(void*)&h->session;
    case kHServer:
      return (kvcommComm_t*)(void*)&h->server;
    case kHEndpoint:
      return (kvcommComm_t*)(void*)&h->endpoint;
    case kHRegistration:
      return (kvcommComm_t*)(void*)&h->registration;
    case kHRemote:
      return (kvcommComm_t*)(void*)&h->remote;
    case kHTransfer:
      return (kvcommComm_t*)(void*)&h->transfer;
    case kHConverted:
      return (kvcommComm_t*)(void*)&h->converted;
    default:
      return (kvcommComm_t*)(void*)&h->op;
  }
}

static const char* typeName(unsigned type) {
  switch (type) {
    case kHComm:
      return "kvcommComm_t";
    case kHLayout:
      return "kvcommParallelGroups_t";
    case kHBuffer:
      return "kvcommBuffer_t";
    case kHPublisher:
      return "kvcommPublisher_t";
    case kHBarrier:
      return "kvcommBarrier_t";
    case kHFetcher:
      return "kvcommFetcher_t";
    case kHPlan:
      return "kvcommFetchPlan_t";
    case kHArena:
      return "kvcommArena_t";
    case kHPin:
      return "kvcommArenaPin_t";
    case kHImport:
      return "kvcommArenaImport_t";
    case kHSession:
      return "kvcommArenaSession_t";
    case kHServer:
      return "kvcommArenaServer_t";
    case kHEndpoint:
      return "kvcommEndpoint_t";
    case kHRegistration:
      return "kvcommRegistration_t";
    case kHRemote:
      return "kvcommRemoteMemory_t";
    case kHTransfer:
      return "kvcommTransfer_t";
    case kHConverted:
      return "kvcommConvertedFetcher_t";
    default:
      return "kvcommFetchOperation_t";
  }
}

static int endsWith(const char* s, const char* tail) {
  size_t a = strlen(s), b = strlen(tail);
  return a >= b && strcmp(s + a - b, tail) == 0;
}

/* Every entry taking a handle of `type`, with that handle NULL, destroyed just before (no handle is created between
 * its destruction and these calls, so its address cannot have been handed out again), zeroed memory kvcomm never
 * returned, and a live handle of another type. */
static void handlePhase(Ctx* c, unsigned type) {
  Handles fresh;
  memset(&fresh, 0, sizeof(fresh));
  makeHandles(c, type, &fresh);
  void* dead = *(void**)slotOf(&fresh, type);
  destroyHandles(c, &fresh);
  static uint64_t zeroed[64];
  void* other = type == kHBuffer ? (void*)c->h.comm : (void*)c->h.buffer;
  const char* otherName = type == kHBuffer ? "is a kvcommComm_t" : "is a kvcommBuffer_t";
  char notLive[64];
  snprintf(notLive, sizeof(notLive), "is not a live %s", typeName(type));
  struct {
    void* handle;
    const char* word;
  } cases[4] = {{NULL, "is NULL"}, {dead, notLive}, {zeroed, notLive}, {other, otherName}};
  sync(c);
  for (size_t e = 0; e < s_numTable; ++e) {
    const Entry* en = s_table[e];
    if (!(en->handles & type) || !en->call) continue;
    c->entry = en->name;
    c->watchBuffer = en->writesMemory;
    for (int k = 0; k < 4; ++k) {
      Handles h = c->h;
      *(void**)slotOf(&h, type) = cases[k].handle;
      prepare(c);
      kvcommResult_t r = en->call(c, &h);
      char what[160];
      snprintf(what, sizeof(what), "%s with its %s %s", en->name, typeName(type),
               k == 0   ? "NULL"
               : k == 1 ? "destroyed"
               : k == 2 ? "never created"
                        : "of another type");
      if (k == 0 && endsWith(en->name, "Destroy"))
        succeeded(c, what, r, __LINE__);
      else
        refused(c, what, r, kvcommInvalidArgument, cases[k].word, __LINE__);
    }
  }
  c->watchBuffer = 0;
  sync(c);
}

/* ---- main ----------------------------------------------------------------------------------------------------- */

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Ctx ctx;
  memset(&ctx, 0, sizeof(ctx));
  Ctx* c = &ctx;
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  makeValues();
  makeTable();
  c->entry = "table";

  /* 1. The table against the header: every declared function has an entry, every entry a declared function. */
  const char* header = argc > 1 ? argv[1] : KVCOMM_HEADER;
  static char declared[512][64];
  size_t numDeclared = headerFunctions(header, declared, 512);
  if (numDeclared < 100) {
    fprintf(stderr, "[rank %d] found only %zu functions in %s\n", c->rank, numDeclared, header);
    ++c->failures;
  }
  for (size_t i = 0; i < numDeclared; ++i) {
    int found = 0;
    for (size_t e = 0; e < s_numTable && !found; ++e) found = strcmp(s_table[e]->name, declared[i]) == 0;
    if (!found) {
      fprintf(stderr, "[rank %d] %s is declared in kvcomm.h but has no entry in the property table\n", c->rank,
              declared[i]);
      ++c->failures;
    }
  }
  for (size_t e = 0; e < s_numTable; ++e) {
    int found = 0;
    for (size_t i = 0; i < numDeclared && !found; ++i) found = strcmp(s_table[e]->name, declared[i]) == 0;
    if (!found) {
      fprintf(stderr, "[rank %d] the property table has %s, which kvcomm.h does not declare\n", c->rank,
              s_table[e]->name);
      ++c->failures;
    }
  }

  /* 2. The handle phase, one handle type at a time. */
  setUp(c);
  for (unsigned t = 0; t < kNumHandleTypes; ++t) handlePhase(c, 1u << t);

  /* 3. Every entry's generated arguments. */
  long total = 0;
  for (size_t e = 0; e < s_numTable; ++e) {
    c->entry = s_table[e]->name;
    c->cases = 0;
    c->watchBuffer = 0;
    sync(c);
    s_table[e]->props(c);
    c->watchBuffer = 0;
    sync(c);
    if (c->cases == 0) {
      fprintf(stderr, "[rank %d] %s: its entry generated no call\n", c->rank, c->entry);
      ++c->failures;
    }
    total += c->cases;
  }

  FIXTURE_OK(kvcommArenaSessionDestroy(c->peerSession));
  destroyHandles(c, &c->h);
  endpointTearDown(c);
  free(c->scratch);
  free(c->image);
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long failures = 0;
  MPI_Allreduce(&c->failures, &failures, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (c->rank == 0)
    printf(
        "capi props: %s: %zu functions declared, %zu entries, %ld generated calls per rank, %d ranks, %.1f s "
        "(%ld failed checks)\n",
        failures ? "FAILED" : "passed", numDeclared, s_numTable, total, c->size,
        (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), failures);
  MPI_Finalize();
  return failures ? 1 : 0;
}
