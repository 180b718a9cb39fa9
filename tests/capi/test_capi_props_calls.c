/* The property table of the C ABI: one entry per function of kvcomm.h (test_capi_props.c checks the table against
 * the header). `call` makes one call with the handles it is given (the handle phase substitutes NULL, destroyed,
 * foreign and other-type handles); `props` sweeps the other arguments through the generated values: every integer
 * argument through g_values (INT64_MIN to UINT64_MAX, the neighbours of every enum and KVCOMM_MAX_* limit), every
 * enum through its enumerators and neighbours, every pointer through NULL, then valid calls whose results are
 * checked. The oracle of each argument is the documented contract: a value it admits must succeed, any other must be
 * refused with kvcommInvalidArgument naming the argument, writing nothing. Sizes that describe the caller's memory are
 * swept through the values that fit the test's arrays and those whose products overflow. */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi_props.h"
#include "kvcomm/kvcomm.h"

/* Runs the statement once per generated value, as `x` (uint64_t); `continue` goes to the next value. */
#define FOR_VALUES(x)                                  \
  for (size_t i_##x = 0; i_##x < g_numValues; ++i_##x) \
    for (uint64_t x = g_values[i_##x], once_##x = 1; once_##x; once_##x = 0)

/* A call that returns a string rather than a result. */
static void counted(Ctx* c) {
  ++c->cases;
}

/* ---- errors, version ------------------------------------------------------------------------------------------ */

static void propsGetErrorString(Ctx* c) {
  unsigned vals[24];
  size_t n = enumValues(kvcommNumResults, vals);
  for (size_t i = 0; i < n; ++i) {
    counted(c);
    const char* name = kvcommGetErrorString((kvcommResult_t)vals[i]);
    EXPECT(name != NULL);
    if (name) EXPECT((i < kvcommNumResults) == (strcmp(name, "Unknown") != 0));
  }
  EXPECT(strcmp(kvcommGetErrorString(kvcommBusy), "Busy") == 0);
}

static void propsGetLastError(Ctx* c) {
  counted(c);
  kvcommGetVersion(NULL);
  const char* e = kvcommGetLastError();
  EXPECT(e != NULL && strstr(e, "kvcommGetVersion") != NULL);
  int v = 0;
  SUCCEEDS(kvcommGetVersion(&v)); /* success leaves it */
  EXPECT(kvcommGetLastError() == e && strstr(e, "kvcommGetVersion") != NULL);
}

static void propsGetVersion(Ctx* c) {
  REFUSED("version is NULL", kvcommGetVersion(NULL));
  int v = 0;
  SUCCEEDS(kvcommGetVersion(&v));
  EXPECT(v == KVCOMM_VERSION);
}

/* ---- bootstrap ------------------------------------------------------------------------------------------------ */

static void propsGetUniqueId(Ctx* c) {
  REFUSED("id is NULL", kvcommGetUniqueId(NULL, NULL));
  REFUSED("kvcomm-no-such-if", kvcommGetUniqueId(SCRATCH(kvcommUniqueId*), "kvcomm-no-such-if"));
}

static void propsUniqueIdToString(Ctx* c) {
  char text[KVCOMM_UNIQUE_ID_STRING_LEN + 64];
  FOR_VALUES(x) {
    size_t bytes = (size_t)x;
    if (bytes > KVCOMM_UNIQUE_ID_STRING_LEN) {
      memset(text, 'x', sizeof(text));
      SUCCEEDS(kvcommUniqueIdToString(&c->id, text, bytes));
      EXPECT(strlen(text) == KVCOMM_UNIQUE_ID_STRING_LEN && text[KVCOMM_UNIQUE_ID_STRING_LEN + 1] == 'x');
    } else {
      REFUSED("textBytes", kvcommUniqueIdToString(&c->id, SCRATCH(char*), bytes));
    }
  }
  REFUSED("id is NULL", kvcommUniqueIdToString(NULL, SCRATCH(char*), sizeof(text)));
  REFUSED("text is NULL", kvcommUniqueIdToString(&c->id, NULL, sizeof(text)));
}

static void propsUniqueIdFromString(Ctx* c) {
  char text[KVCOMM_UNIQUE_ID_STRING_LEN + 2];
  SUCCEEDS(kvcommUniqueIdToString(&c->id, text, sizeof(text)));
  kvcommUniqueId id;
  SUCCEEDS(kvcommUniqueIdFromString(text, &id));
  EXPECT(memcmp(&id, &c->id, sizeof(id)) == 0);
  REFUSED("text is NULL", kvcommUniqueIdFromString(NULL, SCRATCH(kvcommUniqueId*)));
  REFUSED("id is NULL", kvcommUniqueIdFromString(text, NULL));
  REFUSED("hex", kvcommUniqueIdFromString("zz", SCRATCH(kvcommUniqueId*)));
  text[5] = 'g';
  REFUSED("hex", kvcommUniqueIdFromString(text, SCRATCH(kvcommUniqueId*)));
  REFUSED("hex", kvcommUniqueIdFromString("", SCRATCH(kvcommUniqueId*)));
}

static int s_calls = 0;
static int countingAllgather(const void* send, void* recv, size_t bytes, void* user) {
  (void)send;
  (void)recv;
  (void)bytes;
  (void)user;
  ++s_calls;
  return 3;
}

/* rank and size through every value: a value outside [0, size) or a size outside [1, KVCOMM_MAX_RANKS] is refused
 * before the bootstrap sizes anything or calls back; a valid pair reaches the callback (which fails here). */
static void propsCommInitCallback(Ctx* c) {
  FOR_VALUES(x) {
    int v = asInt(x);
    s_calls = 0;
    REFUSED("rank", kvcommCommInitCallback(SCRATCH(kvcommComm_t*), v < 0 || v >= c->size ? v : -1, c->size,
                                           countingAllgather, NULL));
    EXPECT(s_calls == 0);
    if (v <= 0 || v > KVCOMM_MAX_RANKS) {
      REFUSED("size", kvcommCommInitCallback(SCRATCH(kvcommComm_t*), 0, v, countingAllgather, NULL));
      EXPECT(s_calls == 0);
    } else if (v <= 64 || v == KVCOMM_MAX_RANKS) {
      REFUSED_AS(kvcommRemoteError, "returned 3",
                 kvcommCommInitCallback(SCRATCH(kvcommComm_t*), v - 1, v, countingAllgather, NULL));
      EXPECT(s_calls == 1);
    }
  }
  REFUSED("comm is NULL", kvcommCommInitCallback(NULL, 0, 1, countingAllgather, NULL));
  REFUSED("allgather is NULL", kvcommCommInitCallback(SCRATCH(kvcommComm_t*), 0, 1, NULL, NULL));
}

static void propsCommInitTcp(Ctx* c) {
  FOR_VALUES(x) {
    int v = asInt(x);
    if (v < 0 || v >= c->size)
      REFUSED("rank", kvcommCommInitTcp(SCRATCH(kvcommComm_t*), &c->id, v, c->size, (int64_t)x));
    if (v <= 0 || v > KVCOMM_MAX_RANKS)
      REFUSED("size", kvcommCommInitTcp(SCRATCH(kvcommComm_t*), &c->id, 0, v, (int64_t)x));
  }
  REFUSED("comm is NULL", kvcommCommInitTcp(NULL, &c->id, c->rank, c->size, 1000));
  REFUSED("id is NULL", kvcommCommInitTcp(SCRATCH(kvcommComm_t*), NULL, c->rank, c->size, 1000));
  /* Valid: the world over TCP from the fixture's id (rank 0 created it). */
  kvcommComm_t tcp = NULL;
  SUCCEEDS(kvcommCommInitTcp(&tcp, &c->id, c->rank, c->size, 60000));
  int r = -1;
  SUCCEEDS(kvcommCommRank(tcp, &r));
  EXPECT(r == c->rank);
  SUCCEEDS(kvcommCommDestroy(tcp));
}

/* ---- communicator --------------------------------------------------------------------------------------------- */

static kvcommResult_t callCommDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommCommDestroy(h->comm);
}
static void propsCommDestroy(Ctx* c) {
  SUCCEEDS(kvcommCommDestroy(NULL));
  kvcommComm_t s = NULL;
  SUCCEEDS(kvcommCommSplit(c->h.comm, 0, c->rank, &s));
  SUCCEEDS(kvcommCommDestroy(s));
  REFUSED("not a live kvcommComm_t", kvcommCommDestroy(s)); /* twice: refused, nothing freed again */
}

static kvcommResult_t callCommRank(Ctx* c, const Handles* h) {
  return kvcommCommRank(h->comm, SCRATCH(int*));
}
static void propsCommRank(Ctx* c) {
  REFUSED("rank is NULL", kvcommCommRank(c->h.comm, NULL));
  int r = -1;
  SUCCEEDS(kvcommCommRank(c->h.comm, &r));
  EXPECT(r == c->rank);
}

static kvcommResult_t callCommSize(Ctx* c, const Handles* h) {
  return kvcommCommSize(h->comm, SCRATCH(int*));
}
static void propsCommSize(Ctx* c) {
  REFUSED("size is NULL", kvcommCommSize(c->h.comm, NULL));
  int s = -1;
  SUCCEEDS(kvcommCommSize(c->h.comm, &s));
  EXPECT(s == c->size);
}

static kvcommResult_t callCommWorldRank(Ctx* c, const Handles* h) {
  return kvcommCommWorldRank(h->comm, 0, SCRATCH(int*));
}
static void propsCommWorldRank(Ctx* c) {
  FOR_VALUES(x) {
    int v = asInt(x), w = -1;
    OUTCOME(v >= 0 && v < c->size, "rank",
            kvcommCommWorldRank(c->h.comm, v, v >= 0 && v < c->size ? &w : SCRATCH(int*)));
    if (v >= 0 && v < c->size) EXPECT(w == v);
  }
  REFUSED("worldRank is NULL", kvcommCommWorldRank(c->h.comm, 0, NULL));
}

static kvcommResult_t callCommId(Ctx* c, const Handles* h) {
  return kvcommCommId(h->comm, SCRATCH(uint64_t*));
}
static void propsCommId(Ctx* c) {
  REFUSED("id is NULL", kvcommCommId(c->h.comm, NULL));
  uint64_t a = 0, b = 0;
  SUCCEEDS(kvcommCommId(c->h.comm, &a));
  uint64_t all[64];
  MPI_Allgather(&a, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (int r = 0; r < c->size; ++r) EXPECT(all[r] == a);
  kvcommComm_t s = NULL;
  SUCCEEDS(kvcommCommSplit(c->h.comm, 0, c->rank, &s));
  SUCCEEDS(kvcommCommId(s, &b));
  EXPECT(a != b);
  SUCCEEDS(kvcommCommDestroy(s));
}

static kvcommResult_t callCommAbort(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommCommAbort(h->comm);
}
static void propsCommAbort(Ctx* c) {
  kvcommComm_t s = NULL;
  SUCCEEDS(kvcommCommSplit(c->h.comm, 0, c->rank, &s));
  SUCCEEDS(kvcommCommAbort(s));
  SUCCEEDS(kvcommCommAbort(s)); /* any number of times */
  REFUSED_AS(kvcommAborted, "aborted", kvcommCommBarrier(s));
  SUCCEEDS(kvcommCommDestroy(s));
  SUCCEEDS(kvcommCommBarrier(c->h.comm)); /* the parent is not aborted */
}

static kvcommResult_t callCommHealth(Ctx* c, const Handles* h) {
  return kvcommCommHealth(h->comm, SCRATCH(int*), SCRATCH(int*) + 1);
}
static void propsCommHealth(Ctx* c) {
  int healthy = -1, failed = -2;
  SUCCEEDS(kvcommCommHealth(c->h.comm, NULL, NULL)); /* either pointer may be NULL */
  SUCCEEDS(kvcommCommHealth(c->h.comm, &healthy, &failed));
  EXPECT(healthy == 1 && failed == -1);
}

static kvcommResult_t callCommSplit(Ctx* c, const Handles* h) {
  return kvcommCommSplit(h->comm, 0, 0, SCRATCH(kvcommComm_t*));
}
/* Any color and key are valid (a negative color takes part and gets NULL); every rank passes the same values. */
static void propsCommSplit(Ctx* c) {
  size_t k = 0;
  FOR_VALUES(x) {
    if (k++ % 3) continue; /* a third of the values: every split is a collective */
    int v = asInt(x);
    kvcommComm_t s = (kvcommComm_t)c->scratch;
    SUCCEEDS(kvcommCommSplit(c->h.comm, v, v, &s));
    EXPECT((v < 0) == (s == NULL));
    if (s) {
      int n = 0;
      SUCCEEDS(kvcommCommSize(s, &n));
      EXPECT(n == c->size);
    }
    SUCCEEDS(kvcommCommDestroy(s));
  }
  REFUSED("out is NULL", kvcommCommSplit(c->h.comm, 0, 0, NULL));
}

static kvcommResult_t callCommAllgather(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommCommAllgather(h->comm, NULL, 0);
}
/* bytesPerRank: up to the test's array, a valid in-place allgather; a size times the group overflowing: refused. */
static void propsCommAllgather(Ctx* c) {
  uint8_t data[64 * 256];
  FOR_VALUES(x) {
    size_t b = (size_t)x;
    if (b <= 256) {
      for (int r = 0; r < c->size; ++r) memset(data + (size_t)r * b, r == c->rank ? c->rank + 1 : 0, b);
      SUCCEEDS(kvcommCommAllgather(c->h.comm, data, b));
      for (size_t i = 0; i < (size_t)c->size * b; ++i) EXPECT(data[i] == (uint8_t)(i / b + 1));
    } else if (b > SIZE_MAX / (size_t)c->size) {
      REFUSED("bytesPerRank", kvcommCommAllgather(c->h.comm, c->scratch, b));
    }
  }
  REFUSED("data is NULL", kvcommCommAllgather(c->h.comm, NULL, 1));
}

static kvcommResult_t callCommBarrier(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommCommBarrier(h->comm);
}
static void propsCommBarrier(Ctx* c) {
  SUCCEEDS(kvcommCommBarrier(c->h.comm));
}

static kvcommResult_t callCommSend(Ctx* c, const Handles* h) {
  return kvcommCommSend(h->comm, c->scratch, 0, 0, 1);
}
static kvcommResult_t callCommRecv(Ctx* c, const Handles* h) {
  return kvcommCommRecv(h->comm, c->scratch, 0, 0, 1);
}
/* peer outside [0, size) and tag >= 2^31 are refused (any bytes); a valid ring exchange succeeds. */
static void sendRecvProps(Ctx* c, int send) {
  FOR_VALUES(x) {
    int v = asInt(x);
    uint32_t tag = (uint32_t)x;
    if (v < 0 || v >= c->size) {
      if (send)
        REFUSED("peer", kvcommCommSend(c->h.comm, c->scratch, 8, v, 1));
      else
        REFUSED("peer", kvcommCommRecv(c->h.comm, c->scratch, 8, v, 1));
    }
    if (tag >= 0x80000000u) {
      if (send)
        REFUSED("tag", kvcommCommSend(c->h.comm, c->scratch, 8, 0, tag));
      else
        REFUSED("tag", kvcommCommRecv(c->h.comm, c->scratch, 8, 0, tag));
    }
  }
  if (send)
    REFUSED("data is NULL", kvcommCommSend(c->h.comm, NULL, 8, 0, 1));
  else
    REFUSED("data is NULL", kvcommCommRecv(c->h.comm, NULL, 8, 0, 1));
  int token = c->rank * 7 + (send ? 1 : 2), got = -1;
  SUCCEEDS(kvcommCommSend(c->h.comm, &token, sizeof(token), (c->rank + 1) % c->size, 9));
  SUCCEEDS(kvcommCommRecv(c->h.comm, &got, sizeof(got), (c->rank + c->size - 1) % c->size, 9));
  EXPECT(got == ((c->rank + c->size - 1) % c->size) * 7 + (send ? 1 : 2));
}
static void propsCommSend(Ctx* c) {
  sendRecvProps(c, 1);
}
static void propsCommRecv(Ctx* c) {
  sendRecvProps(c, 0);
}

static kvcommResult_t callCommNumHosts(Ctx* c, const Handles* h) {
  return kvcommCommNumHosts(h->comm, SCRATCH(int*));
}
static void propsCommNumHosts(Ctx* c) {
  REFUSED("numHosts is NULL", kvcommCommNumHosts(c->h.comm, NULL));
  int n = 0;
  SUCCEEDS(kvcommCommNumHosts(c->h.comm, &n));
  EXPECT(n == 1);
}

static kvcommResult_t callCommMember(Ctx* c, const Handles* h) {
  return kvcommCommMember(h->comm, 0, SCRATCH(kvcommMemberInfo*));
}
static void propsCommMember(Ctx* c) {
  FOR_VALUES(x) {
    int v = asInt(x);
    if (v >= 0 && v < c->size) {
      kvcommMemberInfo m;
      SUCCEEDS(kvcommCommMember(c->h.comm, v, &m));
      EXPECT(m.rank == v && m.localSize == c->size && m.hostname[0] != '\0');
    } else {
      REFUSED("rank", kvcommCommMember(c->h.comm, v, SCRATCH(kvcommMemberInfo*)));
    }
  }
  REFUSED("info is NULL", kvcommCommMember(c->h.comm, 0, NULL));
}

/* Two member arguments: each through every value with the other valid. */
static void pairProps(Ctx* c, int canAccess) {
  FOR_VALUES(x) {
    int v = asInt(x), out = -1;
    int ok = v >= 0 && v < c->size;
    if (canAccess) {
      OUTCOME(ok, "rank", kvcommCommCanAccessPeer(c->h.comm, v, 0, ok ? &out : SCRATCH(int*)));
      OUTCOME(ok, "rank", kvcommCommCanAccessPeer(c->h.comm, 0, v, ok ? &out : SCRATCH(int*)));
    } else {
      OUTCOME(ok, "rank", kvcommCommSameHost(c->h.comm, v, 0, ok ? &out : SCRATCH(int*)));
      OUTCOME(ok, "rank", kvcommCommSameHost(c->h.comm, 0, v, ok ? &out : SCRATCH(int*)));
      if (ok) EXPECT(out == 1);
    }
  }
  if (canAccess)
    REFUSED("canAccess is NULL", kvcommCommCanAccessPeer(c->h.comm, 0, 0, NULL));
  else
    REFUSED("same is NULL", kvcommCommSameHost(c->h.comm, 0, 0, NULL));
}
static kvcommResult_t callCommSameHost(Ctx* c, const Handles* h) {
  return kvcommCommSameHost(h->comm, 0, 0, SCRATCH(int*));
}
static void propsCommSameHost(Ctx* c) {
  pairProps(c, 0);
}
static kvcommResult_t callCommCanAccessPeer(Ctx* c, const Handles* h) {
  return kvcommCommCanAccessPeer(h->comm, 0, 0, SCRATCH(int*));
}
static void propsCommCanAccessPeer(Ctx* c) {
  pairProps(c, 1);
}

/* Strings by the list pattern: NULL text with textBytes > 0 refused; any textBytes up to the test's array is copied
 * truncated and NUL-terminated, *needed the full length + 1. */
typedef kvcommResult_t (*StringFn)(Ctx* c, char* text, size_t textBytes, size_t* needed);
static void stringProps(Ctx* c, StringFn fn) {
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
static kvcommResult_t topology(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommCommTopologyString(c->h.comm, text, bytes, needed);
}
static kvcommResult_t callCommTopologyString(Ctx* c, const Handles* h) {
  return kvcommCommTopologyString(h->comm, SCRATCH(char*), 16, SCRATCH(size_t*) + 64);
}
static void propsCommTopologyString(Ctx* c) {
  stringProps(c, topology);
}

/* ---- layout --------------------------------------------------------------------------------------------------- */

static int* field(kvcommParallelSpec* s, int k) {
  return k == 0 ? &s->tp : k == 1 ? &s->pcp : k == 2 ? &s->pp : &s->dp;
}

static kvcommResult_t callParallelGroupsCreate(Ctx* c, const Handles* h) {
  kvcommParallelSpec spec = {c->size, 1, 1, 1};
  return kvcommParallelGroupsCreate(h->comm, &spec, SCRATCH(kvcommParallelGroups_t*));
}
/* Each size through every value, the others 1: valid (a collective create) exactly when it is the world size. */
static void propsParallelGroupsCreate(Ctx* c) {
  for (int k = 0; k < 4; ++k) FOR_VALUES(x) {
      kvcommParallelSpec spec = {1, 1, 1, 1};
      *field(&spec, k) = asInt(x);
      if (asInt(x) == c->size) {
        kvcommParallelGroups_t l = NULL;
        SUCCEEDS(kvcommParallelGroupsCreate(c->h.comm, &spec, &l));
        SUCCEEDS(kvcommParallelGroupsDestroy(l));
      } else {
        REFUSED("", kvcommParallelGroupsCreate(c->h.comm, &spec, SCRATCH(kvcommParallelGroups_t*)));
      }
    }
  kvcommParallelSpec spec = {c->size, 1, 1, 1};
  REFUSED("spec is NULL", kvcommParallelGroupsCreate(c->h.comm, NULL, SCRATCH(kvcommParallelGroups_t*)));
  REFUSED("layout is NULL", kvcommParallelGroupsCreate(c->h.comm, &spec, NULL));
}

static kvcommResult_t callParallelGroupsDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommParallelGroupsDestroy(h->layout);
}
static void propsParallelGroupsDestroy(Ctx* c) {
  SUCCEEDS(kvcommParallelGroupsDestroy(NULL));
  kvcommParallelSpec spec = {c->size, 1, 1, 1};
  kvcommParallelGroups_t l = NULL;
  SUCCEEDS(kvcommParallelGroupsCreate(c->h.comm, &spec, &l));
  SUCCEEDS(kvcommParallelGroupsDestroy(l));
  REFUSED("not a live kvcommParallelGroups_t", kvcommParallelGroupsDestroy(l));
}

static kvcommResult_t callParallelGroupsComm(Ctx* c, const Handles* h) {
  return kvcommParallelGroupsComm(h->layout, kvcommAxisTP, SCRATCH(kvcommComm_t*));
}
static void propsParallelGroupsComm(Ctx* c) {
  unsigned vals[24];
  size_t n = enumValues(4, vals);
  for (size_t i = 0; i < n; ++i) {
    if (i < 4) {
      kvcommComm_t g = NULL;
      int s = 0;
      SUCCEEDS(kvcommParallelGroupsComm(c->h.layout, (kvcommAxis_t)vals[i], &g));
      SUCCEEDS(kvcommCommSize(g, &s));
      EXPECT(s == (i == 0 ? c->size : 1));
      SUCCEEDS(kvcommCommDestroy(g));
    } else {
      char word[48];
      snprintf(word, sizeof(word), "axis %u", vals[i]);
      REFUSED(word, kvcommParallelGroupsComm(c->h.layout, (kvcommAxis_t)vals[i], SCRATCH(kvcommComm_t*)));
      REFUSED("kvcommAxis_t", kvcommParallelGroupsComm(c->h.layout, (kvcommAxis_t)vals[i], SCRATCH(kvcommComm_t*)));
    }
  }
  REFUSED("comm is NULL", kvcommParallelGroupsComm(c->h.layout, kvcommAxisTP, NULL));
}

static kvcommResult_t callParallelGroupsGetSpec(Ctx* c, const Handles* h) {
  return kvcommParallelGroupsGetSpec(h->layout, SCRATCH(kvcommParallelSpec*));
}
static void propsParallelGroupsGetSpec(Ctx* c) {
  REFUSED("spec is NULL", kvcommParallelGroupsGetSpec(c->h.layout, NULL));
  kvcommParallelSpec s;
  SUCCEEDS(kvcommParallelGroupsGetSpec(c->h.layout, &s));
  EXPECT(s.tp == c->size && s.pcp == 1 && s.pp == 1 && s.dp == 1);
}

static kvcommResult_t callParallelGroupsGetCoord(Ctx* c, const Handles* h) {
  return kvcommParallelGroupsGetCoord(h->layout, SCRATCH(kvcommParallelCoord*));
}
static void propsParallelGroupsGetCoord(Ctx* c) {
  REFUSED("coord is NULL", kvcommParallelGroupsGetCoord(c->h.layout, NULL));
  kvcommParallelCoord k;
  SUCCEEDS(kvcommParallelGroupsGetCoord(c->h.layout, &k));
  EXPECT(k.tp == c->rank && k.pcp == 0 && k.pp == 0 && k.dp == 0);
}

/* A spec is valid when every size is positive and their product is at most INT_MAX. */
static int specValid(const kvcommParallelSpec* s) {
  if (s->tp <= 0 || s->pcp <= 0 || s->pp <= 0 || s->dp <= 0) return 0;
  long long p = (long long)s->tp * s->pcp;
  if (p > INT_MAX) return 0;
  p *= s->pp;
  if (p > INT_MAX) return 0;
  p *= s->dp;
  return p <= INT_MAX;
}

static void propsParallelCoordOf(Ctx* c) {
  for (int k = 0; k < 4; ++k) FOR_VALUES(x) {
      kvcommParallelSpec spec = {2, 3, 1, 2};
      *field(&spec, k) = asInt(x);
      kvcommParallelCoord out;
      int ok = specValid(&spec);
      OUTCOME(ok, "", kvcommParallelCoordOf(&spec, 1, ok ? &out : SCRATCH(kvcommParallelCoord*)));
      if (ok) EXPECT(out.tp == (spec.tp > 1 ? 1 : 0));
    }
  kvcommParallelSpec spec = {2, 3, 1, 2};
  FOR_VALUES(x) {
    int r = asInt(x), ok = r >= 0 && r < 12;
    kvcommParallelCoord out;
    OUTCOME(ok, "rank", kvcommParallelCoordOf(&spec, r, ok ? &out : SCRATCH(kvcommParallelCoord*)));
    if (ok) EXPECT(((out.dp * 1 + out.pp) * 3 + out.pcp) * 2 + out.tp == r);
  }
  REFUSED("spec is NULL", kvcommParallelCoordOf(NULL, 0, SCRATCH(kvcommParallelCoord*)));
  REFUSED("coord is NULL", kvcommParallelCoordOf(&spec, 0, NULL));
}

static void propsParallelRankOf(Ctx* c) {
  kvcommParallelSpec spec = {2, 3, 1, 2};
  for (int k = 0; k < 4; ++k) FOR_VALUES(x) {
      kvcommParallelCoord co = {1, 2, 0, 1};
      int v = asInt(x);
      int* f = k == 0 ? &co.tp : k == 1 ? &co.pcp : k == 2 ? &co.pp : &co.dp;
      *f = v;
      int limit = k == 0 ? 2 : k == 1 ? 3 : k == 2 ? 1 : 2, ok = v >= 0 && v < limit, r = -1;
      OUTCOME(ok, "outside the spec", kvcommParallelRankOf(&spec, &co, ok ? &r : SCRATCH(int*)));
      if (ok) EXPECT(r == ((co.dp * 1 + co.pp) * 3 + co.pcp) * 2 + co.tp);
    }
  kvcommParallelCoord co = {0, 0, 0, 0};
  REFUSED("spec is NULL", kvcommParallelRankOf(NULL, &co, SCRATCH(int*)));
  REFUSED("coord is NULL", kvcommParallelRankOf(&spec, NULL, SCRATCH(int*)));
  REFUSED("rank is NULL", kvcommParallelRankOf(&spec, &co, NULL));
}

/* Axis through its enumerators and neighbours, capacity through every value (at most the group is written; a
 * group of 2^30 members is counted, not materialised), the rank through every value. */
static void propsParallelGroupOf(Ctx* c) {
  kvcommParallelSpec spec = {2, 3, 1, 2};
  unsigned vals[24];
  size_t n = enumValues(4, vals);
  for (size_t i = 0; i < n; ++i) {
    int ranks[4], count = -1;
    if (i < 4) {
      SUCCEEDS(kvcommParallelGroupOf(&spec, 7, (kvcommAxis_t)vals[i], ranks, 4, &count));
      EXPECT(count == (i == 0 ? 2 : i == 1 ? 3 : i == 2 ? 1 : 2));
    } else {
      REFUSED("axis", kvcommParallelGroupOf(&spec, 7, (kvcommAxis_t)vals[i], SCRATCH(int*), 4, SCRATCH(int*) + 64));
    }
  }
  FOR_VALUES(x) {
    int cap = asInt(x), ranks[4] = {-9, -9, -9, -9}, count = -1;
    if (cap < 0) {
      REFUSED("capacity", kvcommParallelGroupOf(&spec, 7, kvcommAxisPCP, SCRATCH(int*), cap, SCRATCH(int*) + 64));
    } else {
      SUCCEEDS(kvcommParallelGroupOf(&spec, 7, kvcommAxisPCP, ranks, cap, &count));
      /* rank 7 = (tp 1, pcp 0, dp 1): its PCP group is 7, 9, 11 */
      EXPECT(count == 3 && (cap == 0 || ranks[0] == 7) && (cap < 3 || (ranks[1] == 9 && ranks[2] == 11)) &&
             ranks[3] == -9 && (cap > 0 || ranks[0] == -9));
    }
    int r = asInt(x);
    if (r < 0 || r >= 12)
      REFUSED("rank", kvcommParallelGroupOf(&spec, r, kvcommAxisTP, SCRATCH(int*), 4, SCRATCH(int*) + 64));
  }
  kvcommParallelSpec huge = {1 << 30, 1, 1, 1};
  int ranks[4], count = 0;
  SUCCEEDS(kvcommParallelGroupOf(&huge, 5, kvcommAxisTP, ranks, 4, &count));
  EXPECT(count == 1 << 30 && ranks[3] == 3);
  REFUSED("spec is NULL", kvcommParallelGroupOf(NULL, 0, kvcommAxisTP, SCRATCH(int*), 4, SCRATCH(int*) + 64));
  REFUSED("count is NULL", kvcommParallelGroupOf(&spec, 0, kvcommAxisTP, SCRATCH(int*), 4, NULL));
  REFUSED("ranks is NULL", kvcommParallelGroupOf(&spec, 0, kvcommAxisTP, NULL, 4, SCRATCH(int*)));
}

/* ---- symmetric memory ----------------------------------------------------------------------------------------- */

static kvcommResult_t callBufferCreate(Ctx* c, const Handles* h) {
  return kvcommBufferCreate(h->comm, 65536, 65536, kvcommMemoryHost, SCRATCH(kvcommBuffer_t*));
}
/* kind through its enumerators and neighbours (Auto is host memory here, Cuda is Unsupported without a GPU), the
 * sizes through every value (collective creates; capacity past what the reservation can take is refused or, past
 * the machine's address space, a SystemError). */
static void propsBufferCreate(Ctx* c) {
  unsigned vals[24];
  size_t n = enumValues(3, vals);
  for (size_t i = 0; i < n; ++i) {
    kvcommBuffer_t b = NULL;
    kvcommMemoryKind_t k = (kvcommMemoryKind_t)vals[i];
    if (vals[i] == kvcommMemoryHost || vals[i] == kvcommMemoryAuto) {
      SUCCEEDS(kvcommBufferCreate(c->h.comm, 65536, 4096, k, &b));
      kvcommMemoryKind_t got = kvcommMemoryAuto;
      SUCCEEDS(kvcommBufferKind(b, &got));
      EXPECT(got == kvcommMemoryHost);
      SUCCEEDS(kvcommBufferDestroy(b));
    } else if (vals[i] == kvcommMemoryCuda) {
      prepare(c);
      kvcommResult_t r = kvcommBufferCreate(c->h.comm, 65536, 4096, k, &b);
      if (r == kvcommSuccess)
        SUCCEEDS(kvcommBufferDestroy(b));
      else
        refused(c, "kvcommBufferCreate(kvcommMemoryCuda) without a GPU", r,
                r == kvcommCudaError ? r : kvcommUnsupported, "", __LINE__);
    } else {
      char word[48];
      snprintf(word, sizeof(word), "kind %u", vals[i]);
      REFUSED(word, kvcommBufferCreate(c->h.comm, 65536, 4096, k, SCRATCH(kvcommBuffer_t*)));
    }
  }
  FOR_VALUES(x) {
    size_t cap = (size_t)x;
    kvcommBuffer_t b = NULL;
    if (cap == 0) {
      REFUSED("capacity", kvcommBufferCreate(c->h.comm, cap, 0, kvcommMemoryHost, SCRATCH(kvcommBuffer_t*)));
    } else if (cap <= ((size_t)1 << 40)) {
      SUCCEEDS(kvcommBufferCreate(c->h.comm, cap, 0, kvcommMemoryHost, &b));
      SUCCEEDS(kvcommBufferDestroy(b));
    } else {
      prepare(c);
      kvcommResult_t r = kvcommBufferCreate(c->h.comm, cap, 0, kvcommMemoryHost, SCRATCH(kvcommBuffer_t*));
      refused(c, "kvcommBufferCreate(capacity past the address space)", r,
              r == kvcommSystemError ? kvcommSystemError : kvcommInvalidArgument, "", __LINE__);
    }
    size_t init = (size_t)x;
    if (init > 65536)
      REFUSED("initialBytes", kvcommBufferCreate(c->h.comm, 65536, init, kvcommMemoryHost, SCRATCH(kvcommBuffer_t*)));
  }
  REFUSED("buffer is NULL", kvcommBufferCreate(c->h.comm, 65536, 0, kvcommMemoryHost, NULL));
}

static kvcommResult_t callBufferAdopt(Ctx* c, const Handles* h) {
  return kvcommBufferAdopt(h->comm, c->scratch, 65536, kvcommMemoryHost, SCRATCH(kvcommBuffer_t*));
}
static void propsBufferAdopt(Ctx* c) {
  unsigned vals[24];
  size_t n = enumValues(3, vals);
  for (size_t i = 3; i < n; ++i)
    REFUSED("kvcommMemoryKind_t",
            kvcommBufferAdopt(c->h.comm, c->scratch, 65536, (kvcommMemoryKind_t)vals[i], SCRATCH(kvcommBuffer_t*)));
  REFUSED("buffer is NULL", kvcommBufferAdopt(c->h.comm, c->scratch, 65536, kvcommMemoryHost, NULL));
  REFUSED("base", kvcommBufferAdopt(c->h.comm, NULL, 65536, kvcommMemoryHost, SCRATCH(kvcommBuffer_t*)));
  FOR_VALUES(x) {
    size_t bytes = (size_t)x;
    if (bytes % 4096 != 0 || bytes == 0)
      REFUSED("reservedBytes",
              kvcommBufferAdopt(c->h.comm, c->scratch + 1, bytes, kvcommMemoryHost, SCRATCH(kvcommBuffer_t*)));
  }
}

static kvcommResult_t callBufferDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommBufferDestroy(h->buffer);
}
static void propsBufferDestroy(Ctx* c) {
  SUCCEEDS(kvcommBufferDestroy(NULL));
  kvcommBuffer_t b = NULL;
  SUCCEEDS(kvcommBufferCreate(c->h.comm, 65536, 4096, kvcommMemoryHost, &b));
  SUCCEEDS(kvcommBufferDestroy(b));
  REFUSED("not a live kvcommBuffer_t", kvcommBufferDestroy(b));
}

static kvcommResult_t callBufferGrow(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommBufferGrow(h->buffer, 0);
}
/* newBytes through every value on a buffer of its own: up to the capacity it grows (never shrinks), past it is
 * refused. */
static void propsBufferGrow(Ctx* c) {
  kvcommBuffer_t b = NULL;
  SUCCEEDS(kvcommBufferCreate(c->h.comm, 1 << 20, 4096, kvcommMemoryHost, &b));
  FOR_VALUES(x) {
    size_t bytes = (size_t)x, mapped = 0;
    if (bytes <= (1 << 20)) {
      SUCCEEDS(kvcommBufferGrow(b, bytes));
      SUCCEEDS(kvcommBufferMappedBytes(b, &mapped));
      EXPECT(mapped >= bytes);
    } else {
      REFUSED("", kvcommBufferGrow(b, bytes));
    }
  }
  SUCCEEDS(kvcommBufferDestroy(b));
}

/* numRanges through every value: past KVCOMM_MAX_BUFFER_RANGES refused before anything is read; up to what the
 * test's array holds, refused because the fixture's buffer is a created one (commit/release are for adopted
 * buffers). Collective. */
static void rangesProps(Ctx* c, int commit) {
  c->watchBuffer = 1;
  kvcommRange* r = SCRATCH(kvcommRange*);
  FOR_VALUES(x) {
    size_t n = (size_t)x;
    const char* word = n > KVCOMM_MAX_BUFFER_RANGES ? "KVCOMM_MAX_BUFFER_RANGES" : "adopted";
    if (n > KVCOMM_MAX_BUFFER_RANGES || n <= kScratchBytes / sizeof(kvcommRange)) {
      if (commit)
        REFUSED(word, kvcommBufferCommit(c->h.buffer, r, n));
      else
        REFUSED(word, kvcommBufferRelease(c->h.buffer, r, n));
    }
  }
  if (commit)
    REFUSED("ranges is NULL", kvcommBufferCommit(c->h.buffer, NULL, 1));
  else
    REFUSED("ranges is NULL", kvcommBufferRelease(c->h.buffer, NULL, 1));
  c->watchBuffer = 0;
}
static kvcommResult_t callBufferCommit(Ctx* c, const Handles* h) {
  return kvcommBufferCommit(h->buffer, SCRATCH(kvcommRange*), 0);
}
static void propsBufferCommit(Ctx* c) {
  rangesProps(c, 1);
}
static kvcommResult_t callBufferRelease(Ctx* c, const Handles* h) {
  return kvcommBufferRelease(h->buffer, SCRATCH(kvcommRange*), 0);
}
static void propsBufferRelease(Ctx* c) {
  rangesProps(c, 0);
}

static kvcommResult_t callBufferClose(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommBufferClose(h->buffer);
}
static void propsBufferClose(Ctx* c) {
  kvcommBuffer_t b = NULL;
  SUCCEEDS(kvcommBufferCreate(c->h.comm, 65536, 4096, kvcommMemoryHost, &b));
  SUCCEEDS(kvcommBufferClose(b));
  SUCCEEDS(kvcommBufferClose(b)); /* idempotent */
  SUCCEEDS(kvcommBufferDestroy(b));
}

/* Getters of the buffer: a NULL output is refused, a valid call returns the fixture's value. */
#define BUFFER_GETTER(Name, Type, outName, checkExpr)                   \
  static kvcommResult_t callBuffer##Name(Ctx* c, const Handles* h) {    \
    return kvcommBuffer##Name(h->buffer, SCRATCH(Type*));               \
  }                                                                     \
  static void propsBuffer##Name(Ctx* c) {                               \
    REFUSED(outName " is NULL", kvcommBuffer##Name(c->h.buffer, NULL)); \
    Type v;                                                             \
    memset(&v, 0, sizeof(v));                                           \
    SUCCEEDS(kvcommBuffer##Name(c->h.buffer, &v));                      \
    EXPECT(checkExpr);                                                  \
  }
BUFFER_GETTER(Local, void*, "ptr", v != NULL)
BUFFER_GETTER(Rank, int, "rank", v == c->rank)
BUFFER_GETTER(Size, int, "size", v == c->size)
BUFFER_GETTER(Capacity, size_t, "bytes", v == kCapacity)
BUFFER_GETTER(MappedBytes, size_t, "bytes", v == kMapped)
BUFFER_GETTER(Generation, uint64_t, "generation", v >= 1)
BUFFER_GETTER(Granularity, size_t, "bytes", v > 0 && (v & (v - 1)) == 0)
BUFFER_GETTER(Kind, kvcommMemoryKind_t, "kind", v == kvcommMemoryHost)
BUFFER_GETTER(Adopted, int, "adopted", v == 0)
BUFFER_GETTER(PeerTable, const uint64_t*, "table", v != NULL && v[c->rank] != 0)
BUFFER_GETTER(BackedBitmap, const uint64_t*, "bitmap", v != NULL && (v[0] & 1u))

static void peerProps(Ctx* c, int mappedFn) {
  FOR_VALUES(x) {
    int r = asInt(x), ok = r >= 0 && r < c->size;
    void* p = NULL;
    int m = -1;
    if (mappedFn) {
      OUTCOME(ok, "rank", kvcommBufferIsMapped(c->h.buffer, r, ok ? &m : SCRATCH(int*)));
      if (ok) EXPECT(m == 1);
    } else {
      OUTCOME(ok, "rank", kvcommBufferPeer(c->h.buffer, r, ok ? &p : SCRATCH(void**)));
      if (ok) EXPECT(p != NULL);
    }
  }
  if (mappedFn)
    REFUSED("mapped is NULL", kvcommBufferIsMapped(c->h.buffer, 0, NULL));
  else
    REFUSED("ptr is NULL", kvcommBufferPeer(c->h.buffer, 0, NULL));
}
static kvcommResult_t callBufferPeer(Ctx* c, const Handles* h) {
  return kvcommBufferPeer(h->buffer, 0, SCRATCH(void**));
}
static void propsBufferPeer(Ctx* c) {
  peerProps(c, 0);
}
static kvcommResult_t callBufferIsMapped(Ctx* c, const Handles* h) {
  return kvcommBufferIsMapped(h->buffer, 0, SCRATCH(int*));
}
static void propsBufferIsMapped(Ctx* c) {
  peerProps(c, 1);
}

static kvcommResult_t callBufferIsBacked(Ctx* c, const Handles* h) {
  return kvcommBufferIsBacked(h->buffer, 0, 1, SCRATCH(int*));
}
/* Any offset and length are valid (overflow-safe): backed exactly when [offset, offset + bytes) lies in the mapped
 * prefix. */
static void propsBufferIsBacked(Ctx* c) {
  FOR_VALUES(x) {
    int backed = -1;
    SUCCEEDS(kvcommBufferIsBacked(c->h.buffer, (size_t)x, 1, &backed));
    EXPECT(backed == ((size_t)x < kMapped));
    SUCCEEDS(kvcommBufferIsBacked(c->h.buffer, 16, (size_t)x, &backed));
    EXPECT(backed == ((size_t)x == 0 || (size_t)x <= kMapped - 16));
  }
  REFUSED("backed is NULL", kvcommBufferIsBacked(c->h.buffer, 0, 1, NULL));
}

static kvcommResult_t callBufferBackedRanges(Ctx* c, const Handles* h) {
  return kvcommBufferBackedRanges(h->buffer, SCRATCH(kvcommRange*), 4, SCRATCH(size_t*) + 256);
}
static void propsBufferBackedRanges(Ctx* c) {
  FOR_VALUES(x) {
    kvcommRange r[2];
    size_t count = 0;
    memset(r, 0xEE, sizeof(r));
    SUCCEEDS(kvcommBufferBackedRanges(c->h.buffer, (size_t)x ? r : NULL, (size_t)x, &count));
    EXPECT(count == 1 && ((size_t)x == 0 || (r[0].offset == 0 && r[0].bytes == kMapped)) && r[1].offset != 0);
    if ((size_t)x > 0)
      REFUSED("ranges is NULL", kvcommBufferBackedRanges(c->h.buffer, NULL, (size_t)x, SCRATCH(size_t*)));
  }
  REFUSED("count is NULL", kvcommBufferBackedRanges(c->h.buffer, SCRATCH(kvcommRange*), 1, NULL));
}

static kvcommResult_t handleType(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommBufferHandleType(c->h.buffer, text, bytes, needed);
}
static kvcommResult_t callBufferHandleType(Ctx* c, const Handles* h) {
  return kvcommBufferHandleType(h->buffer, SCRATCH(char*), 16, SCRATCH(size_t*) + 64);
}
static void propsBufferHandleType(Ctx* c) {
  stringProps(c, handleType);
  char t[16];
  SUCCEEDS(kvcommBufferHandleType(c->h.buffer, t, sizeof(t), NULL));
  EXPECT(strcmp(t, "memfd") == 0);
}

static kvcommResult_t callBufferComm(Ctx* c, const Handles* h) {
  return kvcommBufferComm(h->buffer, SCRATCH(kvcommComm_t*));
}
static void propsBufferComm(Ctx* c) {
  REFUSED("comm is NULL", kvcommBufferComm(c->h.buffer, NULL));
  kvcommComm_t g = NULL;
  int s = 0;
  SUCCEEDS(kvcommBufferComm(c->h.buffer, &g));
  SUCCEEDS(kvcommCommSize(g, &s));
  EXPECT(s == c->size);
  SUCCEEDS(kvcommCommDestroy(g));
}

/* ---- publish -------------------------------------------------------------------------------------------------- */

static void propsCacheTensorInit(Ctx* c) {
  REFUSED("tensor is NULL", kvcommCacheTensorInit(NULL));
  kvcommCacheTensor t;
  memset(&t, 0xEE, sizeof(t));
  SUCCEEDS(kvcommCacheTensorInit(&t));
  EXPECT(t.blockSize == 1 && t.src == NULL && t.rowBytes == 0 && t.limitBytes == 0);
}

static void propsPublisherOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommPublisherOptionsInit(NULL));
  kvcommPublisherOptions o;
  SUCCEEDS(kvcommPublisherOptionsInit(&o));
  EXPECT(o.lanes == 2 && o.barrierTimeoutMs < 0);
}

