/* The property table's arena entries (test_capi_props.c appends them to test_capi_props_calls.c's table): one entry
 * per kvcommArena* function of kvcomm.h. Each rank works on arenas of its own, over a server of its own that it
 * connects to itself (the fixture imports its own arena through that session), so no call here is collective.
 * The oracle is the documented contract, as in the rest of the table: a value the call admits succeeds (its result
 * checked: bytes read back, layouts, counts, leases), any other is refused with kvcommInvalidArgument (or the
 * documented code: kvcommBusy, kvcommTimeout, kvcommAborted) naming the argument, with nothing written. Calls that
 * change or end an object (grow, shrink, free, close, destroy) get objects made for them, never the fixture's. */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "capi_props.h"
#include "kvcomm/kvcomm.h"

#define FOR_VALUES(x)                                  \
  for (size_t i_##x = 0; i_##x < g_numValues; ++i_##x) \
    for (uint64_t x = g_values[i_##x], once_##x = 1; once_##x; once_##x = 0)

/* ---- helpers -------------------------------------------------------------------------------------------------- */

#define FIXTURE(call)                                                                                     \
  do {                                                                                                    \
    kvcommResult_t r_ = (call);                                                                           \
    if (r_ != kvcommSuccess) {                                                                            \
      fprintf(stderr, "[rank %d] %s: %s -> %s: %s\n", c->rank, c->entry, #call, kvcommGetErrorString(r_), \
              kvcommGetLastError());                                                                      \
      ++c->failures;                                                                                      \
    }                                                                                                     \
  } while (0)

void arenaLayout(kvcommKvRegion* r) {
  r->offset = 0;
  r->blockBytes = kArenaBlockBytes;
  r->blockStride = 0;
  r->numBlocks = kArenaBlocks;
}

/* A host arena of the fixture's layout (capacity kArenaCapacity). */
kvcommArena_t arenaMake(Ctx* c) {
  kvcommKvRegion r;
  arenaLayout(&r);
  kvcommArenaOptions o;
  kvcommArenaOptionsInit(&o);
  o.kind = kvcommMemoryHost;
  o.capacity = kArenaCapacity;
  kvcommArena_t a = NULL;
  FIXTURE(kvcommArenaCreate(&r, 1, 3, &o, &a));
  return a;
}

/* An import of `a` by this very process, over `s` (a session to this process's own server). */
kvcommArenaImport_t arenaImportOf(Ctx* c, kvcommArena_t a, kvcommArenaSession_t s) {
  kvcommArenaCapability cap;
  kvcommArenaImport_t i = NULL;
  FIXTURE(kvcommArenaSessionOffer(s, a, 60000, &cap));
  FIXTURE(kvcommArenaSessionImport(s, &cap, NULL, &i));
  return i;
}

kvcommArenaSession_t arenaConnect(Ctx* c, kvcommArenaServer_t srv) {
  char address[128];
  kvcommArenaSession_t s = NULL;
  FIXTURE(kvcommArenaServerAddress(srv, address, sizeof(address), NULL));
  FIXTURE(kvcommArenaSessionConnect(address, NULL, &s));
  return s;
}

static size_t arenaBytes(Ctx* c) {
  size_t b = 0;
  FIXTURE(kvcommArenaBytes(c->h.arena, &b));
  return b;
}

/* Whether [offset, offset + bytes) lies inside `total` bytes without wrapping. */
static int inside(uint64_t offset, uint64_t bytes, size_t total) {
  return offset <= total && bytes <= total - offset;
}

typedef kvcommResult_t (*TextFn)(Ctx* c, char* text, size_t bytes, size_t* needed);
/* The string pattern: *needed is the length + 1; any textBytes copies a NUL-terminated prefix, never more. */
static void textProps(Ctx* c, TextFn fn) {
  size_t needed = 0;
  SUCCEEDS(fn(c, NULL, 0, &needed));
  EXPECT(needed >= 1);
  char* text = (char*)malloc(needed + 64);
  FOR_VALUES(x) {
    size_t b = (size_t)x;
    if (b <= needed + 32) {
      memset(text, 'x', needed + 64);
      size_t got = 0;
      SUCCEEDS(fn(c, b ? text : NULL, b, &got));
      EXPECT(got == needed);
      if (b) EXPECT(strlen(text) == (b < needed ? b - 1 : needed - 1) && text[b < needed ? b : needed] == 'x');
    }
    if (b > 0) REFUSED("text is NULL", fn(c, NULL, b, SCRATCH(size_t*)));
  }
  free(text);
}

/* A layout argument: NULL, counts around KVCOMM_MAX_ARENA_REGIONS (refused before anything reads the array). */
typedef kvcommResult_t (*LayoutFn)(Ctx* c, const kvcommKvRegion* regions, size_t n);
static void layoutArgProps(Ctx* c, LayoutFn fn) {
  static kvcommKvRegion many[4];
  FOR_VALUES(x) {
    if (x > KVCOMM_MAX_ARENA_REGIONS) REFUSED("KVCOMM_MAX_ARENA_REGIONS", fn(c, many, (size_t)x));
  }
  REFUSED("regions is NULL", fn(c, NULL, 1));
  REFUSED("regions is NULL", fn(c, NULL, 0));
}

/* ---- options -------------------------------------------------------------------------------------------------- */

static void propsArenaOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommArenaOptionsInit(NULL));
  kvcommArenaOptions o;
  memset(&o, 0x5a, sizeof(o));
  SUCCEEDS(kvcommArenaOptionsInit(&o));
  EXPECT(o.kind == kvcommMemoryAuto && o.capacity == 0 && o.legacyIpc == 0);
}
static void propsArenaImportOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommArenaImportOptionsInit(NULL));
  kvcommArenaImportOptions o;
  memset(&o, 0x5a, sizeof(o));
  SUCCEEDS(kvcommArenaImportOptionsInit(&o));
  EXPECT(o.onOwnerLoss == kvcommArenaOwnerLossKeep && o.timeoutMs < 0);
}
static void propsArenaSessionOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommArenaSessionOptionsInit(NULL));
  kvcommArenaSessionOptions o;
  memset(&o, 0x5a, sizeof(o));
  SUCCEEDS(kvcommArenaSessionOptionsInit(&o));
  EXPECT(o.timeoutMs < 0);
}
static void propsArenaServerOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommArenaServerOptionsInit(NULL));
  kvcommArenaServerOptions o;
  memset(&o, 0x5a, sizeof(o));
  SUCCEEDS(kvcommArenaServerOptionsInit(&o));
  EXPECT(o.maxSessions == 1024 && o.maxPendingHandshakes == 64 && o.handshakeTimeoutMs < 0 && o.requestTimeoutMs < 0);
}

/* ---- the owner's arena ---------------------------------------------------------------------------------------- */

