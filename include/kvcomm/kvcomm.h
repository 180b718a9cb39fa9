/* kvcomm: the C ABI (C11, no C++ types), for engines that call native code through FFI (Rust, C, Go, Zig).
 *
 * Style of nccl.h: every call returns a kvcommResult_t; on failure kvcommGetLastError() gives the detail (the same
 * message the C++ API's exception carries: "kvcomm [rank R] <call>: <cause>"), per thread. Objects are opaque
 * handles created by *Create / *Init calls and freed by the matching *Destroy. No C++ exception ever crosses this
 * boundary.
 *
 * Call order (collective calls are made by every member of the group, in the same order):
 *   kvcommGetUniqueId (rank 0) -> kvcommCommInitTcp (all)   or   kvcommCommInitCallback (all)
 *   -> kvcommCommSplit / kvcommLayoutCreate
 *   -> kvcommBufferCreate / kvcommBufferAdopt -> kvcommPublisherCreate
 *   -> per step: kvcommPublish (per layer) ... kvcommPublisherBarrier (or kvcommPublishAndBarrier)
 *   -> kvcommPublisherDestroy, kvcommBufferDestroy, kvcommLayoutDestroy, kvcommCommDestroy (local, any order: a
 *      handle keeps what it uses alive).
 */
#ifndef KVCOMM_KVCOMM_H_
#define KVCOMM_KVCOMM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
typedef enum {
  kvcommSuccess = 0,
  kvcommInvalidArgument = 1, /**< the caller passed something wrong; nothing was changed */
  kvcommUnsupported = 2,     /**< the requested mode cannot run here (no GPU, no P2P, handle type) */
  kvcommSystemError = 3,     /**< an operating-system call failed */
  kvcommCudaError = 4,       /**< a CUDA driver or runtime call failed */
  kvcommNetworkError = 5,    /**< a socket or transport failed, or a peer went away */
  kvcommRemoteError = 6,     /**< another rank reported a failure during a collective step */
  kvcommTimeout = 7,         /**< a bounded wait expired */
  kvcommAborted = 8,         /**< stopped because the object is closing */
  kvcommInternalError = 9,   /**< a kvcomm invariant broke (a bug), or an unexpected C++ exception */
  kvcommNumResults = 10
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
/** The TP/PCP/PP/DP groups of this rank (kvcomm::Layout). */
typedef struct kvcommLayout* kvcommLayout_t;
/** Symmetric memory on a group (kvcomm::SymmetricBuffer). */
typedef struct kvcommBuffer* kvcommBuffer_t;
/** Publication into a buffer's replicas and its barrier (kvcomm::Publisher). */
typedef struct kvcommPublisher* kvcommPublisher_t;

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
} kvcommLayoutSpec;
/** A rank's coordinates: rank = ((dp * PP + pp) * PCP + pcp) * TP + tp (TP fastest, as engines number ranks). */
typedef struct {
  int tp, pcp, pp, dp;
} kvcommLayoutCoord;
typedef enum { kvcommAxisTP = 0, kvcommAxisPCP = 1, kvcommAxisPP = 2, kvcommAxisDP = 3 } kvcommAxis_t;

/** Splits `world` into the four groups (collective). kvcommInvalidArgument unless world size == tp*pcp*pp*dp. */
kvcommResult_t kvcommLayoutCreate(kvcommComm_t world, const kvcommLayoutSpec* spec, kvcommLayout_t* layout);
kvcommResult_t kvcommLayoutDestroy(kvcommLayout_t layout);
/** A new handle on the group along `axis` (free it with kvcommCommDestroy); its rank is this rank's coordinate. */
kvcommResult_t kvcommLayoutComm(kvcommLayout_t layout, kvcommAxis_t axis, kvcommComm_t* comm);
kvcommResult_t kvcommLayoutGetSpec(kvcommLayout_t layout, kvcommLayoutSpec* spec);
kvcommResult_t kvcommLayoutGetCoord(kvcommLayout_t layout, kvcommLayoutCoord* coord);
/** Pure functions of a spec: coordinates of `rank`, the rank of coordinates, and the world ranks of the group along
 *  `axis` holding `rank` in group-rank order (*count receives the group size; at most `capacity` are written). */
kvcommResult_t kvcommLayoutCoordOf(const kvcommLayoutSpec* spec, int rank, kvcommLayoutCoord* coord);
kvcommResult_t kvcommLayoutRankOf(const kvcommLayoutSpec* spec, const kvcommLayoutCoord* coord, int* rank);
kvcommResult_t kvcommLayoutGroupOf(const kvcommLayoutSpec* spec, int rank, kvcommAxis_t axis, int* ranks, int capacity,
                                   int* count);

/* ---- symmetric memory ----------------------------------------------------------------------------------------- */