static kvcommResult_t callPublisherCreate(Ctx* c, const Handles* h) {
  return kvcommPublisherCreate(h->buffer, NULL, SCRATCH(kvcommPublisher_t*));
}
/* lanes through every value (valid 1..KVCOMM_MAX_BARRIER_LANES), the staging sizes through every value (a product
 * past the address space is refused), the timeout through every value (any is valid). Collective. */
static void propsPublisherCreate(Ctx* c) {
  kvcommPublisherOptions o;
  SUCCEEDS(kvcommPublisherOptionsInit(&o));
  size_t k = 0;
  FOR_VALUES(x) {
    kvcommPublisherOptions t = o;
    kvcommPublisher_t p = NULL;
    t.lanes = asInt(x);
    if (t.lanes >= 1 && t.lanes <= KVCOMM_MAX_BARRIER_LANES) {
      SUCCEEDS(kvcommPublisherCreate(c->h.buffer, &t, &p));
      SUCCEEDS(kvcommPublisherDestroy(p));
    } else {
      REFUSED("lanes", kvcommPublisherCreate(c->h.buffer, &t, SCRATCH(kvcommPublisher_t*)));
    }
    if (k++ % 4 == 0) { /* a quarter of the values: each is a collective create */
      t = o;
      t.barrierTimeoutMs = (int64_t)x;
      SUCCEEDS(kvcommPublisherCreate(c->h.buffer, &t, &p));
      SUCCEEDS(kvcommPublisherDestroy(p));
    }
    t = o;
    t.stagingTokens = (size_t)x;
    t.stagingBytesPerToken = (size_t)x;
    if ((size_t)x > UINT32_MAX) /* the staging's size overflows */
      REFUSED("stagingTokens", kvcommPublisherCreate(c->h.buffer, &t, SCRATCH(kvcommPublisher_t*)));
  }
  REFUSED("publisher is NULL", kvcommPublisherCreate(c->h.buffer, NULL, NULL));
}