static kvcommResult_t createWith(Ctx* c, const kvcommKvRegion* regions, size_t n) {
  return kvcommArenaCreate(regions, n, 0, NULL, SCRATCH(kvcommArena_t*));
}
/* options->kind through every value of its enum and neighbours, legacyIpc and capacity through the values. */
static void propsArenaCreate(Ctx* c) {
  layoutArgProps(c, createWith);
  kvcommKvRegion r;
  arenaLayout(&r);
  REFUSED("arena is NULL", kvcommArenaCreate(&r, 1, 0, NULL, NULL));
  kvcommArenaOptions o;
  kvcommArenaOptionsInit(&o);
  unsigned vals[24];
  size_t n = enumValues(3, vals);
  for (size_t i = 0; i < n; ++i) {
    o.kind = (kvcommMemoryKind_t)vals[i];
    if (i >= 3) REFUSED("options->kind", kvcommArenaCreate(&r, 1, 0, &o, SCRATCH(kvcommArena_t*)));
  }
  o.kind = kvcommMemoryHost;
  FOR_VALUES(x) {
    o.legacyIpc = asInt(x);
    if (o.legacyIpc != 0 && o.legacyIpc != 1)
      REFUSED("options->legacyIpc", kvcommArenaCreate(&r, 1, 0, &o, SCRATCH(kvcommArena_t*)));
  }
  o.legacyIpc = 1; /* host arenas refuse legacy IPC */
  REFUSED("legacyIpc", kvcommArenaCreate(&r, 1, 0, &o, SCRATCH(kvcommArena_t*)));
  o.legacyIpc = 0;
  FOR_VALUES(x) {
    o.capacity = (size_t)x;
    if (x > 0 && x < (uint64_t)kArenaBlocks * kArenaBlockBytes)
      REFUSED("capacity", kvcommArenaCreate(&r, 1, 0, &o, SCRATCH(kvcommArena_t*)));
  }
  /* Region fields: zero sizes and products that wrap are refused. */
  o.capacity = 0;
  kvcommKvRegion bad = r;
  bad.blockBytes = 0;
  REFUSED("blockBytes", kvcommArenaCreate(&bad, 1, 0, &o, SCRATCH(kvcommArena_t*)));
  bad = r;
  bad.numBlocks = SIZE_MAX;
  REFUSED("Arena::create", kvcommArenaCreate(&bad, 1, 0, &o, SCRATCH(kvcommArena_t*)));
  /* Valid: the layout and kind come back as given. */
  kvcommArena_t a = NULL;
  SUCCEEDS(kvcommArenaCreate(&r, 1, 11, &o, &a));
  kvcommKvRegion got;
  size_t count = 0;
  uint64_t version = 0;
  SUCCEEDS(kvcommArenaLayout(a, &got, 1, &count, &version));
  EXPECT(count == 1 && version == 11 && got.numBlocks == kArenaBlocks && got.blockBytes == kArenaBlockBytes);
  SUCCEEDS(kvcommArenaDestroy(a));
}

static kvcommResult_t callArenaDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaDestroy(h->arena);
}
static void propsArenaDestroy(Ctx* c) {
  SUCCEEDS(kvcommArenaDestroy(NULL));
  kvcommArena_t a = arenaMake(c);
  SUCCEEDS(kvcommArenaDestroy(a));
  REFUSED("is not a live kvcommArena_t", kvcommArenaDestroy(a));
}

