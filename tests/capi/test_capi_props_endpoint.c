/* The property table's endpoint entries (test_capi_props.c appends them to the table): one entry per kvcommEndpoint*,
 * kvcommRegistration*, kvcommRemoteMemory* and kvcommTransfer* function of kvcomm.h. Each rank has two endpoints of
 * its own on loopback (the fixture's and a peer), so no call here is collective. The oracle is the documented
 * contract: a value the call admits succeeds (its result checked: bytes read or written against a block-by-block
 * oracle, metadata, layouts, notifications taken), any other is refused with kvcommInvalidArgument (or the documented
 * code) naming the argument, with the outputs, the fixture's local memory and the peer's memory untouched. Calls that
 * end an object (unregister, disconnect, close, destroy) get objects made for them, never the fixture's. */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi_props.h"
#include "kvcomm/kvcomm.h"

#define FOR_VALUES(x)                                  \
  for (size_t i_##x = 0; i_##x < g_numValues; ++i_##x) \
    for (uint64_t x = g_values[i_##x], once_##x = 1; once_##x; once_##x = 0)

#define FIXTURE(call)                                                                                     \
  do {                                                                                                    \
    kvcommResult_t r_ = (call);                                                                           \
    if (r_ != kvcommSuccess) {                                                                            \
      fprintf(stderr, "[rank %d] %s: %s -> %s: %s\n", c->rank, c->entry, #call, kvcommGetErrorString(r_), \
              kvcommGetLastError());                                                                      \
      ++c->failures;                                                                                      \
    }                                                                                                     \
  } while (0)

enum { kEpBytes = kEpBlocks * kEpBlockBytes };

static void epRegion(kvcommKvRegion* r) {
  r->offset = 0;
  r->blockBytes = kEpBlockBytes;
  r->blockStride = 0;
  r->numBlocks = kEpBlocks;
}

static unsigned char s_localImage[kEpBytes], s_peerImage[kEpBytes];

/* The memories as they were before a call that must not change them. */
static void epSnapshot(Ctx* c) {
  memcpy(s_localImage, c->epLocal, kEpBytes);
  memcpy(s_peerImage, c->epPeer, kEpBytes);
}
static void epUnchanged(Ctx* c, const char* what, int line) {
  if (memcmp(s_localImage, c->epLocal, kEpBytes) != 0 || memcmp(s_peerImage, c->epPeer, kEpBytes) != 0) {
    ++c->failures;
    fprintf(stderr, "[rank %d] %s (line %d): %s changed endpoint memory\n", c->rank, c->entry, line, what);
    memcpy(c->epLocal, s_localImage, kEpBytes);
    memcpy(c->epPeer, s_peerImage, kEpBytes);
  }
}
/* A refused call that must also leave both endpoint memories untouched. */
#define EP_REFUSED_AS(code, word, call)                    \
  do {                                                     \
    epSnapshot(c);                                         \
    REFUSED_AS((code), (word), (call));                    \
    epUnchanged(c, #call, __LINE__);                       \
  } while (0)
#define EP_REFUSED(word, call) EP_REFUSED_AS(kvcommInvalidArgument, (word), (call))

static kvcommEndpoint_t newEndpoint(Ctx* c, const char* name) {
  kvcommEndpointOptions o;
  kvcommEndpointOptionsInit(&o);
  o.name = name;
  o.tcpAddress = "127.0.0.1:0";
  kvcommEndpoint_t e = NULL;
  FIXTURE(kvcommEndpointCreate(&o, &e));
  return e;
}

static kvcommRegistration_t registerOn(Ctx* c, kvcommEndpoint_t e, unsigned char* mem) {
  kvcommKvRegion r;
  epRegion(&r);
  kvcommRegistration_t reg = NULL;
  FIXTURE(kvcommEndpointRegister(e, mem, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0, kvcommAccessReadWrite, &reg));
  return reg;
}

static kvcommRemoteMemory_t connectTo(Ctx* c, kvcommEndpoint_t e, kvcommRegistration_t reg) {
  static unsigned char md[4096];
  size_t bytes = 0;
  FIXTURE(kvcommRegistrationMetadata(reg, md, sizeof(md), &bytes));
  kvcommRemoteMemory_t r = NULL;
  FIXTURE(kvcommEndpointConnect(e, md, bytes, &r));
  return r;
}

static int64_t s_src[4] = {0, 1, 2, 7}, s_dst[4] = {8, 9, 10, 15};

static kvcommTransfer_t finishedRead(Ctx* c, kvcommEndpoint_t e, kvcommRegistration_t local,
                                     kvcommRemoteMemory_t remote) {
  kvcommTransfer_t t = NULL;
  FIXTURE(kvcommEndpointRead(e, local, remote, s_src, s_dst, 4, NULL, &t));
  kvcommFetchStatus st;
  FIXTURE(kvcommTransferWait(t, 60000, &st));
  if (st.state != kvcommFetchDone) {
    ++c->failures;
    fprintf(stderr, "[rank %d] %s: the fixture's read did not finish\n", c->rank, c->entry);
  }
  return t;
}

void endpointSetUp(Ctx* c) {
  c->epLocal = (unsigned char*)malloc(kEpBytes);
  c->epPeer = (unsigned char*)malloc(kEpBytes);
  for (size_t i = 0; i < kEpBytes; ++i) {
    c->epLocal[i] = (unsigned char)(i * 3 + 1);
    c->epPeer[i] = (unsigned char)(i * 5 + 7);
  }
  c->peerEndpoint = newEndpoint(c, "props peer");
  c->peerRegistration = registerOn(c, c->peerEndpoint, c->epPeer);
  c->h.endpoint = newEndpoint(c, "props");
  c->h.registration = registerOn(c, c->h.endpoint, c->epLocal);
  c->h.remote = connectTo(c, c->h.endpoint, c->peerRegistration);
  c->h.transfer = finishedRead(c, c->h.endpoint, c->h.registration, c->h.remote);
}

void endpointMake(Ctx* c, unsigned types, Handles* out) {
  if (types & kHEndpoint) out->endpoint = newEndpoint(c, "props fresh");
  kvcommEndpoint_t e = out->endpoint ? out->endpoint : c->h.endpoint;
  if (types & kHRegistration) out->registration = registerOn(c, e, c->epLocal);
  if (types & kHRemote) out->remote = connectTo(c, e, c->peerRegistration);
  if (types & kHTransfer)
    out->transfer = finishedRead(c, e, out->registration ? out->registration : c->h.registration,
                                 out->remote ? out->remote : c->h.remote);
}

void endpointDestroy(Ctx* c, Handles* h) {
  kvcommEndpoint_t e = h->endpoint ? h->endpoint : c->h.endpoint;
  FIXTURE(kvcommTransferDestroy(h->transfer));
  /* The handle only: connect() gave the fixture's own peer (the same metadata, the same peer), which a disconnect
   * would end. */
  FIXTURE(kvcommRemoteMemoryDestroy(h->remote));
  if (h->registration) FIXTURE(kvcommEndpointUnregister(e, h->registration, -1));
  FIXTURE(kvcommRegistrationDestroy(h->registration));
  FIXTURE(kvcommEndpointDestroy(h->endpoint));
  h->transfer = NULL;
  h->remote = NULL;
  h->registration = NULL;
  h->endpoint = NULL;
}

void endpointTearDown(Ctx* c) {
  FIXTURE(kvcommEndpointUnregister(c->peerEndpoint, c->peerRegistration, -1));
  FIXTURE(kvcommRegistrationDestroy(c->peerRegistration));
  FIXTURE(kvcommEndpointDestroy(c->peerEndpoint));
  free(c->epLocal);
  free(c->epPeer);
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

/* ---- options -------------------------------------------------------------------------------------------------- */

static void propsEndpointOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommEndpointOptionsInit(NULL));
  kvcommEndpointOptions o;
  memset(&o, 0x5a, sizeof(o));
  SUCCEEDS(kvcommEndpointOptionsInit(&o));
  EXPECT(o.name == NULL && o.tcpAddress == NULL && o.timeoutMs < 0 && o.connectionsPerPeer == 4 &&
         o.maxQueuedNotifications == 65536);
}

static void propsTransferOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommTransferOptionsInit(NULL));
  kvcommTransferOptions o;
  memset(&o, 0x5a, sizeof(o));
  SUCCEEDS(kvcommTransferOptionsInit(&o));
  EXPECT(o.via == kvcommTransferViaAuto && o.notify == NULL && o.notifyBytes == 0);
}

/* ---- endpoints ------------------------------------------------------------------------------------------------ */

static void propsEndpointCreate(Ctx* c) {
  REFUSED("endpoint is NULL", kvcommEndpointCreate(NULL, NULL));
  kvcommEndpointOptions o;
  kvcommEndpointOptionsInit(&o);
  o.tcpAddress = "127.0.0.1:0";
  kvcommEndpoint_t e = NULL;
  FOR_VALUES(x) {
    int v = asInt(x);
    o.connectionsPerPeer = v;
    if (v >= 1 && v <= 64) {
      e = NULL;
      SUCCEEDS(kvcommEndpointCreate(&o, &e));
      SUCCEEDS(kvcommEndpointDestroy(e));
    } else {
      REFUSED("connectionsPerPeer", kvcommEndpointCreate(&o, SCRATCH(kvcommEndpoint_t*)));
    }
  }
  o.connectionsPerPeer = 4;
  o.maxQueuedNotifications = 0;
  REFUSED("maxQueuedNotifications", kvcommEndpointCreate(&o, SCRATCH(kvcommEndpoint_t*)));
  o.maxQueuedNotifications = 1;
  o.timeoutMs = 0;
  REFUSED("timeoutMs", kvcommEndpointCreate(&o, SCRATCH(kvcommEndpoint_t*)));
  o.timeoutMs = -1;
  char longName[80];
  memset(longName, 'n', sizeof(longName));
  longName[KVCOMM_ENDPOINT_NAME_BYTES + 1] = '\0';
  o.name = longName;
  REFUSED("longer than", kvcommEndpointCreate(&o, SCRATCH(kvcommEndpoint_t*)));
  longName[KVCOMM_ENDPOINT_NAME_BYTES] = '\0';
  SUCCEEDS(kvcommEndpointCreate(&o, &e));
  SUCCEEDS(kvcommEndpointDestroy(e));
  o.name = NULL;
  o.tcpAddress = "no address";
  REFUSED("no address", kvcommEndpointCreate(&o, SCRATCH(kvcommEndpoint_t*)));
  SUCCEEDS(kvcommEndpointCreate(NULL, &e)); /* defaults: this host's address */
  SUCCEEDS(kvcommEndpointDestroy(e));
}

static kvcommResult_t callEndpointDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommEndpointDestroy(h->endpoint);
}
static void propsEndpointDestroy(Ctx* c) {
  SUCCEEDS(kvcommEndpointDestroy(NULL));
  kvcommEndpoint_t e = newEndpoint(c, "destroyed");
  kvcommRegistration_t r = registerOn(c, e, c->epLocal);
  SUCCEEDS(kvcommEndpointDestroy(e));
  int registered = 1;
  SUCCEEDS(kvcommRegistrationRegistered(r, &registered));
  EXPECT(registered == 0); /* destroying closes: everything unregistered */
  SUCCEEDS(kvcommRegistrationDestroy(r));
  REFUSED("not a live kvcommEndpoint_t", kvcommEndpointDestroy(e));
}

