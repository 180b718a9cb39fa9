/* kvcomm: the C ABI (C11, no C++ types), for engines that call native code through FFI (Rust, C, Go, Zig).
 *
 * Style of nccl.h: every call returns a kvcommResult_t; on failure kvcommGetLastError() gives the detail (the same
 * message the C++ API's exception carries: "kvcomm [rank R] <call>: <cause>"), per thread. Objects are opaque
 * handles created by *Create / *Init calls and freed by the matching *Destroy; a call given NULL, a destroyed handle
 * (until a new handle reuses its address), a pointer kvcomm never returned or a handle of another type returns
 * kvcommInvalidArgument and changes nothing. No C++ exception ever crosses this boundary.
 *
 * Call order (collective calls are made by every member of the group, in the same order):
 *   kvcommGetUniqueId (rank 0) -> kvcommCommInitTcp (all)   or   kvcommCommInitCallback (all)
 *   -> kvcommCommSplit / kvcommParallelGroupsCreate
 *   -> kvcommBufferCreate / kvcommBufferAdopt -> kvcommPublisherCreate, kvcommBarrierCreate, kvcommFetcherCreate
 *   -> per step: kvcommPublish (per layer, the last with kvcommPublishThenBarrier, or then kvcommBarrierSync on the
 *      publisher's barrier (kvcommPublisherBarrier); or kvcommPublishThenSignal ... kvcommBarrierWait);
 *      kvcommFetch / kvcommFetchDevice / kvcommFetchStart
 *   -> kvcommFetchOperationDestroy, kvcommFetchPlanDestroy, kvcommFetcherDestroy, kvcommBarrierDestroy,
 *      kvcommPublisherDestroy, kvcommBufferDestroy, kvcommParallelGroupsDestroy, kvcommCommDestroy (local, any order: a
 *      handle keeps what it uses alive).
 *
 * Lists a call returns (backed ranges, group members, failed blocks, layout regions) follow one pattern: the caller
 * passes an array and its capacity, the call writes min(count, capacity) entries and sets *count to the full count;
 * pass NULL and 0 to ask for the count first. Strings follow the same pattern with textBytes and *needed.
 */
#ifndef KVCOMM_KVCOMM_H_
#define KVCOMM_KVCOMM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every function declared here is exported from libkvcomm (built with hidden visibility; see kvcomm/api.hpp). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* ---- enums and limits ------------------------------------------------------------------------------------------ */

/* Every enum of this header is declared `typedef enum KVCOMM_ENUM_BASE {...}`. In C the enum's compatible type is
 * unsigned int (GCC and Clang: no enumerator is negative); compiled as C++ the same type is fixed explicitly, so the
 * ABI is unchanged and any integer a caller passes (9, or -1 read as 4294967295) is a value of the type rather than
 * undefined behaviour. The library reads every enum argument and enum field of an input struct as that integer and
 * refuses a value outside the enum with kvcommInvalidArgument, naming the argument and the value (see docs/c-api.md,
 * "Enums"). */
#ifdef __cplusplus
#define KVCOMM_ENUM_BASE : unsigned int
#else
#define KVCOMM_ENUM_BASE
#endif

/* The limit table: every count the C ABI takes is checked against its limit before anything is sized, and a count
 * past it returns kvcommInvalidArgument naming the count and the limit (nothing is allocated, read or written).
 * kvcomm/limits.hpp holds the same table for C++ (kvcomm::limits), and the library checks that the two agree.
 *   KVCOMM_MAX_RANKS            members of a communicator (kvcommCommInitTcp / kvcommCommInitCallback: size)
 *   KVCOMM_MAX_FETCH_REGIONS    regions of one fetch layout (kvcommFetcherCreate, kvcommKvLayoutHash: numRegions)
 *   KVCOMM_MAX_FETCH_REQUESTS   requests of one fetch call (numRequests)
 *   KVCOMM_MAX_FETCH_PAIRS      block pairs of one fetch call: the sum of its requests' counts, or
 *                               kvcommDeviceFetchBatch.count (2^24)
 *   KVCOMM_MAX_PUBLISH_TENSORS  tensors of one publish call (numTensors)
 *   KVCOMM_MAX_BARRIER_LANES    lanes of a barrier, of a publisher's barrier, of a fetcher's (options->lanes)
 *   KVCOMM_MAX_HANDLE_PEERS     members a kvcommBarrier_t, a device handle, Direct publishing and kvcommFetchAll
 *                               support
 *   KVCOMM_MAX_BUFFER_RANGES    ranges of one kvcommBufferCommit / kvcommBufferRelease call (numRanges)
 *   KVCOMM_MAX_ARENA_REGIONS    regions of one arena layout (kvcommArenaCreate, kvcommArenaGrowLayout,
 *                               kvcommArenaShrinkLayout, kvcommArenaImportOpenIpc: numRegions) */
#define KVCOMM_MAX_RANKS 65536
#define KVCOMM_MAX_FETCH_REGIONS 4096
#define KVCOMM_MAX_FETCH_REQUESTS 65536
#define KVCOMM_MAX_FETCH_PAIRS 16777216
#define KVCOMM_MAX_PUBLISH_TENSORS 4
#define KVCOMM_MAX_BARRIER_LANES 8
#define KVCOMM_MAX_HANDLE_PEERS 32
#define KVCOMM_MAX_BUFFER_RANGES 65536
#define KVCOMM_MAX_ARENA_REGIONS 1024

/* ---- version -------------------------------------------------------------------------------------------------- */

#ifndef KVCOMM_VERSION_MAJOR
#define KVCOMM_VERSION_MAJOR 0
#define KVCOMM_VERSION_MINOR 1
#define KVCOMM_VERSION_PATCH 0
#endif
/** Version code of these headers: MAJOR * 10000 + MINOR * 100 + PATCH. */
#define KVCOMM_VERSION_CODE(major, minor, patch) ((major)*10000 + (minor)*100 + (patch))
#define KVCOMM_VERSION KVCOMM_VERSION_CODE(KVCOMM_VERSION_MAJOR, KVCOMM_VERSION_MINOR, KVCOMM_VERSION_PATCH)

/* ---- results and errors --------------------------------------------------------------------------------------- */

/** Outcome of every call; one value per kvcomm::ErrorCode, plus success. */
typedef enum KVCOMM_ENUM_BASE {
  kvcommSuccess = 0,
  kvcommInvalidArgument = 1, /**< the caller passed something wrong; nothing was changed */
  kvcommUnsupported = 2,     /**< the requested mode cannot run here (no GPU, no P2P, handle type) */
  kvcommSystemError = 3,     /**< an operating-system call failed */
  kvcommCudaError = 4,       /**< a CUDA driver or runtime call failed */
  kvcommNetworkError = 5,    /**< a socket or transport failed, or a peer went away */
  kvcommRemoteError = 6,     /**< another rank reported a failure during a collective step */
  kvcommTimeout = 7,         /**< a bounded wait expired */
  kvcommAborted = 8,         /**< stopped because the communicator was aborted (kvcommCommAbort) */
  kvcommInternalError = 9,   /**< a kvcomm invariant broke (a bug), or an unexpected C++ exception */
  kvcommBusy = 10,           /**< the object is in use (leases or operations in flight); nothing was changed */
  kvcommNumResults = 11
} kvcommResult_t;

/** Short name of a result ("InvalidArgument", ...); "Unknown" for values outside the enum. Never NULL. */
const char* kvcommGetErrorString(kvcommResult_t result);

/** Message of the last failed kvcomm call on the calling thread ("" if none failed yet). Successful calls leave it
 *  unchanged (like errno). The pointer stays valid until the next failing call on this thread. */
const char* kvcommGetLastError(void);

/** Version of the library loaded at run time (KVCOMM_VERSION encoding). */
kvcommResult_t kvcommGetVersion(int* version);

/* ---- handles and plain types ---------------------------------------------------------------------------------- */

/** A group of processes (kvcomm::Communicator). Handles of one group share it; destroying one is local. */
typedef struct kvcommComm* kvcommComm_t;
/** The TP/PCP/PP/DP groups of this rank (kvcomm::ParallelGroups). */
typedef struct kvcommParallelGroups* kvcommParallelGroups_t;
/** Symmetric memory on a group (kvcomm::SymmetricBuffer). */
typedef struct kvcommBuffer* kvcommBuffer_t;
/** Publication into a buffer's replicas and its barrier (kvcomm::Publisher). */
typedef struct kvcommPublisher* kvcommPublisher_t;
/** A release/acquire barrier among the members of a communicator (kvcomm::Barrier). */
typedef struct kvcommBarrier* kvcommBarrier_t;
/** Fetches of KV blocks between the members of a buffer's group (kvcomm::Fetcher). */
typedef struct kvcommFetcher* kvcommFetcher_t;
/** A validated, coalesced batch of block pairs, reusable with kvcommFetchSubmit (kvcomm::FetchPlan). */
typedef struct kvcommFetchPlan* kvcommFetchPlan_t;
/** A polled fetch (kvcomm::FetchOperation). */
typedef struct kvcommFetchOperation* kvcommFetchOperation_t;
/** Converted fetches among the members of a buffer's group whose caches are laid out differently
 *  (kvcomm::ConvertedFetcher). */
typedef struct kvcommConvertedFetcher* kvcommConvertedFetcher_t;

/** Memory this process owns, shareable with other local processes (kvcomm::Arena). */
typedef struct kvcommArena* kvcommArena_t;
/** Another process's arena mapped into this one; holds a lease until closed (kvcomm::ArenaImport). */
typedef struct kvcommArenaImport* kvcommArenaImport_t;
/** A reference on (arena or import, range) held by an operation in flight (kvcomm::ArenaPin). */
typedef struct kvcommArenaPin* kvcommArenaPin_t;
/** One connection between two processes of a host, over which arenas are offered and imported
 *  (kvcomm::ArenaSession). */
typedef struct kvcommArenaSession* kvcommArenaSession_t;
/** Where arena sessions meet a server process (kvcomm::ArenaServer). */
typedef struct kvcommArenaServer* kvcommArenaServer_t;

/** A CUDA stream: the same type as cudaStream_t and CUstream. Ignored by host buffers. */
typedef struct CUstream_st* kvcommStream_t;

/* ---- bootstrap ------------------------------------------------------------------------------------------------ */

#define KVCOMM_UNIQUE_ID_BYTES 64
/** Identity of a TCP bootstrap group (root address + random nonce); pass it to every rank out of band. */
typedef struct {
  char internal[KVCOMM_UNIQUE_ID_BYTES];
} kvcommUniqueId;
/** Characters of kvcommUniqueIdToString's text, without the terminating NUL. */
#define KVCOMM_UNIQUE_ID_STRING_LEN (2 * KVCOMM_UNIQUE_ID_BYTES)

/** Creates an id whose root listens on `ifname` (NULL or "": KVCOMM_SOCKET_IFNAME, else the first non-loopback
 *  interface that is up, else loopback). Call it in the process that will be rank 0 (it opens the listening socket
 *  that process's rank-0 kvcommCommInitTcp adopts). */
kvcommResult_t kvcommGetUniqueId(kvcommUniqueId* id, const char* ifname);
/** Hex text of an id into `text` (at least KVCOMM_UNIQUE_ID_STRING_LEN + 1 bytes), for environment variables. */
kvcommResult_t kvcommUniqueIdToString(const kvcommUniqueId* id, char* text, size_t textBytes);
/** Parses kvcommUniqueIdToString's text; kvcommInvalidArgument on malformed text. */
kvcommResult_t kvcommUniqueIdFromString(const char* text, kvcommUniqueId* id);

/** Builds the world communicator of `size` ranks over TCP (collective). `timeoutMs` < 0 uses
 *  KVCOMM_BOOTSTRAP_TIMEOUT_MS. kvcommTimeout when the root cannot be reached in time. */
kvcommResult_t kvcommCommInitTcp(kvcommComm_t* comm, const kvcommUniqueId* id, int rank, int size, int64_t timeoutMs);