static kvcommResult_t callPublisherDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommPublisherDestroy(h->publisher);
}
static void propsPublisherDestroy(Ctx* c) {
  SUCCEEDS(kvcommPublisherDestroy(NULL));
  kvcommPublisher_t p = NULL;
  SUCCEEDS(kvcommPublisherCreate(c->h.buffer, NULL, &p));
  SUCCEEDS(kvcommPublisherDestroy(p));
  REFUSED("not a live kvcommPublisher_t", kvcommPublisherDestroy(p));
}

/* The fixture's publish: 16 rows of kRowBytes per rank, each rank's rows at slots rank * 16 + i, inside
 * [0, kPubBytes). */
enum { kTokens = 16 };
typedef struct {
  uint8_t rows[kTokens * kRowBytes];
  int64_t slots64[kTokens];
  int32_t slots32[kTokens];
  kvcommCacheTensor t[KVCOMM_MAX_PUBLISH_TENSORS + 1];
} PublishArgs;

static void publishArgs(Ctx* c, PublishArgs* a, int round) {
  for (size_t i = 0; i < sizeof(a->rows); ++i) a->rows[i] = (uint8_t)(i * 7 + (size_t)c->rank * 31 + (size_t)round);
  for (int i = 0; i < kTokens; ++i) a->slots64[i] = a->slots32[i] = c->rank * kTokens + i;
  for (int k = 0; k <= KVCOMM_MAX_PUBLISH_TENSORS; ++k) {
    kvcommCacheTensorInit(&a->t[k]);
    size_t quarter = (size_t)(k % 4) * (kRowBytes / 4); /* tensor k: quarter k of each row, source and replica */
    a->t[k].src = a->rows + quarter;
    a->t[k].rowBytes = kRowBytes / 4;
    a->t[k].rowStride = kRowBytes;
    a->t[k].offset = quarter;
    a->t[k].limitBytes = kPubBytes - quarter;
    a->t[k].srcStride = kRowBytes;
    a->t[k].srcBytes = sizeof(a->rows) - quarter;
  }
}