#define ARENA_GETTER(Name, T, word, cond)                      \
  static kvcommResult_t call##Name(Ctx* c, const Handles* h) { \
    return kvcomm##Name(h->arena, SCRATCH(T*));                \
  }                                                            \
  static void props##Name(Ctx* c) {                            \
    REFUSED(word " is NULL", kvcomm##Name(c->h.arena, NULL));  \
    T v;                                                       \
    memset(&v, 0x5a, sizeof(v));                               \
    SUCCEEDS(kvcomm##Name(c->h.arena, &v));                    \
    EXPECT(cond);                                              \
  }
ARENA_GETTER(ArenaData, void*, "data", v != NULL)
ARENA_GETTER(ArenaBytes, size_t, "bytes", v >= (size_t)kArenaBlocks * kArenaBlockBytes && v <= kArenaCapacity)
ARENA_GETTER(ArenaCapacity, size_t, "bytes", v >= kArenaCapacity)
ARENA_GETTER(ArenaGranularity, size_t, "bytes", v > 0 && (v & (v - 1)) == 0)
ARENA_GETTER(ArenaKind, kvcommMemoryKind_t, "kind", v == kvcommMemoryHost)
ARENA_GETTER(ArenaDevice, int, "device", v == -1)
ARENA_GETTER(ArenaId, uint64_t, "id", v != 0)
ARENA_GETTER(ArenaGeneration, uint64_t, "generation", v >= 1)
ARENA_GETTER(ArenaLeases, size_t, "leases", v == 1)         /* the fixture's import */
ARENA_GETTER(ArenaOperations, size_t, "operations", v == 1) /* the fixture's pin */
ARENA_GETTER(ArenaLiveCapabilities, size_t, "count", v < 1000)
ARENA_GETTER(ArenaFreed, int, "freed", v == 0)

static kvcommResult_t arenaHandleType(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommArenaHandleType(c->h.arena, text, bytes, needed);
}
static kvcommResult_t callArenaHandleType(Ctx* c, const Handles* h) {
  return kvcommArenaHandleType(h->arena, SCRATCH(char*), 16, SCRATCH(size_t*) + 64);
}
static void propsArenaHandleType(Ctx* c) {
  textProps(c, arenaHandleType);
  char t[16];
  SUCCEEDS(kvcommArenaHandleType(c->h.arena, t, sizeof(t), NULL));
  EXPECT(strcmp(t, "memfd") == 0);
}

/* The list pattern over capacity and NULL arrays. */
static kvcommResult_t callArenaLayout(Ctx* c, const Handles* h) {
  return kvcommArenaLayout(h->arena, SCRATCH(kvcommKvRegion*), 4, SCRATCH(size_t*) + 64, NULL);
}
static void propsArenaLayout(Ctx* c) {
  REFUSED("count is NULL", kvcommArenaLayout(c->h.arena, SCRATCH(kvcommKvRegion*), 1, NULL, NULL));
  FOR_VALUES(x) {
    if (x > 0) REFUSED("regions is NULL", kvcommArenaLayout(c->h.arena, NULL, (size_t)x, SCRATCH(size_t*), NULL));
  }
  size_t count = 9;
  SUCCEEDS(kvcommArenaLayout(c->h.arena, NULL, 0, &count, NULL));
  EXPECT(count == 1);
}

static kvcommResult_t callArenaImporters(Ctx* c, const Handles* h) {
  return kvcommArenaImporters(h->arena, SCRATCH(int*), 4, SCRATCH(size_t*) + 64);
}
static void propsArenaImporters(Ctx* c) {
  REFUSED("count is NULL", kvcommArenaImporters(c->h.arena, SCRATCH(int*), 1, NULL));
  FOR_VALUES(x) {
    if (x > 0) REFUSED("pids is NULL", kvcommArenaImporters(c->h.arena, NULL, (size_t)x, SCRATCH(size_t*)));
  }
  int pids[4] = {0, 0, 0, 0};
  size_t count = 0;
  SUCCEEDS(kvcommArenaImporters(c->h.arena, pids, 4, &count));
  EXPECT(count == 1 && pids[0] == (int)getpid());
}

/* pid through every value (> 0 admitted), ttlMs through every value (1 ms to one day admitted). */
static kvcommResult_t callArenaOffer(Ctx* c, const Handles* h) {
  return kvcommArenaOffer(h->arena, (int)getpid(), (uint32_t)getuid(), 1000, SCRATCH(kvcommArenaCapability*));
}
static void propsArenaOffer(Ctx* c) {
  kvcommArena_t a = arenaMake(c);
  kvcommArenaCapability cap;
  FOR_VALUES(x) {
    int pid = asInt(x);
    if (pid <= 0) REFUSED("pid", kvcommArenaOffer(a, pid, 0, 1000, SCRATCH(kvcommArenaCapability*)));
    int64_t ttl = (int64_t)x;
    if (ttl < 1 || ttl > 86400000)
      REFUSED("time to live", kvcommArenaOffer(a, (int)getpid(), 0, ttl, SCRATCH(kvcommArenaCapability*)));
    else if (ttl < 100000) {
      SUCCEEDS(kvcommArenaOffer(a, (int)getpid(), 7, ttl, &cap));
      EXPECT(cap.importerPid == (int32_t)getpid() && cap.importerUid == 7 && cap.generation == 1);
    }
  }
  REFUSED("capability is NULL", kvcommArenaOffer(a, (int)getpid(), 0, 1000, NULL));
  size_t live = 0;
  SUCCEEDS(kvcommArenaLiveCapabilities(a, &live));
  EXPECT(live > 0);
  SUCCEEDS(kvcommArenaRevokeCapabilities(a));
  SUCCEEDS(kvcommArenaLiveCapabilities(a, &live));
  EXPECT(live == 0);
  SUCCEEDS(kvcommArenaDestroy(a));
}

static kvcommResult_t callArenaRevokeCapabilities(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaRevokeCapabilities(h->arena);
}
static void propsArenaRevokeCapabilities(Ctx* c) {
  kvcommArena_t a = arenaMake(c);
  kvcommArenaCapability cap;
  SUCCEEDS(kvcommArenaOffer(a, (int)getpid(), (uint32_t)getuid(), 60000, &cap));
  SUCCEEDS(kvcommArenaRevokeCapabilities(a));
  kvcommArenaImport_t i = NULL;
  REFUSED("revoked", kvcommArenaSessionImport(c->h.session, &cap, NULL, SCRATCH(kvcommArenaImport_t*)));
  (void)i;
  SUCCEEDS(kvcommArenaDestroy(a));
}

/* newBytes through every value: up to the capacity admitted (below the backed bytes is refused). */
static kvcommResult_t callArenaGrow(Ctx* c, const Handles* h) {
  return kvcommArenaGrow(h->arena, 0, 0, SCRATCH(kvcommArenaGrowth*));
}
static void propsArenaGrow(Ctx* c) {
  kvcommArena_t a = arenaMake(c);
  size_t bytes = 0, cap = 0;
  SUCCEEDS(kvcommArenaBytes(a, &bytes));
  SUCCEEDS(kvcommArenaCapacity(a, &cap));
  FOR_VALUES(x) {
    if (x > cap) REFUSED("capacity", kvcommArenaGrow(a, (size_t)x, 1000, SCRATCH(kvcommArenaGrowth*)));
  }
  kvcommArenaGrowth g;
  SUCCEEDS(kvcommArenaGrow(a, cap, 1000, &g));
  EXPECT(g.generation == 2 && g.importersUpdated == 0 && g.numFailures == 0);
  SUCCEEDS(kvcommArenaBytes(a, &bytes));
  EXPECT(bytes == cap);
  SUCCEEDS(kvcommArenaGrow(a, cap, 1000, NULL));
  SUCCEEDS(kvcommArenaDestroy(a));
}

static kvcommResult_t growLayoutWith(Ctx* c, const kvcommKvRegion* regions, size_t n) {
  return kvcommArenaGrowLayout(c->h.arena, regions, n, 0, 1000, SCRATCH(kvcommArenaGrowth*));
}
static kvcommResult_t callArenaGrowLayout(Ctx* c, const Handles* h) {
  (void)c;
  kvcommKvRegion r;
  arenaLayout(&r);
  return kvcommArenaGrowLayout(h->arena, &r, 1, 0, 1000, SCRATCH(kvcommArenaGrowth*));
}
static void propsArenaGrowLayout(Ctx* c) {
  layoutArgProps(c, growLayoutWith);
  kvcommArena_t a = arenaMake(c);
  kvcommKvRegion r;
  arenaLayout(&r);
  r.numBlocks = (size_t)kArenaCapacity / kArenaBlockBytes + 1; /* beyond the capacity */
  REFUSED("beyond", kvcommArenaGrowLayout(a, &r, 1, 5, 1000, SCRATCH(kvcommArenaGrowth*)));
  r.numBlocks = kArenaBlocks * 2;
  kvcommArenaGrowth g;
  SUCCEEDS(kvcommArenaGrowLayout(a, &r, 1, 5, 1000, &g));
  kvcommKvRegion got;
  size_t count = 0;
  uint64_t version = 0;
  SUCCEEDS(kvcommArenaLayout(a, &got, 1, &count, &version));
  EXPECT(g.generation == 2 && count == 1 && version == 5 && got.numBlocks == (size_t)kArenaBlocks * 2);
  SUCCEEDS(kvcommArenaDestroy(a));
}

static kvcommResult_t arenaGrowthFailures(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommArenaGrowthFailures(c->h.arena, text, bytes, needed);
}
static kvcommResult_t callArenaGrowthFailures(Ctx* c, const Handles* h) {
  return kvcommArenaGrowthFailures(h->arena, SCRATCH(char*), 16, SCRATCH(size_t*) + 64);
}
static void propsArenaGrowthFailures(Ctx* c) {
  textProps(c, arenaGrowthFailures);
}

/* Leased or pinned: Busy, nothing changed; free of leases and pins: shrinks. */
static kvcommResult_t callArenaShrink(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaShrink(h->arena, 0, 0);
}
static void propsArenaShrink(Ctx* c) {
  size_t before = arenaBytes(c);
  REFUSED_AS(kvcommBusy, "busy", kvcommArenaShrink(c->h.arena, before, 0)); /* the fixture's lease */
  EXPECT(arenaBytes(c) == before);
  kvcommArena_t a = arenaMake(c);
  size_t bytes = 0, created = 0, cap = 0;
  SUCCEEDS(kvcommArenaBytes(a, &created));
  SUCCEEDS(kvcommArenaCapacity(a, &cap));
  SUCCEEDS(kvcommArenaGrow(a, cap, 1000, NULL));
  kvcommArenaPin_t p = NULL;
  SUCCEEDS(kvcommArenaPinCreate(a, cap - 1, 1, &p));
  REFUSED_AS(kvcommBusy, "busy", kvcommArenaShrink(a, created, 0));
  SUCCEEDS(kvcommArenaPinDestroy(p));
  FOR_VALUES(x) {
    if (x >= cap) SUCCEEDS(kvcommArenaShrink(a, (size_t)x, 0)); /* nothing to release */
  }
  SUCCEEDS(kvcommArenaBytes(a, &bytes));
  EXPECT(bytes == cap);
  SUCCEEDS(kvcommArenaShrink(a, 0, 0)); /* the chunk the create made stays whole: the layout fits */
  SUCCEEDS(kvcommArenaBytes(a, &bytes));
  EXPECT(bytes == created);
  SUCCEEDS(kvcommArenaDestroy(a));
}

static kvcommResult_t shrinkLayoutWith(Ctx* c, const kvcommKvRegion* regions, size_t n) {
  return kvcommArenaShrinkLayout(c->h.arena, regions, n, 0, 0);
}
static kvcommResult_t callArenaShrinkLayout(Ctx* c, const Handles* h) {
  (void)c;
  kvcommKvRegion r;
  arenaLayout(&r);
  return kvcommArenaShrinkLayout(h->arena, &r, 1, 0, 0);
}
static void propsArenaShrinkLayout(Ctx* c) {
  layoutArgProps(c, shrinkLayoutWith);
  kvcommKvRegion r;
  arenaLayout(&r);
  REFUSED_AS(kvcommBusy, "busy", kvcommArenaShrinkLayout(c->h.arena, &r, 1, 0, 0));
  kvcommArena_t a = arenaMake(c);
  r.numBlocks = 1;
  SUCCEEDS(kvcommArenaShrinkLayout(a, &r, 1, 4, 0));
  size_t count = 0;
  uint64_t version = 0;
  kvcommKvRegion got;
  SUCCEEDS(kvcommArenaLayout(a, &got, 1, &count, &version));
  EXPECT(count == 1 && version == 4 && got.numBlocks == 1);
  SUCCEEDS(kvcommArenaDestroy(a));
}

static kvcommResult_t callArenaFree(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaFree(h->arena, 0);
}
static void propsArenaFree(Ctx* c) {
  int freed = 1;
  REFUSED_AS(kvcommBusy, "busy", kvcommArenaFree(c->h.arena, 0));
  REFUSED_AS(kvcommBusy, "busy", kvcommArenaFree(c->h.arena, 20));
  SUCCEEDS(kvcommArenaFreed(c->h.arena, &freed));
  EXPECT(freed == 0);
  kvcommArena_t a = arenaMake(c);
  kvcommArenaPin_t p = NULL;
  SUCCEEDS(kvcommArenaPinCreate(a, 0, 1, &p));
  REFUSED_AS(kvcommBusy, "busy", kvcommArenaFree(a, 0));
  SUCCEEDS(kvcommArenaPinDestroy(p));
  SUCCEEDS(kvcommArenaFree(a, 0));
  SUCCEEDS(kvcommArenaFreed(a, &freed));
  EXPECT(freed == 1);
  void* d = (void*)1;
  SUCCEEDS(kvcommArenaData(a, &d));
  EXPECT(d == NULL);
  REFUSED("freed", kvcommArenaPinCreate(a, 0, 1, SCRATCH(kvcommArenaPin_t*)));
  SUCCEEDS(kvcommArenaFree(a, 0));
  SUCCEEDS(kvcommArenaDestroy(a));
}

/* offset and bytes through every value: inside the backed bytes admitted (bytes 0 copies nothing). */
static kvcommResult_t callArenaWrite(Ctx* c, const Handles* h) {
  return kvcommArenaWrite(h->arena, 0, c->scratch, 16);
}
static void propsArenaWrite(Ctx* c) {
  size_t total = arenaBytes(c);
  unsigned char* src = (unsigned char*)malloc(total);
  unsigned char* back = (unsigned char*)malloc(total);
  for (size_t i = 0; i < total; ++i) src[i] = (unsigned char)(i * 7 + 1);
  FOR_VALUES(o) {
    FOR_VALUES(b) {
      if (b == 0 || !inside(o, b, total))
        OUTCOME(b == 0, "is not inside", kvcommArenaWrite(c->h.arena, (size_t)o, src, (size_t)b));
    }
  }
  REFUSED("src is NULL", kvcommArenaWrite(c->h.arena, 0, NULL, 1));
  SUCCEEDS(kvcommArenaWrite(c->h.arena, 0, NULL, 0));
  SUCCEEDS(kvcommArenaWrite(c->h.arena, 0, src, total));
  SUCCEEDS(kvcommArenaRead(c->h.arena, 0, back, total));
  EXPECT(memcmp(src, back, total) == 0);
  free(src);
  free(back);
}

static kvcommResult_t callArenaRead(Ctx* c, const Handles* h) {
  return kvcommArenaRead(h->arena, 0, SCRATCH(void*), 16);
}
static void propsArenaRead(Ctx* c) {
  size_t total = arenaBytes(c);
  void* data = NULL;
  SUCCEEDS(kvcommArenaData(c->h.arena, &data));
  for (size_t i = 0; i < total; ++i) ((unsigned char*)data)[i] = (unsigned char)(i * 5 + 3);
  FOR_VALUES(o) {
    FOR_VALUES(b) {
      if (b > 0 && !inside(o, b, total))
        REFUSED("is not inside", kvcommArenaRead(c->h.arena, (size_t)o, SCRATCH(void*), (size_t)b));
    }
  }
  REFUSED("dst is NULL", kvcommArenaRead(c->h.arena, 0, NULL, 1));
  unsigned char* back = (unsigned char*)malloc(total);
  SUCCEEDS(kvcommArenaRead(c->h.arena, 1, back, total - 1));
  EXPECT(memcmp(back, (unsigned char*)data + 1, total - 1) == 0);
  free(back);
}

static kvcommResult_t callArenaPinCreate(Ctx* c, const Handles* h) {
  return kvcommArenaPinCreate(h->arena, 0, 1, SCRATCH(kvcommArenaPin_t*));
}
static void propsArenaPinCreate(Ctx* c) {
  size_t total = arenaBytes(c);
  FOR_VALUES(o) {
    FOR_VALUES(b) {
      if (b == 0 || !inside(o, b, total))
        REFUSED("is not inside", kvcommArenaPinCreate(c->h.arena, (size_t)o, (size_t)b, SCRATCH(kvcommArenaPin_t*)));
    }
  }
  REFUSED("pin is NULL", kvcommArenaPinCreate(c->h.arena, 0, 1, NULL));
  kvcommArenaPin_t p = NULL;
  SUCCEEDS(kvcommArenaPinCreate(c->h.arena, total - 1, 1, &p));
  size_t ops = 0;
  SUCCEEDS(kvcommArenaOperations(c->h.arena, &ops));
  EXPECT(ops == 2);
  SUCCEEDS(kvcommArenaPinDestroy(p));
}

static kvcommResult_t callArenaGetIpcHandle(Ctx* c, const Handles* h) {
  return kvcommArenaGetIpcHandle(h->arena, SCRATCH(kvcommArenaIpcHandle*));
}
static void propsArenaGetIpcHandle(Ctx* c) {
  REFUSED("handle is NULL", kvcommArenaGetIpcHandle(c->h.arena, NULL));
  REFUSED("legacyIpc", kvcommArenaGetIpcHandle(c->h.arena, SCRATCH(kvcommArenaIpcHandle*)));
}

/* ---- pins ----------------------------------------------------------------------------------------------------- */

static kvcommResult_t callArenaPinDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaPinDestroy(h->pin);
}
static void propsArenaPinDestroy(Ctx* c) {
  SUCCEEDS(kvcommArenaPinDestroy(NULL));
  kvcommArenaPin_t p = NULL;
  SUCCEEDS(kvcommArenaPinCreate(c->h.arena, 0, 1, &p));
  SUCCEEDS(kvcommArenaPinDestroy(p));
  REFUSED("is not a live kvcommArenaPin_t", kvcommArenaPinDestroy(p));
}
static kvcommResult_t callArenaPinRelease(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaPinRelease(h->pin);
}
static void propsArenaPinRelease(Ctx* c) {
  kvcommArenaPin_t p = NULL;
  SUCCEEDS(kvcommArenaPinCreate(c->h.arena, 8, 8, &p));
  SUCCEEDS(kvcommArenaPinRelease(p));
  SUCCEEDS(kvcommArenaPinRelease(p));
  size_t b = 1, o = 1, ops = 0;
  void* d = (void*)1;
  SUCCEEDS(kvcommArenaPinBytes(p, &b));
  SUCCEEDS(kvcommArenaPinOffset(p, &o));
  SUCCEEDS(kvcommArenaPinData(p, &d));
  SUCCEEDS(kvcommArenaOperations(c->h.arena, &ops));
  EXPECT(b == 0 && o == 0 && d == NULL && ops == 1);
  SUCCEEDS(kvcommArenaPinDestroy(p));
}
#define PIN_GETTER(Name, T, word)                              \
  static kvcommResult_t call##Name(Ctx* c, const Handles* h) { \
    return kvcomm##Name(h->pin, SCRATCH(T*));                  \
  }                                                            \
  static void props##Name(Ctx* c) {                            \
    REFUSED(word " is NULL", kvcomm##Name(c->h.pin, NULL));    \
    T v;                                                       \
    SUCCEEDS(kvcomm##Name(c->h.pin, &v));                      \
    EXPECT(pinCheck##Name(c, v));                              \
  }
static int pinCheckArenaPinData(Ctx* c, void* v) {
  void* base = NULL;
  kvcommArenaData(c->h.arena, &base);
  return v == (unsigned char*)base + kArenaPinOffset;
}
static int pinCheckArenaPinOffset(Ctx* c, size_t v) {
  (void)c;
  return v == kArenaPinOffset;
}
static int pinCheckArenaPinBytes(Ctx* c, size_t v) {
  (void)c;
  return v == kArenaPinBytes;
}
PIN_GETTER(ArenaPinData, void*, "data")
PIN_GETTER(ArenaPinOffset, size_t, "offset")
PIN_GETTER(ArenaPinBytes, size_t, "bytes")

/* ---- imports -------------------------------------------------------------------------------------------------- */

static void propsArenaImportOpenIpc(Ctx* c) {
  kvcommKvRegion r;
  arenaLayout(&r);
  kvcommArenaIpcHandle h;
  memset(&h, 0, sizeof(h));
  FOR_VALUES(x) {
    if (x > KVCOMM_MAX_ARENA_REGIONS)
      REFUSED("KVCOMM_MAX_ARENA_REGIONS",
              kvcommArenaImportOpenIpc(&h, &r, (size_t)x, 0, SCRATCH(kvcommArenaImport_t*)));
  }
  REFUSED("handle is NULL", kvcommArenaImportOpenIpc(NULL, &r, 1, 0, SCRATCH(kvcommArenaImport_t*)));
  REFUSED("import is NULL", kvcommArenaImportOpenIpc(&h, &r, 1, 0, NULL));
  REFUSED("regions is NULL", kvcommArenaImportOpenIpc(&h, NULL, 1, 0, SCRATCH(kvcommArenaImport_t*)));
  /* A zeroed handle is no allocation: refused (kvcommUnsupported without CUDA, kvcommInvalidArgument without a current
   * context, kvcommCudaError from the driver). */
  prepare(c);
  kvcommResult_t r_ = kvcommArenaImportOpenIpc(&h, &r, 1, 0, SCRATCH(kvcommArenaImport_t*));
  int known = r_ == kvcommUnsupported || r_ == kvcommInvalidArgument || r_ == kvcommCudaError;
  refused(c, "kvcommArenaImportOpenIpc(zeroed handle)", r_, known ? r_ : kvcommCudaError, NULL, __LINE__);
}

static kvcommResult_t callArenaImportDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaImportDestroy(h->import);
}
static void propsArenaImportDestroy(Ctx* c) {
  SUCCEEDS(kvcommArenaImportDestroy(NULL));
  kvcommArena_t a = arenaMake(c);
  kvcommArenaImport_t i = arenaImportOf(c, a, c->h.session);
  size_t leases = 0;
  SUCCEEDS(kvcommArenaLeases(a, &leases));
  EXPECT(leases == 1);
  SUCCEEDS(kvcommArenaImportDestroy(i));
  REFUSED("is not a live kvcommArenaImport_t", kvcommArenaImportDestroy(i));
  SUCCEEDS(kvcommArenaFree(a, 10000)); /* the lease goes once the owner hears of the close */
  SUCCEEDS(kvcommArenaDestroy(a));
}

#define IMPORT_GETTER(Name, T, word, cond)                     \
  static kvcommResult_t call##Name(Ctx* c, const Handles* h) { \
    return kvcomm##Name(h->import, SCRATCH(T*));               \
  }                                                            \
  static void props##Name(Ctx* c) {                            \
    REFUSED(word " is NULL", kvcomm##Name(c->h.import, NULL)); \
    T v;                                                       \
    memset(&v, 0x5a, sizeof(v));                               \
    SUCCEEDS(kvcomm##Name(c->h.import, &v));                   \
    EXPECT(cond);                                              \
  }
static uint64_t fixtureArenaId(Ctx* c) {
  uint64_t id = 0;
  kvcommArenaId(c->h.arena, &id);
  return id;
}
static void* fixtureArenaData(Ctx* c) {
  void* d = NULL;
  kvcommArenaData(c->h.arena, &d);
  return d;
}
IMPORT_GETTER(ArenaImportData, void*, "data", v != NULL && v != fixtureArenaData(c))
IMPORT_GETTER(ArenaImportBytes, size_t, "bytes", v == arenaBytes(c))
IMPORT_GETTER(ArenaImportCapacity, size_t, "bytes", v >= kArenaCapacity)
IMPORT_GETTER(ArenaImportKind, kvcommMemoryKind_t, "kind", v == kvcommMemoryHost)
IMPORT_GETTER(ArenaImportArenaId, uint64_t, "id", v == fixtureArenaId(c))
IMPORT_GETTER(ArenaImportGeneration, uint64_t, "generation", v >= 1)
IMPORT_GETTER(ArenaImportOwnerPid, int, "pid", v == (int)getpid())
IMPORT_GETTER(ArenaImportOwnerAlive, int, "alive", v == 1)
IMPORT_GETTER(ArenaImportOperations, size_t, "operations", v == 0)
IMPORT_GETTER(ArenaImportClosed, int, "closed", v == 0)

static kvcommResult_t importHandleType(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommArenaImportHandleType(c->h.import, text, bytes, needed);
}
static kvcommResult_t callArenaImportHandleType(Ctx* c, const Handles* h) {
  return kvcommArenaImportHandleType(h->import, SCRATCH(char*), 16, SCRATCH(size_t*) + 64);
}
static void propsArenaImportHandleType(Ctx* c) {
  textProps(c, importHandleType);
}
static kvcommResult_t importLostReason(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommArenaImportOwnerLostReason(c->h.import, text, bytes, needed);
}
static kvcommResult_t callArenaImportOwnerLostReason(Ctx* c, const Handles* h) {
  return kvcommArenaImportOwnerLostReason(h->import, SCRATCH(char*), 16, SCRATCH(size_t*) + 64);
}
static void propsArenaImportOwnerLostReason(Ctx* c) {
  textProps(c, importLostReason);
  size_t needed = 0;
  SUCCEEDS(kvcommArenaImportOwnerLostReason(c->h.import, NULL, 0, &needed));
  EXPECT(needed == 1); /* "" while alive */
}

static kvcommResult_t callArenaImportLayout(Ctx* c, const Handles* h) {
  return kvcommArenaImportLayout(h->import, SCRATCH(kvcommKvRegion*), 4, SCRATCH(size_t*) + 64, NULL);
}
static void propsArenaImportLayout(Ctx* c) {
  REFUSED("count is NULL", kvcommArenaImportLayout(c->h.import, SCRATCH(kvcommKvRegion*), 1, NULL, NULL));
  FOR_VALUES(x) {
    if (x > 0)
      REFUSED("regions is NULL", kvcommArenaImportLayout(c->h.import, NULL, (size_t)x, SCRATCH(size_t*), NULL));
  }
  kvcommKvRegion r[2];
  size_t count = 0;
  uint64_t version = 0;
  SUCCEEDS(kvcommArenaImportLayout(c->h.import, r, 2, &count, &version));
  EXPECT(count == 1 && version == 3 && r[0].numBlocks == kArenaBlocks && r[0].blockBytes == kArenaBlockBytes);
}

static kvcommResult_t callArenaImportCheck(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaImportCheck(h->import);
}
static void propsArenaImportCheck(Ctx* c) {
  SUCCEEDS(kvcommArenaImportCheck(c->h.import));
  kvcommArena_t a = arenaMake(c);
  kvcommArenaImport_t i = arenaImportOf(c, a, c->h.session);
  SUCCEEDS(kvcommArenaImportClose(i, -1));
  REFUSED("closed", kvcommArenaImportCheck(i));
  SUCCEEDS(kvcommArenaImportDestroy(i));
  SUCCEEDS(kvcommArenaDestroy(a));
}

static kvcommResult_t callArenaImportPinCreate(Ctx* c, const Handles* h) {
  return kvcommArenaImportPinCreate(h->import, 0, 1, SCRATCH(kvcommArenaPin_t*));
}
static void propsArenaImportPinCreate(Ctx* c) {
  size_t total = arenaBytes(c);
  FOR_VALUES(o) {
    FOR_VALUES(b) {
      if (b == 0 || !inside(o, b, total))
        REFUSED("is not inside",
                kvcommArenaImportPinCreate(c->h.import, (size_t)o, (size_t)b, SCRATCH(kvcommArenaPin_t*)));
    }
  }
  REFUSED("pin is NULL", kvcommArenaImportPinCreate(c->h.import, 0, 1, NULL));
  kvcommArenaPin_t p = NULL;
  SUCCEEDS(kvcommArenaImportPinCreate(c->h.import, 0, total, &p));
  size_t ops = 0, b = 0;
  SUCCEEDS(kvcommArenaImportOperations(c->h.import, &ops));
  SUCCEEDS(kvcommArenaPinBytes(p, &b));
  EXPECT(ops == 1 && b == total);
  SUCCEEDS(kvcommArenaPinDestroy(p));
  SUCCEEDS(kvcommArenaImportOperations(c->h.import, &ops));
  EXPECT(ops == 0);
}

/* What the owner wrote the importer reads, and the other way round, through two mappings of one memory. */
static kvcommResult_t callArenaImportWrite(Ctx* c, const Handles* h) {
  return kvcommArenaImportWrite(h->import, 0, c->scratch, 16);
}
static void propsArenaImportWrite(Ctx* c) {
  size_t total = arenaBytes(c);
  unsigned char* src = (unsigned char*)malloc(total);
  unsigned char* back = (unsigned char*)malloc(total);
  for (size_t i = 0; i < total; ++i) src[i] = (unsigned char)(i * 11 + 5);
  FOR_VALUES(o) {
    FOR_VALUES(b) {
      if (b == 0 || !inside(o, b, total))
        OUTCOME(b == 0, "is not inside", kvcommArenaImportWrite(c->h.import, (size_t)o, src, (size_t)b));
    }
  }
  REFUSED("src is NULL", kvcommArenaImportWrite(c->h.import, 0, NULL, 1));
  SUCCEEDS(kvcommArenaImportWrite(c->h.import, 0, src, total));
  SUCCEEDS(kvcommArenaRead(c->h.arena, 0, back, total));
  EXPECT(memcmp(src, back, total) == 0);
  free(src);
  free(back);
}

static kvcommResult_t callArenaImportRead(Ctx* c, const Handles* h) {
  return kvcommArenaImportRead(h->import, 0, SCRATCH(void*), 16);
}
static void propsArenaImportRead(Ctx* c) {
  size_t total = arenaBytes(c);
  unsigned char* src = (unsigned char*)malloc(total);
  unsigned char* back = (unsigned char*)malloc(total);
  for (size_t i = 0; i < total; ++i) src[i] = (unsigned char)(i * 13 + 9);
  SUCCEEDS(kvcommArenaWrite(c->h.arena, 0, src, total));
  FOR_VALUES(o) {
    FOR_VALUES(b) {
      if (b > 0 && !inside(o, b, total))
        REFUSED("is not inside", kvcommArenaImportRead(c->h.import, (size_t)o, SCRATCH(void*), (size_t)b));
    }
  }
  REFUSED("dst is NULL", kvcommArenaImportRead(c->h.import, 0, NULL, 1));
  SUCCEEDS(kvcommArenaImportRead(c->h.import, 0, back, total));
  EXPECT(memcmp(src, back, total) == 0);
  free(src);
  free(back);
}

static kvcommResult_t callArenaImportClose(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaImportClose(h->import, 0);
}
static void propsArenaImportClose(Ctx* c) {
  kvcommArena_t a = arenaMake(c);
  kvcommArenaImport_t i = arenaImportOf(c, a, c->h.session);
  kvcommArenaPin_t p = NULL;
  SUCCEEDS(kvcommArenaImportPinCreate(i, 0, 1, &p));
  REFUSED_AS(kvcommTimeout, "", kvcommArenaImportClose(i, 10)); /* a pin held: the import stays closing */
  REFUSED_AS(kvcommAborted, "", kvcommArenaImportPinCreate(i, 0, 1, SCRATCH(kvcommArenaPin_t*)));
  SUCCEEDS(kvcommArenaPinDestroy(p));
  SUCCEEDS(kvcommArenaImportClose(i, -1));
  SUCCEEDS(kvcommArenaImportClose(i, 0)); /* idempotent */
  int closed = 0;
  void* d = (void*)1;
  size_t leases = 1;
  SUCCEEDS(kvcommArenaImportClosed(i, &closed));
  SUCCEEDS(kvcommArenaImportData(i, &d));
  SUCCEEDS(kvcommArenaLeases(a, &leases));
  EXPECT(closed == 1 && d == NULL && leases == 0);
  SUCCEEDS(kvcommArenaImportDestroy(i));
  SUCCEEDS(kvcommArenaFree(a, 0));
  SUCCEEDS(kvcommArenaDestroy(a));
}

/* ---- sessions ------------------------------------------------------------------------------------------------- */

static void propsArenaSessionConnect(Ctx* c) {
  REFUSED("address is NULL", kvcommArenaSessionConnect(NULL, NULL, SCRATCH(kvcommArenaSession_t*)));
  REFUSED("session is NULL", kvcommArenaSessionConnect("@x", NULL, NULL));
  kvcommArenaSessionOptions o;
  kvcommArenaSessionOptionsInit(&o);
  o.timeoutMs = 50;
  char address[96];
  snprintf(address, sizeof(address), "@kvcomm-props-nobody-%d", (int)getpid());
  prepare(c);
  kvcommResult_t r = kvcommArenaSessionConnect(address, &o, SCRATCH(kvcommArenaSession_t*));
  refused(c, "kvcommArenaSessionConnect(nobody there)", r, r == kvcommTimeout ? kvcommTimeout : kvcommNetworkError,
          NULL, __LINE__);
  kvcommArenaSession_t s = arenaConnect(c, c->h.server);
  int pid = 0;
  SUCCEEDS(kvcommArenaSessionPeerPid(s, &pid));
  EXPECT(pid == (int)getpid());
  SUCCEEDS(kvcommArenaSessionDestroy(s));
}

static kvcommResult_t callArenaSessionDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaSessionDestroy(h->session);
}
static void propsArenaSessionDestroy(Ctx* c) {
  SUCCEEDS(kvcommArenaSessionDestroy(NULL));
  kvcommArenaSession_t s = arenaConnect(c, c->h.server);
  SUCCEEDS(kvcommArenaSessionDestroy(s));
  REFUSED("is not a live kvcommArenaSession_t", kvcommArenaSessionDestroy(s));
}