/** The engine's allgather: gathers `bytesPerRank` bytes from every rank; `send` is this rank's contribution, `recv`
 *  receives size * bytesPerRank bytes ordered by rank. Returns 0 on success, anything else on failure (reported as
 *  kvcommRemoteError with that value). */
typedef int (*kvcommAllgatherFn)(const void* send, void* recv, size_t bytesPerRank, void* user);

/** Builds the world communicator over the engine's own process group (collective): `allgather` (with `user`) is
 *  called during this call only, on the calling thread; neither is kept afterwards. */
kvcommResult_t kvcommCommInitCallback(kvcommComm_t* comm, int rank, int size, kvcommAllgatherFn allgather, void* user);

/* ---- communicator --------------------------------------------------------------------------------------------- */

/** Frees this handle (local; the group's connections close with its last handle, buffers keep theirs). NULL is a
 *  no-op. */
kvcommResult_t kvcommCommDestroy(kvcommComm_t comm);
kvcommResult_t kvcommCommRank(kvcommComm_t comm, int* rank);
kvcommResult_t kvcommCommSize(kvcommComm_t comm, int* size);
/** Rank of member `rank` in the world communicator this one was split from. */
kvcommResult_t kvcommCommWorldRank(kvcommComm_t comm, int rank, int* worldRank);
/** Identity of the group (equal on every member, different for each split). */
kvcommResult_t kvcommCommId(kvcommComm_t comm, uint64_t* id);
/** Stops the group on this rank (kvcomm::Communicator::abort, like ncclCommAbort): every call on it, and on the
 *  objects built on it, that is waiting (in any thread) or made later returns kvcommAborted. Local; any thread. */
kvcommResult_t kvcommCommAbort(kvcommComm_t comm);
/** *healthy = 0 once the communicator was aborted or a member is known dead (every member learns of a death within
 *  5 s), else 1; *failedRank = the first member known dead, or -1 (either pointer may be NULL). Any thread. */
kvcommResult_t kvcommCommHealth(kvcommComm_t comm, int* healthy, int* failedRank);
/** MPI_Comm_split semantics (collective): members with the same color form a group ordered by (key, rank). A negative
 *  color takes part but gets no communicator: *out is set to NULL. */
kvcommResult_t kvcommCommSplit(kvcommComm_t comm, int color, int key, kvcommComm_t* out);
/** In-place allgather (collective): this rank's bytes at data + rank * bytesPerRank. */
kvcommResult_t kvcommCommAllgather(kvcommComm_t comm, void* data, size_t bytesPerRank);
/** Returns when every member entered (collective). */
kvcommResult_t kvcommCommBarrier(kvcommComm_t comm);
/** Point-to-point messages among members; `tag` (< 2^31) separates independent streams. */
kvcommResult_t kvcommCommSend(kvcommComm_t comm, const void* data, size_t bytes, int peer, uint32_t tag);
kvcommResult_t kvcommCommRecv(kvcommComm_t comm, void* data, size_t bytes, int peer, uint32_t tag);

/** What the communicator knows about one member (kvcomm::MemberInfo; strings are NUL-terminated, truncated to fit). */
typedef struct {
  int rank;      /**< rank in this communicator */
  int worldRank; /**< rank in the communicator created from the bootstrap */
  int pid;
  int hostIndex; /**< hosts numbered by first appearance in rank order */
  int localRank; /**< index among the members on the same host */
  int localSize; /**< members on the same host */
  int gpuDevice; /**< CUDA ordinal in that process; -1: none */
  char hostname[256];
  char gpuUuid[64];
  char gpuPciBusId[32];
} kvcommMemberInfo;

/** Number of distinct hosts among the members. */
kvcommResult_t kvcommCommNumHosts(kvcommComm_t comm, int* numHosts);
kvcommResult_t kvcommCommMember(kvcommComm_t comm, int rank, kvcommMemberInfo* info);
/** Whether members a and b share a host. */
kvcommResult_t kvcommCommSameHost(kvcommComm_t comm, int a, int b, int* same);
/** Whether member a's GPU can access member b's directly (same host, same GPU or CUDA peer access). */
kvcommResult_t kvcommCommCanAccessPeer(kvcommComm_t comm, int a, int b, int* canAccess);
/** The topology as a human-readable table, copied into `text` (truncated to textBytes - 1 characters, NUL
 *  terminated); *needed (if not NULL) receives the full length + 1. `text` may be NULL with textBytes 0. */
kvcommResult_t kvcommCommTopologyString(kvcommComm_t comm, char* text, size_t textBytes, size_t* needed);

/* ---- layout --------------------------------------------------------------------------------------------------- */

/** Sizes of an engine's parallel dimensions; world = dp * pp * pcp * tp. */
typedef struct {
  int tp, pcp, pp, dp;
} kvcommParallelSpec;
/** A rank's coordinates: rank = ((dp * PP + pp) * PCP + pcp) * TP + tp (TP fastest, as engines number ranks). */
typedef struct {
  int tp, pcp, pp, dp;
} kvcommParallelCoord;
typedef enum KVCOMM_ENUM_BASE { kvcommAxisTP = 0, kvcommAxisPCP = 1, kvcommAxisPP = 2, kvcommAxisDP = 3 } kvcommAxis_t;

/** Splits `world` into the four groups (collective). kvcommInvalidArgument unless world size == tp*pcp*pp*dp. */
kvcommResult_t kvcommParallelGroupsCreate(kvcommComm_t world, const kvcommParallelSpec* spec,
                                          kvcommParallelGroups_t* layout);
kvcommResult_t kvcommParallelGroupsDestroy(kvcommParallelGroups_t layout);
/** A new handle on the group along `axis` (free it with kvcommCommDestroy); its rank is this rank's coordinate. */
kvcommResult_t kvcommParallelGroupsComm(kvcommParallelGroups_t layout, kvcommAxis_t axis, kvcommComm_t* comm);
kvcommResult_t kvcommParallelGroupsGetSpec(kvcommParallelGroups_t layout, kvcommParallelSpec* spec);
kvcommResult_t kvcommParallelGroupsGetCoord(kvcommParallelGroups_t layout, kvcommParallelCoord* coord);
/** Pure functions of a spec: coordinates of `rank`, the rank of coordinates, and the world ranks of the group along
 *  `axis` holding `rank` in group-rank order (*count receives the group size; at most `capacity` are written). */
kvcommResult_t kvcommParallelCoordOf(const kvcommParallelSpec* spec, int rank, kvcommParallelCoord* coord);
kvcommResult_t kvcommParallelRankOf(const kvcommParallelSpec* spec, const kvcommParallelCoord* coord, int* rank);
kvcommResult_t kvcommParallelGroupOf(const kvcommParallelSpec* spec, int rank, kvcommAxis_t axis, int* ranks,
                                     int capacity, int* count);

/* ---- symmetric memory ----------------------------------------------------------------------------------------- */

typedef enum KVCOMM_ENUM_BASE {
  kvcommMemoryAuto = 0, /**< CUDA when this rank has a current CUDA context, else host */
  kvcommMemoryCuda = 1, /**< cuMemCreate/cuMemMap on the current device */
  kvcommMemoryHost = 2  /**< memfd chunks mapped into a PROT_NONE reservation */
} kvcommMemoryKind_t;

/** A byte range relative to a buffer's base. */
typedef struct {
  size_t offset;
  size_t bytes;
} kvcommRange;

/** Reserves `capacity` bytes per member and maps the first `initialBytes` everywhere (collective; same sizes and
 *  kind on every member). */
kvcommResult_t kvcommBufferCreate(kvcommComm_t comm, size_t capacity, size_t initialBytes, kvcommMemoryKind_t kind,
                                  kvcommBuffer_t* buffer);
/** Adopts an address range the engine reserved and commits itself (collective). */
kvcommResult_t kvcommBufferAdopt(kvcommComm_t comm, void* base, size_t reservedBytes, kvcommMemoryKind_t kind,
                                 kvcommBuffer_t* buffer);
/** Frees this handle; the memory is closed with the last holder (a publisher holds one). NULL is a no-op. */
kvcommResult_t kvcommBufferDestroy(kvcommBuffer_t buffer);
/** Maps up to `newBytes` everywhere (collective; created buffers). Addresses never change. */
kvcommResult_t kvcommBufferGrow(kvcommBuffer_t buffer, size_t newBytes);
/** The engine mapped physical memory at these ranges (collective; adopted buffers). */
kvcommResult_t kvcommBufferCommit(kvcommBuffer_t buffer, const kvcommRange* ranges, size_t numRanges);
/** Peers unmap these committed ranges (collective; adopted buffers). */
kvcommResult_t kvcommBufferRelease(kvcommBuffer_t buffer, const kvcommRange* ranges, size_t numRanges);
/** Unmaps peer windows, then releases this rank's memory (local, never waits on peers; idempotent). The handle
 *  must still be destroyed. */
kvcommResult_t kvcommBufferClose(kvcommBuffer_t buffer);

kvcommResult_t kvcommBufferLocal(kvcommBuffer_t buffer, void** ptr);
/** Member `rank`'s memory as mapped here; NULL when not mapped here (another host). */
kvcommResult_t kvcommBufferPeer(kvcommBuffer_t buffer, int rank, void** ptr);
kvcommResult_t kvcommBufferIsMapped(kvcommBuffer_t buffer, int rank, int* mapped);
kvcommResult_t kvcommBufferRank(kvcommBuffer_t buffer, int* rank);
kvcommResult_t kvcommBufferSize(kvcommBuffer_t buffer, int* size);
kvcommResult_t kvcommBufferCapacity(kvcommBuffer_t buffer, size_t* bytes);
/** Bytes backed on every member (mapped prefix, or committed bytes of an adopted buffer). */
kvcommResult_t kvcommBufferMappedBytes(kvcommBuffer_t buffer, size_t* bytes);
kvcommResult_t kvcommBufferIsBacked(kvcommBuffer_t buffer, size_t offset, size_t bytes, int* backed);
/** Backed ranges, sorted: *count receives how many there are; at most `capacity` are written. */
kvcommResult_t kvcommBufferBackedRanges(kvcommBuffer_t buffer, kvcommRange* ranges, size_t capacity, size_t* count);
/** Increments with every grow/commit/release. */
kvcommResult_t kvcommBufferGeneration(kvcommBuffer_t buffer, uint64_t* generation);
kvcommResult_t kvcommBufferGranularity(kvcommBuffer_t buffer, size_t* bytes);
/** The resolved kind (never kvcommMemoryAuto). */
kvcommResult_t kvcommBufferKind(kvcommBuffer_t buffer, kvcommMemoryKind_t* kind);
kvcommResult_t kvcommBufferAdopted(kvcommBuffer_t buffer, int* adopted);
/** How handles travel ("posix_fd", "fabric", "cuda_ipc" or "memfd"), copied like kvcommCommTopologyString. */
kvcommResult_t kvcommBufferHandleType(kvcommBuffer_t buffer, char* text, size_t textBytes, size_t* needed);
/** A new handle on the buffer's group (free it with kvcommCommDestroy). */
kvcommResult_t kvcommBufferComm(kvcommBuffer_t buffer, kvcommComm_t* comm);
/** uint64[size] of member base addresses (0 = not mapped) at an address that never changes for the buffer's life:
 *  device memory for CUDA buffers, host memory for host buffers. Engine kernels take this plus offsets. */
kvcommResult_t kvcommBufferPeerTable(kvcommBuffer_t buffer, const uint64_t** table);
/** Bit g (word g / 64, bit g % 64) says whether granule g is backed on every member; same memory and stability as
 *  the peer table. */
kvcommResult_t kvcommBufferBackedBitmap(kvcommBuffer_t buffer, const uint64_t** bitmap);

/* ---- publish and barrier -------------------------------------------------------------------------------------- */

typedef enum KVCOMM_ENUM_BASE { kvcommSlotInt64 = 0, kvcommSlotInt32 = 1 } kvcommSlotType_t;
typedef enum KVCOMM_ENUM_BASE { kvcommPublishDirect = 0, kvcommPublishFallback = 1 } kvcommPublishMode_t;
/** What a publish runs on its lane after the rows (fused into the publish kernel in Direct mode on CUDA). */
typedef enum KVCOMM_ENUM_BASE {
  kvcommPublishThenNothing = 0, /**< the rows only */
  kvcommPublishThenBarrier = 1, /**< then the whole barrier (kvcommBarrierSync) */
  kvcommPublishThenSignal = 2   /**< then its first half (kvcommBarrierSignal); kvcommBarrierWait before the reads */
} kvcommPublishThen_t;