/* Publish calls: `then` 0 nothing, 1 the barrier, 2 the signal (then a wait on the publisher's barrier). The slot
 * mapping states its true length, kTokens. */
static kvcommResult_t publishCall(Ctx* c, kvcommPublisher_t p, int which, const kvcommCacheTensor* t, size_t n,
                                  const void* slots, kvcommSlotType_t type, size_t tokens, int lane) {
  (void)c;
  kvcommSlotMapping m = {slots, type, kTokens};
  kvcommResult_t r = kvcommPublish(p, t, n, &m, tokens, NULL, (kvcommPublishThen_t)which, lane);
  if (r == kvcommSuccess && which == 2) {
    kvcommBarrier_t b = NULL;
    r = kvcommPublisherBarrier(p, &b);
    if (r == kvcommSuccess) r = kvcommBarrierWait(b, NULL, lane);
    if (b) kvcommBarrierDestroy(b);
  }
  return r;
}

/* Refused first (nothing lands in any replica): numTensors past KVCOMM_MAX_PUBLISH_TENSORS or below 1, the slot type
 * and `then` through their neighbours, numTokens past the slot mapping's count, a lane outside [0, lanes), NULL
 * arrays. Then valid calls for every numTensors, slot type and lane, compared with the rows in every replica. */
static void publishProps(Ctx* c, int which) {
  PublishArgs a;
  publishArgs(c, &a, which);
  c->watchBuffer = 1;
  kvcommPublisher_t p = c->h.publisher;
  FOR_VALUES(x) {
    if (x < 1 || x > KVCOMM_MAX_PUBLISH_TENSORS)
      REFUSED("numTensors", publishCall(c, p, which, a.t, (size_t)x, a.slots64, kvcommSlotInt64, kTokens, 0));
    if ((size_t)x > kTokens)
      REFUSED("exceeds the slot mapping", publishCall(c, p, which, a.t, 1, a.slots64, kvcommSlotInt64, (size_t)x, 0));
    int lane = asInt(x);
    if (which != 0 && (lane < 0 || lane >= 2))
      REFUSED("lane", publishCall(c, p, which, a.t, 1, a.slots64, kvcommSlotInt64, kTokens, lane));
  }
  unsigned vals[24];
  size_t nv = enumValues(2, vals);
  for (size_t i = 2; i < nv; ++i) {
    char word[48];
    snprintf(word, sizeof(word), "slots->type %u", vals[i]);
    REFUSED(word, publishCall(c, p, which, a.t, 1, a.slots64, (kvcommSlotType_t)vals[i], kTokens, 0));
  }
  REFUSED("numTensors", publishCall(c, p, which, NULL, 1, a.slots64, kvcommSlotInt64, kTokens, 0));
  REFUSED("slotMapping", publishCall(c, p, which, a.t, 1, NULL, kvcommSlotInt64, kTokens, 0));
  c->watchBuffer = 0;
  sync(c);
  kvcommBarrier_t bar = NULL;
  SUCCEEDS(kvcommPublisherBarrier(p, &bar));
  for (int n = 1; n <= KVCOMM_MAX_PUBLISH_TENSORS; ++n)
    for (int type = 0; type < 2; ++type) {
      const void* slots = type ? (const void*)a.slots32 : (const void*)a.slots64;
      SUCCEEDS(publishCall(c, p, which, a.t, (size_t)n, slots, (kvcommSlotType_t)type, kTokens, n % 2));
      if (which == 0) SUCCEEDS(kvcommBarrierSync(bar, NULL, 0));
      /* every replica holds every rank's rows: quarter k of row i of rank r at slot r * 16 + i, for k < n */
      for (int r = 0; r < c->size; ++r) {
        void* base = NULL;
        SUCCEEDS(kvcommBufferPeer(c->h.buffer, r, &base));
        for (int q = 0; q < c->size; ++q)
          for (int i = 0; i < kTokens; ++i)
            for (int k = 0; k < n; ++k) {
              const uint8_t* got = (const uint8_t*)base + (size_t)(q * kTokens + i) * kRowBytes + (size_t)k * 16;
              uint8_t want = (uint8_t)((size_t)(i * kRowBytes + k * 16) * 7 + (size_t)q * 31 + (size_t)which);
              if (got[0] != want) {
                EXPECT(got[0] == want);
                r = c->size, q = c->size, i = kTokens, k = n;
              }
            }
      }
      sync(c); /* everyone read before the next call overwrites */
    }
  SUCCEEDS(kvcommBarrierDestroy(bar));
}