static kvcommResult_t callEndpointClose(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommEndpointClose(h->endpoint);
}
static void propsEndpointClose(Ctx* c) {
  kvcommEndpoint_t e = newEndpoint(c, "closed");
  SUCCEEDS(kvcommEndpointClose(e));
  SUCCEEDS(kvcommEndpointClose(e)); /* idempotent */
  kvcommKvRegion r;
  epRegion(&r);
  REFUSED("closed", kvcommEndpointRegister(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0,
                                           kvcommAccessReadWrite, SCRATCH(kvcommRegistration_t*)));
  SUCCEEDS(kvcommEndpointDestroy(e));
}

static kvcommResult_t callEndpointId(Ctx* c, const Handles* h) {
  return kvcommEndpointId(h->endpoint, SCRATCH(uint64_t*));
}
static void propsEndpointId(Ctx* c) {
  REFUSED("id is NULL", kvcommEndpointId(c->h.endpoint, NULL));
  uint64_t a = 0, b = 0;
  SUCCEEDS(kvcommEndpointId(c->h.endpoint, &a));
  SUCCEEDS(kvcommEndpointId(c->peerEndpoint, &b));
  EXPECT(a != 0 && a != b);
}

static kvcommResult_t callEndpointAddress(Ctx* c, const Handles* h) {
  return kvcommEndpointAddress(h->endpoint, SCRATCH(char*), 16, NULL);
}
static kvcommResult_t addressText(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommEndpointAddress(c->h.endpoint, text, bytes, needed);
}
static void propsEndpointAddress(Ctx* c) {
  textProps(c, addressText);
}

/* ---- registrations -------------------------------------------------------------------------------------------- */

static kvcommResult_t callEndpointRegister(Ctx* c, const Handles* h) {
  kvcommKvRegion r;
  epRegion(&r);
  return kvcommEndpointRegister(h->endpoint, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0,
                                kvcommAccessReadWrite, SCRATCH(kvcommRegistration_t*));
}
static void propsEndpointRegister(Ctx* c) {
  kvcommEndpoint_t e = c->h.endpoint;
  kvcommKvRegion r;
  epRegion(&r);
  kvcommRegistration_t* out = SCRATCH(kvcommRegistration_t*);
  REFUSED("registration is NULL",
          kvcommEndpointRegister(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0, kvcommAccessReadWrite, NULL));
  REFUSED("base", kvcommEndpointRegister(e, NULL, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0, kvcommAccessReadWrite, out));
  REFUSED("regions is NULL",
          kvcommEndpointRegister(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, NULL, 1, 0, kvcommAccessReadWrite, out));
  unsigned vals[24];
  size_t n = enumValues(3, vals);
  for (size_t i = 0; i < n; ++i) {
    kvcommMemoryKind_t k = (kvcommMemoryKind_t)vals[i];
    if (k == kvcommMemoryHost) continue;
    /* Auto is refused (say which memory it is); Cuda needs a GPU (none in this build's tests: refused too). */
    kvcommResult_t r_ = kvcommEndpointRegister(e, c->epLocal, kEpBytes, k, -1, &r, 1, 0, kvcommAccessReadWrite, out);
    ++c->cases;
    EXPECT(r_ != kvcommSuccess);
    if (i >= 3) REFUSED("kind", kvcommEndpointRegister(e, c->epLocal, kEpBytes, k, -1, &r, 1, 0, kvcommAccessReadWrite,
                                                       out));
  }
  REFUSED("kvcommMemoryAuto", kvcommEndpointRegister(e, c->epLocal, kEpBytes, kvcommMemoryAuto, -1, &r, 1, 0,
                                                     kvcommAccessReadWrite, out));
  n = enumValues(2, vals);
  for (size_t i = 2; i < n; ++i)
    REFUSED("access", kvcommEndpointRegister(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0,
                                             (kvcommAccess_t)vals[i], out));
  static kvcommKvRegion many[4];
  FOR_VALUES(x) {
    if (x > KVCOMM_MAX_FETCH_REGIONS)
      REFUSED("KVCOMM_MAX_FETCH_REGIONS", kvcommEndpointRegister(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, many,
                                                                 (size_t)x, 0, kvcommAccessReadWrite, out));
    /* bytes: the layout needs kEpBytes */
    if (x < kEpBytes)
      REFUSED("", kvcommEndpointRegister(e, c->epLocal, (size_t)x, kvcommMemoryHost, -1, &r, 1, 0,
                                         kvcommAccessReadWrite, out));
  }
  kvcommKvRegion bad = r;
  bad.blockBytes = 0;
  REFUSED("blockBytes", kvcommEndpointRegister(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &bad, 1, 0,
                                               kvcommAccessReadWrite, out));
  /* Valid, read-only too: the id, generation and metadata come back. */
  kvcommRegistration_t reg = NULL;
  SUCCEEDS(kvcommEndpointRegister(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &r, 1, 9, kvcommAccessReadOnly, &reg));
  uint64_t gen = 0;
  SUCCEEDS(kvcommRegistrationGeneration(reg, &gen));
  EXPECT(gen == 1);
  SUCCEEDS(kvcommEndpointUnregister(e, reg, -1));
  SUCCEEDS(kvcommRegistrationDestroy(reg));
}

static kvcommResult_t callEndpointRegisterArena(Ctx* c, const Handles* h) {
  return kvcommEndpointRegisterArena(h->endpoint, h->arena, kvcommAccessReadWrite, SCRATCH(kvcommRegistration_t*));
}
static void propsEndpointRegisterArena(Ctx* c) {
  kvcommArena_t a = arenaMake(c);
  REFUSED("registration is NULL", kvcommEndpointRegisterArena(c->h.endpoint, a, kvcommAccessReadWrite, NULL));
  unsigned vals[24];
  size_t n = enumValues(2, vals);
  for (size_t i = 2; i < n; ++i)
    REFUSED("access", kvcommEndpointRegisterArena(c->h.endpoint, a, (kvcommAccess_t)vals[i],
                                                  SCRATCH(kvcommRegistration_t*)));
  kvcommRegistration_t reg = NULL;
  SUCCEEDS(kvcommEndpointRegisterArena(c->h.endpoint, a, kvcommAccessReadOnly, &reg));
  REFUSED_AS(kvcommBusy, "", kvcommArenaFree(a, 0)); /* pinned while registered */
  SUCCEEDS(kvcommEndpointUnregister(c->h.endpoint, reg, -1));
  SUCCEEDS(kvcommRegistrationDestroy(reg));
  SUCCEEDS(kvcommArenaFree(a, 0));
  SUCCEEDS(kvcommArenaDestroy(a));
}

static kvcommResult_t callEndpointRegisterBuffer(Ctx* c, const Handles* h) {
  return kvcommEndpointRegisterBuffer(h->endpoint, h->buffer, &c->region, 1, 0, kvcommAccessReadWrite,
                                      SCRATCH(kvcommRegistration_t*));
}
static void propsEndpointRegisterBuffer(Ctx* c) {
  REFUSED("registration is NULL",
          kvcommEndpointRegisterBuffer(c->h.endpoint, c->h.buffer, &c->region, 1, 0, kvcommAccessReadWrite, NULL));
  REFUSED("regions is NULL", kvcommEndpointRegisterBuffer(c->h.endpoint, c->h.buffer, NULL, 1, 0,
                                                          kvcommAccessReadWrite, SCRATCH(kvcommRegistration_t*)));
  REFUSED("access", kvcommEndpointRegisterBuffer(c->h.endpoint, c->h.buffer, &c->region, 1, 0, (kvcommAccess_t)7,
                                                 SCRATCH(kvcommRegistration_t*)));
  kvcommKvRegion big = c->region;
  big.numBlocks = SIZE_MAX / 1024;
  REFUSED("", kvcommEndpointRegisterBuffer(c->h.endpoint, c->h.buffer, &big, 1, 0, kvcommAccessReadWrite,
                                           SCRATCH(kvcommRegistration_t*)));
  kvcommRegistration_t reg = NULL;
  SUCCEEDS(kvcommEndpointRegisterBuffer(c->h.endpoint, c->h.buffer, &c->region, 1, 0, kvcommAccessReadWrite, &reg));
  SUCCEEDS(kvcommEndpointUnregister(c->h.endpoint, reg, -1));
  SUCCEEDS(kvcommRegistrationDestroy(reg));
}

static kvcommResult_t callEndpointUnregister(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommEndpointUnregister(h->endpoint, h->registration, 0);
}
static void propsEndpointUnregister(Ctx* c) {
  kvcommRegistration_t reg = registerOn(c, c->h.endpoint, c->epLocal);
  kvcommEndpoint_t other = newEndpoint(c, "other");
  REFUSED("another endpoint", kvcommEndpointUnregister(other, reg, -1));
  SUCCEEDS(kvcommEndpointDestroy(other));
  FOR_VALUES(x) {
    if ((int64_t)x < 0 || x < 100) SUCCEEDS(kvcommEndpointUnregister(c->h.endpoint, reg, (int64_t)x)); /* idempotent */
  }
  int registered = 1;
  SUCCEEDS(kvcommRegistrationRegistered(reg, &registered));
  EXPECT(registered == 0);
  SUCCEEDS(kvcommRegistrationDestroy(reg));
}