/** A slot mapping with its length: int64 or int32 slots (< 0: padding, skipped; device memory for CUDA buffers). A
 *  publish of numTokens > count is refused before anything is read. */
typedef struct {
  const void* data;
  kvcommSlotType_t type;
  size_t count; /**< elements readable at data */
} kvcommSlotMapping;

/** One cache tensor of a publish call (bytes). Row i of the source lands in every replica at
 *    offset + (slot / blockSize) * blockStride + (slot % blockSize) * rowStride,   slot = slotMapping[i].
 *  Zero for srcStride, blockStride, rowStride means rowBytes, blockSize * rowStride, rowBytes; blockSize must be >= 1
 *  (kvcommCacheTensorInit sets 1). */
typedef struct {
  const void* src;    /**< row i at src + i * srcStride (device memory for CUDA buffers) */
  size_t srcStride;   /**< bytes between source rows (0: rowBytes) */
  size_t rowBytes;    /**< bytes per row */
  size_t offset;      /**< destination base, bytes from the buffer's base */
  size_t blockSize;   /**< tokens per block */
  size_t blockStride; /**< bytes between blocks (0: blockSize * rowStride) */
  size_t rowStride;   /**< bytes between rows of a block (0: rowBytes) */
  size_t limitBytes;  /**< bytes the tensor may address from offset (0: up to the capacity); rows past it are refused */
  size_t srcBytes;    /**< bytes readable at src (0: not stated); a call whose rows reach past it is refused */
} kvcommCacheTensor;

/** Options of kvcommPublisherCreate; kvcommPublisherOptionsInit fills the C++ defaults. */
typedef struct {
  int lanes;                   /**< independent barrier lanes, 1..8 (default 2) */
  int64_t barrierTimeoutMs;    /**< bound on every barrier wait; < 0: KVCOMM_BARRIER_TIMEOUT_MS */
  size_t stagingTokens;        /**< fallback staging reserved up front: tokens per rank ... */
  size_t stagingBytesPerToken; /**< ... and bytes per token (summed over tensors) */
} kvcommPublisherOptions;

typedef enum KVCOMM_ENUM_BASE {
  kvcommDeviceErrorNone = 0,
  kvcommDeviceErrorSlotOutOfRange = 1,  /**< a slot's row would land outside the backed part; not written */
  kvcommDeviceErrorBarrierTimeout = 2,  /**< a barrier wait expired; the peer never arrived */
  kvcommDeviceErrorBlockOutOfRange = 3, /**< a fetch named a block id outside its layout; that pair was not copied */
  kvcommDeviceErrorPeerFailed = 4,      /**< a barrier wait stopped: the communicator was aborted or a member died */
  kvcommDeviceErrorLaneOutOfRange = 5,  /**< a device barrier call named a lane outside [0, lanes); nothing done */
  kvcommDeviceErrorBatchRefused = 6     /**< a fetch checked on the device had a bad pair: nothing of it was copied */
} kvcommDeviceErrorKind_t;

/** A device error read back by kvcommPublisherPollError, kvcommBarrierPollError or kvcommFetcherPollError. Fields
 *  that do not apply are -1. */
typedef struct {
  kvcommDeviceErrorKind_t kind;
  int64_t tokenIndex; /**< SlotOutOfRange: token index; BlockOutOfRange: index of the block pair; BatchRefused: the
                           pair's index in its request */
  int64_t slot;       /**< SlotOutOfRange: the slot; BlockOutOfRange, BatchRefused: the offending block id */
  int tensor;         /**< SlotOutOfRange: tensor index; BlockOutOfRange: region index; BatchRefused: request index */
  int rank;           /**< rank that detected it */
  int peer;           /**< BarrierTimeout: the peer waited for; BlockOutOfRange, BatchRefused: the source rank */
  int lane; /**< BarrierTimeout: the lane; BatchRefused: why (0 source id, 1 destination id out of range, 2 duplicate
               destination, 3 reads a block the batch writes) */
} kvcommDeviceError;

kvcommResult_t kvcommCacheTensorInit(kvcommCacheTensor* tensor);
kvcommResult_t kvcommPublisherOptionsInit(kvcommPublisherOptions* options);
/** Collective over the buffer's group; picks the mode (KVCOMM_DIRECT). `options` NULL: defaults. */
kvcommResult_t kvcommPublisherCreate(kvcommBuffer_t buffer, const kvcommPublisherOptions* options,
                                     kvcommPublisher_t* publisher);
kvcommResult_t kvcommPublisherDestroy(kvcommPublisher_t publisher);
/** Stores row i of every tensor at slots->data[i] (< 0: padding, skipped) in every replica, then runs `then` on
 *  `lane` (in Direct mode on CUDA, fused into the same kernel). Validates everything knowable before launch
 *  (numTokens <= slots->count, srcBytes where set, offsets and strides); a slot beyond the backed range found on the
 *  device is reported by kvcommPublisherCheckErrors. Capture-safe, no host synchronisation (CUDA buffers). */
kvcommResult_t kvcommPublish(kvcommPublisher_t publisher, const kvcommCacheTensor* tensors, size_t numTensors,
                             const kvcommSlotMapping* slots, size_t numTokens, kvcommStream_t stream,
                             kvcommPublishThen_t then, int lane);
/** A new handle on the publisher's barrier (free it with kvcommBarrierDestroy; it keeps the publisher's barrier
 *  alive after kvcommPublisherDestroy): kvcommBarrierSync, kvcommBarrierSignal, kvcommBarrierWait, the device handle
 *  and device errors. Every call on it refuses a closed buffer. In Fallback mode it is a collective (a small NCCL or
 *  bootstrap allgather): Sync and Signal run the whole of it, Wait only checks its lane, kvcommBarrierDeviceHandle
 *  returns kvcommInvalidArgument. */
kvcommResult_t kvcommPublisherBarrier(kvcommPublisher_t publisher, kvcommBarrier_t* barrier);
kvcommResult_t kvcommPublisherMode(kvcommPublisher_t publisher, kvcommPublishMode_t* mode);
/** Why this mode was chosen; valid for the publisher's life. */
kvcommResult_t kvcommPublisherModeReason(kvcommPublisher_t publisher, const char** reason);
/** Reads (and clears) the first device error since the last call. Synchronise the publishing stream first. */
kvcommResult_t kvcommPublisherPollError(kvcommPublisher_t publisher, kvcommDeviceError* error);
/** Returns the recorded device error, if any, as a result (kvcommInvalidArgument for a slot out of range,
 *  kvcommTimeout for a barrier) with its message in kvcommGetLastError(); kvcommSuccess otherwise. */
kvcommResult_t kvcommPublisherCheckErrors(kvcommPublisher_t publisher);

/* ---- barrier ------------------------------------------------------------------------------------------------ */

/** Options of kvcommBarrierCreate; kvcommBarrierOptionsInit fills the C++ defaults. */
typedef struct {
  int lanes;               /**< independent epoch sequences, 1..8 (default 2), the same on every member */
  int64_t timeoutMs;       /**< bound on every wait; < 0: KVCOMM_BARRIER_TIMEOUT_MS (default); 0 is 1 ms, above
                                86400000 (a day) is a day */
  kvcommMemoryKind_t kind; /**< where the signal area lives (default kvcommMemoryAuto: CUDA with a current
                                CUDA context, else host); must resolve the same on every member */
} kvcommBarrierOptions;

kvcommResult_t kvcommBarrierOptionsInit(kvcommBarrierOptions* options);
/** Collective over `comm`: allocates and zeroes a small symmetric signal area. Every member must map every other
 *  (one host; P2P between the GPUs), else kvcommUnsupported on every rank. `options` NULL: defaults. */
kvcommResult_t kvcommBarrierCreate(kvcommComm_t comm, const kvcommBarrierOptions* options, kvcommBarrier_t* barrier);
/** Frees this handle (local). NULL is a no-op. */
kvcommResult_t kvcommBarrierDestroy(kvcommBarrier_t barrier);
/** Signal and wait in one launch (kvcomm::Barrier::sync): returns, in stream order, once every member reached
 *  the same epoch on `lane`. */
kvcommResult_t kvcommBarrierSync(kvcommBarrier_t barrier, kvcommStream_t stream, int lane);
/** Announces this rank's next epoch on `lane` (system-scope release of everything the stream did before). */
kvcommResult_t kvcommBarrierSignal(kvcommBarrier_t barrier, kvcommStream_t stream, int lane);
/** Returns (in stream order) once every member announced this rank's current epoch on `lane` (acquire). Per lane,
 *  calls alternate Signal, Wait (Sync counts as both). */
kvcommResult_t kvcommBarrierWait(kvcommBarrier_t barrier, kvcommStream_t stream, int lane);
kvcommResult_t kvcommBarrierLanes(kvcommBarrier_t barrier, int* lanes);
/** The resolved kind (never kvcommMemoryAuto). */
kvcommResult_t kvcommBarrierKind(kvcommBarrier_t barrier, kvcommMemoryKind_t* kind);
/** A new handle on the barrier's group (free it with kvcommCommDestroy). */
kvcommResult_t kvcommBarrierComm(kvcommBarrier_t barrier, kvcommComm_t* comm);
/** Bytes of a kvcomm::BarrierDeviceHandle (kvcomm/device/barrier.hpp), for CUDA C++ kernels that fuse the barrier:
 *  copies the handle into `handle` when handleBytes is large enough (else kvcommInvalidArgument); *needed (if not
 *  NULL) receives its size. `handle` may be NULL with handleBytes 0. Valid while the barrier lives. */
kvcommResult_t kvcommBarrierDeviceHandle(kvcommBarrier_t barrier, void* handle, size_t handleBytes, size_t* needed);
/** Reads (and clears) the first device error since the last call. Synchronise the stream first. */
kvcommResult_t kvcommBarrierPollError(kvcommBarrier_t barrier, kvcommDeviceError* error);
/** The recorded device error, if any: a BarrierTimeout as kvcommTimeout with its message (rank, peer, lane) in
 *  kvcommGetLastError(); a PeerFailed (a wait stopped by an abort or a member's death) as the communicator's own
 *  error, kvcommAborted or kvcommNetworkError; kvcommSuccess otherwise. Host barriers return those from the call
 *  itself. */
kvcommResult_t kvcommBarrierCheckErrors(kvcommBarrier_t barrier);

/* ---- fetch ---------------------------------------------------------------------------------------------------- */
/* Pull KV blocks that live in another member's cache straight into this rank's own blocks. Every member registers
 * its own layout (regions indexed by one block id) once; a request names a source rank and block-id pairs; everything
 * is validated before anything moves (see docs/api/fetch.md for the C++ semantics). */

/** One region of a KV layout, bytes from the buffer's base: block b occupies
 *  [offset + b * blockStride, offset + b * blockStride + blockBytes). */
typedef struct {
  size_t offset;
  size_t blockBytes;  /**< bytes of one block in this region (what a fetch copies) */
  size_t blockStride; /**< bytes between consecutive blocks (0: blockBytes) */
  size_t numBlocks;   /**< valid block ids are [0, numBlocks) */
} kvcommKvRegion;

/** What moves a fetch's bytes. */
typedef enum KVCOMM_ENUM_BASE {
  kvcommFetchPathAuto = 0,   /**< per run: copy engines for long runs, else the kernel (CUDA); host on host memory */
  kvcommFetchPathKernel = 1, /**< an SM gather kernel (CUDA buffers) */
  kvcommFetchPathCopyEngine = 2, /**< one copy-engine descriptor per run (CUDA buffers) */
  kvcommFetchPathHost = 3,       /**< CPU copies (host buffers) */
  kvcommFetchPathNetwork = 4     /**< reported only (kvcommFetchPlanInfo.path): every run goes over TCP or RDMA;
                                      refused as options->path */
} kvcommFetchPath_t;