static kvcommResult_t callPublish(Ctx* c, const Handles* h) {
  PublishArgs* a = (PublishArgs*)malloc(sizeof(PublishArgs));
  publishArgs(c, a, 0);
  kvcommSlotMapping m = {a->slots64, kvcommSlotInt64, kTokens};
  kvcommResult_t r = kvcommPublish(h->publisher, a->t, 1, &m, kTokens, NULL, kvcommPublishThenNothing, 0);
  free(a);
  return r;
}
/* Every `then` (nothing, barrier, signal + wait), and `then` through its neighbours (refused). */
static void propsPublish(Ctx* c) {
  for (int which = 0; which < 3; ++which) publishProps(c, which);
  PublishArgs a;
  publishArgs(c, &a, 0);
  kvcommSlotMapping m = {a.slots64, kvcommSlotInt64, kTokens};
  REFUSED("slots is NULL", kvcommPublish(c->h.publisher, a.t, 1, NULL, kTokens, NULL, kvcommPublishThenNothing, 0));
  unsigned vals[24];
  size_t nv = enumValues(3, vals);
  c->watchBuffer = 1;
  for (size_t i = 3; i < nv; ++i) {
    char word[48];
    snprintf(word, sizeof(word), "then %u", vals[i]);
    REFUSED(word, kvcommPublish(c->h.publisher, a.t, 1, &m, kTokens, NULL, (kvcommPublishThen_t)vals[i], 0));
  }
  c->watchBuffer = 0;
  sync(c);
}

/* Lanes through every value: outside [0, lanes) refused; inside, a barrier (or a signal then its wait). */
static void laneProps(Ctx* c, kvcommResult_t (*fn)(Ctx*, kvcommBarrier_t b, int lane, int half), kvcommBarrier_t b,
                      int lanes) {
  FOR_VALUES(x) {
    int lane = asInt(x);
    if (lane >= 0 && lane < lanes) {
      SUCCEEDS(fn(c, b, lane, 0));
      SUCCEEDS(fn(c, b, lane, 1));
    } else {
      REFUSED("lane", fn(c, b, lane, 0));
    }
  }
}
static kvcommResult_t barSync(Ctx* c, kvcommBarrier_t b, int lane, int half) {
  (void)c, (void)half;
  return kvcommBarrierSync(b, NULL, lane);
}
static kvcommResult_t barSignalWait(Ctx* c, kvcommBarrier_t b, int lane, int half) {
  (void)c;
  return half ? kvcommBarrierWait(b, NULL, lane) : kvcommBarrierSignal(b, NULL, lane);
}
static kvcommResult_t callPublisherBarrier(Ctx* c, const Handles* h) {
  return kvcommPublisherBarrier(h->publisher, SCRATCH(kvcommBarrier_t*));
}
/* A new handle on the publisher's barrier: its lanes are the publisher's; sync and signal/wait through every lane;
 * it outlives nothing it needs (destroyed first or last). */
static void propsPublisherBarrier(Ctx* c) {
  REFUSED("barrier is NULL", kvcommPublisherBarrier(c->h.publisher, NULL));
  kvcommBarrier_t b = NULL;
  SUCCEEDS(kvcommPublisherBarrier(c->h.publisher, &b));
  int lanes = 0;
  SUCCEEDS(kvcommBarrierLanes(b, &lanes));
  EXPECT(lanes == 2);
  laneProps(c, barSync, b, 2);
  laneProps(c, barSignalWait, b, 2);
  SUCCEEDS(kvcommBarrierDestroy(b));
}

static kvcommResult_t callPublisherMode(Ctx* c, const Handles* h) {
  return kvcommPublisherMode(h->publisher, SCRATCH(kvcommPublishMode_t*));
}
static void propsPublisherMode(Ctx* c) {
  REFUSED("mode is NULL", kvcommPublisherMode(c->h.publisher, NULL));
  kvcommPublishMode_t m = (kvcommPublishMode_t)7;
  SUCCEEDS(kvcommPublisherMode(c->h.publisher, &m));
  EXPECT(m == kvcommPublishDirect || m == kvcommPublishFallback);
}
static kvcommResult_t callPublisherModeReason(Ctx* c, const Handles* h) {
  return kvcommPublisherModeReason(h->publisher, SCRATCH(const char**));
}
static void propsPublisherModeReason(Ctx* c) {
  REFUSED("reason is NULL", kvcommPublisherModeReason(c->h.publisher, NULL));
  const char* why = NULL;
  SUCCEEDS(kvcommPublisherModeReason(c->h.publisher, &why));
  EXPECT(why != NULL && why[0] != '\0');
}
static kvcommResult_t callPublisherPollError(Ctx* c, const Handles* h) {
  return kvcommPublisherPollError(h->publisher, SCRATCH(kvcommDeviceError*));
}
static void propsPublisherPollError(Ctx* c) {
  REFUSED("error is NULL", kvcommPublisherPollError(c->h.publisher, NULL));
  kvcommDeviceError e;
  SUCCEEDS(kvcommPublisherPollError(c->h.publisher, &e));
  EXPECT(e.kind == kvcommDeviceErrorNone);
}
static kvcommResult_t callPublisherCheckErrors(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommPublisherCheckErrors(h->publisher);
}
static void propsPublisherCheckErrors(Ctx* c) {
  SUCCEEDS(kvcommPublisherCheckErrors(c->h.publisher));
}

/* ---- barrier -------------------------------------------------------------------------------------------------- */

static void propsBarrierOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommBarrierOptionsInit(NULL));
  kvcommBarrierOptions o;
  SUCCEEDS(kvcommBarrierOptionsInit(&o));
  EXPECT(o.lanes == 2 && o.timeoutMs < 0 && o.kind == kvcommMemoryAuto);
}

static kvcommResult_t callBarrierCreate(Ctx* c, const Handles* h) {
  return kvcommBarrierCreate(h->comm, NULL, SCRATCH(kvcommBarrier_t*));
}
/* lanes (1..KVCOMM_MAX_BARRIER_LANES), kind (its enumerators and neighbours; Cuda is Unsupported without a GPU) and
 * the timeout (any value) through their generated values. Collective. */
static void propsBarrierCreate(Ctx* c) {
  kvcommBarrierOptions o;
  SUCCEEDS(kvcommBarrierOptionsInit(&o));
  o.kind = kvcommMemoryHost;
  size_t k = 0;
  FOR_VALUES(x) {
    kvcommBarrierOptions t = o;
    kvcommBarrier_t b = NULL;
    t.lanes = asInt(x);
    if (t.lanes >= 1 && t.lanes <= KVCOMM_MAX_BARRIER_LANES) {
      int lanes = 0;
      SUCCEEDS(kvcommBarrierCreate(c->h.comm, &t, &b));
      SUCCEEDS(kvcommBarrierLanes(b, &lanes));
      EXPECT(lanes == t.lanes);
      SUCCEEDS(kvcommBarrierDestroy(b));
    } else {
      REFUSED("lanes", kvcommBarrierCreate(c->h.comm, &t, SCRATCH(kvcommBarrier_t*)));
    }
    if (k++ % 4 == 0) {
      t = o;
      t.timeoutMs = (int64_t)x;
      SUCCEEDS(kvcommBarrierCreate(c->h.comm, &t, &b));
      SUCCEEDS(kvcommBarrierDestroy(b));
    }
  }
  unsigned vals[24];
  size_t n = enumValues(3, vals);
  for (size_t i = 0; i < n; ++i) {
    kvcommBarrierOptions t = o;
    kvcommBarrier_t b = NULL;
    t.kind = (kvcommMemoryKind_t)vals[i];
    if (vals[i] == kvcommMemoryHost || vals[i] == kvcommMemoryAuto) {
      SUCCEEDS(kvcommBarrierCreate(c->h.comm, &t, &b));
      SUCCEEDS(kvcommBarrierDestroy(b));
    } else if (vals[i] == kvcommMemoryCuda) {
      prepare(c);
      kvcommResult_t r = kvcommBarrierCreate(c->h.comm, &t, SCRATCH(kvcommBarrier_t*));
      refused(c, "kvcommBarrierCreate(kind Cuda) without a GPU", r, r == kvcommCudaError ? r : kvcommUnsupported, "",
              __LINE__);
    } else {
      char word[48];
      snprintf(word, sizeof(word), "options->kind %u", vals[i]);
      REFUSED(word, kvcommBarrierCreate(c->h.comm, &t, SCRATCH(kvcommBarrier_t*)));
    }
  }
  REFUSED("barrier is NULL", kvcommBarrierCreate(c->h.comm, NULL, NULL));
}

static kvcommResult_t callBarrierDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommBarrierDestroy(h->barrier);
}
static void propsBarrierDestroy(Ctx* c) {
  SUCCEEDS(kvcommBarrierDestroy(NULL));
  kvcommBarrierOptions o;
  SUCCEEDS(kvcommBarrierOptionsInit(&o));
  o.kind = kvcommMemoryHost;
  kvcommBarrier_t b = NULL;
  SUCCEEDS(kvcommBarrierCreate(c->h.comm, &o, &b));
  SUCCEEDS(kvcommBarrierDestroy(b));
  REFUSED("not a live kvcommBarrier_t", kvcommBarrierDestroy(b));
}

static kvcommResult_t callBarrierSync(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommBarrierSync(h->barrier, NULL, 0);
}
static void propsBarrierSync(Ctx* c) {
  laneProps(c, barSync, c->h.barrier, 2);
}
static kvcommResult_t callBarrierSignal(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommBarrierSignal(h->barrier, NULL, 0);
}
static void propsBarrierSignal(Ctx* c) {
  laneProps(c, barSignalWait, c->h.barrier, 2);
}
static kvcommResult_t callBarrierWait(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommBarrierWait(h->barrier, NULL, 0);
}
static void propsBarrierWait(Ctx* c) {
  laneProps(c, barSignalWait, c->h.barrier, 2);
}

static kvcommResult_t callBarrierLanes(Ctx* c, const Handles* h) {
  return kvcommBarrierLanes(h->barrier, SCRATCH(int*));
}
static void propsBarrierLanes(Ctx* c) {
  REFUSED("lanes is NULL", kvcommBarrierLanes(c->h.barrier, NULL));
  int l = 0;
  SUCCEEDS(kvcommBarrierLanes(c->h.barrier, &l));
  EXPECT(l == 2);
}
static kvcommResult_t callBarrierKind(Ctx* c, const Handles* h) {
  return kvcommBarrierKind(h->barrier, SCRATCH(kvcommMemoryKind_t*));
}
static void propsBarrierKind(Ctx* c) {
  REFUSED("kind is NULL", kvcommBarrierKind(c->h.barrier, NULL));
  kvcommMemoryKind_t k = kvcommMemoryAuto;
  SUCCEEDS(kvcommBarrierKind(c->h.barrier, &k));
  EXPECT(k == kvcommMemoryHost);
}
static kvcommResult_t callBarrierComm(Ctx* c, const Handles* h) {
  return kvcommBarrierComm(h->barrier, SCRATCH(kvcommComm_t*));
}
static void propsBarrierComm(Ctx* c) {
  REFUSED("comm is NULL", kvcommBarrierComm(c->h.barrier, NULL));
  kvcommComm_t g = NULL;
  int s = 0;
  SUCCEEDS(kvcommBarrierComm(c->h.barrier, &g));
  SUCCEEDS(kvcommCommSize(g, &s));
  EXPECT(s == c->size);
  SUCCEEDS(kvcommCommDestroy(g));
}

/* Device handles: handleBytes through every value. NULL with 0 asks the size; a size below it is refused (nothing
 * written, *needed included); any size at least it copies exactly the handle. */
typedef kvcommResult_t (*HandleFn)(Ctx* c, void* out, size_t bytes, size_t* needed);
static void deviceHandleProps(Ctx* c, HandleFn fn) {
  size_t needed = 0;
  SUCCEEDS(fn(c, NULL, 0, &needed));
  EXPECT(needed > 0 && needed < 2048);
  unsigned char* buf = (unsigned char*)malloc(needed + 64);
  FOR_VALUES(x) {
    size_t b = (size_t)x, got = 0;
    if (b >= needed) {
      memset(buf, 0xEE, needed + 64);
      SUCCEEDS(fn(c, buf, b, &got));
      EXPECT(got == needed && buf[needed] == 0xEE);
    } else if (b > 0) {
      REFUSED("handleBytes", fn(c, SCRATCH(void*), b, SCRATCH(size_t*) + 512));
    }
    if (b > 0) REFUSED("handle is NULL", fn(c, NULL, b, SCRATCH(size_t*)));
  }
  free(buf);
}
static kvcommResult_t barrierDeviceHandleOf(Ctx* c, void* out, size_t bytes, size_t* needed) {
  return kvcommBarrierDeviceHandle(c->h.barrier, out, bytes, needed);
}
static kvcommResult_t callBarrierDeviceHandle(Ctx* c, const Handles* h) {
  return kvcommBarrierDeviceHandle(h->barrier, NULL, 0, SCRATCH(size_t*));
}
static void propsBarrierDeviceHandle(Ctx* c) {
  deviceHandleProps(c, barrierDeviceHandleOf);
}
static kvcommResult_t callBarrierPollError(Ctx* c, const Handles* h) {
  return kvcommBarrierPollError(h->barrier, SCRATCH(kvcommDeviceError*));
}
static void propsBarrierPollError(Ctx* c) {
  REFUSED("error is NULL", kvcommBarrierPollError(c->h.barrier, NULL));
  kvcommDeviceError e;
  SUCCEEDS(kvcommBarrierPollError(c->h.barrier, &e));
  EXPECT(e.kind == kvcommDeviceErrorNone);
}
static kvcommResult_t callBarrierCheckErrors(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommBarrierCheckErrors(h->barrier);
}
static void propsBarrierCheckErrors(Ctx* c) {
  SUCCEEDS(kvcommBarrierCheckErrors(c->h.barrier));
}