static kvcommResult_t callRegistrationDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommRegistrationDestroy(h->registration);
}
static void propsRegistrationDestroy(Ctx* c) {
  SUCCEEDS(kvcommRegistrationDestroy(NULL));
  kvcommRegistration_t reg = registerOn(c, c->h.endpoint, c->epLocal);
  kvcommRemoteMemory_t remote = connectTo(c, c->peerEndpoint, reg);
  SUCCEEDS(kvcommRegistrationDestroy(reg)); /* the handle only: still served */
  int64_t s[1] = {0}, d[1] = {3};
  kvcommTransfer_t t = NULL;
  SUCCEEDS(kvcommEndpointRead(c->peerEndpoint, c->peerRegistration, remote, s, d, 1, NULL, &t));
  kvcommFetchStatus st;
  SUCCEEDS(kvcommTransferWait(t, 60000, &st));
  EXPECT(st.state == kvcommFetchDone && memcmp(c->epPeer + 3 * kEpBlockBytes, c->epLocal, kEpBlockBytes) == 0);
  for (size_t i = 0; i < kEpBlockBytes; ++i) c->epPeer[3 * kEpBlockBytes + i] = (unsigned char)((3 * kEpBlockBytes + i) * 5 + 7);
  SUCCEEDS(kvcommTransferDestroy(t));
  SUCCEEDS(kvcommEndpointDisconnect(c->peerEndpoint, remote));
  SUCCEEDS(kvcommRemoteMemoryDestroy(remote));
}

static kvcommResult_t callRegistrationMetadata(Ctx* c, const Handles* h) {
  return kvcommRegistrationMetadata(h->registration, SCRATCH(void*), 64, SCRATCH(size_t*));
}
static void propsRegistrationMetadata(Ctx* c) {
  size_t bytes = 0;
  REFUSED("bytes is NULL", kvcommRegistrationMetadata(c->h.registration, NULL, 0, NULL));
  SUCCEEDS(kvcommRegistrationMetadata(c->h.registration, NULL, 0, &bytes));
  EXPECT(bytes > 32 && bytes < 4096);
  unsigned char* md = (unsigned char*)malloc(bytes + 64);
  FOR_VALUES(x) {
    if (x > 0 && x <= bytes + 32) {
      memset(md, 0xEE, bytes + 64);
      size_t got = 0;
      SUCCEEDS(kvcommRegistrationMetadata(c->h.registration, md, (size_t)x, &got));
      EXPECT(got == bytes);
      if (x < bytes) EXPECT(md[0] == 0xEE); /* too small: nothing copied */
      if (x >= bytes) EXPECT(md[bytes] == 0xEE);
    }
    if (x > 0) REFUSED("metadata is NULL", kvcommRegistrationMetadata(c->h.registration, NULL, (size_t)x,
                                                                       SCRATCH(size_t*)));
  }
  free(md);
}

static kvcommResult_t callRegistrationRevoke(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommRegistrationRevoke(h->registration);
}
static void propsRegistrationRevoke(Ctx* c) {
  kvcommRegistration_t reg = registerOn(c, c->h.endpoint, c->epLocal);
  kvcommRemoteMemory_t old = connectTo(c, c->peerEndpoint, reg);
  SUCCEEDS(kvcommRegistrationRevoke(reg));
  uint64_t gen = 0;
  SUCCEEDS(kvcommRegistrationGeneration(reg, &gen));
  EXPECT(gen == 2);
  int64_t s[1] = {1}, d[1] = {4};
  kvcommTransfer_t t = NULL;
  epSnapshot(c);
  SUCCEEDS(kvcommEndpointRead(c->peerEndpoint, c->peerRegistration, old, s, d, 1, NULL, &t));
  kvcommFetchStatus st;
  SUCCEEDS(kvcommTransferWait(t, 60000, &st));
  EXPECT(st.state == kvcommFetchFailed);
  epUnchanged(c, "a read with revoked metadata", __LINE__);
  SUCCEEDS(kvcommTransferDestroy(t));
  SUCCEEDS(kvcommEndpointDisconnect(c->peerEndpoint, old));
  SUCCEEDS(kvcommRemoteMemoryDestroy(old));
  SUCCEEDS(kvcommEndpointUnregister(c->h.endpoint, reg, -1));
  SUCCEEDS(kvcommRegistrationDestroy(reg));
}

static kvcommResult_t callRegistrationId(Ctx* c, const Handles* h) {
  return kvcommRegistrationId(h->registration, SCRATCH(uint64_t*));
}
static void propsRegistrationId(Ctx* c) {
  REFUSED("id is NULL", kvcommRegistrationId(c->h.registration, NULL));
  uint64_t a = 0, b = 0, r = 0, g = 0;
  SUCCEEDS(kvcommRegistrationId(c->h.registration, &a));
  SUCCEEDS(kvcommRegistrationId(c->peerRegistration, &b));
  SUCCEEDS(kvcommRemoteMemoryId(c->h.remote, &r, &g));
  EXPECT(a != b && r == b && g == 1);
}

static kvcommResult_t callRegistrationGeneration(Ctx* c, const Handles* h) {
  return kvcommRegistrationGeneration(h->registration, SCRATCH(uint64_t*));
}
static void propsRegistrationGeneration(Ctx* c) {
  REFUSED("generation is NULL", kvcommRegistrationGeneration(c->h.registration, NULL));
  uint64_t g = 0;
  SUCCEEDS(kvcommRegistrationGeneration(c->h.registration, &g));
  EXPECT(g == 1);
}

static kvcommResult_t callRegistrationRegistered(Ctx* c, const Handles* h) {
  return kvcommRegistrationRegistered(h->registration, SCRATCH(int*));
}
static void propsRegistrationRegistered(Ctx* c) {
  REFUSED("registered is NULL", kvcommRegistrationRegistered(c->h.registration, NULL));
  int r = 0;
  SUCCEEDS(kvcommRegistrationRegistered(c->h.registration, &r));
  EXPECT(r == 1);
}

/* ---- peers ---------------------------------------------------------------------------------------------------- */

static kvcommResult_t callEndpointConnect(Ctx* c, const Handles* h) {
  static const unsigned char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  (void)c;
  return kvcommEndpointConnect(h->endpoint, junk, sizeof(junk), SCRATCH(kvcommRemoteMemory_t*));
}
static void propsEndpointConnect(Ctx* c) {
  unsigned char md[4096];
  size_t bytes = 0;
  SUCCEEDS(kvcommRegistrationMetadata(c->peerRegistration, md, sizeof(md), &bytes));
  kvcommRemoteMemory_t* out = SCRATCH(kvcommRemoteMemory_t*);
  REFUSED("remote is NULL", kvcommEndpointConnect(c->h.endpoint, md, bytes, NULL));
  REFUSED("metadata is NULL", kvcommEndpointConnect(c->h.endpoint, NULL, bytes, out));
  FOR_VALUES(x) {
    if (x < bytes) REFUSED("", kvcommEndpointConnect(c->h.endpoint, md, (size_t)x, out));
  }
  for (size_t i = 0; i < bytes; i += 7) { /* any flipped byte: refused (magic, version, checksum) */
    md[i] ^= 0x40;
    REFUSED("", kvcommEndpointConnect(c->h.endpoint, md, bytes, out));
    md[i] ^= 0x40;
  }
  unsigned char longer[4097];
  memcpy(longer, md, bytes);
  longer[bytes] = 0;
  REFUSED("", kvcommEndpointConnect(c->h.endpoint, longer, bytes + 1, out));
  kvcommRemoteMemory_t r = NULL;
  SUCCEEDS(kvcommEndpointConnect(c->h.endpoint, md, bytes, &r));
  uint64_t id = 0, g = 0, want = 0;
  SUCCEEDS(kvcommRemoteMemoryId(r, &id, &g));
  SUCCEEDS(kvcommRegistrationId(c->peerRegistration, &want));
  EXPECT(id == want && g == 1);
  SUCCEEDS(kvcommRemoteMemoryDestroy(r)); /* the same peer as the fixture's remote: not disconnected */
}

static kvcommResult_t callEndpointDisconnect(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommEndpointDisconnect(h->endpoint, h->remote);
}
static void propsEndpointDisconnect(Ctx* c) {
  kvcommRegistration_t reg = registerOn(c, c->peerEndpoint, c->epPeer);
  kvcommRemoteMemory_t r = connectTo(c, c->h.endpoint, reg);
  SUCCEEDS(kvcommEndpointDisconnect(c->h.endpoint, r));
  SUCCEEDS(kvcommEndpointDisconnect(c->h.endpoint, r)); /* idempotent */
  int64_t s[1] = {0}, d[1] = {8};
  EP_REFUSED("disconnected", kvcommEndpointRead(c->h.endpoint, c->h.registration, r, s, d, 1, NULL,
                                                SCRATCH(kvcommTransfer_t*)));
  SUCCEEDS(kvcommRemoteMemoryDestroy(r));
  SUCCEEDS(kvcommEndpointUnregister(c->peerEndpoint, reg, -1));
  SUCCEEDS(kvcommRegistrationDestroy(reg));
}

static kvcommResult_t callRemoteMemoryDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommRemoteMemoryDestroy(h->remote);
}
static void propsRemoteMemoryDestroy(Ctx* c) {
  SUCCEEDS(kvcommRemoteMemoryDestroy(NULL));
  kvcommRemoteMemory_t r = connectTo(c, c->h.endpoint, c->peerRegistration);
  SUCCEEDS(kvcommRemoteMemoryDestroy(r));
  REFUSED("not a live kvcommRemoteMemory_t", kvcommRemoteMemoryDestroy(r));
}

static kvcommResult_t callRemoteMemoryId(Ctx* c, const Handles* h) {
  return kvcommRemoteMemoryId(h->remote, SCRATCH(uint64_t*), SCRATCH(uint64_t*) + 1);
}
static void propsRemoteMemoryId(Ctx* c) {
  uint64_t id = 0, g = 0;
  REFUSED("id is NULL", kvcommRemoteMemoryId(c->h.remote, NULL, SCRATCH(uint64_t*)));
  REFUSED("generation is NULL", kvcommRemoteMemoryId(c->h.remote, SCRATCH(uint64_t*), NULL));
  SUCCEEDS(kvcommRemoteMemoryId(c->h.remote, &id, &g));
  EXPECT(id != 0 && g == 1);
}