/** Where kvcommFetcherFetch checks its pairs (kvcommFetchOptions.validation). */
typedef enum KVCOMM_ENUM_BASE {
  kvcommFetchValidationHost = 0,  /**< on the host before anything is enqueued: a bad pair fails the call */
  kvcommFetchValidationDevice = 1 /**< CUDA, same-host sources: the kernel checks every pair; any bad pair and
                                       nothing is copied (kvcommFetcherCheckErrors names it); host work O(requests) */
} kvcommFetchValidation_t;

/** What carries a fetch's bytes from a source member to this rank (kvcommFetcherTransport). */
typedef enum KVCOMM_ENUM_BASE {
  kvcommFetchTransportNone = 0, /**< the source cannot be reached (a plan naming it says why) */
  kvcommFetchTransportPeer = 1, /**< the peer mappings of one host (and this rank's own blocks) */
  kvcommFetchTransportTcp = 2,  /**< the source's fetch server over TCP */
  kvcommFetchTransportRdma = 3  /**< RDMA READ from the source's registered memory */
} kvcommFetchTransport_t;

/** Blocks to pull from one source member, ids in host memory: pair i copies source block srcBlocks[i] (in the
 *  source's layout) into destination block dstBlocks[i] (in this rank's layout), in every region. A pair with -1 on
 *  either side is skipped; any other negative id is an error. */
typedef struct {
  int srcRank; /**< member to read from (this rank itself is allowed) */
  const int64_t* srcBlocks;
  const int64_t* dstBlocks;
  size_t count;           /**< pairs */
  uint64_t srcLayoutHash; /**< 0: accept the source's registered layout; else it must equal this hash */
} kvcommFetchRequest;

/** Per-call options; kvcommFetchOptionsInit fills the defaults (all zero: path Auto). */
typedef struct {
  kvcommFetchPath_t path;       /**< Auto honours KVCOMM_FETCH_PATH; a path that cannot run is kvcommUnsupported */
  size_t copyEngineMinRunBytes; /**< Auto on CUDA: runs of at least this many bytes go to the copy engines
                                     (0: KVCOMM_FETCH_CE_MIN_BYTES) */
  uint64_t maxBytesPerSecond;   /**< polled fetches on host memory: pace the copies (0: unlimited) */
  kvcommFetchValidation_t validation; /**< kvcommFetcherFetch only (plans, starts and fetchAll check on the host) */
} kvcommFetchOptions;

/** What a plan does (kvcommFetchPlanGetInfo; returned by kvcommFetch and kvcommFetchAll). */
typedef struct {
  size_t pairsIn;      /**< block pairs named by the requests */
  size_t pairsSkipped; /**< pairs with -1 */
  size_t runsOut;      /**< copies after coalescing (consecutive blocks on both sides, one region) */
  size_t kernelRuns;
  size_t copyEngineRuns;
  size_t hostRuns;
  size_t bytes;           /**< bytes to copy */
  kvcommFetchPath_t path; /**< the one path the same-host runs use, Auto when they use both kernel and copy
                               engines, Network when every run goes over TCP or RDMA */
  double planMicros;      /**< host time spent validating and coalescing */
  size_t tcpRuns;         /**< runs the TCP transport moves (sources reached over TCP; not in the counts above) */
  size_t rdmaRuns;        /**< runs RDMA READs move (sources reached over RDMA; not in the counts above) */
} kvcommFetchPlanInfo;

/** Block pairs in device memory (CUDA buffers) or host memory (host buffers), for kvcommFetchDevice. */
typedef struct {
  const int64_t* srcBlocks; /**< [count]; -1 skips the pair */
  const int64_t* dstBlocks; /**< [count]; -1 skips the pair */
  const int32_t* srcRanks;  /**< [count] source member of each pair; NULL: srcRank for every pair */
  int srcRank;
  size_t count;
} kvcommDeviceFetchBatch;

typedef enum KVCOMM_ENUM_BASE {
  kvcommFetchInProgress = 0,
  kvcommFetchDone = 1,
  kvcommFetchFailed = 2
} kvcommFetchState_t;

/** What kvcommFetchOperationTest/Wait report. The failed blocks and the error text of a Failed operation are read
 *  with kvcommFetchOperationFailedBlocks and kvcommFetchOperationError. */
typedef struct {
  kvcommFetchState_t state;
  size_t bytesDone; /**< bytes known to have landed (visible in this rank's memory) */
  size_t bytesTotal;
  size_t numFailedBlocks; /**< Failed: destination blocks whose bytes are not known to have landed */
} kvcommFetchStatus;

/** Options of kvcommFetcherCreate; kvcommFetcherOptionsInit fills the C++ defaults. */
typedef struct {
  int lanes;                /**< unused, kept for the ABI: checked (1..KVCOMM_MAX_BARRIER_LANES), then ignored;
                                 kvcommFetchAll's barriers use one lane */
  int64_t barrierTimeoutMs; /**< bound on the collective form's barrier waits; < 0: KVCOMM_BARRIER_TIMEOUT_MS */
} kvcommFetcherOptions;

kvcommResult_t kvcommFetcherOptionsInit(kvcommFetcherOptions* options);
kvcommResult_t kvcommFetchOptionsInit(kvcommFetchOptions* options);
/** "auto", "kernel", "copy", "host", "network"; "unknown" outside the enum. Never NULL. */
const char* kvcommFetchPathName(kvcommFetchPath_t path);
/** FNV-1a hash of a layout (regions and the engine's version): what requests and peers compare. */
kvcommResult_t kvcommKvLayoutHash(const kvcommKvRegion* regions, size_t numRegions, uint64_t version, uint64_t* hash);

/** Collective over the buffer's group: registers this rank's layout (`numRegions` regions and the engine's
 *  `version`), validates it against the backed part of the buffer and learns every member's. Layouts must be
 *  compatible (same region count, same blockBytes region by region) or every rank gets kvcommInvalidArgument naming
 *  the rank and region. `options` NULL: defaults. */
kvcommResult_t kvcommFetcherCreate(kvcommBuffer_t buffer, const kvcommKvRegion* regions, size_t numRegions,
                                   uint64_t version, const kvcommFetcherOptions* options, kvcommFetcher_t* fetcher);
/** Frees this handle (local). Plans and operations keep what they need; NULL is a no-op. */
kvcommResult_t kvcommFetcherDestroy(kvcommFetcher_t fetcher);

/** Validates and coalesces without moving anything: kvcommInvalidArgument naming the request and pair (id out of
 *  range, negative id other than -1, duplicate destination, stale generation, layout hash mismatch),
 *  kvcommUnsupported when a source cannot be reached by the demanded path. `options` NULL: defaults. */
kvcommResult_t kvcommFetchPlanCreate(kvcommFetcher_t fetcher, const kvcommFetchRequest* requests, size_t numRequests,
                                     const kvcommFetchOptions* options, kvcommFetchPlan_t* plan);
kvcommResult_t kvcommFetchPlanDestroy(kvcommFetchPlan_t plan);
kvcommResult_t kvcommFetchPlanGetInfo(kvcommFetchPlan_t plan, kvcommFetchPlanInfo* info);
/** The buffer generation the plan was validated at (a later grow/commit/release makes it stale). */
kvcommResult_t kvcommFetchPlanGeneration(kvcommFetchPlan_t plan, uint64_t* generation);
/** Enqueues a plan made by this fetcher (stream-ordered; host buffers: done when it returns). Refused while the
 *  stream is being captured (use kvcommFetchDevice). */
kvcommResult_t kvcommFetchSubmit(kvcommFetcher_t fetcher, kvcommFetchPlan_t plan, kvcommStream_t stream);
/** Plan + submit. `info` (may be NULL) receives the plan's info. */
kvcommResult_t kvcommFetch(kvcommFetcher_t fetcher, const kvcommFetchRequest* requests, size_t numRequests,
                           kvcommStream_t stream, const kvcommFetchOptions* options, kvcommFetchPlanInfo* info);
/** Stream-ordered fetch of ids in device memory (host memory for host buffers), safe to capture in a CUDA graph.
 *  CUDA: a bad id skips that pair and is reported by kvcommFetcherCheckErrors; host buffers refuse the whole batch
 *  before copying. Keep the id arrays alive until the stream ran the fetch. */
kvcommResult_t kvcommFetchDevice(kvcommFetcher_t fetcher, const kvcommDeviceFetchBatch* batch, kvcommStream_t stream);
/** Starts a polled fetch (validated like kvcommFetchPlanCreate; the ids are read before it returns). `stream`: CUDA
 *  buffers enqueue on it (NULL: the fetcher's own stream); host buffers copy on a worker thread (at most 256 KiB
 *  unpaced: before it returns). */
kvcommResult_t kvcommFetchStart(kvcommFetcher_t fetcher, const kvcommFetchRequest* requests, size_t numRequests,
                                const kvcommFetchOptions* options, kvcommStream_t stream, kvcommFetchOperation_t* op);
/** Non-blocking progress of a polled fetch. Done and Failed are final. */
kvcommResult_t kvcommFetchOperationTest(kvcommFetchOperation_t op, kvcommFetchStatus* status);
/** Blocks up to `timeoutMs` (< 0: until it ends). Expiry returns kvcommSuccess with state InProgress and cancels
 *  nothing. */
kvcommResult_t kvcommFetchOperationWait(kvcommFetchOperation_t op, int64_t timeoutMs, kvcommFetchStatus* status);
/** The destination block ids of a Failed operation (as of the last Test/Wait; each may be partly written), by the
 *  list pattern: min(count, capacity) written, *count = status.numFailedBlocks. Empty unless Failed. */
kvcommResult_t kvcommFetchOperationFailedBlocks(kvcommFetchOperation_t op, int64_t* blocks, size_t capacity,
                                                size_t* count);
/** Why a Failed operation failed (as of the last Test/Wait; "" otherwise), copied like kvcommCommTopologyString. */
kvcommResult_t kvcommFetchOperationError(kvcommFetchOperation_t op, char* text, size_t textBytes, size_t* needed);
/** Waits until nothing can still write the destination, then frees the handle. NULL is a no-op. */
kvcommResult_t kvcommFetchOperationDestroy(kvcommFetchOperation_t op);

/** Collective: every member passes its own requests (possibly none); returns, in stream order, once every member's
 *  blocks landed. Starts and ends with a barrier. kvcommUnsupported unless every member maps every other. */
kvcommResult_t kvcommFetchAll(kvcommFetcher_t fetcher, const kvcommFetchRequest* requests, size_t numRequests,
                              kvcommStream_t stream, const kvcommFetchOptions* options, kvcommFetchPlanInfo* info);
/** Collective: revalidates every member's layout against the buffer as it is now (after a grow/commit/release) and
 *  adopts its generation. Plans made before stay stale. */
kvcommResult_t kvcommFetcherRefresh(kvcommFetcher_t fetcher);

/** Member `rank`'s registered layout: its regions by the list pattern, and (if not NULL) its version. */
kvcommResult_t kvcommFetcherLayout(kvcommFetcher_t fetcher, int rank, kvcommKvRegion* regions, size_t capacity,
                                   size_t* count, uint64_t* version);
kvcommResult_t kvcommFetcherLayoutHash(kvcommFetcher_t fetcher, int rank, uint64_t* hash);
/** The buffer generation the layouts were validated at. */
kvcommResult_t kvcommFetcherGeneration(kvcommFetcher_t fetcher, uint64_t* generation);
/** The transport that carries fetches from member `rank` to this rank (kvcomm::Fetcher::transport). */
kvcommResult_t kvcommFetcherTransport(kvcommFetcher_t fetcher, int rank, kvcommFetchTransport_t* transport);
/** Bytes of a kvcomm::FetchDeviceHandle (kvcomm/device/fetch.hpp: warpPullBlock), copied like
 *  kvcommBarrierDeviceHandle. Valid while the fetcher lives. */