typedef enum {
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

typedef enum { kvcommSlotInt64 = 0, kvcommSlotInt32 = 1 } kvcommSlotType_t;
typedef enum { kvcommPublishDirect = 0, kvcommPublishFallback = 1 } kvcommPublishMode_t;

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
} kvcommCacheTensor;

/** Options of kvcommPublisherCreate; kvcommPublisherOptionsInit fills the C++ defaults. */
typedef struct {
  int lanes;                   /**< independent barrier lanes, 1..8 (default 2) */
  int64_t barrierTimeoutMs;    /**< bound on every barrier wait; < 0: KVCOMM_BARRIER_TIMEOUT_MS */
  size_t stagingTokens;        /**< fallback staging reserved up front: tokens per rank ... */
  size_t stagingBytesPerToken; /**< ... and bytes per token (summed over tensors) */
} kvcommPublisherOptions;

typedef enum {
  kvcommDeviceErrorNone = 0,
  kvcommDeviceErrorSlotOutOfRange = 1, /**< a slot's row would land outside the backed part; not written */
  kvcommDeviceErrorBarrierTimeout = 2  /**< a barrier wait expired; the peer never arrived */
} kvcommDeviceErrorKind_t;

/** A device error read back by kvcommPublisherPollError. */
typedef struct {
  kvcommDeviceErrorKind_t kind;
  int64_t tokenIndex;
  int64_t slot;
  int tensor;
  int rank;
  int peer;
  int lane;
} kvcommDeviceError;

kvcommResult_t kvcommCacheTensorInit(kvcommCacheTensor* tensor);
kvcommResult_t kvcommPublisherOptionsInit(kvcommPublisherOptions* options);
/** Collective over the buffer's group; picks the mode (KVCOMM_DIRECT). `options` NULL: defaults. */
kvcommResult_t kvcommPublisherCreate(kvcommBuffer_t buffer, const kvcommPublisherOptions* options,
                                     kvcommPublisher_t* publisher);
kvcommResult_t kvcommPublisherDestroy(kvcommPublisher_t publisher);
/** Stores row i of every tensor at slotMapping[i] (< 0: padding, skipped) in every replica. Validates everything
 *  knowable before launch; a slot beyond the backed range found on the device is reported by
 *  kvcommPublisherCheckErrors. Capture-safe, no host synchronisation (CUDA buffers). */
kvcommResult_t kvcommPublish(kvcommPublisher_t publisher, const kvcommCacheTensor* tensors, int numTensors,
                             const void* slotMapping, kvcommSlotType_t slotType, size_t numTokens,
                             kvcommStream_t stream);
/** Returns (in stream order) once every member reached its matching barrier on `lane`. */
kvcommResult_t kvcommPublisherBarrier(kvcommPublisher_t publisher, kvcommStream_t stream, int lane);
/** kvcommPublish then kvcommPublisherBarrier, as one kernel in Direct mode. */
kvcommResult_t kvcommPublishAndBarrier(kvcommPublisher_t publisher, const kvcommCacheTensor* tensors, int numTensors,
                                       const void* slotMapping, kvcommSlotType_t slotType, size_t numTokens,
                                       kvcommStream_t stream, int lane);
kvcommResult_t kvcommPublisherMode(kvcommPublisher_t publisher, kvcommPublishMode_t* mode);
/** Why this mode was chosen; valid for the publisher's life. */
kvcommResult_t kvcommPublisherModeReason(kvcommPublisher_t publisher, const char** reason);
/** Reads (and clears) the first device error since the last call. Synchronise the publishing stream first. */
kvcommResult_t kvcommPublisherPollError(kvcommPublisher_t publisher, kvcommDeviceError* error);
/** Returns the recorded device error, if any, as a result (kvcommInvalidArgument for a slot out of range,
 *  kvcommTimeout for a barrier) with its message in kvcommGetLastError(); kvcommSuccess otherwise. */
kvcommResult_t kvcommPublisherCheckErrors(kvcommPublisher_t publisher);

/* ---- fetch ---------------------------------------------------------------------------------------------------- */
/* Fetch (pulling KV blocks from another rank or node into local slots) gets its C calls here once its C++ API
 * (kvcomm/fetch.hpp) exists; see docs/c-api.md. */

/* ---- capabilities --------------------------------------------------------------------------------------------- */

/** What this machine and build can do, as kvcomm-info prints it (copied like kvcommCommTopologyString). */
kvcommResult_t kvcommCapabilitiesString(char* text, size_t textBytes, size_t* needed);
/** Makes CUDA device localRank % deviceCount current on this thread; *device = its ordinal, or -1 without a GPU. */
kvcommResult_t kvcommUseLocalDevice(int localRank, int* device);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif /* KVCOMM_KVCOMM_H_ */