static kvcommResult_t callRemoteMemoryLayout(Ctx* c, const Handles* h) {
  return kvcommRemoteMemoryLayout(h->remote, SCRATCH(kvcommKvRegion*), 1, SCRATCH(size_t*) + 8, NULL);
}
static void propsRemoteMemoryLayout(Ctx* c) {
  REFUSED("count is NULL", kvcommRemoteMemoryLayout(c->h.remote, NULL, 0, NULL, NULL));
  REFUSED("regions is NULL", kvcommRemoteMemoryLayout(c->h.remote, NULL, 1, SCRATCH(size_t*), NULL));
  kvcommKvRegion r[2];
  memset(r, 0, sizeof(r));
  size_t n = 9;
  uint64_t v = 9;
  SUCCEEDS(kvcommRemoteMemoryLayout(c->h.remote, NULL, 0, &n, &v));
  EXPECT(n == 1 && v == 0);
  SUCCEEDS(kvcommRemoteMemoryLayout(c->h.remote, r, 2, &n, NULL));
  EXPECT(n == 1 && r[0].blockBytes == kEpBlockBytes && r[0].numBlocks == kEpBlocks && r[1].blockBytes == 0);
}

static kvcommResult_t callRemoteMemoryKind(Ctx* c, const Handles* h) {
  return kvcommRemoteMemoryKind(h->remote, SCRATCH(kvcommMemoryKind_t*), NULL);
}
static void propsRemoteMemoryKind(Ctx* c) {
  kvcommMemoryKind_t k = kvcommMemoryAuto;
  kvcommAccess_t a = kvcommAccessReadOnly;
  SUCCEEDS(kvcommRemoteMemoryKind(c->h.remote, &k, &a));
  EXPECT(k == kvcommMemoryHost && a == kvcommAccessReadWrite);
  SUCCEEDS(kvcommRemoteMemoryKind(c->h.remote, NULL, NULL));
}

static kvcommResult_t callRemoteMemoryPeerName(Ctx* c, const Handles* h) {
  return kvcommRemoteMemoryPeerName(h->remote, SCRATCH(char*), 16, NULL);
}
static kvcommResult_t peerNameText(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommRemoteMemoryPeerName(c->h.remote, text, bytes, needed);
}
static void propsRemoteMemoryPeerName(Ctx* c) {
  textProps(c, peerNameText);
  char name[64];
  SUCCEEDS(kvcommRemoteMemoryPeerName(c->h.remote, name, sizeof(name), NULL));
  EXPECT(strcmp(name, "props peer") == 0);
}

/* ---- transfers ------------------------------------------------------------------------------------------------ */

/* The local memory after peer block s[i] was read into local block d[i] (-1 skips), from `before`. */
static void readOracle(const unsigned char* before, const unsigned char* peer, const int64_t* s, const int64_t* d,
                       size_t n, unsigned char* out) {
  memcpy(out, before, kEpBytes);
  for (size_t i = 0; i < n; ++i)
    if (s[i] >= 0 && d[i] >= 0)
      memcpy(out + (size_t)d[i] * kEpBlockBytes, peer + (size_t)s[i] * kEpBlockBytes, kEpBlockBytes);
}

typedef kvcommResult_t (*StartFn)(kvcommEndpoint_t, kvcommRegistration_t, kvcommRemoteMemory_t, const int64_t*,
                                  const int64_t*, size_t, const kvcommTransferOptions*, kvcommTransfer_t*);

/* The arguments both transfer calls share: ids out of range, -2, duplicates, NULL arrays, counts past the limit,
 * options->via and the notification's size; each refused with both memories untouched. */
static void transferArgs(Ctx* c, StartFn fn, int push) {
  kvcommEndpoint_t e = c->h.endpoint;
  kvcommRegistration_t l = c->h.registration;
  kvcommRemoteMemory_t r = c->h.remote;
  kvcommTransfer_t* out = SCRATCH(kvcommTransfer_t*);
  int64_t ok[1] = {8}, ids[1];
  FOR_VALUES(x) {
    ids[0] = (int64_t)x;
    if ((int64_t)x >= kEpBlocks || (int64_t)x < -1) {
      EP_REFUSED("", fn(e, l, r, ids, ok, 1, NULL, out));
      EP_REFUSED("", fn(e, l, r, ok, ids, 1, NULL, out));
    }
    if (x > KVCOMM_MAX_FETCH_PAIRS) EP_REFUSED("KVCOMM_MAX_FETCH_PAIRS", fn(e, l, r, ok, ok, (size_t)x, NULL, out));
  }
  int64_t two[2] = {1, 2}, dup[2] = {9, 9};
  /* the destination: local ids of a read, remote ones of a write */
  EP_REFUSED("duplicate", push ? fn(e, l, r, dup, two, 2, NULL, out) : fn(e, l, r, two, dup, 2, NULL, out));
  EP_REFUSED("NULL", fn(e, l, r, NULL, ok, 1, NULL, out));
  EP_REFUSED("NULL", fn(e, l, r, ok, NULL, 1, NULL, out));
  EP_REFUSED("transfer is NULL", fn(e, l, r, ok, ok, 1, NULL, NULL));
  kvcommTransferOptions o;
  kvcommTransferOptionsInit(&o);
  unsigned vals[24];
  size_t n = enumValues(4, vals);
  for (size_t i = 4; i < n; ++i) {
    o.via = (kvcommTransferVia_t)vals[i];
    EP_REFUSED("options->via", fn(e, l, r, ok, ok, 1, &o, out));
  }
  o.via = kvcommTransferViaPeer; /* plain malloc memory cannot be mapped by a peer */
  EP_REFUSED_AS(kvcommUnsupported, "", fn(e, l, r, ok, ok, 1, &o, out));
  o.via = kvcommTransferViaRdma; /* no RDMA device in the tests' machines, or none for this memory */
  {
    kvcommResult_t r_ = fn(e, l, r, ok, ok, 1, &o, out);
    ++c->cases;
    if (r_ == kvcommSuccess) {
      kvcommFetchStatus st;
      FIXTURE(kvcommTransferWait(*out, 60000, &st));
      FIXTURE(kvcommTransferDestroy(*out));
    }
  }
  o.via = kvcommTransferViaAuto;
  o.notify = NULL;
  o.notifyBytes = 3;
  EP_REFUSED("options->notify is NULL", fn(e, l, r, ok, ok, 1, &o, out));
  static char big[KVCOMM_MAX_NOTIFICATION_BYTES + 2];
  o.notify = big;
  FOR_VALUES(x) {
    if (x > KVCOMM_MAX_NOTIFICATION_BYTES) {
      o.notifyBytes = (size_t)x;
      EP_REFUSED("KVCOMM_MAX_NOTIFICATION_BYTES", fn(e, l, r, ok, ok, 1, &o, out));
    }
  }
}

static kvcommResult_t callEndpointRead(Ctx* c, const Handles* h) {
  int64_t s[1] = {0}, d[1] = {8};
  return kvcommEndpointRead(h->endpoint, h->registration, h->remote, s, d, 1, NULL, SCRATCH(kvcommTransfer_t*));
}
static void propsEndpointRead(Ctx* c) {
  transferArgs(c, kvcommEndpointRead, 0);
  /* Valid: -1 skips, the bytes are the oracle's, the notification arrives once with them. */
  int64_t s[5] = {3, -1, 5, 0, 6}, d[5] = {12, 13, -1, 14, 8};
  unsigned char* want = (unsigned char*)malloc(kEpBytes);
  unsigned char* before = (unsigned char*)malloc(kEpBytes);
  memcpy(before, c->epLocal, kEpBytes);
  readOracle(before, c->epPeer, s, d, 5, want);
  kvcommTransferOptions o;
  kvcommTransferOptionsInit(&o);
  o.notify = "read";
  o.notifyBytes = 4;
  kvcommTransfer_t t = NULL;
  SUCCEEDS(kvcommEndpointRead(c->h.endpoint, c->h.registration, c->h.remote, s, d, 5, &o, &t));
  kvcommFetchStatus st;
  SUCCEEDS(kvcommTransferWait(t, 60000, &st));
  EXPECT(st.state == kvcommFetchDone && st.bytesDone == 3 * kEpBlockBytes);
  EXPECT(memcmp(c->epLocal, want, kEpBytes) == 0);
  SUCCEEDS(kvcommTransferDestroy(t));
  kvcommNotification n;
  char text[16] = {0};
  int received = 0;
  SUCCEEDS(kvcommEndpointNextNotification(c->peerEndpoint, 30000, &n, text, sizeof(text), &received));
  EXPECT(received == 1 && n.messageBytes == 4 && memcmp(text, "read", 4) == 0 && strcmp(n.fromName, "props") == 0);
  SUCCEEDS(kvcommEndpointNextNotification(c->peerEndpoint, 0, &n, text, sizeof(text), &received));
  EXPECT(received == 0);
  memcpy(c->epLocal, before, kEpBytes);
  free(want);
  free(before);
}

static kvcommResult_t callEndpointWrite(Ctx* c, const Handles* h) {
  int64_t s[1] = {0}, d[1] = {8};
  return kvcommEndpointWrite(h->endpoint, h->registration, h->remote, d, s, 1, NULL, SCRATCH(kvcommTransfer_t*));
}
static void propsEndpointWrite(Ctx* c) {
  transferArgs(c, kvcommEndpointWrite, 1);
  /* Valid: local block l[i] into peer block r[i]. */
  int64_t r[3] = {9, 10, -1}, l[3] = {1, 2, 3};
  unsigned char* want = (unsigned char*)malloc(kEpBytes);
  unsigned char* before = (unsigned char*)malloc(kEpBytes);
  memcpy(before, c->epPeer, kEpBytes);
  readOracle(before, c->epLocal, l, r, 3, want);
  kvcommTransfer_t t = NULL;
  SUCCEEDS(kvcommEndpointWrite(c->h.endpoint, c->h.registration, c->h.remote, r, l, 3, NULL, &t));
  kvcommFetchStatus st;
  SUCCEEDS(kvcommTransferWait(t, 60000, &st));
  EXPECT(st.state == kvcommFetchDone && memcmp(c->epPeer, want, kEpBytes) == 0);
  SUCCEEDS(kvcommTransferDestroy(t));
  memcpy(c->epPeer, before, kEpBytes);
  free(want);
  free(before);
}

