/* Arenas through the C ABI, C11, two processes of one host (host memory): the parent is the server, the child its
 * client; they fork before either makes a kvcomm object (arenas do not survive fork()).
 *
 * Server-owned: the server creates an arena from a two-region layout with a gap between the regions, fills it with a
 * known pattern, offers it over the session and sends the capability as an application message; the client imports
 * it, reads every byte (kvcommArenaImportRead and the mapping itself) against the oracle, writes a pattern of its own
 * into the second region, and the server reads it back byte for byte. While leased, shrink and free return
 * kvcommBusy and change nothing; a grow reaches the importer at the same address; a pin keeps free() Busy after the
 * lease is gone. Client-owned: the client creates an arena and the server imports it, both ways byte-exact.
 * Bad input, each with its code, a message naming the argument and nothing written: a used and a forged token, reads
 * and writes out of range (and offsets that wrap), NULL arrays, counts past KVCOMM_MAX_ARENA_REGIONS, enum values
 * outside their enum, destroyed handles and handles of another kind.
 *   kvcomm_capi_arena_test            (CTest capi.arena) */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvcomm/kvcomm.h"

static const char* g_who = "?";
static int g_failures = 0;

#define CAPI_WHO_FMT "%s"
#define CAPI_WHO g_who
#define CAPI_STOP() exit(2)
#include "capi_checks.h"

/* ---- the layout and the oracle ----------------------------------------------------------------------------------- */

enum { kBlocks = 24, kBlockBytes = 1000, kStride = 1024, kGap = 8192 };
#define REGION1 ((size_t)kBlocks * kStride + kGap)
#define EXTENT (REGION1 + (size_t)kBlocks * kStride)
#define CAPACITY ((size_t)8 << 20)

static void layout(kvcommKvRegion r[2]) {
  r[0].offset = 0;
  r[0].blockBytes = kBlockBytes;
  r[0].blockStride = kStride;
  r[0].numBlocks = kBlocks;
  r[1] = r[0];
  r[1].offset = REGION1;
}

static uint8_t byteOf(unsigned seed, size_t i) {
  uint64_t x = ((uint64_t)seed << 40) ^ (uint64_t)i;
  x = (x ^ (x >> 31)) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return (uint8_t)(x >> 17);
}

static void fill(uint8_t* p, size_t n, unsigned seed, size_t base) {
  for (size_t i = 0; i < n; ++i) p[i] = byteOf(seed, base + i);
}

/* Index of the first byte of [p, p + n) that differs from the pattern, or n. */
static size_t firstDiff(const uint8_t* p, size_t n, unsigned seed, size_t base) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != byteOf(seed, base + i)) return i;
  return n;
}

/* ---- messages: fixed-size tags and capabilities over the session ------------------------------------------------- */

static void sendTag(kvcommArenaSession_t s, const char* tag) {
  OK(kvcommArenaSessionSend(s, tag, strlen(tag) + 1));
}

static void expectTag(kvcommArenaSession_t s, const char* tag) {
  char text[64];
  size_t n = 0;
  OK(kvcommArenaSessionReceive(s, 20000, text, sizeof(text), &n));
  CHECK(n == strlen(tag) + 1 && memcmp(text, tag, n) == 0, "expected message '%s', got %zu bytes '%.*s'", tag, n,
        (int)(n < sizeof(text) ? n : sizeof(text)), text);
}

static void sendCapability(kvcommArenaSession_t s, const kvcommArenaCapability* cap) {
  OK(kvcommArenaSessionSend(s, cap, sizeof(*cap)));
}