#define SESSION_GETTER(Name, T, word, cond)                     \
  static kvcommResult_t call##Name(Ctx* c, const Handles* h) {  \
    return kvcomm##Name(h->session, SCRATCH(T*));               \
  }                                                             \
  static void props##Name(Ctx* c) {                             \
    REFUSED(word " is NULL", kvcomm##Name(c->h.session, NULL)); \
    T v;                                                        \
    memset(&v, 0x5a, sizeof(v));                                \
    SUCCEEDS(kvcomm##Name(c->h.session, &v));                   \
    EXPECT(cond);                                               \
  }
SESSION_GETTER(ArenaSessionPeerPid, int, "pid", v == (int)getpid())
SESSION_GETTER(ArenaSessionPeerUid, uint32_t, "uid", v == (uint32_t)getuid())
SESSION_GETTER(ArenaSessionAlive, int, "alive", v == 1)

static kvcommResult_t sessionLostReason(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommArenaSessionLostReason(c->h.session, text, bytes, needed);
}
static kvcommResult_t callArenaSessionLostReason(Ctx* c, const Handles* h) {
  return kvcommArenaSessionLostReason(h->session, SCRATCH(char*), 16, SCRATCH(size_t*) + 64);
}
static void propsArenaSessionLostReason(Ctx* c) {
  textProps(c, sessionLostReason);
}

static kvcommResult_t callArenaSessionOffer(Ctx* c, const Handles* h) {
  return kvcommArenaSessionOffer(h->session, h->arena, 1000, SCRATCH(kvcommArenaCapability*));
}
static void propsArenaSessionOffer(Ctx* c) {
  kvcommArena_t a = arenaMake(c);
  FOR_VALUES(x) {
    int64_t ttl = (int64_t)x;
    if (ttl < 1 || ttl > 86400000)
      REFUSED("time to live", kvcommArenaSessionOffer(c->h.session, a, ttl, SCRATCH(kvcommArenaCapability*)));
  }
  REFUSED("capability is NULL", kvcommArenaSessionOffer(c->h.session, a, 1000, NULL));
  kvcommArenaCapability cap;
  SUCCEEDS(kvcommArenaSessionOffer(c->h.session, a, 1000, &cap));
  EXPECT(cap.importerPid == (int32_t)getpid() && cap.importerUid == (uint32_t)getuid());
  SUCCEEDS(kvcommArenaDestroy(a));
}

/* The capability's refusals (forged, used, another generation, another process), then options->onOwnerLoss. */
static kvcommResult_t callArenaSessionImport(Ctx* c, const Handles* h) {
  kvcommArenaCapability cap;
  memset(&cap, 0, sizeof(cap));
  return kvcommArenaSessionImport(h->session, &cap, NULL, SCRATCH(kvcommArenaImport_t*));
}
static void propsArenaSessionImport(Ctx* c) {
  kvcommArena_t a = arenaMake(c);
  kvcommArenaCapability cap, bad;
  SUCCEEDS(kvcommArenaSessionOffer(c->h.session, a, 60000, &cap));
  REFUSED("capability is NULL", kvcommArenaSessionImport(c->h.session, NULL, NULL, SCRATCH(kvcommArenaImport_t*)));
  REFUSED("import is NULL", kvcommArenaSessionImport(c->h.session, &cap, NULL, NULL));
  kvcommArenaImportOptions o;
  kvcommArenaImportOptionsInit(&o);
  unsigned vals[24];
  size_t n = enumValues(2, vals);
  for (size_t i = 2; i < n; ++i) {
    o.onOwnerLoss = (kvcommArenaOwnerLoss_t)vals[i];
    REFUSED("options->onOwnerLoss", kvcommArenaSessionImport(c->h.session, &cap, &o, SCRATCH(kvcommArenaImport_t*)));
  }
  o.onOwnerLoss = kvcommArenaOwnerLossKeep;
  for (int b = 0; b < 16; b += 5) {
    bad = cap;
    bad.token[b] ^= 1;
    REFUSED("never issued", kvcommArenaSessionImport(c->h.session, &bad, &o, SCRATCH(kvcommArenaImport_t*)));
  }
  bad = cap;
  bad.generation += 1;
  REFUSED("generation", kvcommArenaSessionImport(c->h.session, &bad, &o, SCRATCH(kvcommArenaImport_t*)));
  bad = cap;
  bad.arenaId ^= 0x10;
  REFUSED("no arena", kvcommArenaSessionImport(c->h.session, &bad, &o, SCRATCH(kvcommArenaImport_t*)));
  kvcommArenaImport_t i = NULL;
  SUCCEEDS(kvcommArenaSessionImport(c->h.session, &cap, &o, &i));
  REFUSED("already used", kvcommArenaSessionImport(c->h.session, &cap, &o, SCRATCH(kvcommArenaImport_t*)));
  kvcommArenaCapability other;
  SUCCEEDS(kvcommArenaOffer(a, (int)getpid() + 1, (uint32_t)getuid(), 60000, &other));
  REFUSED("issued to pid", kvcommArenaSessionImport(c->h.session, &other, &o, SCRATCH(kvcommArenaImport_t*)));
  SUCCEEDS(kvcommArenaImportDestroy(i));
  SUCCEEDS(kvcommArenaDestroy(a));
}

static kvcommResult_t callArenaSessionSend(Ctx* c, const Handles* h) {
  return kvcommArenaSessionSend(h->session, c->scratch, 4);
}
/* Sizes through every value: up to KVCOMM_ARENA_MAX_MESSAGE_BYTES admitted; each admitted message arrives whole. */
static void propsArenaSessionSend(Ctx* c) {
  unsigned char* msg = (unsigned char*)malloc(KVCOMM_ARENA_MAX_MESSAGE_BYTES);
  unsigned char* got = (unsigned char*)malloc(KVCOMM_ARENA_MAX_MESSAGE_BYTES);
  for (size_t i = 0; i < KVCOMM_ARENA_MAX_MESSAGE_BYTES; ++i) msg[i] = (unsigned char)(i * 3 + 1);
  FOR_VALUES(x) {
    if (x > KVCOMM_ARENA_MAX_MESSAGE_BYTES) {
      REFUSED("KVCOMM_ARENA_MAX_MESSAGE_BYTES", kvcommArenaSessionSend(c->h.session, msg, (size_t)x));
      continue;
    }
    SUCCEEDS(kvcommArenaSessionSend(c->h.session, msg, (size_t)x));
    size_t n = 0;
    SUCCEEDS(kvcommArenaSessionReceive(c->peerSession, 10000, got, KVCOMM_ARENA_MAX_MESSAGE_BYTES, &n));
    EXPECT(n == (size_t)x && memcmp(got, msg, n) == 0);
  }
  REFUSED("data is NULL", kvcommArenaSessionSend(c->h.session, NULL, 1));
  free(msg);
  free(got);
}

static kvcommResult_t callArenaSessionReceive(Ctx* c, const Handles* h) {
  return kvcommArenaSessionReceive(h->session, 0, SCRATCH(void*), 16, SCRATCH(size_t*) + 64);
}
/* capacity through every value: a message larger stays queued (its size reported), one that fits is consumed. */
static void propsArenaSessionReceive(Ctx* c) {
  REFUSED_AS(kvcommTimeout, "no message",
             kvcommArenaSessionReceive(c->h.session, 0, SCRATCH(void*), 16, SCRATCH(size_t*) + 64));
  REFUSED("bytes is NULL", kvcommArenaSessionReceive(c->h.session, 0, SCRATCH(void*), 16, NULL));
  unsigned char msg[100], got[200];
  for (size_t i = 0; i < sizeof(msg); ++i) msg[i] = (unsigned char)(200 - i);
  SUCCEEDS(kvcommArenaSessionSend(c->peerSession, msg, sizeof(msg)));
  FOR_VALUES(x) {
    if (x > 0) REFUSED("data is NULL", kvcommArenaSessionReceive(c->h.session, 0, NULL, (size_t)x, SCRATCH(size_t*)));
    if (x < sizeof(msg)) {
      size_t n = 0;
      SUCCEEDS(kvcommArenaSessionReceive(c->h.session, 10000, x ? got : NULL, (size_t)x, &n));
      EXPECT(n == sizeof(msg));
    }
  }
  size_t n = 0;
  memset(got, 0, sizeof(got));
  SUCCEEDS(kvcommArenaSessionReceive(c->h.session, 0, got, sizeof(got), &n));
  EXPECT(n == sizeof(msg) && memcmp(got, msg, n) == 0);
  REFUSED_AS(kvcommTimeout, "no message", kvcommArenaSessionReceive(c->h.session, 0, got, sizeof(got), &n));
  SUCCEEDS(kvcommArenaSessionSend(c->peerSession, NULL, 0)); /* an empty message fits any capacity */
  SUCCEEDS(kvcommArenaSessionReceive(c->h.session, 1000, NULL, 0, &n));
  EXPECT(n == 0);
}

static kvcommResult_t callArenaSessionClose(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaSessionClose(h->session);
}
/* Closing a session ends the leases over it: the importer's owner is gone, the owner's lease dropped. */
static void propsArenaSessionClose(Ctx* c) {
  kvcommArena_t a = arenaMake(c);
  kvcommArenaSession_t s = arenaConnect(c, c->h.server);
  kvcommArenaImport_t i = arenaImportOf(c, a, s);
  SUCCEEDS(kvcommArenaSessionClose(s));
  SUCCEEDS(kvcommArenaSessionClose(s));
  int alive = 1;
  SUCCEEDS(kvcommArenaSessionAlive(s, &alive));
  EXPECT(alive == 0);
  REFUSED_AS(kvcommNetworkError, "", kvcommArenaSessionSend(s, "x", 1));
  /* The import learns of it from its session's thread: within 5 s. */
  alive = 1;
  for (int k = 0; k < 500 && alive; ++k) {
    SUCCEEDS(kvcommArenaImportOwnerAlive(i, &alive));
    if (alive) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
  }
  EXPECT(alive == 0);
  REFUSED_AS(kvcommNetworkError, "gone", kvcommArenaImportCheck(i));
  SUCCEEDS(kvcommArenaImportDestroy(i));
  SUCCEEDS(kvcommArenaSessionDestroy(s));
  SUCCEEDS(kvcommArenaFree(a, 10000));
  SUCCEEDS(kvcommArenaDestroy(a));
}

/* ---- servers -------------------------------------------------------------------------------------------------- */

static void propsArenaServerListen(Ctx* c) {
  REFUSED("server is NULL", kvcommArenaServerListen(NULL, NULL, NULL));
  REFUSED("/tmp", kvcommArenaServerListen("/tmp/kvcomm-props.sock", NULL, SCRATCH(kvcommArenaServer_t*)));
  kvcommArenaServer_t s = NULL;
  SUCCEEDS(kvcommArenaServerListen("", NULL, &s));
  char address[128];
  SUCCEEDS(kvcommArenaServerAddress(s, address, sizeof(address), NULL));
  EXPECT(address[0] == '@');
  REFUSED_AS(kvcommSystemError, "", kvcommArenaServerListen(address, NULL, SCRATCH(kvcommArenaServer_t*)));
  SUCCEEDS(kvcommArenaServerDestroy(s));
}

static kvcommResult_t callArenaServerDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaServerDestroy(h->server);
}
static void propsArenaServerDestroy(Ctx* c) {
  SUCCEEDS(kvcommArenaServerDestroy(NULL));
  kvcommArenaServer_t s = NULL;
  SUCCEEDS(kvcommArenaServerListen(NULL, NULL, &s));
  SUCCEEDS(kvcommArenaServerDestroy(s));
  REFUSED("is not a live kvcommArenaServer_t", kvcommArenaServerDestroy(s));
}

