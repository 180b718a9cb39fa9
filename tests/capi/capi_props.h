/* The property test of the C ABI (test_capi_props.c runs it; test_capi_props_calls.c holds one entry per function of
 * kvcomm.h): the fixture every entry uses, the generated values, and the checks of one generated call. */
#ifndef KVCOMM_TESTS_CAPI_CAPI_PROPS_H_
#define KVCOMM_TESTS_CAPI_CAPI_PROPS_H_

#include <stddef.h>
#include <stdint.h>

#include "kvcomm/kvcomm.h"

/* ---- the fixture -------------------------------------------------------------------------------------------- */

/* Handles every entry may use; the handle phase substitutes one of them at a time (NULL, destroyed, foreign). */
typedef struct {
  kvcommComm_t comm;
  kvcommParallelGroups_t layout;
  kvcommBuffer_t buffer;
  kvcommPublisher_t publisher;
  kvcommBarrier_t barrier;
  kvcommFetcher_t fetcher;
  kvcommFetchPlan_t plan;
  kvcommFetchOperation_t op;
  kvcommArena_t arena;          /* host memory, the layout below; leased by `import`, pinned by `pin` */
  kvcommArenaPin_t pin;         /* [kArenaPinOffset, +kArenaPinBytes) of `arena` */
  kvcommArenaImport_t import;   /* this process's import of `arena`, over `session` */
  kvcommArenaSession_t session; /* a session to `server`, this process's own */
  kvcommArenaServer_t server;
  kvcommEndpoint_t endpoint;          /* listening on loopback; `registration` is its */
  kvcommRegistration_t registration;  /* kEpBlocks blocks of this rank's endpoint memory */
  kvcommRemoteMemory_t remote;        /* `endpoint`'s connection to the peer endpoint's registration (Ctx) */
  kvcommTransfer_t transfer;          /* a finished read through `remote` */
  kvcommConvertedFetcher_t converted; /* over `buffer`, the fetch layout, described (fetchContents()) */
} Handles;

enum {
  kHComm = 1 << 0,
  kHLayout = 1 << 1,
  kHBuffer = 1 << 2,
  kHPublisher = 1 << 3,
  kHBarrier = 1 << 4,
  kHFetcher = 1 << 5,
  kHPlan = 1 << 6,
  kHOp = 1 << 7,
  kHArena = 1 << 8,
  kHPin = 1 << 9,
  kHImport = 1 << 10,
  kHSession = 1 << 11,
  kHServer = 1 << 12,
  kHEndpoint = 1 << 13,
  kHRegistration = 1 << 14,
  kHRemote = 1 << 15,
  kHTransfer = 1 << 16,
  kHConverted = 1 << 17,
  kNumHandleTypes = 18
};

/* The fixture's endpoint memory: one region of kEpBlocks blocks of kEpBlockBytes, this rank's and the peer
 * endpoint's (a second endpoint of this process). Reads go from peer blocks [0, 8) into local blocks [8, 16). */
enum { kEpBlocks = 16, kEpBlockBytes = 1024 };

/* The fixture's arenas: one region of kArenaBlocks blocks of kArenaBlockBytes, capacity kArenaCapacity. */
enum {
  kArenaBlocks = 16,
  kArenaBlockBytes = 4096,
  kArenaCapacity = 1 << 20,
  kArenaPinOffset = 4096,
  kArenaPinBytes = 100
};

/* The fixture's buffer: host memory, every replica mapped here. Publish rows land in [0, kPubBytes), the fetch
 * layout is one region of kFetchBlocks blocks at kFetchOffset (sources [0, kFetchBlocks / 2), destinations above). */
enum {
  kCapacity = 1 << 20,
  kMapped = 256 * 1024,
  kRowBytes = 64,
  kPubBytes = 64 * 1024,
  kFetchOffset = 128 * 1024,
  kFetchBlockBytes = 256,
  kFetchBlocks = 256,
  kScratchBytes = 8192
};

typedef struct {
  int rank, size;
  Handles h;                        /* live handles */
  kvcommKvRegion region;            /* the fetcher's layout */
  unsigned char* scratch;           /* every output of a refused call points here; poisoned before each call */
  unsigned char* image;             /* a copy of every replica (size * kMapped bytes), taken before a refused call */
  int watchBuffer;                  /* refused calls must leave every replica as it was */
  kvcommUniqueId id;                /* a valid unique id (rank 0's), shared by every rank */
  long cases;                       /* generated calls made by the current entry */
  long failures;                    /* failed checks on this rank */
  const char* entry;                /* name of the entry running */
  kvcommArenaSession_t peerSession; /* the server's end of h.session (accepted) */
  kvcommEndpoint_t peerEndpoint;    /* the endpoint h.remote connects to */
  kvcommRegistration_t peerRegistration;
  unsigned char* epLocal; /* h.registration's memory (poisoned and compared like the scratch) */
  unsigned char* epPeer;  /* peerRegistration's memory */
} Ctx;

/* ---- generated values ----------------------------------------------------------------------------------------- */