/* Receives a capability: first the size alone (the message stays queued), then the bytes. */
static kvcommArenaCapability receiveCapability(kvcommArenaSession_t s) {
  kvcommArenaCapability cap;
  size_t n = 0;
  OK(kvcommArenaSessionReceive(s, 20000, NULL, 0, &n));
  CHECK(n == sizeof(cap), "a capability message of %zu bytes", n);
  unsigned char small[8];
  OK(kvcommArenaSessionReceive(s, 20000, small, sizeof(small), &n)); /* too small: still queued */
  CHECK(n == sizeof(cap), "a capability message of %zu bytes", n);
  OK(kvcommArenaSessionReceive(s, 20000, &cap, sizeof(cap), &n));
  CHECK(n == sizeof(cap), "a capability message of %zu bytes", n);
  return cap;
}

/* ---- the client (child) ------------------------------------------------------------------------------------------ */

static int client(const char* address) {
  g_who = "client";
  kvcommArenaSessionOptions so;
  OK(kvcommArenaSessionOptionsInit(&so));
  CHECK(so.timeoutMs < 0, "default session timeout %lld", (long long)so.timeoutMs);
  so.timeoutMs = 20000;
  kvcommArenaSession_t s = NULL;
  OK(kvcommArenaSessionConnect(address, &so, &s));
  int peer = 0;
  OK(kvcommArenaSessionPeerPid(s, &peer));
  CHECK(peer == (int)getppid(), "peer pid %d, parent %d", peer, (int)getppid());

  /* 1. Server-owned: import, read every byte. */
  kvcommArenaCapability cap = receiveCapability(s);
  CHECK(cap.importerPid == (int32_t)getpid(), "capability for pid %d, I am %d", (int)cap.importerPid, (int)getpid());
  kvcommArenaImportOptions io;
  OK(kvcommArenaImportOptionsInit(&io));
  CHECK(io.onOwnerLoss == kvcommArenaOwnerLossKeep && io.timeoutMs < 0, "import defaults");
  kvcommArenaImport_t imp = NULL;
  io.onOwnerLoss = (kvcommArenaOwnerLoss_t)7;
  FAILS(kvcommArenaSessionImport(s, &cap, &io, &imp), kvcommInvalidArgument, "options->onOwnerLoss 7");
  CHECK(imp == NULL, "a refused import must not hand out a handle");
  io.onOwnerLoss = kvcommArenaOwnerLossKeep;
  kvcommArenaCapability forged = cap;
  forged.token[3] ^= 0x5a;
  FAILS(kvcommArenaSessionImport(s, &forged, &io, &imp), kvcommInvalidArgument, "never issued");
  FAILS(kvcommArenaSessionImport(s, NULL, &io, &imp), kvcommInvalidArgument, "capability is NULL");
  FAILS(kvcommArenaSessionImport(s, &cap, &io, NULL), kvcommInvalidArgument, "import is NULL");
  OK(kvcommArenaSessionImport(s, &cap, &io, &imp));
  FAILS(kvcommArenaSessionImport(s, &cap, NULL, &imp), kvcommInvalidArgument, "already used");

  size_t bytes = 0, count = 0;
  uint64_t version = 0, gen = 0;
  kvcommKvRegion regions[4];
  OK(kvcommArenaImportBytes(imp, &bytes));
  OK(kvcommArenaImportLayout(imp, regions, 4, &count, &version));
  OK(kvcommArenaImportGeneration(imp, &gen));
  CHECK(bytes >= EXTENT && count == 2 && version == 7 && regions[1].offset == REGION1 && gen == 1,
        "import: %zu bytes, %zu regions, version %llu, generation %llu", bytes, count, (unsigned long long)version,
        (unsigned long long)gen);
  kvcommMemoryKind_t kind = kvcommMemoryAuto;
  OK(kvcommArenaImportKind(imp, &kind));
  char type[32];
  OK(kvcommArenaImportHandleType(imp, type, sizeof(type), NULL));
  CHECK(kind == kvcommMemoryHost && strcmp(type, "memfd") == 0, "kind %d, handle type %s", (int)kind, type);
  uint8_t* got = (uint8_t*)malloc(bytes);
  OK(kvcommArenaImportRead(imp, 0, got, EXTENT));
  size_t d = firstDiff(got, EXTENT, 1, 0);
  CHECK(d == EXTENT, "server-owned: byte %zu read through the import differs", d);
  void* data = NULL;
  OK(kvcommArenaImportData(imp, &data));
  d = firstDiff((const uint8_t*)data, EXTENT, 1, 0);
  CHECK(d == EXTENT, "server-owned: byte %zu of the mapping differs", d);

  /* Bad reads and writes: nothing read or written. */
  memset(got, 0xEE, 64);
  FAILS(kvcommArenaImportRead(imp, bytes - 8, got, 16), kvcommInvalidArgument, "ArenaImport");
  FAILS(kvcommArenaImportRead(imp, SIZE_MAX - 4, got, 16), kvcommInvalidArgument, "ArenaImport");
  FAILS(kvcommArenaImportRead(imp, 0, NULL, 16), kvcommInvalidArgument, "dst is NULL");
  FAILS(kvcommArenaImportWrite(imp, bytes, got, 1), kvcommInvalidArgument, "ArenaImport");
  FAILS(kvcommArenaImportWrite(imp, 0, NULL, 1), kvcommInvalidArgument, "src is NULL");
  FAILS(kvcommArenaImportLayout(imp, NULL, 4, &count, NULL), kvcommInvalidArgument, "regions is NULL");
  CHECK(got[0] == 0xEE && got[63] == 0xEE, "a refused read wrote its output");
  kvcommArenaPin_t pin = NULL;
  FAILS(kvcommArenaImportPinCreate(imp, 0, bytes + 1, &pin), kvcommInvalidArgument, "ArenaImport");
  CHECK(pin == NULL, "a refused pin must not hand out a handle");
  /* Wrong kinds of handle. */
  FAILS(kvcommArenaImportBytes((kvcommArenaImport_t)(void*)s, &bytes), kvcommInvalidArgument,
        "is a kvcommArenaSession_t, not a kvcommArenaImport_t");
  FAILS(kvcommArenaSessionSend((kvcommArenaSession_t)(void*)imp, "x", 1), kvcommInvalidArgument,
        "is a kvcommArenaImport_t, not a kvcommArenaSession_t");

  /* The client writes region 1; the server checks it. */
  uint8_t* mine = (uint8_t*)malloc((size_t)kBlocks * kStride);
  fill(mine, (size_t)kBlocks * kStride, 2, 0);
  OK(kvcommArenaImportWrite(imp, REGION1, mine, (size_t)kBlocks * kStride));
  sendTag(s, "written");

  /* The server tried shrink/free (Busy) and grew the arena: the new bytes are mapped at the same address. */
  expectTag(s, "grown");
  size_t grown = 0;
  void* data2 = NULL;
  OK(kvcommArenaImportBytes(imp, &grown));
  OK(kvcommArenaImportData(imp, &data2));
  OK(kvcommArenaImportGeneration(imp, &gen));
  CHECK(grown >= 2 * EXTENT && data2 == data && gen == 2, "after grow: %zu bytes, data %p (was %p), generation %llu",
        grown, data2, data, (unsigned long long)gen);
  if (grown >= 2 * EXTENT) {
    OK(kvcommArenaImportRead(imp, EXTENT, got, EXTENT));
    d = firstDiff(got, EXTENT, 3, 0);
    CHECK(d == EXTENT, "grown bytes: byte %zu differs", d);
  }
  int alive = 0;
  OK(kvcommArenaImportOwnerAlive(imp, &alive));
  CHECK(alive == 1, "owner alive");
  OK(kvcommArenaImportCheck(imp));

  /* A pin of the import, then close (drains; the owner drops the lease before it returns). */
  OK(kvcommArenaImportPinCreate(imp, 4096, 4096, &pin));
  size_t ops = 0;
  OK(kvcommArenaImportOperations(imp, &ops));
  CHECK(ops == 1, "import operations %zu", ops);
  OK(kvcommArenaPinDestroy(pin));
  OK(kvcommArenaImportClose(imp, 5000));
  int closed = 0;
  OK(kvcommArenaImportClosed(imp, &closed));
  CHECK(closed == 1, "closed");
  FAILS(kvcommArenaImportRead(imp, 0, got, 16), kvcommInvalidArgument, "ArenaImport");
  OK(kvcommArenaImportDestroy(imp));
  FAILS(kvcommArenaImportRead(imp, 0, got, 16), kvcommInvalidArgument, "is not a live kvcommArenaImport_t");
  FAILS(kvcommArenaImportDestroy(imp), kvcommInvalidArgument, "is not a live kvcommArenaImport_t");
  sendTag(s, "closed");

  /* 2. Client-owned: this process creates an arena, the server imports it. */
  kvcommKvRegion l[2];
  layout(l);
  kvcommArenaOptions ao;
  OK(kvcommArenaOptionsInit(&ao));
  ao.kind = kvcommMemoryHost;
  kvcommArena_t own = NULL;
  OK(kvcommArenaCreate(l, 2, 9, &ao, &own));
  uint8_t* src = (uint8_t*)malloc(EXTENT);
  fill(src, EXTENT, 4, 0);
  OK(kvcommArenaWrite(own, 0, src, EXTENT));
  kvcommArenaCapability mineCap;
  OK(kvcommArenaSessionOffer(s, own, 30000, &mineCap));
  sendCapability(s, &mineCap);
  expectTag(s, "checked");
  /* The server wrote region 0 through its import. */
  OK(kvcommArenaRead(own, 0, src, (size_t)kBlocks * kStride));
  d = firstDiff(src, (size_t)kBlocks * kStride, 5, 0);
  CHECK(d == (size_t)kBlocks * kStride, "client-owned: byte %zu the server wrote differs", d);
  expectTag(s, "released");
  size_t leases = 7;
  OK(kvcommArenaLeases(own, &leases));
  CHECK(leases == 0, "leases after the server closed: %zu", leases);
  OK(kvcommArenaFree(own, 0));
  OK(kvcommArenaDestroy(own));
  sendTag(s, "bye");

  OK(kvcommArenaSessionClose(s));
  int sAlive = 1;
  OK(kvcommArenaSessionAlive(s, &sAlive));
  CHECK(sAlive == 0, "session alive after close");
  OK(kvcommArenaSessionDestroy(s));
  free(got);
  free(mine);
  free(src);
  return g_failures;
}