static kvcommResult_t serverAddress(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommArenaServerAddress(c->h.server, text, bytes, needed);
}
static kvcommResult_t callArenaServerAddress(Ctx* c, const Handles* h) {
  return kvcommArenaServerAddress(h->server, SCRATCH(char*), 16, SCRATCH(size_t*) + 64);
}
static void propsArenaServerAddress(Ctx* c) {
  textProps(c, serverAddress);
}

static kvcommResult_t callArenaServerAccept(Ctx* c, const Handles* h) {
  return kvcommArenaServerAccept(h->server, 0, SCRATCH(kvcommArenaSession_t*));
}
static void propsArenaServerAccept(Ctx* c) {
  REFUSED("session is NULL", kvcommArenaServerAccept(c->h.server, 0, NULL));
  REFUSED_AS(kvcommTimeout, "", kvcommArenaServerAccept(c->h.server, 0, SCRATCH(kvcommArenaSession_t*)));
  REFUSED_AS(kvcommTimeout, "", kvcommArenaServerAccept(c->h.server, 1, SCRATCH(kvcommArenaSession_t*)));
  kvcommArenaSession_t s = arenaConnect(c, c->h.server), peer = NULL;
  SUCCEEDS(kvcommArenaServerAccept(c->h.server, 10000, &peer));
  int pid = 0;
  SUCCEEDS(kvcommArenaSessionPeerPid(peer, &pid));
  EXPECT(pid == (int)getpid());
  SUCCEEDS(kvcommArenaSessionDestroy(peer));
  SUCCEEDS(kvcommArenaSessionDestroy(s));
}