/* ---- fetch ---------------------------------------------------------------------------------------------------- */

static void propsFetcherOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommFetcherOptionsInit(NULL));
  kvcommFetcherOptions o;
  SUCCEEDS(kvcommFetcherOptionsInit(&o));
  EXPECT(o.lanes == 1 && o.barrierTimeoutMs < 0);
}
static void propsFetchOptionsInit(Ctx* c) {
  REFUSED("options is NULL", kvcommFetchOptionsInit(NULL));
  kvcommFetchOptions o;
  SUCCEEDS(kvcommFetchOptionsInit(&o));
  EXPECT(o.path == kvcommFetchPathAuto && o.copyEngineMinRunBytes == 0 && o.maxBytesPerSecond == 0 &&
         o.validation == kvcommFetchValidationHost);
}

static void propsFetchPathName(Ctx* c) {
  unsigned vals[24];
  size_t n = enumValues(5, vals);
  const char* names[5] = {"auto", "kernel", "copy", "host", "network"};
  for (size_t i = 0; i < n; ++i) {
    counted(c);
    const char* name = kvcommFetchPathName((kvcommFetchPath_t)vals[i]);
    EXPECT(name != NULL && strcmp(name, i < 5 ? names[i] : "unknown") == 0);
  }
}

/* KVCOMM_MAX_FETCH_REGIONS + 1 copies of the fixture's region. */
static kvcommKvRegion* regionArray(Ctx* c) {
  static kvcommKvRegion* r = NULL;
  if (!r) {
    r = (kvcommKvRegion*)malloc(sizeof(kvcommKvRegion) * (KVCOMM_MAX_FETCH_REGIONS + 1));
    for (size_t i = 0; i <= KVCOMM_MAX_FETCH_REGIONS; ++i) r[i] = c->region;
  }
  return r;
}

/* numRegions through every value (up to KVCOMM_MAX_FETCH_REGIONS hashed, past it refused before anything is read or
 * sized), the version through every value (every hash differs from the fixture's). */
static void propsKvLayoutHash(Ctx* c) {
  kvcommKvRegion* r = regionArray(c);
  uint64_t base = 0;
  SUCCEEDS(kvcommKvLayoutHash(r, 1, 1, &base));
  FOR_VALUES(x) {
    size_t n = (size_t)x;
    uint64_t h = 0;
    if (n <= KVCOMM_MAX_FETCH_REGIONS) {
      SUCCEEDS(kvcommKvLayoutHash(n ? r : NULL, n, 1, &h));
      EXPECT((n == 1) == (h == base));
    } else {
      REFUSED("KVCOMM_MAX_FETCH_REGIONS", kvcommKvLayoutHash(r, n, 1, SCRATCH(uint64_t*)));
    }
    SUCCEEDS(kvcommKvLayoutHash(r, 1, x, &h));
    EXPECT((x == 1) == (h == base));
    if (n > 0) REFUSED("regions is NULL", kvcommKvLayoutHash(NULL, n, 1, SCRATCH(uint64_t*)));
  }
  REFUSED("hash is NULL", kvcommKvLayoutHash(r, 1, 1, NULL));
  uint64_t h = 0;
  SUCCEEDS(kvcommFetcherLayoutHash(c->h.fetcher, c->rank, &h));
  EXPECT(h == base);
}

static kvcommResult_t callFetcherCreate(Ctx* c, const Handles* h) {
  return kvcommFetcherCreate(h->buffer, &c->region, 1, 1, NULL, SCRATCH(kvcommFetcher_t*));
}
/* numRegions through every value: 1 registers; 0 and several copies of one region (they share bytes) are refused by
 * every member; past KVCOMM_MAX_FETCH_REGIONS refused by every member before anything is sized (SIZE_MAX reached an
 * allocation first: "vector::_M_default_append"). lanes through every value (1..KVCOMM_MAX_BARRIER_LANES). */
static void propsFetcherCreate(Ctx* c) {
  kvcommKvRegion* r = regionArray(c);
  size_t k = 0;
  FOR_VALUES(x) {
    size_t n = (size_t)x;
    kvcommFetcher_t f = NULL;
    if (n == 1) {
      SUCCEEDS(kvcommFetcherCreate(c->h.buffer, r, n, 1, NULL, &f));
      SUCCEEDS(kvcommFetcherDestroy(f));
    } else {
      REFUSED(n > KVCOMM_MAX_FETCH_REGIONS ? "KVCOMM_MAX_FETCH_REGIONS" : "",
              kvcommFetcherCreate(c->h.buffer, r, n, 1, NULL, SCRATCH(kvcommFetcher_t*)));
    }
    kvcommFetcherOptions o;
    SUCCEEDS(kvcommFetcherOptionsInit(&o));
    o.lanes = asInt(x);
    if (o.lanes >= 1 && o.lanes <= KVCOMM_MAX_BARRIER_LANES) {
      SUCCEEDS(kvcommFetcherCreate(c->h.buffer, r, 1, 1, &o, &f));
      SUCCEEDS(kvcommFetcherDestroy(f));
    } else {
      REFUSED("lanes", kvcommFetcherCreate(c->h.buffer, r, 1, 1, &o, SCRATCH(kvcommFetcher_t*)));
    }
    if (k++ % 8 == 0) {
      SUCCEEDS(kvcommFetcherCreate(c->h.buffer, r, 1, x, NULL, &f));
      SUCCEEDS(kvcommFetcherDestroy(f));
    }
  }
  REFUSED("regions is NULL", kvcommFetcherCreate(c->h.buffer, NULL, 1, 1, NULL, SCRATCH(kvcommFetcher_t*)));
  REFUSED("fetcher is NULL", kvcommFetcherCreate(c->h.buffer, r, 1, 1, NULL, NULL));
}

static kvcommResult_t callFetcherDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommFetcherDestroy(h->fetcher);
}
static void propsFetcherDestroy(Ctx* c) {
  SUCCEEDS(kvcommFetcherDestroy(NULL));
  kvcommFetcher_t f = NULL;
  SUCCEEDS(kvcommFetcherCreate(c->h.buffer, &c->region, 1, 1, NULL, &f));
  SUCCEEDS(kvcommFetcherDestroy(f));
  REFUSED("not a live kvcommFetcher_t", kvcommFetcherDestroy(f));
}

/* The request sweeps shared by kvcommFetchPlanCreate, kvcommFetch, kvcommFetchStart and kvcommFetchAll. `fn` makes
 * the call (and, for a polled one, waits for it and destroys it). Refused, nothing written: numRequests past
 * KVCOMM_MAX_FETCH_REQUESTS, pair counts whose sum passes KVCOMM_MAX_FETCH_PAIRS (or wraps), a source rank outside
 * the group, ids outside [-1, blocks), a duplicate destination, a layout hash other than 0 and the source's, a path
 * outside the enum (a path that cannot run here: Unsupported), NULL arrays. Valid: up to KVCOMM_MAX_FETCH_REQUESTS
 * empty requests, and pairs whose bytes are then compared with the source's blocks. */
typedef kvcommResult_t (*FetchFn)(Ctx* c, const kvcommFetchRequest* q, size_t n, const kvcommFetchOptions* o);

static kvcommFetchRequest* requestArray(Ctx* c) {
  static kvcommFetchRequest* r = NULL;
  if (!r) {
    r = (kvcommFetchRequest*)calloc(KVCOMM_MAX_FETCH_REQUESTS + 1, sizeof(kvcommFetchRequest));
    for (size_t i = 0; i <= KVCOMM_MAX_FETCH_REQUESTS; ++i) r[i].srcRank = c->rank;
  }
  return r;
}

static int landed(Ctx* c, const kvcommFetchRequest* q) {
  void* src = NULL;
  void* dst = NULL;
  if (kvcommBufferPeer(c->h.buffer, q->srcRank, &src) != kvcommSuccess) return 0;
  if (kvcommBufferLocal(c->h.buffer, &dst) != kvcommSuccess) return 0;
  for (size_t i = 0; i < q->count; ++i) {
    if (q->srcBlocks[i] == -1 || q->dstBlocks[i] == -1) continue;
    if (memcmp((char*)dst + kFetchOffset + (size_t)q->dstBlocks[i] * kFetchBlockBytes,
               (char*)src + kFetchOffset + (size_t)q->srcBlocks[i] * kFetchBlockBytes, kFetchBlockBytes) != 0)
      return 0;
  }
  return 1;
}

static void fetchProps(Ctx* c, FetchFn fn, int writes) {
  const int64_t half = kFetchBlocks / 2;
  int64_t src[4] = {0, 1, 2, 9}, dst[4] = {half, half + 1, half + 2, half + 5};
  kvcommFetchRequest base = {(c->rank + 1) % c->size, src, dst, 4, 0};
  kvcommFetchRequest* many = requestArray(c);
  uint64_t hash = 0;
  SUCCEEDS(kvcommFetcherLayoutHash(c->h.fetcher, base.srcRank, &hash));
  c->watchBuffer = writes;
  FOR_VALUES(x) {
    size_t n = (size_t)x;
    if (n > KVCOMM_MAX_FETCH_REQUESTS)
      REFUSED("KVCOMM_MAX_FETCH_REQUESTS", fn(c, many, n, NULL));
    else if (n <= KVCOMM_MAX_FETCH_REQUESTS && (n <= 64 || n == KVCOMM_MAX_FETCH_REQUESTS))
      SUCCEEDS(fn(c, many, n, NULL)); /* empty requests: nothing moves */
    kvcommFetchRequest q[2] = {base, base};
    q[0].count = (size_t)x;
    if (q[0].count > KVCOMM_MAX_FETCH_PAIRS) REFUSED("KVCOMM_MAX_FETCH_PAIRS", fn(c, q, 1, NULL));
    q[0].count = KVCOMM_MAX_FETCH_PAIRS - 2;
    q[1].count = (size_t)x;
    if ((size_t)x > 2) REFUSED("KVCOMM_MAX_FETCH_PAIRS", fn(c, q, 2, NULL));
    q[0] = base;
    q[0].srcRank = asInt(x);
    if (q[0].srcRank < 0 || q[0].srcRank >= c->size) REFUSED("source rank", fn(c, q, 1, NULL));
    q[0] = base;
    q[0].srcLayoutHash = x;
    if (x != 0 && x != hash) REFUSED("layout hash", fn(c, q, 1, NULL));
    int64_t id = (int64_t)x, s2[4] = {0, 1, 2, 9}, d2[4] = {half, half + 1, half + 2, half + 5};
    q[0] = base;
    q[0].srcBlocks = s2;
    q[0].dstBlocks = d2;
    s2[3] = id;
    if (id < -1 || id >= kFetchBlocks) REFUSED("source block", fn(c, q, 1, NULL));
    s2[3] = 9;
    d2[3] = id;
    if (id < -1 || id >= kFetchBlocks) REFUSED("destination block", fn(c, q, 1, NULL));
  }
  kvcommFetchRequest q[2] = {base, base};
  q[1].srcRank = c->rank;
  REFUSED("duplicate", fn(c, q, 2, NULL));
  q[0].count = SIZE_MAX / 2 + 1;
  q[1].count = SIZE_MAX / 2 + 1; /* the sum wraps to 0 */
  REFUSED("KVCOMM_MAX_FETCH_PAIRS", fn(c, q, 2, NULL));
  unsigned vals[24];
  size_t nv = enumValues(4, vals);
  for (size_t i = 0; i < nv; ++i) {
    kvcommFetchOptions o;
    SUCCEEDS(kvcommFetchOptionsInit(&o));
    o.path = (kvcommFetchPath_t)vals[i];
    if (vals[i] == kvcommFetchPathKernel || vals[i] == kvcommFetchPathCopyEngine) {
      REFUSED_AS(kvcommUnsupported, "path", fn(c, &base, 1, &o));
    } else if (i >= 4) {
      char word[48];
      snprintf(word, sizeof(word), "options->path %u", vals[i]);
      REFUSED(word, fn(c, &base, 1, &o));
    }
  }
  /* validation: every value outside the enum is refused naming it; host buffers check on the host either way. */
  nv = enumValues(2, vals);
  for (size_t i = 2; i < nv; ++i) {
    kvcommFetchOptions o;
    SUCCEEDS(kvcommFetchOptionsInit(&o));
    o.validation = (kvcommFetchValidation_t)vals[i];
    char word[48];
    snprintf(word, sizeof(word), "options->validation %u", vals[i]);
    REFUSED(word, fn(c, &base, 1, &o));
  }
  REFUSED("requests is NULL", fn(c, NULL, 1, NULL));
  q[0] = base;
  q[0].dstBlocks = NULL;
  REFUSED("NULL", fn(c, q, 1, NULL));
  c->watchBuffer = 0;
  sync(c);
  /* Valid: every path that runs here, the pairs land. */
  for (unsigned p = 0; p < 4; ++p) {
    if (p == kvcommFetchPathKernel || p == kvcommFetchPathCopyEngine) continue;
    kvcommFetchOptions o;
    SUCCEEDS(kvcommFetchOptionsInit(&o));
    o.path = (kvcommFetchPath_t)p;
    q[0] = base;
    q[0].srcLayoutHash = hash;
    SUCCEEDS(fn(c, q, 1, &o));
    if (writes) EXPECT(landed(c, &q[0]));
  }
  int64_t s3[3] = {-1, 4, 5}, d3[3] = {half + 9, -1, half + 10};
  kvcommFetchRequest pad = {c->rank, s3, d3, 3, 0};
  SUCCEEDS(fn(c, &pad, 1, NULL));
  if (writes) EXPECT(landed(c, &pad));
  sync(c);
}