/* ---- the server (parent) ----------------------------------------------------------------------------------------- */

static void badArenaInput(kvcommArena_t a) {
  kvcommKvRegion l[2];
  layout(l);
  kvcommArena_t x = NULL;
  kvcommArenaOptions o;
  OK(kvcommArenaOptionsInit(&o));
  CHECK(o.kind == kvcommMemoryAuto && o.capacity == 0 && o.legacyIpc == 0, "arena option defaults");
  FAILS(kvcommArenaCreate(NULL, 2, 0, NULL, &x), kvcommInvalidArgument, "regions is NULL");
  FAILS(kvcommArenaCreate(l, 2, 0, NULL, NULL), kvcommInvalidArgument, "arena is NULL");
  FAILS(kvcommArenaCreate(l, KVCOMM_MAX_ARENA_REGIONS + 1, 0, NULL, &x), kvcommInvalidArgument,
        "numRegions 1025 exceeds KVCOMM_MAX_ARENA_REGIONS (1024)");
  FAILS(kvcommArenaCreate(l, SIZE_MAX, 0, NULL, &x), kvcommInvalidArgument, "KVCOMM_MAX_ARENA_REGIONS");
  o.kind = (kvcommMemoryKind_t)4294967295u;
  FAILS(kvcommArenaCreate(l, 2, 0, &o, &x), kvcommInvalidArgument, "options->kind 4294967295 (-1)");
  o.kind = kvcommMemoryHost;
  o.legacyIpc = 2;
  FAILS(kvcommArenaCreate(l, 2, 0, &o, &x), kvcommInvalidArgument, "options->legacyIpc 2");
  o.legacyIpc = 1;
  FAILS(kvcommArenaCreate(l, 2, 0, &o, &x), kvcommInvalidArgument, "legacyIpc");
  o.legacyIpc = 0;
  o.capacity = 4096;
  FAILS(kvcommArenaCreate(l, 2, 0, &o, &x), kvcommInvalidArgument, "capacity");
  kvcommKvRegion overlap[2];
  layout(overlap);
  overlap[1].offset = 2048;
  o.capacity = 0;
  FAILS(kvcommArenaCreate(overlap, 2, 0, &o, &x), kvcommInvalidArgument, "overlap");
  CHECK(x == NULL, "a refused create must not hand out a handle");

  uint8_t buf[64];
  memset(buf, 0xEE, sizeof(buf));
  size_t bytes = 0;
  OK(kvcommArenaBytes(a, &bytes));
  FAILS(kvcommArenaRead(a, bytes, buf, 1), kvcommInvalidArgument, "Arena");
  FAILS(kvcommArenaRead(a, SIZE_MAX, buf, 2), kvcommInvalidArgument, "Arena");
  FAILS(kvcommArenaWrite(a, bytes - 1, buf, 2), kvcommInvalidArgument, "Arena");
  FAILS(kvcommArenaWrite(a, 0, NULL, 2), kvcommInvalidArgument, "src is NULL");
  CHECK(buf[0] == 0xEE, "a refused read wrote its output");
  kvcommArenaPin_t p = NULL;
  FAILS(kvcommArenaPinCreate(a, 0, bytes + 1, &p), kvcommInvalidArgument, "Arena");
  FAILS(kvcommArenaPinCreate(a, 0, 16, NULL), kvcommInvalidArgument, "pin is NULL");
  FAILS(kvcommArenaGrow(a, CAPACITY * 2, 1000, NULL), kvcommInvalidArgument, "capacity");
  FAILS(kvcommArenaGrowLayout(a, NULL, 2, 0, 1000, NULL), kvcommInvalidArgument, "regions is NULL");
  FAILS(kvcommArenaShrinkLayout(a, l, KVCOMM_MAX_ARENA_REGIONS + 1, 0, 0), kvcommInvalidArgument,
        "KVCOMM_MAX_ARENA_REGIONS");
  kvcommArenaIpcHandle ipc;
  FAILS(kvcommArenaGetIpcHandle(a, &ipc), kvcommInvalidArgument, "legacyIpc");
  kvcommArenaCapability cap;
  FAILS(kvcommArenaOffer(a, 0, 0, 1000, &cap), kvcommInvalidArgument, "pid");
  FAILS(kvcommArenaOffer(a, (int)getpid(), 0, 1000, NULL), kvcommInvalidArgument, "capability is NULL");
  size_t count = 0;
  FAILS(kvcommArenaImporters(a, NULL, 4, &count), kvcommInvalidArgument, "pids is NULL");
  FAILS(kvcommArenaLayout(a, NULL, 0, NULL, NULL), kvcommInvalidArgument, "count is NULL");
  kvcommArenaImport_t imp = NULL;
  FAILS(kvcommArenaImportOpenIpc(&ipc, l, KVCOMM_MAX_ARENA_REGIONS + 1, 0, &imp), kvcommInvalidArgument,
        "KVCOMM_MAX_ARENA_REGIONS");
  FAILS(kvcommArenaImportOpenIpc(NULL, l, 2, 0, &imp), kvcommInvalidArgument, "handle is NULL");
  CHECK(imp == NULL, "a refused open must not hand out a handle");
  /* A handle of another kind, and things kvcomm never returned. */
  static uint64_t zeroed[32];
  FAILS(kvcommArenaBytes((kvcommArena_t)(void*)zeroed, &bytes), kvcommInvalidArgument, "is not a live kvcommArena_t");
  FAILS(kvcommArenaBytes(NULL, &bytes), kvcommInvalidArgument, "arena is NULL");
  kvcommArenaSession_t s = NULL;
  FAILS(kvcommArenaSessionConnect(NULL, NULL, &s), kvcommInvalidArgument, "address is NULL");
  FAILS(kvcommArenaServerAccept(NULL, 0, &s), kvcommInvalidArgument, "server is NULL");
}