kvcommResult_t kvcommFetcherDeviceHandle(kvcommFetcher_t fetcher, void* handle, size_t handleBytes, size_t* needed);
/** Reads (and clears) the first device error of kvcommFetchDevice / kvcommFetchAll. Synchronise the stream first. */
kvcommResult_t kvcommFetcherPollError(kvcommFetcher_t fetcher, kvcommDeviceError* error);
/** The recorded device error as a result: kvcommInvalidArgument for a bad block id (naming the pair), kvcommTimeout
 *  for the collective form's barrier, the communicator's own error (kvcommAborted, or kvcommNetworkError naming a
 *  dead member) for a barrier wait the group's failure stopped; kvcommSuccess when none. */
kvcommResult_t kvcommFetcherCheckErrors(kvcommFetcher_t fetcher);

/* ---- arenas --------------------------------------------------------------------------------------------------- */
/* KV memory shared between independent processes of one host (a KV offload/cache server and the engines it serves;
 * see docs/api/arena.md for the C++ semantics, which these calls keep). An owner creates an arena described by a KV
 * layout (kvcommKvRegion, as for fetch) and offers it over a session; the importer presents the one-use capability
 * and maps the arena (kvcommArenaSessionImport). Either side may own. Processes meet through a server's socket
 * address; no communicator is involved, so messages name no rank ("kvcomm [rank ?] ...").
 *
 * Call order:
 *   server: kvcommArenaServerListen -> kvcommArenaServerAccept -> (session)
 *   client: kvcommArenaSessionConnect -> (session)
 *   owner:    kvcommArenaCreate -> kvcommArenaSessionOffer -> send the capability (kvcommArenaSessionSend, or any RPC)
 *   importer: receive it -> kvcommArenaSessionImport -> kvcommArenaImportData / Read / Write / PinCreate ...
 *             -> kvcommArenaImportClose -> kvcommArenaImportDestroy
 *   owner:    kvcommArenaFree (kvcommBusy while leases or pins exist) -> kvcommArenaDestroy
 *   both:     kvcommArenaSessionDestroy, kvcommArenaServerDestroy (local, any order: an import keeps its session).
 * A timeout below 0 (where a call accepts one) means the documented default or no bound, as in the C++ API. */

/** The most bytes of one application message (kvcommArenaSessionSend / kvcommArenaSessionReceive). */
#define KVCOMM_ARENA_MAX_MESSAGE_BYTES 61440
/** Default time to live of a capability (ms). */
#define KVCOMM_ARENA_DEFAULT_TTL_MS 60000
/** Bytes of a legacy CUDA IPC handle (CUipcMemHandle). */
#define KVCOMM_ARENA_IPC_HANDLE_BYTES 64

/** What an import does when its owner goes away (process death, closed session, the owner released the arena). */
typedef enum KVCOMM_ENUM_BASE {
  kvcommArenaOwnerLossKeep = 0,   /**< keep the mapping until the import is closed (readable); calls fail with
                                       kvcommNetworkError */
  kvcommArenaOwnerLossRelease = 1 /**< unmap as soon as no pin is left (servers reclaiming a dead client's memory) */
} kvcommArenaOwnerLoss_t;

/** Options of kvcommArenaCreate; kvcommArenaOptionsInit fills the C++ defaults. */
typedef struct {
  kvcommMemoryKind_t kind; /**< kvcommMemoryAuto: CUDA when this thread has a current CUDA context, else host */
  size_t capacity;         /**< address space reserved for growth (0: the layout's extent, no growth) */
  int legacyIpc;           /**< 0 or 1. CUDA only: cuMemAlloc the whole capacity, exportable as a legacy IPC handle
                                (kvcommArenaGetIpcHandle); such memory cannot be registered by an importer's NIC */
} kvcommArenaOptions;

/** What an importer presents (kvcomm::ArenaCapability, the same 48 bytes): a one-use 128-bit token bound to (arena,
 *  generation, importer pid and uid) with an expiry. Plain bytes: send it over the session or any RPC. */
typedef struct {
  uint64_t arenaId;
  uint64_t generation; /**< the arena's generation when issued; a grow or shrink since makes it stale */
  uint8_t token[16];
  int32_t importerPid;  /**< the only process that may present it */
  uint32_t importerUid; /**< and its user */
  uint64_t expiresAtMs; /**< CLOCK_REALTIME milliseconds; informational (the owner's clock decides) */
} kvcommArenaCapability;

/** The legacy CUDA IPC handle of a legacyIpc arena (CUipcMemHandle), for RPCs that carry it. */
typedef struct {
  uint8_t bytes[KVCOMM_ARENA_IPC_HANDLE_BYTES];
} kvcommArenaIpcHandle;

/** What kvcommArenaGrow did. The failures' text is read with kvcommArenaGrowthFailures. */
typedef struct {
  uint64_t generation;     /**< the arena's new generation */
  size_t importersUpdated; /**< importers that mapped the new bytes before the call returned */
  size_t numFailures;      /**< importers that failed or did not answer in time (the growth itself stands) */
} kvcommArenaGrowth;

/** Options of kvcommArenaSessionImport; kvcommArenaImportOptionsInit fills the C++ defaults. */
typedef struct {
  kvcommArenaOwnerLoss_t onOwnerLoss; /**< default kvcommArenaOwnerLossKeep */
  int64_t timeoutMs;                  /**< bound on the import request (< 0: the session's timeout) */
} kvcommArenaImportOptions;

/** Options of kvcommArenaSessionConnect; kvcommArenaSessionOptionsInit fills the C++ defaults. */
typedef struct {
  int64_t timeoutMs; /**< bound on connecting and the handshake, and the default bound of import and close
                          requests (< 0: 10 s) */
} kvcommArenaSessionOptions;

/** Options of kvcommArenaServerListen; kvcommArenaServerOptionsInit fills the C++ defaults. */
typedef struct {
  size_t maxSessions;          /**< most connections at once (default 1024) */
  size_t maxPendingHandshakes; /**< most connections still handshaking at once (default 64) */
  int64_t handshakeTimeoutMs;  /**< a connection must complete its handshake within this (< 0: 1 s) */
  int64_t requestTimeoutMs;    /**< default bound of requests over accepted sessions (< 0: 10 s) */
} kvcommArenaServerOptions;

kvcommResult_t kvcommArenaOptionsInit(kvcommArenaOptions* options);
kvcommResult_t kvcommArenaImportOptionsInit(kvcommArenaImportOptions* options);
kvcommResult_t kvcommArenaSessionOptionsInit(kvcommArenaSessionOptions* options);
kvcommResult_t kvcommArenaServerOptionsInit(kvcommArenaServerOptions* options);

/* -- the owner's arena -- */

/** Allocates the layout's extent (`numRegions` regions, the engine's `version`) and reserves options->capacity bytes
 *  of address space for growth. kvcommInvalidArgument for a malformed layout (see kvcommFetcherCreate) or options;
 *  kvcommUnsupported for CUDA memory without a usable driver or current context. `options` NULL: defaults. */
kvcommResult_t kvcommArenaCreate(const kvcommKvRegion* regions, size_t numRegions, uint64_t version,
                                 const kvcommArenaOptions* options, kvcommArena_t* arena);
/** Frees the handle. An arena not freed (kvcommArenaFree) is withdrawn: importers are told and keep their mappings
 *  until they close them; the memory is returned when the last one does. NULL is a no-op. */
kvcommResult_t kvcommArenaDestroy(kvcommArena_t arena);
/** Base address (device memory for CUDA arenas), stable for the arena's life; NULL once freed. */
kvcommResult_t kvcommArenaData(kvcommArena_t arena, void** data);
/** Bytes backed now (a multiple of the granularity). */
kvcommResult_t kvcommArenaBytes(kvcommArena_t arena, size_t* bytes);
kvcommResult_t kvcommArenaCapacity(kvcommArena_t arena, size_t* bytes);
kvcommResult_t kvcommArenaGranularity(kvcommArena_t arena, size_t* bytes);
/** The resolved kind (never kvcommMemoryAuto). */
kvcommResult_t kvcommArenaKind(kvcommArena_t arena, kvcommMemoryKind_t* kind);
/** "memfd", "posix_fd" or "cuda_ipc", copied like kvcommCommTopologyString. */
kvcommResult_t kvcommArenaHandleType(kvcommArena_t arena, char* text, size_t textBytes, size_t* needed);
/** CUDA ordinal of the memory (-1 for host memory). */
kvcommResult_t kvcommArenaDevice(kvcommArena_t arena, int* device);
/** Random 64-bit id, unique per arena. */
kvcommResult_t kvcommArenaId(kvcommArena_t arena, uint64_t* id);
/** Starts at 1; increments with every grow and shrink. */
kvcommResult_t kvcommArenaGeneration(kvcommArena_t arena, uint64_t* generation);
/** The arena's layout: its regions by the list pattern, and (if not NULL) its version. */
kvcommResult_t kvcommArenaLayout(kvcommArena_t arena, kvcommKvRegion* regions, size_t capacity, size_t* count,
                                 uint64_t* version);
/** Imports that hold a lease now. */
kvcommResult_t kvcommArenaLeases(kvcommArena_t arena, size_t* leases);
/** Pins (operations in flight) on the arena in this process. */
kvcommResult_t kvcommArenaOperations(kvcommArena_t arena, size_t* operations);
/** Pids of the processes holding leases (one entry per lease), by the list pattern. */
kvcommResult_t kvcommArenaImporters(kvcommArena_t arena, int* pids, size_t capacity, size_t* count);
/** Capabilities issued and not yet used, expired or revoked. */
kvcommResult_t kvcommArenaLiveCapabilities(kvcommArena_t arena, size_t* count);
/** *freed = 1 once kvcommArenaFree released the memory, else 0. */
kvcommResult_t kvcommArenaFreed(kvcommArena_t arena, int* freed);
/** A one-use capability for process `pid` (user `uid`) to import the arena within `ttlMs` ms (1 ms to one day). */
kvcommResult_t kvcommArenaOffer(kvcommArena_t arena, int pid, uint32_t uid, int64_t ttlMs,
                                kvcommArenaCapability* capability);
/** Withdraws every capability not yet used (imports already made keep their leases). */
kvcommResult_t kvcommArenaRevokeCapabilities(kvcommArena_t arena);
/** Maps [bytes, newBytes) (rounded up to the granularity) at the same addresses here and in every importer, waiting
 *  up to `timeoutMs` (< 0: 10 s) for each importer to map them. `growth` (may be NULL) says what happened.
 *  kvcommInvalidArgument beyond the capacity. Capabilities issued before are stale. */
kvcommResult_t kvcommArenaGrow(kvcommArena_t arena, size_t newBytes, int64_t timeoutMs, kvcommArenaGrowth* growth);
/** kvcommArenaGrow to the new layout's extent, then the new layout is the arena's (and the importers'). */
kvcommResult_t kvcommArenaGrowLayout(kvcommArena_t arena, const kvcommKvRegion* regions, size_t numRegions,
                                     uint64_t version, int64_t timeoutMs, kvcommArenaGrowth* growth);
/** The failures of the last kvcommArenaGrow / kvcommArenaGrowLayout made through this handle, one line per importer
 *  ('\n'-separated; "" when none), copied like kvcommCommTopologyString. */
kvcommResult_t kvcommArenaGrowthFailures(kvcommArena_t arena, char* text, size_t textBytes, size_t* needed);
/** Releases whole chunks from the top, keeping at least `newBytes`. kvcommBusy (nothing changed) while any lease
 *  exists or a pin overlaps the released bytes after waiting up to `waitMs` (0: no wait; < 0: no bound). */
kvcommResult_t kvcommArenaShrink(kvcommArena_t arena, size_t newBytes, int64_t waitMs);
/** kvcommArenaShrink to the new layout's extent, which becomes the arena's layout. */
kvcommResult_t kvcommArenaShrinkLayout(kvcommArena_t arena, const kvcommKvRegion* regions, size_t numRegions,
                                       uint64_t version, int64_t waitMs);
/** Unmaps and releases the memory now; kvcommBusy (nothing changed) while leases or pins exist after waiting up to
 *  `waitMs` (0: no wait; < 0: no bound). Afterwards every call but the queries returns kvcommInvalidArgument; a second
 *  free does nothing. The handle must still be destroyed. */