/* Integers from INT64_MIN to UINT64_MAX as 64-bit patterns: 0 and small values, every enum's neighbours, every
 * limit's (KVCOMM_MAX_* - 1, itself, + 1), and the edges of int, unsigned int, int64_t and uint64_t. An int argument
 * takes the value modulo 2^32 as a signed int, a size_t or uint64_t argument as it is. */
extern const uint64_t* g_values;
extern size_t g_numValues;
/* Values for an enum of `n` enumerators: every enumerator, then -1, n, n + 1, 42, INT_MAX, INT_MAX + 1, UINT_MAX - 1
 * and UINT_MAX as the underlying unsigned int. Returns how many were written (at most n + 7); the first `n` are valid.
 */
size_t enumValues(unsigned n, unsigned out[24]);
/* What the fetch layout's region holds: 4 tokens x 1 head x 32 elements of 2 bytes (its 256-byte blocks). */
kvcommKvContents fetchContents(void);
int asInt(uint64_t v);

/* ---- checks of one generated call ----------------------------------------------------------------------------- */

void prepare(Ctx* c);
/* A call the contract refuses: kvcommInvalidArgument (or `expected`), a message containing `word`, the scratch
 * untouched and, when watched, every replica of the buffer untouched. */
void refused(Ctx* c, const char* what, kvcommResult_t r, kvcommResult_t expected, const char* word, int line);
void succeeded(Ctx* c, const char* what, kvcommResult_t r, int line);
void check(Ctx* c, int cond, const char* what, int line);
/* Waits for every rank (separates a section of refused calls from one whose valid calls write into replicas). */
void sync(Ctx* c);
/* The scratch as an output pointer of any type (poisoned; a refused call must not write it). */
#define SCRATCH(type) ((type)(void*)c->scratch)

#define REFUSED(word, call)                                         \
  do {                                                              \
    prepare(c);                                                     \
    kvcommResult_t r_ = (call);                                     \
    refused(c, #call, r_, kvcommInvalidArgument, (word), __LINE__); \
  } while (0)
#define REFUSED_AS(code, word, call)                 \
  do {                                               \
    prepare(c);                                      \
    kvcommResult_t r_ = (call);                      \
    refused(c, #call, r_, (code), (word), __LINE__); \
  } while (0)
#define SUCCEEDS(call)                 \
  do {                                 \
    ++c->cases;                        \
    kvcommResult_t r_ = (call);        \
    succeeded(c, #call, r_, __LINE__); \
  } while (0)
/* A generated case: succeeds when `valid`, else is refused naming `word`. */
#define OUTCOME(valid, word, call)                                    \
  do {                                                                \
    prepare(c);                                                       \
    kvcommResult_t r_ = (call);                                       \
    if (valid)                                                        \
      succeeded(c, #call, r_, __LINE__);                              \
    else                                                              \
      refused(c, #call, r_, kvcommInvalidArgument, (word), __LINE__); \
  } while (0)
#define EXPECT(cond) check(c, (cond), #cond, __LINE__)

/* ---- the table ------------------------------------------------------------------------------------------------ */

typedef struct {
  const char* name; /* the function of kvcomm.h */
  unsigned handles; /* kH* bits: the handle arguments it takes */
  int writesMemory; /* whether it may write into the buffer's replicas (refused calls are checked against them) */
  /* One call with `h` for its handles and otherwise valid arguments (outputs in the scratch); NULL without handles.
   * Run with one handle NULL, destroyed, foreign or of another type: it must be refused naming that argument. */
  kvcommResult_t (*call)(Ctx* c, const Handles* h);
  /* The generated arguments: integers, enums, counts around their limits, NULL pointers; then valid calls. */
  void (*props)(Ctx* c);
} Entry;

extern const Entry g_entries[];
extern const size_t g_numEntries;
/* The arena entries (test_capi_props_arena.c), run after g_entries. */
extern const Entry g_arenaEntries[];
extern const size_t g_numArenaEntries;
/* The endpoint entries (test_capi_props_endpoint.c), run last. */
extern const Entry g_endpointEntries[];
extern const size_t g_numEndpointEntries;

/* Arena fixtures (test_capi_props_arena.c): the fixture's layout, a host arena of it, a session to a server, and an
 * import of an arena by this process over a session to its own server. */
void arenaLayout(kvcommKvRegion* region);
kvcommArena_t arenaMake(Ctx* c);
kvcommArenaSession_t arenaConnect(Ctx* c, kvcommArenaServer_t server);
kvcommArenaImport_t arenaImportOf(Ctx* c, kvcommArena_t arena, kvcommArenaSession_t session);

/* Endpoint fixtures (test_capi_props_endpoint.c): the peer endpoint and the fixture's own (endpointSetUp), handles of
 * the types in `types` for the handle phase (endpointMake, on fresh objects or the fixture's), their end
 * (endpointDestroy), and the fixture's end (endpointTearDown). */
void endpointSetUp(Ctx* c);
void endpointMake(Ctx* c, unsigned types, Handles* out);
void endpointDestroy(Ctx* c, Handles* h);
void endpointTearDown(Ctx* c);

#endif /* KVCOMM_TESTS_CAPI_CAPI_PROPS_H_ */