static kvcommResult_t callTransferTest(Ctx* c, const Handles* h) {
  return kvcommTransferTest(h->transfer, SCRATCH(kvcommFetchStatus*));
}
static void propsTransferTest(Ctx* c) {
  REFUSED("status is NULL", kvcommTransferTest(c->h.transfer, NULL));
  kvcommFetchStatus st;
  SUCCEEDS(kvcommTransferTest(c->h.transfer, &st));
  EXPECT(st.state == kvcommFetchDone && st.bytesDone == 4 * kEpBlockBytes && st.numFailedBlocks == 0);
}

static kvcommResult_t callTransferWait(Ctx* c, const Handles* h) {
  return kvcommTransferWait(h->transfer, 0, SCRATCH(kvcommFetchStatus*));
}
static void propsTransferWait(Ctx* c) {
  REFUSED("status is NULL", kvcommTransferWait(c->h.transfer, -1, NULL));
  FOR_VALUES(x) {
    kvcommFetchStatus st;
    SUCCEEDS(kvcommTransferWait(c->h.transfer, (int64_t)x, &st));
    EXPECT(st.state == kvcommFetchDone);
  }
}

static kvcommResult_t callTransferFailedBlocks(Ctx* c, const Handles* h) {
  return kvcommTransferFailedBlocks(h->transfer, NULL, 0, SCRATCH(size_t*));
}
static void propsTransferFailedBlocks(Ctx* c) {
  REFUSED("count is NULL", kvcommTransferFailedBlocks(c->h.transfer, NULL, 0, NULL));
  REFUSED("blocks is NULL", kvcommTransferFailedBlocks(c->h.transfer, NULL, 3, SCRATCH(size_t*)));
  size_t n = 9;
  int64_t b[2] = {-7, -7};
  SUCCEEDS(kvcommTransferFailedBlocks(c->h.transfer, b, 2, &n));
  EXPECT(n == 0 && b[0] == -7);
}

static kvcommResult_t callTransferError(Ctx* c, const Handles* h) {
  return kvcommTransferError(h->transfer, SCRATCH(char*), 8, NULL);
}
static kvcommResult_t errorText(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommTransferError(c->h.transfer, text, bytes, needed);
}
static void propsTransferError(Ctx* c) {
  textProps(c, errorText);
  size_t needed = 9;
  SUCCEEDS(kvcommTransferError(c->h.transfer, NULL, 0, &needed));
  EXPECT(needed == 1); /* done: no error */
}

static kvcommResult_t callTransferGetInfo(Ctx* c, const Handles* h) {
  return kvcommTransferGetInfo(h->transfer, SCRATCH(kvcommFetchPlanInfo*));
}
static void propsTransferGetInfo(Ctx* c) {
  REFUSED("info is NULL", kvcommTransferGetInfo(c->h.transfer, NULL));
  kvcommFetchPlanInfo i;
  SUCCEEDS(kvcommTransferGetInfo(c->h.transfer, &i));
  EXPECT(i.pairsIn == 4 && i.pairsSkipped == 0 && i.bytes == 4 * kEpBlockBytes && i.tcpRuns >= 1);
}

static kvcommResult_t callTransferTransport(Ctx* c, const Handles* h) {
  return kvcommTransferTransport(h->transfer, SCRATCH(kvcommFetchTransport_t*));
}
static void propsTransferTransport(Ctx* c) {
  REFUSED("transport is NULL", kvcommTransferTransport(c->h.transfer, NULL));
  kvcommFetchTransport_t t = kvcommFetchTransportNone;
  SUCCEEDS(kvcommTransferTransport(c->h.transfer, &t));
  EXPECT(t == kvcommFetchTransportTcp);
}

static kvcommResult_t callTransferDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommTransferDestroy(h->transfer);
}
static void propsTransferDestroy(Ctx* c) {
  SUCCEEDS(kvcommTransferDestroy(NULL));
  kvcommTransfer_t t = finishedRead(c, c->h.endpoint, c->h.registration, c->h.remote);
  SUCCEEDS(kvcommTransferDestroy(t));
  REFUSED("not a live kvcommTransfer_t", kvcommTransferDestroy(t));
}

/* Device-id transfers need the peer path: plain malloc memory is refused (Unsupported); a memfd arena is mapped and
 * copied synchronously on host memory. */
typedef kvcommResult_t (*DeviceFn)(kvcommEndpoint_t, kvcommRegistration_t, kvcommRemoteMemory_t,
                                   const kvcommDeviceTransferBatch*, kvcommStream_t);
static void deviceArgs(Ctx* c, DeviceFn fn) {
  int64_t ok[1] = {8};
  kvcommDeviceTransferBatch b = {ok, ok, 1};
  EP_REFUSED("batch is NULL", fn(c->h.endpoint, c->h.registration, c->h.remote, NULL, NULL));
  kvcommDeviceTransferBatch nulls = {NULL, ok, 1};
  EP_REFUSED("NULL", fn(c->h.endpoint, c->h.registration, c->h.remote, &nulls, NULL));
  FOR_VALUES(x) {
    if (x > KVCOMM_MAX_FETCH_PAIRS) {
      kvcommDeviceTransferBatch many = {ok, ok, (size_t)x};
      EP_REFUSED("KVCOMM_MAX_FETCH_PAIRS", fn(c->h.endpoint, c->h.registration, c->h.remote, &many, NULL));
    }
  }
  EP_REFUSED_AS(kvcommUnsupported, "", fn(c->h.endpoint, c->h.registration, c->h.remote, &b, NULL));
}

static kvcommResult_t callEndpointReadDevice(Ctx* c, const Handles* h) {
  int64_t ids[1] = {8};
  kvcommDeviceTransferBatch b = {ids, ids, 1};
  (void)c;
  return kvcommEndpointReadDevice(h->endpoint, h->registration, h->remote, &b, NULL);
}
static kvcommResult_t callEndpointWriteDevice(Ctx* c, const Handles* h) {
  int64_t ids[1] = {8};
  kvcommDeviceTransferBatch b = {ids, ids, 1};
  (void)c;
  return kvcommEndpointWriteDevice(h->endpoint, h->registration, h->remote, &b, NULL);
}

/* A host arena served by the peer endpoint, mapped by the fixture's: the device-id forms run (synchronously). */
static void deviceValid(Ctx* c, int push) {
  kvcommArena_t mine = arenaMake(c), theirs = arenaMake(c);
  enum { kBytes = kArenaBlocks * kArenaBlockBytes };
  unsigned char* a = (unsigned char*)malloc(kBytes);
  unsigned char* b = (unsigned char*)malloc(kBytes);
  for (size_t i = 0; i < kBytes; ++i) a[i] = (unsigned char)(i * 11 + 1), b[i] = (unsigned char)(i * 13 + 5);
  FIXTURE(kvcommArenaWrite(mine, 0, a, kBytes));
  FIXTURE(kvcommArenaWrite(theirs, 0, b, kBytes));
  kvcommRegistration_t lr = NULL, pr = NULL;
  FIXTURE(kvcommEndpointRegisterArena(c->h.endpoint, mine, kvcommAccessReadWrite, &lr));
  FIXTURE(kvcommEndpointRegisterArena(c->peerEndpoint, theirs, kvcommAccessReadWrite, &pr));
  kvcommRemoteMemory_t remote = connectTo(c, c->h.endpoint, pr);
  int64_t rids[2] = {2, 5}, lids[2] = {7, -1}, bad[1] = {kArenaBlocks};
  kvcommDeviceTransferBatch batch = {rids, lids, 2};
  if (push)
    SUCCEEDS(kvcommEndpointWriteDevice(c->h.endpoint, lr, remote, &batch, NULL));
  else
    SUCCEEDS(kvcommEndpointReadDevice(c->h.endpoint, lr, remote, &batch, NULL));
  unsigned char* got = (unsigned char*)malloc(kBytes);
  FIXTURE(kvcommArenaRead(push ? theirs : mine, 0, got, kBytes));
  unsigned char* want = push ? b : a;
  const unsigned char* from = push ? a : b;
  size_t to = (size_t)(push ? rids[0] : lids[0]), src = (size_t)(push ? lids[0] : rids[0]);
  memcpy(want + to * kArenaBlockBytes, from + src * kArenaBlockBytes, kArenaBlockBytes);
  EXPECT(memcmp(got, want, kBytes) == 0);
  /* Host registrations check the ids before copying: a bad one is refused, nothing copied. */
  kvcommDeviceTransferBatch wrong = {bad, lids, 1};
  if (push)
    REFUSED("", kvcommEndpointWriteDevice(c->h.endpoint, lr, remote, &wrong, NULL));
  else
    REFUSED("", kvcommEndpointReadDevice(c->h.endpoint, lr, remote, &wrong, NULL));
  FIXTURE(kvcommArenaRead(push ? theirs : mine, 0, got, kBytes));
  EXPECT(memcmp(got, want, kBytes) == 0);
  kvcommDeviceError err;
  SUCCEEDS(kvcommEndpointPollError(c->h.endpoint, lr, remote, &err));
  EXPECT(err.kind == kvcommDeviceErrorNone);
  FIXTURE(kvcommEndpointDisconnect(c->h.endpoint, remote));
  FIXTURE(kvcommRemoteMemoryDestroy(remote));
  FIXTURE(kvcommEndpointUnregister(c->h.endpoint, lr, -1));
  FIXTURE(kvcommEndpointUnregister(c->peerEndpoint, pr, -1));
  FIXTURE(kvcommRegistrationDestroy(lr));
  FIXTURE(kvcommRegistrationDestroy(pr));
  FIXTURE(kvcommArenaDestroy(mine));
  FIXTURE(kvcommArenaDestroy(theirs));
  free(a);
  free(b);
  free(got);
}

static void propsEndpointReadDevice(Ctx* c) {
  deviceArgs(c, kvcommEndpointReadDevice);
  deviceValid(c, 0);
}
static void propsEndpointWriteDevice(Ctx* c) {
  deviceArgs(c, kvcommEndpointWriteDevice);
  deviceValid(c, 1);
}