kvcommResult_t kvcommArenaFree(kvcommArena_t arena, int64_t waitMs);
/** Synchronous copies between [offset, offset + bytes) of the arena and host memory `src` / `dst` (memcpy, or
 *  cuMemcpyHtoD / DtoH for CUDA arenas; device-to-device copies use the arena's address), pinned while they run.
 *  kvcommInvalidArgument outside the backed bytes. */
kvcommResult_t kvcommArenaWrite(kvcommArena_t arena, size_t offset, const void* src, size_t bytes);
kvcommResult_t kvcommArenaRead(kvcommArena_t arena, size_t offset, void* dst, size_t bytes);
/** Pins [offset, offset + bytes) for an operation in flight: while the pin lives the arena cannot be freed or shrunk
 *  under it. */
kvcommResult_t kvcommArenaPinCreate(kvcommArena_t arena, size_t offset, size_t bytes, kvcommArenaPin_t* pin);
/** The legacy CUDA IPC handle of a legacyIpc arena; kvcommInvalidArgument for other arenas. */
kvcommResult_t kvcommArenaGetIpcHandle(kvcommArena_t arena, kvcommArenaIpcHandle* handle);

/* -- pins -- */

/** Ends the operation and frees the handle. NULL is a no-op. */
kvcommResult_t kvcommArenaPinDestroy(kvcommArenaPin_t pin);
/** Ends the operation now (idempotent); the handle stays, a pin of nothing (data NULL, offset and bytes 0). */
kvcommResult_t kvcommArenaPinRelease(kvcommArenaPin_t pin);
/** Start of the pinned range in this process (device memory for CUDA arenas); NULL once released. */
kvcommResult_t kvcommArenaPinData(kvcommArenaPin_t pin, void** data);
kvcommResult_t kvcommArenaPinOffset(kvcommArenaPin_t pin, size_t* offset);
kvcommResult_t kvcommArenaPinBytes(kvcommArenaPin_t pin, size_t* bytes);

/* -- imports -- */

/** Opens a legacy CUDA IPC handle (the layout's extent must fit in the owner's allocation). No lease, no dead-owner
 *  detection; the memory cannot be registered with a NIC or re-exported by this process. */
kvcommResult_t kvcommArenaImportOpenIpc(const kvcommArenaIpcHandle* handle, const kvcommKvRegion* regions,
                                        size_t numRegions, uint64_t version, kvcommArenaImport_t* import);
/** Closes without waiting (an import with pins left closes when the last pin is released) and frees the handle.
 *  NULL is a no-op. */
kvcommResult_t kvcommArenaImportDestroy(kvcommArenaImport_t import);
/** Base address of the mapping (device memory for CUDA arenas): stable while the import is open, across growth;
 *  NULL after close (or after kvcommArenaOwnerLossRelease unmapped it). */
kvcommResult_t kvcommArenaImportData(kvcommArenaImport_t import, void** data);
/** Bytes mapped now (follows the owner's growth). */
kvcommResult_t kvcommArenaImportBytes(kvcommArenaImport_t import, size_t* bytes);
kvcommResult_t kvcommArenaImportCapacity(kvcommArenaImport_t import, size_t* bytes);
kvcommResult_t kvcommArenaImportKind(kvcommArenaImport_t import, kvcommMemoryKind_t* kind);
/** "memfd", "posix_fd" or "cuda_ipc", copied like kvcommCommTopologyString. */
kvcommResult_t kvcommArenaImportHandleType(kvcommArenaImport_t import, char* text, size_t textBytes, size_t* needed);
kvcommResult_t kvcommArenaImportArenaId(kvcommArenaImport_t import, uint64_t* id);
/** The owner's generation this import has mapped. */
kvcommResult_t kvcommArenaImportGeneration(kvcommArenaImport_t import, uint64_t* generation);
/** The arena's layout as this import knows it, by the list pattern (like kvcommArenaLayout). */
kvcommResult_t kvcommArenaImportLayout(kvcommArenaImport_t import, kvcommKvRegion* regions, size_t capacity,
                                       size_t* count, uint64_t* version);
kvcommResult_t kvcommArenaImportOwnerPid(kvcommArenaImport_t import, int* pid);
/** *alive = 0 once the owner is known gone (process death, closed session, arena released), else 1. */
kvcommResult_t kvcommArenaImportOwnerAlive(kvcommArenaImport_t import, int* alive);
/** Why the owner is gone ("" while alive), copied like kvcommCommTopologyString. */
kvcommResult_t kvcommArenaImportOwnerLostReason(kvcommArenaImport_t import, char* text, size_t textBytes,
                                                size_t* needed);
/** kvcommNetworkError naming the owner and the reason when it is gone, kvcommInvalidArgument when closed. */
kvcommResult_t kvcommArenaImportCheck(kvcommArenaImport_t import);
/** Pins (operations in flight) on this import. */
kvcommResult_t kvcommArenaImportOperations(kvcommArenaImport_t import, size_t* operations);
/** Pins [offset, offset + bytes). kvcommNetworkError when the owner is gone, kvcommAborted while closing,
 *  kvcommInvalidArgument outside the mapped bytes or after close. */
kvcommResult_t kvcommArenaImportPinCreate(kvcommArenaImport_t import, size_t offset, size_t bytes,
                                          kvcommArenaPin_t* pin);
/** Synchronous copies between the mapping and host memory, pinned while they run (errors as
 *  kvcommArenaImportPinCreate). */
kvcommResult_t kvcommArenaImportWrite(kvcommArenaImport_t import, size_t offset, const void* src, size_t bytes);
kvcommResult_t kvcommArenaImportRead(kvcommArenaImport_t import, size_t offset, void* dst, size_t bytes);
/** Drains (waits up to `timeoutMs` for every pin; < 0: no bound; kvcommTimeout leaves the import closing), unmaps,
 *  and tells the owner, which drops the lease before this returns. Idempotent; works after the owner is gone. The
 *  handle must still be destroyed. */
kvcommResult_t kvcommArenaImportClose(kvcommArenaImport_t import, int64_t timeoutMs);
kvcommResult_t kvcommArenaImportClosed(kvcommArenaImport_t import, int* closed);

/* -- sessions -- */

/** Connects to the server at `address` ("@name": abstract Unix socket; otherwise a filesystem path), waiting for it
 *  to appear until the timeout; the server must run as the same uid. kvcommNetworkError when refused (with the
 *  server's reason) or nobody is there; kvcommTimeout when the handshake was never answered. `options` NULL:
 *  defaults. */
kvcommResult_t kvcommArenaSessionConnect(const char* address, const kvcommArenaSessionOptions* options,
                                         kvcommArenaSession_t* session);
/** Frees the handle; the session ends once no import made over it remains. NULL is a no-op. */
kvcommResult_t kvcommArenaSessionDestroy(kvcommArenaSession_t session);
/** The peer process (SO_PEERCRED). */
kvcommResult_t kvcommArenaSessionPeerPid(kvcommArenaSession_t session, int* pid);
kvcommResult_t kvcommArenaSessionPeerUid(kvcommArenaSession_t session, uint32_t* uid);
/** *alive = 0 once the session ended (peer closed or died, protocol error, close), else 1. */
kvcommResult_t kvcommArenaSessionAlive(kvcommArenaSession_t session, int* alive);
/** Why it ended ("" while alive), copied like kvcommCommTopologyString. */
kvcommResult_t kvcommArenaSessionLostReason(kvcommArenaSession_t session, char* text, size_t textBytes, size_t* needed);
/** Owner side: a capability for the session's peer to import `arena` within `ttlMs` ms (kvcommArenaOffer bound to
 *  the peer's pid and uid). */
kvcommResult_t kvcommArenaSessionOffer(kvcommArenaSession_t session, kvcommArena_t arena, int64_t ttlMs,
                                       kvcommArenaCapability* capability);
/** Importer side: imports the arena the peer offered. kvcommInvalidArgument with the owner's reason when the
 *  capability is refused (forged, already used, expired, issued to another process or generation, arena freed);
 *  kvcommNetworkError when the session is gone; kvcommTimeout after the bound. `options` NULL: defaults. */
kvcommResult_t kvcommArenaSessionImport(kvcommArenaSession_t session, const kvcommArenaCapability* capability,
                                        const kvcommArenaImportOptions* options, kvcommArenaImport_t* import);
/** Sends an application message of at most KVCOMM_ARENA_MAX_MESSAGE_BYTES bytes to the peer. */
kvcommResult_t kvcommArenaSessionSend(kvcommArenaSession_t session, const void* data, size_t bytes);
/** The next application message, waiting up to `timeoutMs` (< 0: no bound; kvcommTimeout on expiry,
 *  kvcommNetworkError once the session ended and no message is left). *bytes receives its size. When it fits in
 *  `capacity` it is copied into `data` and consumed; otherwise nothing is copied and it stays next in line (pass
 *  NULL and 0 to learn the size first, then call again with at least *bytes). */
kvcommResult_t kvcommArenaSessionReceive(kvcommArenaSession_t session, int64_t timeoutMs, void* data, size_t capacity,
                                         size_t* bytes);
/** Ends the session now: leases over it are dropped on both sides. Idempotent; the handle must still be destroyed. */
kvcommResult_t kvcommArenaSessionClose(kvcommArenaSession_t session);

/* -- servers -- */

/** Listens on `address`: "@name" (abstract Unix socket), a filesystem path (its directory must be mode 0700 and
 *  owned by this user), or NULL / "" for a fresh abstract name (kvcommArenaServerAddress). `options` NULL:
 *  defaults. */
kvcommResult_t kvcommArenaServerListen(const char* address, const kvcommArenaServerOptions* options,
                                       kvcommArenaServer_t* server);
/** Stops listening, ends every session, and frees the handle. NULL is a no-op. */
kvcommResult_t kvcommArenaServerDestroy(kvcommArenaServer_t server);
/** The address clients pass to kvcommArenaSessionConnect, copied like kvcommCommTopologyString. */
kvcommResult_t kvcommArenaServerAddress(kvcommArenaServer_t server, char* text, size_t textBytes, size_t* needed);
/** The next client whose handshake completed, waiting up to `timeoutMs` (< 0: no bound): kvcommTimeout on expiry,
 *  kvcommAborted after kvcommArenaServerClose. */
kvcommResult_t kvcommArenaServerAccept(kvcommArenaServer_t server, int64_t timeoutMs, kvcommArenaSession_t* session);
/** Connections established now. */
kvcommResult_t kvcommArenaServerSessions(kvcommArenaServer_t server, size_t* sessions);
/** Connections refused or dropped before or during the handshake so far. */
kvcommResult_t kvcommArenaServerRefusedConnections(kvcommArenaServer_t server, uint64_t* refused);
/** Stops listening and ends every session (idempotent); the handle must still be destroyed. */
kvcommResult_t kvcommArenaServerClose(kvcommArenaServer_t server);

/* ---- endpoints ------------------------------------------------------------------------------------------------ */
/* KV transfers between processes that meet at run time (a prefill and a decode instance, a KV server and its
 * engines), with no communicator: each process makes one endpoint, registers the memory it has with its KV layout,
 * and hands each registration's metadata (opaque bytes) to its peers over its own channel; a peer connects from the
 * metadata alone and reads remote blocks into its own registered memory, or writes its blocks into the remote's,
 * optionally with a notification. See docs/api/endpoint.md for the C++ semantics, which these calls keep. Endpoints
 * have no rank: messages say "kvcomm [rank ?] ...".
 *
 * Call order:
 *   both:  kvcommEndpointCreate -> kvcommEndpointRegister (or RegisterArena / RegisterBuffer)
 *          -> kvcommRegistrationMetadata (send the bytes to peers)
 *   peer:  kvcommEndpointConnect(metadata) -> kvcommEndpointRead / kvcommEndpointWrite -> kvcommTransferTest / Wait
 *          -> kvcommTransferDestroy; kvcommEndpointNotify; kvcommEndpointNextNotification on the receiving side
 *   end:   kvcommEndpointUnregister (before freeing the memory), kvcommRegistrationDestroy, kvcommRemoteMemoryDestroy,
 *          kvcommEndpointDestroy (closes: unregisters everything). Handles keep what they use alive. */