static kvcommResult_t planFn(Ctx* c, const kvcommFetchRequest* q, size_t n, const kvcommFetchOptions* o) {
  kvcommFetchPlan_t p = NULL;
  int valid = 1;
  kvcommResult_t r = kvcommFetchPlanCreate(c->h.fetcher, q, n, o, valid ? &p : NULL);
  if (r == kvcommSuccess) {
    kvcommFetchPlanInfo info;
    if (kvcommFetchPlanGetInfo(p, &info) != kvcommSuccess) r = kvcommInternalError;
    kvcommFetchPlanDestroy(p);
  }
  return r;
}
static kvcommResult_t callFetchPlanCreate(Ctx* c, const Handles* h) {
  kvcommFetchRequest q = {c->rank, NULL, NULL, 0, 0};
  return kvcommFetchPlanCreate(h->fetcher, &q, 1, NULL, SCRATCH(kvcommFetchPlan_t*));
}
static void propsFetchPlanCreate(Ctx* c) {
  fetchProps(c, planFn, 0);
  kvcommFetchRequest q = {c->rank, NULL, NULL, 0, 0};
  REFUSED("plan is NULL", kvcommFetchPlanCreate(c->h.fetcher, &q, 1, NULL, NULL));
}

static kvcommResult_t fetchFn(Ctx* c, const kvcommFetchRequest* q, size_t n, const kvcommFetchOptions* o) {
  return kvcommFetch(c->h.fetcher, q, n, NULL, o, NULL);
}
static kvcommResult_t callFetch(Ctx* c, const Handles* h) {
  kvcommFetchRequest q = {c->rank, NULL, NULL, 0, 0};
  return kvcommFetch(h->fetcher, &q, 1, NULL, NULL, SCRATCH(kvcommFetchPlanInfo*));
}
static void propsFetch(Ctx* c) {
  fetchProps(c, fetchFn, 1);
  int64_t s[1] = {3}, d[1] = {kFetchBlocks / 2 + 20};
  kvcommFetchRequest q = {c->rank, s, d, 1, 0};
  kvcommFetchPlanInfo info;
  SUCCEEDS(kvcommFetch(c->h.fetcher, &q, 1, NULL, NULL, &info));
  EXPECT(info.pairsIn == 1 && info.bytes == kFetchBlockBytes && info.path == kvcommFetchPathHost);
}

static kvcommResult_t startFn(Ctx* c, const kvcommFetchRequest* q, size_t n, const kvcommFetchOptions* o) {
  kvcommFetchOperation_t op = NULL;
  kvcommResult_t r = kvcommFetchStart(c->h.fetcher, q, n, o, NULL, &op);
  if (r == kvcommSuccess) {
    kvcommFetchStatus st;
    r = kvcommFetchOperationWait(op, -1, &st);
    if (r == kvcommSuccess && st.state != kvcommFetchDone) r = kvcommInternalError;
    kvcommFetchOperationDestroy(op);
  }
  return r;
}
static kvcommResult_t callFetchStart(Ctx* c, const Handles* h) {
  kvcommFetchRequest q = {c->rank, NULL, NULL, 0, 0};
  return kvcommFetchStart(h->fetcher, &q, 1, NULL, NULL, SCRATCH(kvcommFetchOperation_t*));
}
static void propsFetchStart(Ctx* c) {
  fetchProps(c, startFn, 1);
  kvcommFetchRequest q = {c->rank, NULL, NULL, 0, 0};
  REFUSED("op is NULL", kvcommFetchStart(c->h.fetcher, &q, 1, NULL, NULL, NULL));
}

static kvcommResult_t allFn(Ctx* c, const kvcommFetchRequest* q, size_t n, const kvcommFetchOptions* o) {
  return kvcommFetchAll(c->h.fetcher, q, n, NULL, o, NULL);
}
static kvcommResult_t callFetchAll(Ctx* c, const Handles* h) {
  kvcommFetchRequest q = {c->rank, NULL, NULL, 0, 0};
  return kvcommFetchAll(h->fetcher, &q, 1, NULL, NULL, SCRATCH(kvcommFetchPlanInfo*));
}
static void propsFetchAll(Ctx* c) {
  fetchProps(c, allFn, 1);
}

static kvcommResult_t callFetchPlanDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommFetchPlanDestroy(h->plan);
}
static void propsFetchPlanDestroy(Ctx* c) {
  SUCCEEDS(kvcommFetchPlanDestroy(NULL));
  kvcommFetchRequest q = {c->rank, NULL, NULL, 0, 0};
  kvcommFetchPlan_t p = NULL;
  SUCCEEDS(kvcommFetchPlanCreate(c->h.fetcher, &q, 1, NULL, &p));
  SUCCEEDS(kvcommFetchPlanDestroy(p));
  REFUSED("not a live kvcommFetchPlan_t", kvcommFetchPlanDestroy(p));
}
static kvcommResult_t callFetchPlanGetInfo(Ctx* c, const Handles* h) {
  return kvcommFetchPlanGetInfo(h->plan, SCRATCH(kvcommFetchPlanInfo*));
}
static void propsFetchPlanGetInfo(Ctx* c) {
  REFUSED("info is NULL", kvcommFetchPlanGetInfo(c->h.plan, NULL));
  kvcommFetchPlanInfo info;
  SUCCEEDS(kvcommFetchPlanGetInfo(c->h.plan, &info));
  EXPECT(info.pairsIn == 4 && info.bytes == 4 * kFetchBlockBytes && info.path == kvcommFetchPathHost);
}
static kvcommResult_t callFetchPlanGeneration(Ctx* c, const Handles* h) {
  return kvcommFetchPlanGeneration(h->plan, SCRATCH(uint64_t*));
}
static void propsFetchPlanGeneration(Ctx* c) {
  REFUSED("generation is NULL", kvcommFetchPlanGeneration(c->h.plan, NULL));
  uint64_t g = 0, f = 0;
  SUCCEEDS(kvcommFetchPlanGeneration(c->h.plan, &g));
  SUCCEEDS(kvcommFetcherGeneration(c->h.fetcher, &f));
  EXPECT(g == f);
}
static kvcommResult_t callFetchSubmit(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommFetchSubmit(h->fetcher, h->plan, NULL);
}
static void propsFetchSubmit(Ctx* c) {
  SUCCEEDS(kvcommFetchSubmit(c->h.fetcher, c->h.plan, NULL));
  SUCCEEDS(kvcommFetchSubmit(c->h.fetcher, c->h.plan, NULL));
  kvcommFetchRequest q = {
      (c->rank + 1) % c->size, (const int64_t[]){0, 1, 2, 5},
      (const int64_t[]){kFetchBlocks / 2, kFetchBlocks / 2 + 1, kFetchBlocks / 2 + 2, kFetchBlocks / 2 + 7}, 4, 0};
  EXPECT(landed(c, &q));
  sync(c);
}

static kvcommResult_t callFetchDevice(Ctx* c, const Handles* h) {
  kvcommDeviceFetchBatch b = {NULL, NULL, NULL, c->rank, 0};
  return kvcommFetchDevice(h->fetcher, &b, NULL);
}
/* count past KVCOMM_MAX_FETCH_PAIRS refused before anything is read; srcRank and every id through every value
 * (host buffers refuse the whole batch before copying); valid batches land. */
static void propsFetchDevice(Ctx* c) {
  const int64_t half = kFetchBlocks / 2;
  int64_t src[4] = {0, 1, 2, 9}, dst[4] = {half, half + 1, half + 2, half + 5};
  int32_t ranks[4];
  for (int i = 0; i < 4; ++i) ranks[i] = (c->rank + 1) % c->size;
  kvcommDeviceFetchBatch base = {src, dst, NULL, (c->rank + 1) % c->size, 4};
  c->watchBuffer = 1;
  FOR_VALUES(x) {
    kvcommDeviceFetchBatch b = base;
    b.count = (size_t)x;
    if (b.count > KVCOMM_MAX_FETCH_PAIRS) REFUSED("KVCOMM_MAX_FETCH_PAIRS", kvcommFetchDevice(c->h.fetcher, &b, NULL));
    b = base;
    b.srcRank = asInt(x);
    if (b.srcRank < 0 || b.srcRank >= c->size) REFUSED("srcRank", kvcommFetchDevice(c->h.fetcher, &b, NULL));
    int64_t id = (int64_t)x, s2[4] = {0, 1, 2, 9}, d2[4] = {half, half + 1, half + 2, half + 5};
    int32_t r2[4] = {ranks[0], ranks[1], ranks[2], asInt(x)};
    b = base;
    b.srcBlocks = s2;
    b.dstBlocks = d2;
    s2[2] = id;
    if (id < -1 || id >= kFetchBlocks) REFUSED("pair 2", kvcommFetchDevice(c->h.fetcher, &b, NULL));
    s2[2] = 2;
    d2[2] = id;
    if (id < -1 || id >= kFetchBlocks) REFUSED("pair 2", kvcommFetchDevice(c->h.fetcher, &b, NULL));
    b = base;
    b.srcRanks = r2;
    if (r2[3] < 0 || r2[3] >= c->size) REFUSED("", kvcommFetchDevice(c->h.fetcher, &b, NULL));
  }
  REFUSED("batch is NULL", kvcommFetchDevice(c->h.fetcher, NULL, NULL));
  kvcommDeviceFetchBatch b = base;
  b.srcBlocks = NULL;
  REFUSED("", kvcommFetchDevice(c->h.fetcher, &b, NULL));
  c->watchBuffer = 0;
  sync(c);
  b = base;
  SUCCEEDS(kvcommFetchDevice(c->h.fetcher, &b, NULL));
  b.srcRanks = ranks;
  b.srcRank = -5; /* ignored with srcRanks */
  SUCCEEDS(kvcommFetchDevice(c->h.fetcher, &b, NULL));
  SUCCEEDS(kvcommFetcherCheckErrors(c->h.fetcher));
  kvcommFetchRequest q = {(c->rank + 1) % c->size, src, dst, 4, 0};
  EXPECT(landed(c, &q));
  sync(c);
}

static kvcommResult_t callFetchOperationTest(Ctx* c, const Handles* h) {
  return kvcommFetchOperationTest(h->op, SCRATCH(kvcommFetchStatus*));
}
static void propsFetchOperationTest(Ctx* c) {
  REFUSED("status is NULL", kvcommFetchOperationTest(c->h.op, NULL));
  kvcommFetchStatus st;
  SUCCEEDS(kvcommFetchOperationTest(c->h.op, &st));
  EXPECT(st.state == kvcommFetchDone && st.bytesDone == st.bytesTotal && st.numFailedBlocks == 0);
}
static kvcommResult_t callFetchOperationWait(Ctx* c, const Handles* h) {
  return kvcommFetchOperationWait(h->op, 0, SCRATCH(kvcommFetchStatus*));
}
/* Any timeout is valid (the operation is done: every wait returns at once). */
static void propsFetchOperationWait(Ctx* c) {
  FOR_VALUES(x) {
    kvcommFetchStatus st;
    SUCCEEDS(kvcommFetchOperationWait(c->h.op, (int64_t)x, &st));
    EXPECT(st.state == kvcommFetchDone);
  }
  REFUSED("status is NULL", kvcommFetchOperationWait(c->h.op, 0, NULL));
}
static kvcommResult_t callFetchOperationFailedBlocks(Ctx* c, const Handles* h) {
  return kvcommFetchOperationFailedBlocks(h->op, SCRATCH(int64_t*), 4, SCRATCH(size_t*) + 512);
}
static void propsFetchOperationFailedBlocks(Ctx* c) {
  FOR_VALUES(x) {
    int64_t blocks[2] = {-7, -7};
    size_t count = 99;
    SUCCEEDS(kvcommFetchOperationFailedBlocks(c->h.op, (size_t)x ? blocks : NULL, (size_t)x, &count));
    EXPECT(count == 0 && blocks[0] == -7);
    if ((size_t)x > 0)
      REFUSED("blocks is NULL", kvcommFetchOperationFailedBlocks(c->h.op, NULL, (size_t)x, SCRATCH(size_t*)));
  }
  REFUSED("count is NULL", kvcommFetchOperationFailedBlocks(c->h.op, SCRATCH(int64_t*), 1, NULL));
}
static kvcommResult_t opError(Ctx* c, char* text, size_t bytes, size_t* needed) {
  return kvcommFetchOperationError(c->h.op, text, bytes, needed);
}
static kvcommResult_t callFetchOperationError(Ctx* c, const Handles* h) {
  return kvcommFetchOperationError(h->op, SCRATCH(char*), 16, SCRATCH(size_t*) + 64);
}
static void propsFetchOperationError(Ctx* c) {
  stringProps(c, opError);
}
static kvcommResult_t callFetchOperationDestroy(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommFetchOperationDestroy(h->op);
}
static void propsFetchOperationDestroy(Ctx* c) {
  SUCCEEDS(kvcommFetchOperationDestroy(NULL));
  kvcommFetchRequest q = {c->rank, NULL, NULL, 0, 0};
  kvcommFetchOperation_t op = NULL;
  SUCCEEDS(kvcommFetchStart(c->h.fetcher, &q, 1, NULL, NULL, &op));
  SUCCEEDS(kvcommFetchOperationDestroy(op));
  REFUSED("not a live kvcommFetchOperation_t", kvcommFetchOperationDestroy(op));
}