static kvcommResult_t callEndpointPollError(Ctx* c, const Handles* h) {
  return kvcommEndpointPollError(h->endpoint, h->registration, h->remote, SCRATCH(kvcommDeviceError*));
}
static void propsEndpointPollError(Ctx* c) {
  REFUSED("error is NULL", kvcommEndpointPollError(c->h.endpoint, c->h.registration, c->h.remote, NULL));
  kvcommDeviceError e;
  SUCCEEDS(kvcommEndpointPollError(c->h.endpoint, c->h.registration, c->h.remote, &e));
  EXPECT(e.kind == kvcommDeviceErrorNone);
}

/* ---- notifications -------------------------------------------------------------------------------------------- */

static kvcommResult_t callEndpointNotify(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommEndpointNotify(h->endpoint, h->remote, "x", 1);
}
/* Takes exactly the notification `want` (`bytes` bytes) from the peer endpoint. */
static void takeOne(Ctx* c, const void* want, size_t bytes) {
  static char got[KVCOMM_MAX_NOTIFICATION_BYTES];
  kvcommNotification n;
  int received = 0;
  SUCCEEDS(kvcommEndpointNextNotification(c->peerEndpoint, 30000, &n, got, sizeof(got), &received));
  EXPECT(received == 1 && n.messageBytes == bytes && (bytes == 0 || memcmp(got, want, bytes) == 0));
  SUCCEEDS(kvcommEndpointNextNotification(c->peerEndpoint, 0, &n, got, sizeof(got), &received));
  EXPECT(received == 0);
}
static void propsEndpointNotify(Ctx* c) {
  static char big[KVCOMM_MAX_NOTIFICATION_BYTES + 1];
  for (size_t i = 0; i < sizeof(big); ++i) big[i] = (char)(i * 7);
  REFUSED("message is NULL", kvcommEndpointNotify(c->h.endpoint, c->h.remote, NULL, 1));
  FOR_VALUES(x) {
    if (x <= KVCOMM_MAX_NOTIFICATION_BYTES) {
      SUCCEEDS(kvcommEndpointNotify(c->h.endpoint, c->h.remote, big, (size_t)x));
      takeOne(c, big, (size_t)x);
    } else {
      REFUSED("KVCOMM_MAX_NOTIFICATION_BYTES", kvcommEndpointNotify(c->h.endpoint, c->h.remote, big, (size_t)x));
    }
  }
  SUCCEEDS(kvcommEndpointNotify(c->h.endpoint, c->h.remote, NULL, 0));
  takeOne(c, NULL, 0);
  /* A full inbox: kvcommBusy, and the sender may go on once it is emptied. */
  kvcommEndpointOptions o;
  kvcommEndpointOptionsInit(&o);
  o.tcpAddress = "127.0.0.1:0";
  o.maxQueuedNotifications = 1;
  kvcommEndpoint_t small = NULL;
  SUCCEEDS(kvcommEndpointCreate(&o, &small));
  kvcommRegistration_t reg = registerOn(c, small, c->epPeer);
  kvcommRemoteMemory_t r = connectTo(c, c->h.endpoint, reg);
  SUCCEEDS(kvcommEndpointNotify(c->h.endpoint, r, "1", 1));
  REFUSED_AS(kvcommBusy, "", kvcommEndpointNotify(c->h.endpoint, r, "2", 1));
  kvcommNotification n;
  char text[4];
  int received = 0;
  SUCCEEDS(kvcommEndpointNextNotification(small, 0, &n, text, sizeof(text), &received));
  EXPECT(received == 1 && text[0] == '1');
  SUCCEEDS(kvcommEndpointNotify(c->h.endpoint, r, "3", 1));
  SUCCEEDS(kvcommEndpointDisconnect(c->h.endpoint, r));
  SUCCEEDS(kvcommRemoteMemoryDestroy(r));
  SUCCEEDS(kvcommRegistrationDestroy(reg));
  SUCCEEDS(kvcommEndpointDestroy(small));
}

static kvcommResult_t callEndpointNextNotification(Ctx* c, const Handles* h) {
  return kvcommEndpointNextNotification(h->endpoint, 0, SCRATCH(kvcommNotification*), NULL, 0, SCRATCH(int*) + 512);
}
static void propsEndpointNextNotification(Ctx* c) {
  kvcommEndpoint_t e = c->peerEndpoint;
  REFUSED("info is NULL", kvcommEndpointNextNotification(e, 0, NULL, NULL, 0, SCRATCH(int*)));
  REFUSED("received is NULL", kvcommEndpointNextNotification(e, 0, SCRATCH(kvcommNotification*), NULL, 0, NULL));
  REFUSED("message is NULL", kvcommEndpointNextNotification(e, 0, SCRATCH(kvcommNotification*), NULL, 4,
                                                            SCRATCH(int*) + 512));
  /* Any timeout with one waiting returns it at once; with none, a short one returns none. */
  FOR_VALUES(x) {
    SUCCEEDS(kvcommEndpointNotify(c->h.endpoint, c->h.remote, "abcdef", 6));
    kvcommNotification n;
    char text[8];
    int received = 0;
    /* Too small first: announced, not taken. */
    SUCCEEDS(kvcommEndpointNextNotification(e, (int64_t)x, &n, text, 5, &received));
    EXPECT(received == 1 && n.messageBytes == 6);
    SUCCEEDS(kvcommEndpointNextNotification(e, (int64_t)x, &n, text, 6, &received));
    EXPECT(received == 1 && memcmp(text, "abcdef", 6) == 0);
  }
  kvcommNotification n;
  int received = 1;
  SUCCEEDS(kvcommEndpointNextNotification(e, 10, &n, NULL, 0, &received));
  EXPECT(received == 0);
}

/* ---- KV contents and converted reads ------------------------------------------------------------------------- */

/* The fixture's registrations described: 4 tokens per block, one head of 128 two-byte elements (1024 bytes). */
static kvcommKvContents epContents(void) {
  kvcommKvContents k;
  memset(&k, 0, sizeof(k));
  k.elementBytes = 2;
  k.headDim = 128;
  k.tokensPerBlock = 4;
  k.numHeads = 1;
  k.order = kvcommKvOrderTokensHeadsDim;
  return k;
}

static void propsConvertedReadOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommConvertedReadOptionsInit(NULL));
  kvcommConvertedReadOptions o;
  memset(&o, 0x5a, sizeof(o));
  SUCCEEDS(kvcommConvertedReadOptionsInit(&o));
  EXPECT(o.preferredSource == 0 && o.via == kvcommTransferViaAuto && o.timeoutMs == -1);
}

static void propsKvCheckContents(Ctx* c) {
  kvcommKvRegion r = {0, kEpBlockBytes, 0, kEpBlocks};
  kvcommKvContents k = epContents();
  SUCCEEDS(kvcommKvCheckContents(&r, 1, &k, 1));
  REFUSED("regions is NULL", kvcommKvCheckContents(NULL, 1, &k, 1));
  REFUSED("contents is NULL", kvcommKvCheckContents(&r, 1, NULL, 1));
  REFUSED("the description has", kvcommKvCheckContents(&r, 1, &k, 0));
  REFUSED("KVCOMM_MAX_FETCH_REGIONS", kvcommKvCheckContents(&r, 1, &k, (size_t)KVCOMM_MAX_FETCH_REGIONS + 1));
  FOR_VALUES(x) {
    kvcommKvContents b = epContents();
    b.headDim = (uint32_t)x;  /* only 128 fills the 1024-byte blocks */
    OUTCOME((uint32_t)x == 128, "region 0", kvcommKvCheckContents(&r, 1, &b, 1));
    b = epContents();
    b.replicated = asInt(x);  /* 0 or 1; one head held whole either way */
    OUTCOME(b.replicated == 0 || b.replicated == 1, "replicated", kvcommKvCheckContents(&r, 1, &b, 1));
  }
  unsigned ev[24];
  size_t n = enumValues(2, ev);
  for (size_t i = 0; i < n; ++i) {
    kvcommKvContents b = epContents();
    b.order = (kvcommKvOrder_t)ev[i];
    OUTCOME(i < 2, "order", kvcommKvCheckContents(&r, 1, &b, 1));
  }
}

static void propsKvWhyNotConvertible(Ctx* c) {
  kvcommKvContents a = epContents(), b = epContents();
  char text[256];
  size_t needed = 0;
  SUCCEEDS(kvcommKvWhyNotConvertible(&a, 1, &b, 1, text, sizeof(text), &needed));
  EXPECT(needed == 1 && text[0] == 0);
  b.order = kvcommKvOrderHeadsTokensDim;
  b.tokensPerBlock = 16;  /* order and block size convert */
  SUCCEEDS(kvcommKvWhyNotConvertible(&a, 1, &b, 1, text, sizeof(text), &needed));
  EXPECT(needed == 1);
  b.headDim = 64;  /* head dims do not */
  SUCCEEDS(kvcommKvWhyNotConvertible(&a, 1, &b, 1, text, sizeof(text), &needed));
  EXPECT(needed > 1 && strlen(text) + 1 == needed);
  REFUSED("src is NULL", kvcommKvWhyNotConvertible(NULL, 1, &b, 1, text, sizeof(text), &needed));
  REFUSED("dst is NULL", kvcommKvWhyNotConvertible(&a, 1, NULL, 1, text, sizeof(text), &needed));
  REFUSED("KVCOMM_MAX_FETCH_REGIONS",
          kvcommKvWhyNotConvertible(&a, (size_t)KVCOMM_MAX_FETCH_REGIONS + 1, &b, 1, SCRATCH(char*), 8, NULL));
}