/** Longest notification message (bytes). */
#define KVCOMM_MAX_NOTIFICATION_BYTES 16384
/** Longest endpoint name carried in metadata (bytes, without the NUL). */
#define KVCOMM_ENDPOINT_NAME_BYTES 63

/** One process's endpoint: its listener, registrations and connections (kvcomm::Endpoint). Thread-safe. */
typedef struct kvcommEndpoint* kvcommEndpoint_t;
/** Memory registered with an endpoint (kvcomm::Registration). Destroying the handle does not unregister. */
typedef struct kvcommRegistration* kvcommRegistration_t;
/** A peer's registration known from its metadata (kvcomm::RemoteMemory). */
typedef struct kvcommRemoteMemory* kvcommRemoteMemory_t;
/** A polled transfer (kvcomm::Transfer). */
typedef struct kvcommTransfer* kvcommTransfer_t;

/** What a registration lets the holders of its metadata do. */
typedef enum KVCOMM_ENUM_BASE {
  kvcommAccessReadWrite = 0, /**< peers read its blocks and write into them */
  kvcommAccessReadOnly = 1   /**< peers read only: a write is refused before any byte lands */
} kvcommAccess_t;

/** Which transport a transfer must take (a demanded one that cannot run is kvcommUnsupported, naming why). */
typedef enum KVCOMM_ENUM_BASE {
  kvcommTransferViaAuto = 0, /**< same-host peer mappings, else RDMA between hosts with devices, else TCP */
  kvcommTransferViaPeer = 1,
  kvcommTransferViaTcp = 2,
  kvcommTransferViaRdma = 3
} kvcommTransferVia_t;

/** Options of kvcommEndpointCreate; kvcommEndpointOptionsInit fills the C++ defaults. */
typedef struct {
  const char* name;              /**< how peers' errors name it (NULL or "": "pid <pid>"); at most
                                      KVCOMM_ENDPOINT_NAME_BYTES bytes */
  const char* tcpAddress;        /**< "a.b.c.d:port" or "[v6]:port" to listen on (NULL or "": this host's address as
                                      KVCOMM_SOCKET_IFNAME picks it, an ephemeral port) */
  int64_t timeoutMs;             /**< a transfer with no progress for this long fails (< 0:
                                      KVCOMM_FETCH_NET_TIMEOUT_MS) */
  int connectionsPerPeer;        /**< parallel connections per (local, remote) registration pair, 1..64 */
  size_t maxQueuedNotifications; /**< notifications received and not yet taken; a sender beyond it gets kvcommBusy
                                      (at least 1) */
} kvcommEndpointOptions;

/** Per-transfer options; kvcommTransferOptionsInit fills the defaults (Auto, no notification). */
typedef struct {
  kvcommTransferVia_t via;
  const void* notify; /**< NULL: no notification; else notifyBytes bytes (0 allowed) delivered to the remote endpoint
                           once the transfer's bytes are in place (a write: visible there; a read: read, so the owner
                           may reuse the blocks). A transfer that fails never delivers it. */
  size_t notifyBytes; /**< at most KVCOMM_MAX_NOTIFICATION_BYTES */
} kvcommTransferOptions;

/** Block ids in device memory (CUDA registrations) or host memory (host registrations), for
 *  kvcommEndpointReadDevice / WriteDevice: pair i moves remote block remoteBlocks[i] and local block localBlocks[i];
 *  -1 skips the pair. */
typedef struct {
  const int64_t* remoteBlocks;
  const int64_t* localBlocks;
  size_t count;
} kvcommDeviceTransferBatch;

/** A notification this endpoint received (kvcommEndpointNextNotification); its bytes go to the caller's array. */
typedef struct {
  uint64_t from;                                 /**< the sending endpoint's id (a restarted sender has another) */
  char fromName[KVCOMM_ENDPOINT_NAME_BYTES + 1]; /**< its name, NUL-terminated */
  uint64_t registration; /**< the registration of this endpoint whose metadata the sender used */
  size_t messageBytes;   /**< the message's size */
} kvcommNotification;

kvcommResult_t kvcommEndpointOptionsInit(kvcommEndpointOptions* options);
kvcommResult_t kvcommTransferOptionsInit(kvcommTransferOptions* options);
/** Listens (TCP) and is ready to register memory and connect to peers. `options` NULL: defaults. kvcommSystemError
 *  when it cannot listen. */
kvcommResult_t kvcommEndpointCreate(const kvcommEndpointOptions* options, kvcommEndpoint_t* endpoint);
/** Closes the endpoint (as kvcommEndpointClose) and frees the handle. NULL is a no-op. */
kvcommResult_t kvcommEndpointDestroy(kvcommEndpoint_t endpoint);
/** Unregisters everything (waiting for transfers, no bound), stops listening and drops every connection.
 *  Idempotent; the handle must still be destroyed. */
kvcommResult_t kvcommEndpointClose(kvcommEndpoint_t endpoint);
/** Random 64-bit id of this endpoint (in its metadata; a restarted process has another). */
kvcommResult_t kvcommEndpointId(kvcommEndpoint_t endpoint, uint64_t* id);
/** Where it listens ("host:port"), copied like kvcommCommTopologyString. */
kvcommResult_t kvcommEndpointAddress(kvcommEndpoint_t endpoint, char* text, size_t textBytes, size_t* needed);

/** Registers [base, base + bytes) of host memory (kvcommMemoryHost: any memory of this process) or CUDA memory
 *  (kvcommMemoryCuda: cudaMalloc, caching-allocator blocks, VMM mappings; `device` its ordinal) with its KV layout
 *  (`numRegions` regions, at most KVCOMM_MAX_FETCH_REGIONS, and the engine's `version`). kvcommInvalidArgument
 *  when the layout is malformed or does not fit in `bytes`, or base is NULL. */
kvcommResult_t kvcommEndpointRegister(kvcommEndpoint_t endpoint, void* base, size_t bytes, kvcommMemoryKind_t kind,
                                      int device, const kvcommKvRegion* regions, size_t numRegions, uint64_t version,
                                      kvcommAccess_t access, kvcommRegistration_t* registration);
/** An arena this process owns, with its layout; pinned while registered (it cannot be freed or shrunk). */
kvcommResult_t kvcommEndpointRegisterArena(kvcommEndpoint_t endpoint, kvcommArena_t arena, kvcommAccess_t access,
                                           kvcommRegistration_t* registration);
/** This rank's memory of a symmetric buffer (its backed part must hold the layout). */
kvcommResult_t kvcommEndpointRegisterBuffer(kvcommEndpoint_t endpoint, kvcommBuffer_t buffer,
                                            const kvcommKvRegion* regions, size_t numRegions, uint64_t version,
                                            kvcommAccess_t access, kvcommRegistration_t* registration);
/** Unregisters: new requests are refused, this endpoint's transfers using it are waited for up to `timeoutMs`
 *  (< 0: no bound) then cancelled, peers' requests end and same-host peers unmap it; returns when nothing can read
 *  or write the memory any more. kvcommTimeout naming the pids when a same-host peer still maps it at the bound
 *  (keep the memory; call again). Idempotent. */
kvcommResult_t kvcommEndpointUnregister(kvcommEndpoint_t endpoint, kvcommRegistration_t registration,
                                        int64_t timeoutMs);
/** Frees the handle only (the memory stays registered until kvcommEndpointUnregister). NULL is a no-op. */
kvcommResult_t kvcommRegistrationDestroy(kvcommRegistration_t registration);
/** The metadata peers connect with (bytes, by the list pattern: copied when *bytes <= capacity; NULL and 0 ask for
 *  the size). Anyone holding them may read (and, read-write, write) this memory: hand them to peers only. */
kvcommResult_t kvcommRegistrationMetadata(kvcommRegistration_t registration, void* metadata, size_t capacity,
                                          size_t* bytes);
/** Replaces the capability and increments the generation: every earlier metadata is refused from now on; same-host
 *  peers mapping the memory are waited for until they unmapped it (kvcommTimeout, naming them, past the endpoint's
 *  timeout). */
kvcommResult_t kvcommRegistrationRevoke(kvcommRegistration_t registration);
/** Random 64-bit id of the registration (in its metadata). */
kvcommResult_t kvcommRegistrationId(kvcommRegistration_t registration, uint64_t* id);
/** Starts at 1; each revoke increments it. */
kvcommResult_t kvcommRegistrationGeneration(kvcommRegistration_t registration, uint64_t* generation);
/** *registered = 0 once unregistered (or its endpoint closed), else 1. */
kvcommResult_t kvcommRegistrationRegistered(kvcommRegistration_t registration, int* registered);

/** A peer's registration from its metadata (lazy: nothing is sent until a transfer; the same metadata gives the
 *  same peer). kvcommInvalidArgument naming what is wrong: not kvcomm metadata, truncated or corrupted, a wire
 *  version this build does not speak, a malformed layout. Stale metadata is refused by its owner at the first
 *  transfer. */
kvcommResult_t kvcommEndpointConnect(kvcommEndpoint_t endpoint, const void* metadata, size_t bytes,
                                     kvcommRemoteMemory_t* remote);
/** Forgets a peer's registration: its running transfers fail ("disconnected"), its connections close and later
 *  transfers through it are refused. Idempotent. */
kvcommResult_t kvcommEndpointDisconnect(kvcommEndpoint_t endpoint, kvcommRemoteMemory_t remote);
/** Frees the handle only. NULL is a no-op. */
kvcommResult_t kvcommRemoteMemoryDestroy(kvcommRemoteMemory_t remote);
/** The peer registration's id and generation, as its metadata says. */
kvcommResult_t kvcommRemoteMemoryId(kvcommRemoteMemory_t remote, uint64_t* id, uint64_t* generation);
/** Its layout: regions by the list pattern, and (if not NULL) the engine's version. */
kvcommResult_t kvcommRemoteMemoryLayout(kvcommRemoteMemory_t remote, kvcommKvRegion* regions, size_t capacity,
                                        size_t* count, uint64_t* version);
/** Its memory kind (host or CUDA) and access. Either pointer may be NULL. */
kvcommResult_t kvcommRemoteMemoryKind(kvcommRemoteMemory_t remote, kvcommMemoryKind_t* kind, kvcommAccess_t* access);
/** The peer endpoint's name, copied like kvcommCommTopologyString. */
kvcommResult_t kvcommRemoteMemoryPeerName(kvcommRemoteMemory_t remote, char* text, size_t textBytes, size_t* needed);

/** Pulls remote blocks into local ones: pair i copies remote block remoteBlocks[i] into local block localBlocks[i],
 *  in every region (layouts: same region count and blockBytes). -1 on either side skips the pair. Everything is
 *  validated before anything moves (kvcommInvalidArgument naming the pair: out of range, negative other than -1,
 *  duplicate destination); the ids are read before it returns. `options` NULL: defaults. */
kvcommResult_t kvcommEndpointRead(kvcommEndpoint_t endpoint, kvcommRegistration_t local, kvcommRemoteMemory_t remote,
                                  const int64_t* remoteBlocks, const int64_t* localBlocks, size_t count,
                                  const kvcommTransferOptions* options, kvcommTransfer_t* transfer);
/** Pushes local blocks into remote ones (the remote registration must be read-write). CUDA memory: the blocks must
 *  be final when it is called. */
kvcommResult_t kvcommEndpointWrite(kvcommEndpoint_t endpoint, kvcommRegistration_t local, kvcommRemoteMemory_t remote,
                                   const int64_t* remoteBlocks, const int64_t* localBlocks, size_t count,
                                   const kvcommTransferOptions* options, kvcommTransfer_t* transfer);
/** Non-blocking progress (kvcommFetchStatus: failed blocks are destination ids, local ones of a read, remote ones of
 *  a write). Done and Failed are final. */