static kvcommResult_t callFetcherRefresh(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommFetcherRefresh(h->fetcher);
}
static void propsFetcherRefresh(Ctx* c) {
  SUCCEEDS(kvcommFetcherRefresh(c->h.fetcher));
}

static kvcommResult_t callFetcherLayout(Ctx* c, const Handles* h) {
  return kvcommFetcherLayout(h->fetcher, 0, SCRATCH(kvcommKvRegion*), 4, SCRATCH(size_t*) + 512,
                             SCRATCH(uint64_t*) + 600);
}
static void propsFetcherLayout(Ctx* c) {
  FOR_VALUES(x) {
    int r = asInt(x);
    kvcommKvRegion got[2];
    size_t count = 0;
    uint64_t version = 0;
    if (r >= 0 && r < c->size) {
      SUCCEEDS(kvcommFetcherLayout(c->h.fetcher, r, got, 2, &count, &version));
      EXPECT(count == 1 && version == 1 && got[0].offset == c->region.offset &&
             got[0].blockBytes == c->region.blockBytes && got[0].numBlocks == c->region.numBlocks);
    } else {
      REFUSED("rank", kvcommFetcherLayout(c->h.fetcher, r, SCRATCH(kvcommKvRegion*), 2, SCRATCH(size_t*) + 512,
                                          SCRATCH(uint64_t*) + 600));
    }
    memset(got, 0xEE, sizeof(got));
    SUCCEEDS(kvcommFetcherLayout(c->h.fetcher, 0, (size_t)x ? got : NULL, (size_t)x, &count, NULL));
    EXPECT(count == 1 && ((size_t)x == 0 || got[0].blockBytes == kFetchBlockBytes) && got[1].offset != 0);
    if ((size_t)x > 0)
      REFUSED("regions is NULL", kvcommFetcherLayout(c->h.fetcher, 0, NULL, (size_t)x, SCRATCH(size_t*), NULL));
  }
  REFUSED("count is NULL", kvcommFetcherLayout(c->h.fetcher, 0, SCRATCH(kvcommKvRegion*), 1, NULL, NULL));
}
static kvcommResult_t callFetcherLayoutHash(Ctx* c, const Handles* h) {
  return kvcommFetcherLayoutHash(h->fetcher, 0, SCRATCH(uint64_t*));
}
static void propsFetcherLayoutHash(Ctx* c) {
  FOR_VALUES(x) {
    int r = asInt(x);
    uint64_t h = 0;
    OUTCOME(r >= 0 && r < c->size, "rank",
            kvcommFetcherLayoutHash(c->h.fetcher, r, r >= 0 && r < c->size ? &h : SCRATCH(uint64_t*)));
  }
  REFUSED("hash is NULL", kvcommFetcherLayoutHash(c->h.fetcher, 0, NULL));
}
static kvcommResult_t callFetcherTransport(Ctx* c, const Handles* h) {
  return kvcommFetcherTransport(h->fetcher, 0, SCRATCH(kvcommFetchTransport_t*));
}
static void propsFetcherTransport(Ctx* c) {
  FOR_VALUES(x) {
    int r = asInt(x);
    kvcommFetchTransport_t t = kvcommFetchTransportNone;
    OUTCOME(r >= 0 && r < c->size, "rank",
            kvcommFetcherTransport(c->h.fetcher, r, r >= 0 && r < c->size ? &t : SCRATCH(kvcommFetchTransport_t*)));
    if (r >= 0 && r < c->size) EXPECT(t == kvcommFetchTransportPeer); /* one host: every member is mapped */
  }
  REFUSED("transport is NULL", kvcommFetcherTransport(c->h.fetcher, 0, NULL));
}
static kvcommResult_t callFetcherGeneration(Ctx* c, const Handles* h) {
  return kvcommFetcherGeneration(h->fetcher, SCRATCH(uint64_t*));
}
static void propsFetcherGeneration(Ctx* c) {
  REFUSED("generation is NULL", kvcommFetcherGeneration(c->h.fetcher, NULL));
  uint64_t g = 0, b = 0;
  SUCCEEDS(kvcommFetcherGeneration(c->h.fetcher, &g));
  SUCCEEDS(kvcommBufferGeneration(c->h.buffer, &b));
  EXPECT(g == b);
}
static kvcommResult_t fetcherHandle(Ctx* c, void* out, size_t bytes, size_t* needed) {
  return kvcommFetcherDeviceHandle(c->h.fetcher, out, bytes, needed);
}
static kvcommResult_t callFetcherDeviceHandle(Ctx* c, const Handles* h) {
  return kvcommFetcherDeviceHandle(h->fetcher, NULL, 0, SCRATCH(size_t*));
}
static void propsFetcherDeviceHandle(Ctx* c) {
  deviceHandleProps(c, fetcherHandle);
}
static kvcommResult_t callFetcherPollError(Ctx* c, const Handles* h) {
  return kvcommFetcherPollError(h->fetcher, SCRATCH(kvcommDeviceError*));
}
static void propsFetcherPollError(Ctx* c) {
  REFUSED("error is NULL", kvcommFetcherPollError(c->h.fetcher, NULL));
  kvcommDeviceError e;
  SUCCEEDS(kvcommFetcherPollError(c->h.fetcher, &e));
  EXPECT(e.kind == kvcommDeviceErrorNone);
}
static kvcommResult_t callFetcherCheckErrors(Ctx* c, const Handles* h) {
  (void)c;
  return kvcommFetcherCheckErrors(h->fetcher);
}
static void propsFetcherCheckErrors(Ctx* c) {
  SUCCEEDS(kvcommFetcherCheckErrors(c->h.fetcher));
}

/* ---- capabilities --------------------------------------------------------------------------------------------- */

static kvcommResult_t capabilities(Ctx* c, char* text, size_t bytes, size_t* needed) {
  (void)c;
  return kvcommCapabilitiesString(text, bytes, needed);
}
static void propsCapabilitiesString(Ctx* c) {
  stringProps(c, capabilities);
}

static void propsUseLocalDevice(Ctx* c) {
  FOR_VALUES(x) {
    int v = asInt(x), device = 7;
    if (v < 0) {
      REFUSED("localRank", kvcommUseLocalDevice(v, SCRATCH(int*)));
    } else {
      SUCCEEDS(kvcommUseLocalDevice(v, &device));
      EXPECT(device >= -1 && device != 7);
    }
  }
  REFUSED("device is NULL", kvcommUseLocalDevice(0, NULL));
}

/* ---- the table ------------------------------------------------------------------------------------------------ */

#define ENTRY(Name, handles, writes) \
  { "kvcomm" #Name, (handles), (writes), call##Name, props##Name }
#define PURE(Name) \
  { "kvcomm" #Name, 0, 0, NULL, props##Name }

const Entry g_entries[] = {
    PURE(GetErrorString),
    PURE(GetLastError),
    PURE(GetVersion),
    PURE(GetUniqueId),
    PURE(UniqueIdToString),
    PURE(UniqueIdFromString),
    PURE(CommInitTcp),
    PURE(CommInitCallback),
    ENTRY(CommDestroy, kHComm, 0),
    ENTRY(CommRank, kHComm, 0),
    ENTRY(CommSize, kHComm, 0),
    ENTRY(CommWorldRank, kHComm, 0),
    ENTRY(CommId, kHComm, 0),
    ENTRY(CommAbort, kHComm, 0),
    ENTRY(CommHealth, kHComm, 0),
    ENTRY(CommSplit, kHComm, 0),
    ENTRY(CommAllgather, kHComm, 0),
    ENTRY(CommBarrier, kHComm, 0),
    ENTRY(CommSend, kHComm, 0),
    ENTRY(CommRecv, kHComm, 0),
    ENTRY(CommNumHosts, kHComm, 0),
    ENTRY(CommMember, kHComm, 0),
    ENTRY(CommSameHost, kHComm, 0),
    ENTRY(CommCanAccessPeer, kHComm, 0),
    ENTRY(CommTopologyString, kHComm, 0),
    ENTRY(ParallelGroupsCreate, kHComm, 0),
    ENTRY(ParallelGroupsDestroy, kHLayout, 0),
    ENTRY(ParallelGroupsComm, kHLayout, 0),
    ENTRY(ParallelGroupsGetSpec, kHLayout, 0),
    ENTRY(ParallelGroupsGetCoord, kHLayout, 0),
    PURE(ParallelCoordOf),
    PURE(ParallelRankOf),
    PURE(ParallelGroupOf),
    ENTRY(BufferCreate, kHComm, 0),
    ENTRY(BufferAdopt, kHComm, 0),
    ENTRY(BufferDestroy, kHBuffer, 1),
    ENTRY(BufferGrow, kHBuffer, 1),
    ENTRY(BufferCommit, kHBuffer, 1),
    ENTRY(BufferRelease, kHBuffer, 1),
    ENTRY(BufferClose, kHBuffer, 1),
    ENTRY(BufferLocal, kHBuffer, 0),
    ENTRY(BufferPeer, kHBuffer, 0),
    ENTRY(BufferIsMapped, kHBuffer, 0),
    ENTRY(BufferRank, kHBuffer, 0),
    ENTRY(BufferSize, kHBuffer, 0),
    ENTRY(BufferCapacity, kHBuffer, 0),
    ENTRY(BufferMappedBytes, kHBuffer, 0),
    ENTRY(BufferIsBacked, kHBuffer, 0),
    ENTRY(BufferBackedRanges, kHBuffer, 0),
    ENTRY(BufferGeneration, kHBuffer, 0),
    ENTRY(BufferGranularity, kHBuffer, 0),
    ENTRY(BufferKind, kHBuffer, 0),
    ENTRY(BufferAdopted, kHBuffer, 0),
    ENTRY(BufferHandleType, kHBuffer, 0),
    ENTRY(BufferComm, kHBuffer, 0),
    ENTRY(BufferPeerTable, kHBuffer, 0),
    ENTRY(BufferBackedBitmap, kHBuffer, 0),
    PURE(CacheTensorInit),
    PURE(PublisherOptionsInit),
    ENTRY(PublisherCreate, kHBuffer, 0),
    ENTRY(PublisherDestroy, kHPublisher, 0),
    ENTRY(Publish, kHPublisher, 1),
    ENTRY(PublisherBarrier, kHPublisher, 0),
    ENTRY(PublisherMode, kHPublisher, 0),
    ENTRY(PublisherModeReason, kHPublisher, 0),
    ENTRY(PublisherPollError, kHPublisher, 0),
    ENTRY(PublisherCheckErrors, kHPublisher, 0),
    PURE(BarrierOptionsInit),
    ENTRY(BarrierCreate, kHComm, 0),
    ENTRY(BarrierDestroy, kHBarrier, 0),
    ENTRY(BarrierSync, kHBarrier, 0),
    ENTRY(BarrierSignal, kHBarrier, 0),
    ENTRY(BarrierWait, kHBarrier, 0),
    ENTRY(BarrierLanes, kHBarrier, 0),
    ENTRY(BarrierKind, kHBarrier, 0),
    ENTRY(BarrierComm, kHBarrier, 0),
    ENTRY(BarrierDeviceHandle, kHBarrier, 0),
    ENTRY(BarrierPollError, kHBarrier, 0),
    ENTRY(BarrierCheckErrors, kHBarrier, 0),
    PURE(FetcherOptionsInit),
    PURE(FetchOptionsInit),
    PURE(FetchPathName),
    PURE(KvLayoutHash),
    ENTRY(FetcherCreate, kHBuffer, 0),
    ENTRY(FetcherDestroy, kHFetcher, 0),
    ENTRY(FetchPlanCreate, kHFetcher, 0),
    ENTRY(FetchPlanDestroy, kHPlan, 0),
    ENTRY(FetchPlanGetInfo, kHPlan, 0),
    ENTRY(FetchPlanGeneration, kHPlan, 0),
    ENTRY(FetchSubmit, kHFetcher | kHPlan, 1),
    ENTRY(Fetch, kHFetcher, 1),
    ENTRY(FetchDevice, kHFetcher, 1),
    ENTRY(FetchStart, kHFetcher, 1),
    ENTRY(FetchOperationTest, kHOp, 0),
    ENTRY(FetchOperationWait, kHOp, 0),
    ENTRY(FetchOperationFailedBlocks, kHOp, 0),
    ENTRY(FetchOperationError, kHOp, 0),
    ENTRY(FetchOperationDestroy, kHOp, 0),
    ENTRY(FetchAll, kHFetcher, 1),
    ENTRY(FetcherRefresh, kHFetcher, 0),
    ENTRY(FetcherLayout, kHFetcher, 0),
    ENTRY(FetcherLayoutHash, kHFetcher, 0),
    ENTRY(FetcherGeneration, kHFetcher, 0),
    ENTRY(FetcherTransport, kHFetcher, 0),
    ENTRY(FetcherDeviceHandle, kHFetcher, 0),
    ENTRY(FetcherPollError, kHFetcher, 0),
    ENTRY(FetcherCheckErrors, kHFetcher, 0),
    PURE(CapabilitiesString),
    PURE(UseLocalDevice),
};
const size_t g_numEntries = sizeof(g_entries) / sizeof(g_entries[0]);