static int server(const char* address, pid_t child) {
  g_who = "server";
  kvcommArenaServerOptions so;
  OK(kvcommArenaServerOptionsInit(&so));
  CHECK(so.maxSessions == 1024 && so.maxPendingHandshakes == 64, "server option defaults");
  kvcommArenaServer_t srv = NULL;
  OK(kvcommArenaServerListen(address, &so, &srv));
  char addr[128];
  size_t needed = 0;
  OK(kvcommArenaServerAddress(srv, addr, sizeof(addr), &needed));
  CHECK(strcmp(addr, address) == 0 && needed == strlen(address) + 1, "address '%s' (%zu)", addr, needed);

  kvcommKvRegion l[2];
  layout(l);
  kvcommArenaOptions ao;
  OK(kvcommArenaOptionsInit(&ao));
  ao.kind = kvcommMemoryHost;
  ao.capacity = CAPACITY;
  kvcommArena_t a = NULL;
  OK(kvcommArenaCreate(l, 2, 7, &ao, &a));
  badArenaInput(a);
  size_t bytes = 0, cap = 0, gran = 0;
  OK(kvcommArenaBytes(a, &bytes));
  OK(kvcommArenaCapacity(a, &cap));
  OK(kvcommArenaGranularity(a, &gran));
  CHECK(bytes >= EXTENT && bytes % gran == 0 && cap >= CAPACITY, "bytes %zu capacity %zu granularity %zu", bytes, cap,
        gran);
  int dev = 5;
  OK(kvcommArenaDevice(a, &dev));
  CHECK(dev == -1, "host arena device %d", dev);
  uint64_t gen = 0;
  OK(kvcommArenaGeneration(a, &gen));
  CHECK(gen == 1, "generation %llu", (unsigned long long)gen);
  uint8_t* pattern = (uint8_t*)malloc(2 * EXTENT);
  fill(pattern, EXTENT, 1, 0);
  OK(kvcommArenaWrite(a, 0, pattern, EXTENT / 2)); /* half by a copy, half straight into the memory */
  void* data = NULL;
  OK(kvcommArenaData(a, &data));
  memcpy((uint8_t*)data + EXTENT / 2, pattern + EXTENT / 2, EXTENT - EXTENT / 2);

  kvcommArenaSession_t s = NULL;
  OK(kvcommArenaServerAccept(srv, 20000, &s));
  int peer = 0;
  OK(kvcommArenaSessionPeerPid(s, &peer));
  CHECK(peer == (int)child, "session peer %d, child %d", peer, (int)child);
  kvcommArenaCapability c;
  FAILS(kvcommArenaSessionOffer(s, (kvcommArena_t)(void*)srv, 1000, &c), kvcommInvalidArgument,
        "is a kvcommArenaServer_t, not a kvcommArena_t");
  OK(kvcommArenaSessionOffer(s, a, 30000, &c));
  CHECK(c.importerPid == (int32_t)child && c.generation == 1, "capability for pid %d generation %llu",
        (int)c.importerPid, (unsigned long long)c.generation);
  size_t live = 0;
  OK(kvcommArenaLiveCapabilities(a, &live));
  CHECK(live == 1, "live capabilities %zu", live);
  FAILS(kvcommArenaSessionSend(s, pattern, KVCOMM_ARENA_MAX_MESSAGE_BYTES + 1), kvcommInvalidArgument,
        "KVCOMM_ARENA_MAX_MESSAGE_BYTES");
  sendCapability(s, &c);

  expectTag(s, "written");
  size_t leases = 0, count = 0;
  int pids[4] = {0, 0, 0, 0};
  OK(kvcommArenaLeases(a, &leases));
  OK(kvcommArenaImporters(a, pids, 4, &count));
  CHECK(leases == 1 && count == 1 && pids[0] == (int)child, "leases %zu importers %zu (%d)", leases, count, pids[0]);
  uint8_t* back = (uint8_t*)malloc(2 * EXTENT);
  OK(kvcommArenaRead(a, REGION1, back, (size_t)kBlocks * kStride));
  size_t d = firstDiff(back, (size_t)kBlocks * kStride, 2, 0);
  CHECK(d == (size_t)kBlocks * kStride, "server-owned: byte %zu the client wrote differs", d);
  OK(kvcommArenaRead(a, 0, back, REGION1));
  d = firstDiff(back, REGION1, 1, 0);
  CHECK(d == REGION1, "server-owned: byte %zu of region 0 changed", d);

  /* Leased: shrink and free are Busy and change nothing. */
  FAILS(kvcommArenaShrink(a, gran, 0), kvcommBusy, "busy");
  FAILS(kvcommArenaShrinkLayout(a, l, 1, 7, 0), kvcommBusy, "busy");
  FAILS(kvcommArenaFree(a, 0), kvcommBusy, "busy");
  FAILS(kvcommArenaFree(a, 50), kvcommBusy, "busy");
  size_t after = 0;
  int freed = 1;
  OK(kvcommArenaBytes(a, &after));
  OK(kvcommArenaFreed(a, &freed));
  OK(kvcommArenaGeneration(a, &gen));
  CHECK(after == bytes && freed == 0 && gen == 1, "a Busy call changed the arena: bytes %zu freed %d gen %llu", after,
        freed, (unsigned long long)gen);

  /* Growth reaches the importer. */
  kvcommArenaGrowth g;
  OK(kvcommArenaGrow(a, 2 * EXTENT, 10000, &g));
  CHECK(g.generation == 2 && g.importersUpdated == 1 && g.numFailures == 0, "growth: gen %llu updated %zu failed %zu",
        (unsigned long long)g.generation, g.importersUpdated, g.numFailures);
  char failures[16] = "x";
  OK(kvcommArenaGrowthFailures(a, failures, sizeof(failures), &needed));
  CHECK(failures[0] == '\0' && needed == 1, "growth failures '%s'", failures);
  fill(pattern, EXTENT, 3, 0);
  OK(kvcommArenaWrite(a, EXTENT, pattern, EXTENT));
  sendTag(s, "grown");

  /* The owner's own pin keeps free() Busy once the lease is gone. */
  kvcommArenaPin_t pin = NULL;
  OK(kvcommArenaPinCreate(a, gran, 100, &pin));
  void* pd = NULL;
  size_t po = 0, pb = 0;
  OK(kvcommArenaPinData(pin, &pd));
  OK(kvcommArenaPinOffset(pin, &po));
  OK(kvcommArenaPinBytes(pin, &pb));
  CHECK(pd == (uint8_t*)data + gran && po == gran && pb == 100, "pin %p +%zu %zu", pd, po, pb);
  expectTag(s, "closed");
  OK(kvcommArenaLeases(a, &leases));
  CHECK(leases == 0, "leases after the client closed: %zu", leases);
  size_t ops = 0;
  OK(kvcommArenaOperations(a, &ops));
  CHECK(ops == 1, "operations %zu", ops);
  FAILS(kvcommArenaFree(a, 0), kvcommBusy, "busy");
  OK(kvcommArenaPinRelease(pin));
  OK(kvcommArenaPinRelease(pin)); /* idempotent */
  OK(kvcommArenaPinData(pin, &pd));
  OK(kvcommArenaPinBytes(pin, &pb));
  CHECK(pd == NULL && pb == 0, "a released pin is a pin of nothing");
  OK(kvcommArenaPinDestroy(pin));
  FAILS(kvcommArenaPinBytes(pin, &pb), kvcommInvalidArgument, "is not a live kvcommArenaPin_t");
  OK(kvcommArenaShrink(a, EXTENT, 0));
  OK(kvcommArenaFree(a, 0));
  OK(kvcommArenaFreed(a, &freed));
  OK(kvcommArenaData(a, &data));
  CHECK(freed == 1 && data == NULL, "after free: freed %d data %p", freed, data);
  FAILS(kvcommArenaWrite(a, 0, pattern, 1), kvcommInvalidArgument, "freed");
  OK(kvcommArenaFree(a, 0)); /* a second free does nothing */
  OK(kvcommArenaDestroy(a));
  FAILS(kvcommArenaBytes(a, &bytes), kvcommInvalidArgument, "is not a live kvcommArena_t");
  FAILS(kvcommArenaDestroy(a), kvcommInvalidArgument, "is not a live kvcommArena_t");
  OK(kvcommArenaDestroy(NULL));

  /* Client-owned: import the client's arena, check it, write region 0 back. */
  kvcommArenaCapability theirs = receiveCapability(s);
  kvcommArenaImportOptions io;
  OK(kvcommArenaImportOptionsInit(&io));
  io.onOwnerLoss = kvcommArenaOwnerLossRelease;
  kvcommArenaImport_t imp = NULL;
  OK(kvcommArenaSessionImport(s, &theirs, &io, &imp));
  int owner = 0;
  OK(kvcommArenaImportOwnerPid(imp, &owner));
  CHECK(owner == (int)child, "owner pid %d", owner);
  void* idata = NULL;
  OK(kvcommArenaImportData(imp, &idata));
  d = firstDiff((const uint8_t*)idata, EXTENT, 4, 0);
  CHECK(d == EXTENT, "client-owned: byte %zu of the mapping differs", d);
  fill(pattern, (size_t)kBlocks * kStride, 5, 0);
  OK(kvcommArenaImportWrite(imp, 0, pattern, (size_t)kBlocks * kStride));
  sendTag(s, "checked");
  OK(kvcommArenaImportClose(imp, -1));
  OK(kvcommArenaImportDestroy(imp));
  sendTag(s, "released");
  expectTag(s, "bye");

  size_t sessions = 9;
  uint64_t refused = 9;
  OK(kvcommArenaServerRefusedConnections(srv, &refused));
  CHECK(refused == 0, "refused connections %llu", (unsigned long long)refused);
  OK(kvcommArenaSessionDestroy(s));
  OK(kvcommArenaServerClose(srv));
  OK(kvcommArenaServerSessions(srv, &sessions));
  CHECK(sessions == 0, "sessions after close %zu", sessions);
  kvcommArenaSession_t none = NULL;
  FAILS(kvcommArenaServerAccept(srv, 100, &none), kvcommAborted, "");
  OK(kvcommArenaServerDestroy(srv));
  FAILS(kvcommArenaServerClose(srv), kvcommInvalidArgument, "is not a live kvcommArenaServer_t");
  free(pattern);
  free(back);
  return g_failures;
}

int main(void) {
  char address[96];
  snprintf(address, sizeof(address), "@kvcomm-capi-arena-test-%d", (int)getpid());
  fflush(stdout);
  fflush(stderr);
  pid_t child = fork();
  if (child < 0) {
    perror("fork");
    return 1;
  }
  if (child == 0) _exit(client(address) ? 1 : 0);
  int failures = server(address, child);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "[server] the client failed (status %d)\n", status);
    ++failures;
  }
  printf("capi arena: %s (%d failed checks in the server; client %s)\n", failures ? "FAILED" : "passed", failures,
         WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "passed" : "FAILED");
  return failures ? 1 : 0;
}