static kvcommResult_t callEndpointRegisterDescribed(Ctx* c, const Handles* h) {
  kvcommKvRegion r;
  epRegion(&r);
  kvcommKvContents k = epContents();
  return kvcommEndpointRegisterDescribed(h->endpoint, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0,
                                         kvcommAccessReadWrite, &k, 1, SCRATCH(kvcommRegistration_t*));
}
static void propsEndpointRegisterDescribed(Ctx* c) {
  kvcommEndpoint_t e = c->h.endpoint;
  kvcommKvRegion r;
  epRegion(&r);
  kvcommKvContents k = epContents();
  kvcommRegistration_t* out = SCRATCH(kvcommRegistration_t*);
  REFUSED("numContents is 0", kvcommEndpointRegisterDescribed(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0,
                                                              kvcommAccessReadWrite, &k, 0, out));
  REFUSED("contents is NULL", kvcommEndpointRegisterDescribed(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0,
                                                              kvcommAccessReadWrite, NULL, 1, out));
  REFUSED("registration is NULL", kvcommEndpointRegisterDescribed(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &r,
                                                                  1, 0, kvcommAccessReadWrite, &k, 1, NULL));
  FOR_VALUES(x) {
    kvcommKvContents b = epContents();
    b.tokensPerBlock = (uint32_t)x; /* only 4 fills the 1024-byte blocks */
    prepare(c);
    kvcommRegistration_t reg = NULL;
    kvcommResult_t r_ = kvcommEndpointRegisterDescribed(e, c->epLocal, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0,
                                                        kvcommAccessReadWrite, &b, 1,
                                                        (uint32_t)x == 4 ? &reg : out);
    if ((uint32_t)x == 4) {
      succeeded(c, "kvcommEndpointRegisterDescribed(tokensPerBlock 4)", r_, __LINE__);
      SUCCEEDS(kvcommEndpointUnregister(e, reg, 30000));
      SUCCEEDS(kvcommRegistrationDestroy(reg));
    } else {
      refused(c, "kvcommEndpointRegisterDescribed(tokensPerBlock)", r_, kvcommInvalidArgument, "region 0", __LINE__);
    }
  }
  /* Valid: a peer reads the contents from the metadata, and a converted read needs none passed. */
  kvcommRegistration_t reg = NULL;
  SUCCEEDS(kvcommEndpointRegisterDescribed(c->peerEndpoint, c->epPeer, kEpBytes, kvcommMemoryHost, -1, &r, 1, 0,
                                           kvcommAccessReadWrite, &k, 1, &reg));
  kvcommRemoteMemory_t remote = connectTo(c, e, reg);
  kvcommKvContents got[2];
  size_t count = 0;
  SUCCEEDS(kvcommRemoteMemoryContents(remote, got, 2, &count));
  EXPECT(count == 1 && memcmp(&got[0], &k, sizeof(k)) == 0);
  int64_t s[2] = {0, 1}, d[2] = {8, 9};
  kvcommConvertedSource src = {remote, NULL, 0};
  kvcommKvTokenRange t = {s, 2, d, 2, 0, 8};
  unsigned char* before = (unsigned char*)malloc(kEpBytes);
  unsigned char* want = (unsigned char*)malloc(kEpBytes);
  memcpy(before, c->epLocal, kEpBytes);
  readOracle(before, c->epPeer, s, d, 2, want);
  kvcommConvertedReadResult res;
  SUCCEEDS(kvcommEndpointReadConverted(e, c->h.registration, &k, 1, &src, 1, &t, NULL, &res));
  EXPECT(res.state == kvcommFetchDone && memcmp(c->epLocal, want, kEpBytes) == 0);
  memcpy(c->epLocal, before, kEpBytes);
  free(want);
  free(before);
  SUCCEEDS(kvcommEndpointDisconnect(e, remote));
  SUCCEEDS(kvcommRemoteMemoryDestroy(remote));
  SUCCEEDS(kvcommEndpointUnregister(c->peerEndpoint, reg, 30000));
  SUCCEEDS(kvcommRegistrationDestroy(reg));
}

static kvcommResult_t callRemoteMemoryContents(Ctx* c, const Handles* h) {
  return kvcommRemoteMemoryContents(h->remote, SCRATCH(kvcommKvContents*), 4, SCRATCH(size_t*) + 64);
}
static void propsRemoteMemoryContents(Ctx* c) {
  kvcommRemoteMemory_t r = c->h.remote;
  REFUSED("count is NULL", kvcommRemoteMemoryContents(r, SCRATCH(kvcommKvContents*), 4, NULL));
  REFUSED("contents is NULL", kvcommRemoteMemoryContents(r, NULL, 4, SCRATCH(size_t*)));
  size_t count = 7;
  SUCCEEDS(kvcommRemoteMemoryContents(r, NULL, 0, &count));
  EXPECT(count == 0); /* the fixture's peer registered no contents */
}

static kvcommResult_t callEndpointReadConverted(Ctx* c, const Handles* h) {
  kvcommKvContents k = epContents();
  int64_t s[1] = {0}, d[1] = {8};
  kvcommConvertedSource src = {h->remote, &k, 1};
  kvcommKvTokenRange t = {s, 1, d, 1, 0, 4};
  return kvcommEndpointReadConverted(h->endpoint, h->registration, &k, 1, &src, 1, &t, NULL,
                                     SCRATCH(kvcommConvertedReadResult*));
}
static void propsEndpointReadConverted(Ctx* c) {
  kvcommKvContents k = epContents();
  kvcommConvertedSource src = {c->h.remote, &k, 1};
  int64_t s[8], d[8];
  for (int i = 0; i < 8; ++i) {
    s[i] = i;
    d[i] = 8 + i;
  }
  kvcommKvTokenRange t = {s, 8, d, 8, 0, 32};
  kvcommEndpoint_t e = c->h.endpoint;
  kvcommRegistration_t l = c->h.registration;
  kvcommConvertedReadResult* out = SCRATCH(kvcommConvertedReadResult*);
  REFUSED("tokens is NULL", kvcommEndpointReadConverted(e, l, &k, 1, &src, 1, NULL, NULL, out));
  REFUSED("result is NULL", kvcommEndpointReadConverted(e, l, &k, 1, &src, 1, &t, NULL, NULL));
  REFUSED("sources is NULL", kvcommEndpointReadConverted(e, l, &k, 1, NULL, 1, &t, NULL, out));
  REFUSED("localContents is NULL", kvcommEndpointReadConverted(e, l, NULL, 1, &src, 1, &t, NULL, out));
  REFUSED("KVCOMM_MAX_RANKS", kvcommEndpointReadConverted(e, l, &k, 1, &src, (size_t)KVCOMM_MAX_RANKS + 1, &t, NULL, out));
  kvcommConvertedSource bad = {c->h.remote, NULL, 1};
  REFUSED("sources[0].contents is NULL", kvcommEndpointReadConverted(e, l, &k, 1, &bad, 1, &t, NULL, out));
  kvcommKvTokenRange nt = t;
  nt.srcBlocks = NULL;
  REFUSED("srcBlocks", kvcommEndpointReadConverted(e, l, &k, 1, &src, 1, &nt, NULL, out));
  nt = t;
  nt.numDstBlocks = (size_t)KVCOMM_MAX_FETCH_PAIRS + 1;
  REFUSED("KVCOMM_MAX_FETCH_PAIRS", kvcommEndpointReadConverted(e, l, &k, 1, &src, 1, &nt, NULL, out));
  FOR_VALUES(x) {  /* tokens past the tables, out-of-range ids, a bad via: refused before anything moves */
    kvcommKvTokenRange r = t;
    r.numTokens = x;
    if (x > 32) REFUSED("", kvcommEndpointReadConverted(e, l, &k, 1, &src, 1, &r, NULL, out));
    int64_t ids[8];
    memcpy(ids, s, sizeof(ids));
    ids[3] = (int64_t)x;
    r = t;
    r.srcBlocks = ids;
    if ((int64_t)x < -1 || (int64_t)x >= kEpBlocks)
      REFUSED("srcBlocks[3]", kvcommEndpointReadConverted(e, l, &k, 1, &src, 1, &r, NULL, out));
  }
  unsigned ev[24];
  size_t n = enumValues(4, ev);
  for (size_t i = 4; i < n; ++i) {
    kvcommConvertedReadOptions o;
    kvcommConvertedReadOptionsInit(&o);
    o.via = (kvcommTransferVia_t)ev[i];
    REFUSED("via", kvcommEndpointReadConverted(e, l, &k, 1, &src, 1, &t, &o, out));
  }
  kvcommKvContents other = k;
  other.headDim = 64;
  other.numHeads = 2;  /* 4 x 2 x 64 x 2 = 1024 bytes: describes the layout, but does not convert */
  kvcommConvertedSource mismatched = {c->h.remote, &other, 1};
  REFUSED("cannot be converted", kvcommEndpointReadConverted(e, l, &k, 1, &mismatched, 1, &t, NULL, out));
  /* Valid: peer blocks [0, 8) into local blocks [8, 16), the other local blocks untouched. */
  unsigned char* before = (unsigned char*)malloc(kEpBytes);
  unsigned char* want = (unsigned char*)malloc(kEpBytes);
  memcpy(before, c->epLocal, kEpBytes);
  readOracle(before, c->epPeer, s, d, 8, want);
  kvcommConvertedReadResult res;
  SUCCEEDS(kvcommEndpointReadConverted(e, l, &k, 1, &src, 1, &t, NULL, &res));
  EXPECT(res.state == kvcommFetchDone && res.bytesConverted == 8 * kEpBlockBytes && res.sourcesRead == 1);
  EXPECT(memcmp(c->epLocal, want, kEpBytes) == 0);
  memcpy(c->epLocal, before, kEpBytes);
  free(want);
  free(before);
}

/* ---- converted fetches among the group's members (the fixture buffer, the fetch layout, every member alike) ---- */

static kvcommResult_t callConvertedFetcherCreate(Ctx* c, const Handles* h) {
  kvcommKvContents k = fetchContents();
  return kvcommConvertedFetcherCreate(h->buffer, &c->region, 1, &k, 1, "127.0.0.1:0",
                                      SCRATCH(kvcommConvertedFetcher_t*));
}
/* Collective: every member's arguments are agreed on, so one member's bad list, count or description fails every
 * member naming it. headDim through every value (only 32 fills the 256-byte blocks). */