static kvcommResult_t callArenaServerSessions(Ctx* c, const Handles* h) {
  return kvcommArenaServerSessions(h->server, SCRATCH(size_t*));
}
static void propsArenaServerSessions(Ctx* c) {
  REFUSED("sessions is NULL", kvcommArenaServerSessions(c->h.server, NULL));
  size_t n = 0;
  SUCCEEDS(kvcommArenaServerSessions(c->h.server, &n));
  EXPECT(n >= 1);
}

static kvcommResult_t callArenaServerRefusedConnections(Ctx* c, const Handles* h) {
  return kvcommArenaServerRefusedConnections(h->server, SCRATCH(uint64_t*));
}
static void propsArenaServerRefusedConnections(Ctx* c) {
  REFUSED("refused is NULL", kvcommArenaServerRefusedConnections(c->h.server, NULL));
  uint64_t n = 9;
  SUCCEEDS(kvcommArenaServerRefusedConnections(c->h.server, &n));
  EXPECT(n == 0);
}

static kvcommResult_t callArenaServerClose(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommArenaServerClose(h->server);
}
static void propsArenaServerClose(Ctx* c) {
  kvcommArenaServer_t s = NULL;
  SUCCEEDS(kvcommArenaServerListen(NULL, NULL, &s));
  SUCCEEDS(kvcommArenaServerClose(s));
  SUCCEEDS(kvcommArenaServerClose(s));
  REFUSED_AS(kvcommAborted, "", kvcommArenaServerAccept(s, 0, SCRATCH(kvcommArenaSession_t*)));
  SUCCEEDS(kvcommArenaServerDestroy(s));
}