kvcommResult_t kvcommTransferTest(kvcommTransfer_t transfer, kvcommFetchStatus* status);
/** Blocks up to `timeoutMs` (< 0: until it ends). Expiry returns kvcommSuccess with state InProgress. */
kvcommResult_t kvcommTransferWait(kvcommTransfer_t transfer, int64_t timeoutMs, kvcommFetchStatus* status);
/** The failed destination blocks of a Failed transfer (as of the last Test/Wait), by the list pattern. */
kvcommResult_t kvcommTransferFailedBlocks(kvcommTransfer_t transfer, int64_t* blocks, size_t capacity, size_t* count);
/** Why a Failed transfer failed (as of the last Test/Wait; "" otherwise), copied like kvcommCommTopologyString. */
kvcommResult_t kvcommTransferError(kvcommTransfer_t transfer, char* text, size_t textBytes, size_t* needed);
/** What it does (pairs, runs, bytes, runs per transport). */
kvcommResult_t kvcommTransferGetInfo(kvcommTransfer_t transfer, kvcommFetchPlanInfo* info);
/** The transport that carries it. */
kvcommResult_t kvcommTransferTransport(kvcommTransfer_t transfer, kvcommFetchTransport_t* transport);
/** Waits until nothing the transfer started can touch either side's memory (cancelling it if still running), then
 *  frees the handle. NULL is a no-op. */
kvcommResult_t kvcommTransferDestroy(kvcommTransfer_t transfer);

/** Same-host peers only: stream-ordered pull with the ids in device memory (CUDA registrations; capture-safe) or
 *  host memory (host registrations: synchronous). A bad pair copies nothing and is recorded
 *  (kvcommEndpointPollError). Make the first call for a (local, remote) pair before a CUDA graph capture (count 0
 *  does only that). */
kvcommResult_t kvcommEndpointReadDevice(kvcommEndpoint_t endpoint, kvcommRegistration_t local,
                                        kvcommRemoteMemory_t remote, const kvcommDeviceTransferBatch* batch,
                                        kvcommStream_t stream);
/** The same, pushing local blocks into remote ones. */
kvcommResult_t kvcommEndpointWriteDevice(kvcommEndpoint_t endpoint, kvcommRegistration_t local,
                                         kvcommRemoteMemory_t remote, const kvcommDeviceTransferBatch* batch,
                                         kvcommStream_t stream);
/** Reads (and clears) the first error a device-id transfer between these two recorded. Synchronise first. */
kvcommResult_t kvcommEndpointPollError(kvcommEndpoint_t endpoint, kvcommRegistration_t local,
                                       kvcommRemoteMemory_t remote, kvcommDeviceError* error);

/** Sends `bytes` bytes (at most KVCOMM_MAX_NOTIFICATION_BYTES; `message` may be NULL when 0) to the endpoint that
 *  owns `remote`, and returns once that endpoint holds it. This endpoint's notifications to one endpoint (these and
 *  transfers') arrive in the order they were issued, each once. kvcommInvalidArgument for metadata the owner refuses
 *  (revoked, unregistered, restarted), kvcommBusy when its inbox is full, kvcommNetworkError when it cannot be
 *  reached (whether it arrived is then unknown). */
kvcommResult_t kvcommEndpointNotify(kvcommEndpoint_t endpoint, kvcommRemoteMemory_t remote, const void* message,
                                    size_t bytes);
/** The oldest notification received and not yet taken, waiting up to `timeoutMs` (< 0: no bound) for one.
 *  *received = 0 when none came (or the endpoint closed); else 1 and *info describes it: when info->messageBytes
 *  fits in `capacity` its bytes are copied into `message` and it is taken; otherwise nothing is copied and it stays
 *  next in line (call again with at least info->messageBytes). `message` may be NULL with capacity 0. */
kvcommResult_t kvcommEndpointNextNotification(kvcommEndpoint_t endpoint, int64_t timeoutMs, kvcommNotification* info,
                                              void* message, size_t capacity, int* received);

/* ---- KV contents and converted reads (kvcomm/kv_contents.hpp, kvcomm/converted_read.hpp) -----------------------
 *
 * A KV region's contents beside its bytes, so that a read between caches laid out differently (another TP split,
 * block size or token/head order) converts in flight: docs/api/kv-conversion.md. */

/** How a block orders its elements: tokens x heads x headDim ("NHD") or heads x tokens x headDim ("HND"). */
typedef enum KVCOMM_ENUM_BASE { kvcommKvOrderTokensHeadsDim = 0, kvcommKvOrderHeadsTokensDim = 1 } kvcommKvOrder_t;

/** What one region's blocks hold (kvcomm::KvContents): tokensPerBlock tokens, for each the heads [headBegin,
 *  headEnd) of the model's numHeads (headEnd 0: numHeads), each headDim elements of elementBytes bytes, in `order`.
 *  blockBytes of the region must be tokensPerBlock * (headEnd - headBegin) * headDim * elementBytes. replicated
 *  (0 or 1): every rank holds every head (MLA's latent cache, an indexer's keys). */
typedef struct {
  uint32_t elementBytes;
  uint32_t headDim;
  uint32_t tokensPerBlock;
  uint32_t numHeads;
  uint32_t headBegin;
  uint32_t headEnd;
  kvcommKvOrder_t order;
  int replicated;
} kvcommKvContents;

/** One source of a converted read: a peer's registration and what its regions hold (numContents: one per region of
 *  its layout; 0 with contents NULL: as its owner registered them, from its metadata). */
typedef struct {
  kvcommRemoteMemory_t remote;
  const kvcommKvContents* contents;
  size_t numContents;
} kvcommConvertedSource;

/** The tokens [firstToken, firstToken + numTokens) to move: token t is in block srcBlocks[t / source tokensPerBlock]
 *  of every source and dstBlocks[t / local tokensPerBlock] locally; -1 in either table skips those tokens. Each table
 *  at most KVCOMM_MAX_FETCH_PAIRS entries. */
typedef struct {
  const int64_t* srcBlocks;
  size_t numSrcBlocks;
  const int64_t* dstBlocks;
  size_t numDstBlocks;
  uint64_t firstToken;
  uint64_t numTokens;
} kvcommKvTokenRange;

/** kvcommConvertedReadOptionsInit fills the defaults (source 0 preferred, Auto, no bound). */
typedef struct {
  int32_t preferredSource; /**< a head several sources hold comes from this one when it holds it (the nearest) */
  kvcommTransferVia_t via;
  int64_t timeoutMs; /**< for the whole read; < 0: no bound */
} kvcommConvertedReadOptions;

/** What a converted read did. */
typedef struct {
  kvcommFetchState_t state; /**< Done, or Failed (then nothing was written locally) */
  uint64_t bytesConverted;  /**< bytes written into the local registration */
  uint64_t bytesLanded;     /**< bytes the transports moved into landing areas (0 when every source was mapped) */
  size_t pieces;            /**< contiguous copies */
  size_t sourcesRead;       /**< sources that supplied a head */
  size_t sourcesMapped;     /**< of those, read through a same-host mapping (nothing landed) */
} kvcommConvertedReadResult;

kvcommResult_t kvcommConvertedReadOptionsInit(kvcommConvertedReadOptions* options);
/** kvcommEndpointRegister with what the regions hold (`numContents` == numRegions): checked against the layout
 *  (kvcommInvalidArgument naming the region and field) and carried in the metadata, so that peers converting from it
 *  need not be told (kvcommEndpointReadConverted with no contents for it). */
kvcommResult_t kvcommEndpointRegisterDescribed(kvcommEndpoint_t endpoint, void* base, size_t bytes,
                                               kvcommMemoryKind_t kind, int device, const kvcommKvRegion* regions,
                                               size_t numRegions, uint64_t version, kvcommAccess_t access,
                                               const kvcommKvContents* contents, size_t numContents,
                                               kvcommRegistration_t* registration);
/** What a peer's regions hold, from its metadata, by the list pattern (*count 0: not described). */
kvcommResult_t kvcommRemoteMemoryContents(kvcommRemoteMemory_t remote, kvcommKvContents* contents, size_t capacity,
                                          size_t* count);
/** kvcommSuccess when `contents` (numContents, one per region) describe the layout `regions`; else
 *  kvcommInvalidArgument naming the region and field (kvcomm::checkDescription). */
kvcommResult_t kvcommKvCheckContents(const kvcommKvRegion* regions, size_t numRegions, const kvcommKvContents* contents,
                                     size_t numContents);
/** "" (*needed 1) when a cache described by `src` converts into one described by `dst`, else one sentence naming
 *  the region and what differs; copied like kvcommCommTopologyString. */
kvcommResult_t kvcommKvWhyNotConvertible(const kvcommKvContents* src, size_t numSrc, const kvcommKvContents* dst,
                                         size_t numDst, char* text, size_t textBytes, size_t* needed);
/** Reads `tokens` from `sources` (at most KVCOMM_MAX_RANKS) into `local` (host or CUDA memory of `endpoint`,
 *  described by localContents), converting TP split, block size and order on the way (kvcomm::readConverted):
 *  same-host sources of the local memory kind straight through their mappings, others landed first. Synchronous.
 *  kvcommInvalidArgument before anything moves for what does not describe or convert (naming the source, region,
 *  table or index); kvcommUnsupported when via Peer cannot reach a source; when a source fails (revoked,
 *  unregistered, dead, past timeoutMs) kvcommNetworkError naming it, result->state Failed and the local memory as
 *  it was. `options` NULL: defaults. */
kvcommResult_t kvcommEndpointReadConverted(kvcommEndpoint_t endpoint, kvcommRegistration_t local,
                                           const kvcommKvContents* localContents, size_t numLocalContents,
                                           const kvcommConvertedSource* sources, size_t numSources,
                                           const kvcommKvTokenRange* tokens, const kvcommConvertedReadOptions* options,
                                           kvcommConvertedReadResult* result);

/** Collective over the buffer's group (kvcomm::ConvertedFetcher::create): this member's layout (`regions`, at most
 *  KVCOMM_MAX_FETCH_REGIONS) and what its regions hold (`contents`, one per region); layouts may differ between
 *  members. A member's malformed arguments, bad layout or contents that do not describe it fail every member with
 *  kvcommInvalidArgument naming it. `tcpAddress` NULL or "": this host's address (KVCOMM_SOCKET_IFNAME), an ephemeral
 *  port. Destroy it on every member once no member fetches any more. */
kvcommResult_t kvcommConvertedFetcherCreate(kvcommBuffer_t buffer, const kvcommKvRegion* regions, size_t numRegions,
                                            const kvcommKvContents* contents, size_t numContents,
                                            const char* tcpAddress, kvcommConvertedFetcher_t* fetcher);
/** One-sided: `tokens` from the members `sources` (ranks, each once, not this member, at most KVCOMM_MAX_RANKS; the
 *  sources share tokens->srcBlocks) into this member's memory, converted (kvcomm::ConvertedFetcher::fetch;
 *  options->preferredSource indexes `sources`). kvcommInvalidArgument before anything moves for bad sources and what
 *  does not convert; a source that fails is kvcommNetworkError naming it, result->state Failed and this member's
 *  memory as it was. `options` NULL: defaults. */
kvcommResult_t kvcommConvertedFetch(kvcommConvertedFetcher_t fetcher, const int* sources, size_t numSources,
                                    const kvcommKvTokenRange* tokens, const kvcommConvertedReadOptions* options,
                                    kvcommConvertedReadResult* result);
kvcommResult_t kvcommConvertedFetcherDestroy(kvcommConvertedFetcher_t fetcher);

/* ---- capabilities --------------------------------------------------------------------------------------------- */

/** What this machine and build can do, as kvcomm-info prints it (copied like kvcommCommTopologyString). */
kvcommResult_t kvcommCapabilitiesString(char* text, size_t textBytes, size_t* needed);
/** Makes CUDA device localRank % deviceCount current on this thread; *device = its ordinal, or -1 without a GPU.
 *  A negative localRank is kvcommInvalidArgument (the C++ useLocalDevice takes it as 0). */
kvcommResult_t kvcommUseLocalDevice(int localRank, int* device);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}  // extern "C"
#endif

#endif /* KVCOMM_KVCOMM_H_ */