static void propsConvertedFetcherCreate(Ctx* c) {
  kvcommBuffer_t b = c->h.buffer;
  kvcommKvContents k = fetchContents();
  kvcommConvertedFetcher_t* out = SCRATCH(kvcommConvertedFetcher_t*);
  REFUSED("regions is NULL", kvcommConvertedFetcherCreate(b, NULL, 1, &k, 1, "127.0.0.1:0", out));
  REFUSED("contents is NULL", kvcommConvertedFetcherCreate(b, &c->region, 1, NULL, 1, "127.0.0.1:0", out));
  REFUSED("the description has", kvcommConvertedFetcherCreate(b, &c->region, 1, &k, 0, "127.0.0.1:0", out));
  REFUSED("fetcher is NULL", kvcommConvertedFetcherCreate(b, &c->region, 1, &k, 1, "127.0.0.1:0", NULL));
  REFUSED("KVCOMM_MAX_FETCH_REGIONS", kvcommConvertedFetcherCreate(b, &c->region, (size_t)KVCOMM_MAX_FETCH_REGIONS + 1,
                                                                   &k, 1, "127.0.0.1:0", out));
  REFUSED("has no :port", kvcommConvertedFetcherCreate(b, &c->region, 1, &k, 1, "not an address", out));
  kvcommKvContents one = k; /* one member's description does not describe its layout: every member refused */
  if (c->rank == 1) one.headDim = 31;
  REFUSED("rank 1", kvcommConvertedFetcherCreate(b, &c->region, 1, &one, 1, "127.0.0.1:0", out));
  FOR_VALUES(x) {
    kvcommKvContents d = k;
    d.headDim = (uint32_t)x;
    kvcommConvertedFetcher_t f = NULL;
    prepare(c);
    kvcommResult_t r_ =
        kvcommConvertedFetcherCreate(b, &c->region, 1, &d, 1, "127.0.0.1:0", (uint32_t)x == 32 ? &f : out);
    if ((uint32_t)x == 32) {
      succeeded(c, "kvcommConvertedFetcherCreate(headDim 32)", r_, __LINE__);
      SUCCEEDS(kvcommConvertedFetcherDestroy(f));
    } else {
      refused(c, "kvcommConvertedFetcherCreate(headDim)", r_, kvcommInvalidArgument, "region 0", __LINE__);
    }
  }
}

/* The next member's source blocks [0, 8) (its bytes: the fixture pattern) into this member's blocks [200, 208). */
static void fetchOracle(int src, unsigned char* want) {
  for (size_t i = 0; i < 8 * (size_t)kFetchBlockBytes; ++i) {
    size_t at = kFetchOffset + i;
    want[200 * (size_t)kFetchBlockBytes + i] = (unsigned char)(at * 13 + (size_t)src * 101);
  }
}

static kvcommResult_t callConvertedFetch(Ctx* c, const Handles* h) {
  int64_t s[2] = {0, 1}, d[2] = {200, 201};
  kvcommKvTokenRange t = {s, 2, d, 2, 0, 8};
  int src = (c->rank + 1) % c->size;
  return kvcommConvertedFetch(h->converted, &src, 1, &t, NULL, SCRATCH(kvcommConvertedReadResult*));
}
static void propsConvertedFetch(Ctx* c) {
  kvcommConvertedFetcher_t f = c->h.converted;
  int64_t s[8], d[8];
  for (int i = 0; i < 8; ++i) {
    s[i] = i;
    d[i] = 200 + i;
  }
  kvcommKvTokenRange t = {s, 8, d, 8, 0, 32};
  const int next = (c->rank + 1) % c->size;
  kvcommConvertedReadResult* out = SCRATCH(kvcommConvertedReadResult*);
  REFUSED("tokens is NULL", kvcommConvertedFetch(f, &next, 1, NULL, NULL, out));
  REFUSED("result is NULL", kvcommConvertedFetch(f, &next, 1, &t, NULL, NULL));
  REFUSED("sources is NULL", kvcommConvertedFetch(f, NULL, 1, &t, NULL, out));
  REFUSED("no sources", kvcommConvertedFetch(f, &next, 0, &t, NULL, out));
  REFUSED("KVCOMM_MAX_RANKS", kvcommConvertedFetch(f, &next, (size_t)KVCOMM_MAX_RANKS + 1, &t, NULL, out));
  REFUSED("this member", kvcommConvertedFetch(f, &c->rank, 1, &t, NULL, out));
  int twice[2] = {next, next};
  REFUSED("repeats member", kvcommConvertedFetch(f, twice, 2, &t, NULL, out));
  kvcommKvTokenRange nt = t;
  nt.dstBlocks = NULL;
  REFUSED("dstBlocks", kvcommConvertedFetch(f, &next, 1, &nt, NULL, out));
  unsigned ev[24];
  size_t n = enumValues(4, ev);
  for (size_t i = 4; i < n; ++i) {
    kvcommConvertedReadOptions o;
    kvcommConvertedReadOptionsInit(&o);
    o.via = (kvcommTransferVia_t)ev[i];
    REFUSED("via", kvcommConvertedFetch(f, &next, 1, &t, &o, out));
  }
  FOR_VALUES(x) { /* a source rank outside the group, tokens past the tables, ids outside the layout */
    int r = asInt(x);
    if (r < 0 || r >= c->size) REFUSED("outside the group", kvcommConvertedFetch(f, &r, 1, &t, NULL, out));
    kvcommKvTokenRange q = t;
    q.numTokens = x;
    if (x > 32) REFUSED("", kvcommConvertedFetch(f, &next, 1, &q, NULL, out));
    int64_t ids[8];
    memcpy(ids, s, sizeof(ids));
    ids[3] = (int64_t)x;
    q = t;
    q.srcBlocks = ids;
    if ((int64_t)x < -1 || (int64_t)x >= kFetchBlocks)
      REFUSED("srcBlocks[3]", kvcommConvertedFetch(f, &next, 1, &q, NULL, out));
  }
  /* Valid: the next member's blocks [0, 8) into [200, 208), every byte of the buffer checked, then put back. */
  sync(c);
  unsigned char* local = NULL;
  SUCCEEDS(kvcommBufferLocal(c->h.buffer, (void**)&local));
  unsigned char* before = (unsigned char*)malloc(kMapped);
  unsigned char* want = (unsigned char*)malloc(kMapped);
  memcpy(before, local, kMapped);
  memcpy(want, local, kMapped);
  fetchOracle(next, want + kFetchOffset);
  kvcommConvertedReadResult res;
  SUCCEEDS(kvcommConvertedFetch(f, &next, 1, &t, NULL, &res));
  EXPECT(res.state == kvcommFetchDone && res.bytesConverted == 8 * (uint64_t)kFetchBlockBytes && res.sourcesRead == 1);
  EXPECT(memcmp(local, want, kMapped) == 0);
  memcpy(local, before, kMapped);
  free(want);
  free(before);
  sync(c);
}

static kvcommResult_t callConvertedFetcherDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommConvertedFetcherDestroy(h->converted);
}
static void propsConvertedFetcherDestroy(Ctx* c) {
  SUCCEEDS(kvcommConvertedFetcherDestroy(NULL));
  kvcommKvContents k = fetchContents();
  kvcommConvertedFetcher_t f = NULL;
  SUCCEEDS(kvcommConvertedFetcherCreate(c->h.buffer, &c->region, 1, &k, 1, "127.0.0.1:0", &f));
  SUCCEEDS(kvcommConvertedFetcherDestroy(f));
  REFUSED("not a live kvcommConvertedFetcher_t", kvcommConvertedFetcherDestroy(f));
}

#define ENTRY(Name, handles) \
  { "kvcomm" #Name, (handles), 0, call##Name, props##Name }
#define PURE(Name) \
  { "kvcomm" #Name, 0, 0, NULL, props##Name }

const Entry g_endpointEntries[] = {
    ENTRY(ConvertedFetcherCreate, kHBuffer),
    {"kvcommConvertedFetch", kHConverted, 1, callConvertedFetch, propsConvertedFetch},
    ENTRY(ConvertedFetcherDestroy, kHConverted),
    PURE(EndpointOptionsInit),
    PURE(TransferOptionsInit),
    PURE(EndpointCreate),
    ENTRY(EndpointDestroy, kHEndpoint),
    ENTRY(EndpointClose, kHEndpoint),
    ENTRY(EndpointId, kHEndpoint),
    ENTRY(EndpointAddress, kHEndpoint),
    ENTRY(EndpointRegister, kHEndpoint),
    ENTRY(EndpointRegisterArena, kHEndpoint | kHArena),
    ENTRY(EndpointRegisterBuffer, kHEndpoint | kHBuffer),
    ENTRY(EndpointUnregister, kHEndpoint | kHRegistration),
    ENTRY(RegistrationDestroy, kHRegistration),
    ENTRY(RegistrationMetadata, kHRegistration),
    ENTRY(RegistrationRevoke, kHRegistration),
    ENTRY(RegistrationId, kHRegistration),
    ENTRY(RegistrationGeneration, kHRegistration),
    ENTRY(RegistrationRegistered, kHRegistration),
    ENTRY(EndpointConnect, kHEndpoint),
    ENTRY(EndpointDisconnect, kHEndpoint | kHRemote),
    ENTRY(RemoteMemoryDestroy, kHRemote),
    ENTRY(RemoteMemoryId, kHRemote),
    ENTRY(RemoteMemoryLayout, kHRemote),
    ENTRY(RemoteMemoryKind, kHRemote),
    ENTRY(RemoteMemoryPeerName, kHRemote),
    ENTRY(EndpointRead, kHEndpoint | kHRegistration | kHRemote),
    ENTRY(EndpointWrite, kHEndpoint | kHRegistration | kHRemote),
    ENTRY(TransferTest, kHTransfer),
    ENTRY(TransferWait, kHTransfer),
    ENTRY(TransferFailedBlocks, kHTransfer),
    ENTRY(TransferError, kHTransfer),
    ENTRY(TransferGetInfo, kHTransfer),
    ENTRY(TransferTransport, kHTransfer),
    ENTRY(TransferDestroy, kHTransfer),
    ENTRY(EndpointReadDevice, kHEndpoint | kHRegistration | kHRemote),
    ENTRY(EndpointWriteDevice, kHEndpoint | kHRegistration | kHRemote),
    ENTRY(EndpointPollError, kHEndpoint | kHRegistration | kHRemote),
    ENTRY(EndpointNotify, kHEndpoint | kHRemote),
    ENTRY(EndpointNextNotification, kHEndpoint),
    PURE(ConvertedReadOptionsInit),
    PURE(KvCheckContents),
    PURE(KvWhyNotConvertible),
    ENTRY(EndpointRegisterDescribed, kHEndpoint),
    ENTRY(RemoteMemoryContents, kHRemote),
    ENTRY(EndpointReadConverted, kHEndpoint | kHRegistration | kHRemote),
};
const size_t g_numEndpointEntries = sizeof(g_endpointEntries) / sizeof(g_endpointEntries[0]);