/* ---- the table ------------------------------------------------------------------------------------------------ */

#define ENTRY(Name, handles) \
  { "kvcomm" #Name, (handles), 0, call##Name, props##Name }
#define PURE(Name) \
  { "kvcomm" #Name, 0, 0, NULL, props##Name }

const Entry g_arenaEntries[] = {
    PURE(ArenaOptionsInit),
    PURE(ArenaImportOptionsInit),
    PURE(ArenaSessionOptionsInit),
    PURE(ArenaServerOptionsInit),
    PURE(ArenaCreate),
    ENTRY(ArenaDestroy, kHArena),
    ENTRY(ArenaData, kHArena),
    ENTRY(ArenaBytes, kHArena),
    ENTRY(ArenaCapacity, kHArena),
    ENTRY(ArenaGranularity, kHArena),
    ENTRY(ArenaKind, kHArena),
    ENTRY(ArenaHandleType, kHArena),
    ENTRY(ArenaDevice, kHArena),
    ENTRY(ArenaId, kHArena),
    ENTRY(ArenaGeneration, kHArena),
    ENTRY(ArenaLayout, kHArena),
    ENTRY(ArenaLeases, kHArena),
    ENTRY(ArenaOperations, kHArena),
    ENTRY(ArenaImporters, kHArena),
    ENTRY(ArenaLiveCapabilities, kHArena),
    ENTRY(ArenaFreed, kHArena),
    ENTRY(ArenaOffer, kHArena),
    ENTRY(ArenaRevokeCapabilities, kHArena),
    ENTRY(ArenaGrow, kHArena),
    ENTRY(ArenaGrowLayout, kHArena),
    ENTRY(ArenaGrowthFailures, kHArena),
    ENTRY(ArenaShrink, kHArena),
    ENTRY(ArenaShrinkLayout, kHArena),
    ENTRY(ArenaFree, kHArena),
    ENTRY(ArenaWrite, kHArena),
    ENTRY(ArenaRead, kHArena),
    ENTRY(ArenaPinCreate, kHArena),
    ENTRY(ArenaGetIpcHandle, kHArena),
    ENTRY(ArenaPinDestroy, kHPin),
    ENTRY(ArenaPinRelease, kHPin),
    ENTRY(ArenaPinData, kHPin),
    ENTRY(ArenaPinOffset, kHPin),
    ENTRY(ArenaPinBytes, kHPin),
    PURE(ArenaImportOpenIpc),
    ENTRY(ArenaImportDestroy, kHImport),
    ENTRY(ArenaImportData, kHImport),
    ENTRY(ArenaImportBytes, kHImport),
    ENTRY(ArenaImportCapacity, kHImport),
    ENTRY(ArenaImportKind, kHImport),
    ENTRY(ArenaImportHandleType, kHImport),
    ENTRY(ArenaImportArenaId, kHImport),
    ENTRY(ArenaImportGeneration, kHImport),
    ENTRY(ArenaImportLayout, kHImport),
    ENTRY(ArenaImportOwnerPid, kHImport),
    ENTRY(ArenaImportOwnerAlive, kHImport),
    ENTRY(ArenaImportOwnerLostReason, kHImport),
    ENTRY(ArenaImportCheck, kHImport),
    ENTRY(ArenaImportOperations, kHImport),
    ENTRY(ArenaImportPinCreate, kHImport),
    ENTRY(ArenaImportWrite, kHImport),
    ENTRY(ArenaImportRead, kHImport),
    ENTRY(ArenaImportClose, kHImport),
    ENTRY(ArenaImportClosed, kHImport),
    PURE(ArenaSessionConnect),
    ENTRY(ArenaSessionDestroy, kHSession),
    ENTRY(ArenaSessionPeerPid, kHSession),
    ENTRY(ArenaSessionPeerUid, kHSession),
    ENTRY(ArenaSessionAlive, kHSession),
    ENTRY(ArenaSessionLostReason, kHSession),
    ENTRY(ArenaSessionOffer, kHSession | kHArena),
    ENTRY(ArenaSessionImport, kHSession),
    ENTRY(ArenaSessionSend, kHSession),
    ENTRY(ArenaSessionReceive, kHSession),
    ENTRY(ArenaSessionClose, kHSession),
    PURE(ArenaServerListen),
    ENTRY(ArenaServerDestroy, kHServer),
    ENTRY(ArenaServerAddress, kHServer),
    ENTRY(ArenaServerAccept, kHServer),
    ENTRY(ArenaServerSessions, kHServer),
    ENTRY(ArenaServerRefusedConnections, kHServer),
    ENTRY(ArenaServerClose, kHServer),
};
const size_t g_numArenaEntries = sizeof(g_arenaEntries) / sizeof(g_arenaEntries[0]);
