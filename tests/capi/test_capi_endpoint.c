/* Endpoints through the C ABI, 4 processes under mpirun (MPI only carries the metadata, as an engine's own channel
 * would): each rank registers host memory whose every byte has a known value, with guard bytes between blocks;
 * connects to the next rank from its metadata alone; reads blocks from it (-1 skips on both sides) and writes two
 * blocks into it, each transfer carrying a notification, after a plain notification. The whole memory of every rank
 * is then compared with an independent oracle (pairs copied block by block), and each rank's notifications must be
 * its previous rank's three, in issue order, once each, naming the sender and the registration.
 * Hostile input: ids out of range, a duplicate destination, a bad enum, a message past the limit, NULL arrays, a
 * demanded peer path on plain memory, metadata cut short or after a revoke: each refused with the right code and
 * message, nothing written and, for a transfer that failed, no notification delivered. A notification larger than
 * the caller's array stays next in line. Source blocks [0, 20) are only read, blocks [20, 32) written by one peer. */
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi_test.h"

int g_rank = 0;
int g_failures = 0;

enum { kBlocks = 32, kK = 256, kKStride = 320, kV = 128, kVOffset = 64 + kBlocks * kKStride + 128 };
static const size_t kBytes = kVOffset + kBlocks * kV + 64;

static void layout(kvcommKvRegion r[2]) {
  r[0].offset = 64;
  r[0].blockBytes = kK;
  r[0].blockStride = kKStride;
  r[0].numBlocks = kBlocks;
  r[1].offset = kVOffset;
  r[1].blockBytes = kV;
  r[1].blockStride = 0;
  r[1].numBlocks = kBlocks;
}

static unsigned char patternByte(int rank, size_t i) {
  return (unsigned char)(i * 7 + (size_t)rank * 31 + 3);
}

/* dst after pair i copied src block s[i] into dst block d[i] in both regions (-1 skips). */
static void copyBlocks(unsigned char* dst, const unsigned char* src, const int64_t* s, const int64_t* d, size_t n) {
  kvcommKvRegion r[2];
  layout(r);
  for (size_t i = 0; i < n; ++i) {
    if (s[i] < 0 || d[i] < 0) continue;
    for (int g = 0; g < 2; ++g) {
      size_t stride = r[g].blockStride ? r[g].blockStride : r[g].blockBytes;
      memcpy(dst + r[g].offset + (size_t)d[i] * stride, src + r[g].offset + (size_t)s[i] * stride, r[g].blockBytes);
    }
  }
}

static void image(unsigned char* out, int rank) {
  for (size_t i = 0; i < kBytes; ++i) out[i] = patternByte(rank, i);
}

/* Every rank's metadata, gathered (each padded to the largest). */
static unsigned char* gatherMetadata(kvcommRegistration_t reg, int size, size_t* each) {
  size_t bytes = 0;
  OK(kvcommRegistrationMetadata(reg, NULL, 0, &bytes));
  unsigned long mine = (unsigned long)bytes, most = 0;
  MPI_Allreduce(&mine, &most, 1, MPI_UNSIGNED_LONG, MPI_MAX, MPI_COMM_WORLD);
  unsigned char* md = (unsigned char*)calloc(most + 8, 1);
  size_t got = 0;
  OK(kvcommRegistrationMetadata(reg, md + 8, most, &got));
  memcpy(md, &got, sizeof(got) < 8 ? sizeof(got) : 8);
  unsigned char* all = (unsigned char*)malloc((most + 8) * (size_t)size);
  MPI_Allgather(md, (int)(most + 8), MPI_BYTE, all, (int)(most + 8), MPI_BYTE, MPI_COMM_WORLD);
  free(md);
  *each = most + 8;
  return all;
}

static kvcommResult_t waitTransfer(kvcommTransfer_t t, kvcommFetchStatus* st) {
  return kvcommTransferWait(t, 60000, st);
}

/* The next notification (waiting up to `ms`): its text into `text`; returns whether one came. */
static int nextText(kvcommEndpoint_t ep, int64_t ms, kvcommNotification* info, char* text, size_t cap) {
  int received = 0;
  memset(text, 0, cap);
  OK(kvcommEndpointNextNotification(ep, ms, info, text, cap - 1, &received));
  return received;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int next = (g_rank + 1) % size, prev = (g_rank + size - 1) % size;

  kvcommEndpointOptions eo;
  OK(kvcommEndpointOptionsInit(&eo));
  CHECK(eo.connectionsPerPeer == 4 && eo.maxQueuedNotifications == 65536 && eo.timeoutMs < 0 && eo.name == NULL,
        "endpoint defaults");
  char name[32];
  snprintf(name, sizeof(name), "c rank %d", g_rank);
  eo.name = name;
  eo.tcpAddress = "127.0.0.1:0";
  kvcommEndpoint_t ep = NULL;
  OK(kvcommEndpointCreate(&eo, &ep));
  uint64_t myId = 0;
  OK(kvcommEndpointId(ep, &myId));
  char address[128];
  size_t needed = 0;
  OK(kvcommEndpointAddress(ep, address, sizeof(address), &needed));
  CHECK(strncmp(address, "127.0.0.1:", 10) == 0 && needed == strlen(address) + 1, "address %s", address);

  unsigned char* mem = (unsigned char*)malloc(kBytes);
  image(mem, g_rank);
  kvcommKvRegion regions[2];
  layout(regions);
  kvcommRegistration_t reg = NULL;
  OK(kvcommEndpointRegister(ep, mem, kBytes, kvcommMemoryHost, -1, regions, 2, 5, kvcommAccessReadWrite, &reg));
  uint64_t regId = 0, gen = 0;
  OK(kvcommRegistrationId(reg, &regId));
  OK(kvcommRegistrationGeneration(reg, &gen));
  CHECK(gen == 1, "generation %llu", (unsigned long long)gen);

  size_t each = 0;
  unsigned char* all = gatherMetadata(reg, size, &each);
  size_t nextBytes = 0;
  memcpy(&nextBytes, all + (size_t)next * each, sizeof(nextBytes) < 8 ? sizeof(nextBytes) : 8);
  const unsigned char* nextMd = all + (size_t)next * each + 8;

  /* Metadata cut short is refused at connect, naming it. */
  kvcommRemoteMemory_t remote = NULL;
  FAILS(kvcommEndpointConnect(ep, nextMd, nextBytes - 1, &remote), kvcommInvalidArgument, "truncated");
  CHECK(remote == NULL, "no handle for refused metadata");
  OK(kvcommEndpointConnect(ep, nextMd, nextBytes, &remote));
  uint64_t rid = 0, rgen = 0, rversion = 0;
  OK(kvcommRemoteMemoryId(remote, &rid, &rgen));
  kvcommKvRegion got[4];
  size_t count = 0;
  OK(kvcommRemoteMemoryLayout(remote, got, 4, &count, &rversion));
  CHECK(count == 2 && rversion == 5 && got[0].blockStride == kKStride && got[1].blockStride == kV && rgen == 1,
        "remote layout: %zu regions, version %llu", count, (unsigned long long)rversion);
  kvcommMemoryKind_t kind = kvcommMemoryAuto;
  kvcommAccess_t access = kvcommAccessReadOnly;
  OK(kvcommRemoteMemoryKind(remote, &kind, &access));
  CHECK(kind == kvcommMemoryHost && access == kvcommAccessReadWrite, "remote kind %u access %u", (unsigned)kind,
        (unsigned)access);
  char peer[80];
  OK(kvcommRemoteMemoryPeerName(remote, peer, sizeof(peer), NULL));
  char want[32];
  snprintf(want, sizeof(want), "c rank %d", next);
  CHECK(strcmp(peer, want) == 0, "peer name '%s'", peer);

  /* ---- the transfers, each with a notification, after a plain one ---- */
  char msg[64];
  snprintf(msg, sizeof(msg), "hello from %d", g_rank);
  OK(kvcommEndpointNotify(ep, remote, msg, strlen(msg)));
  int64_t readSrc[6] = {3, 4, 5, 17, -1, 19}, readDst[6] = {0, 1, 2, 9, 10, -1};
  int64_t writeDst[2] = {25, 26}, writeSrc[2] = {20, 21};
  kvcommTransferOptions to;
  OK(kvcommTransferOptionsInit(&to));
  CHECK(to.via == kvcommTransferViaAuto && to.notify == NULL && to.notifyBytes == 0, "transfer defaults");
  char readMsg[32], writeMsg[32];
  snprintf(readMsg, sizeof(readMsg), "read by %d", g_rank);
  snprintf(writeMsg, sizeof(writeMsg), "written by %d", g_rank);
  to.notify = readMsg;
  to.notifyBytes = strlen(readMsg);
  kvcommTransfer_t t = NULL;
  kvcommFetchStatus st;
  OK(kvcommEndpointRead(ep, reg, remote, readSrc, readDst, 6, &to, &t));
  OK(waitTransfer(t, &st));
  CHECK(st.state == kvcommFetchDone && st.bytesDone == 4 * (kK + kV) && st.bytesTotal == st.bytesDone,
        "read: state %u, %zu of %zu bytes", (unsigned)st.state, st.bytesDone, st.bytesTotal);
  kvcommFetchPlanInfo info;
  OK(kvcommTransferGetInfo(t, &info));
  CHECK(info.pairsIn == 6 && info.pairsSkipped == 2 && info.tcpRuns > 0, "read info: %zu pairs, %zu skipped",
        info.pairsIn, info.pairsSkipped);
  kvcommFetchTransport_t tr = kvcommFetchTransportNone;
  OK(kvcommTransferTransport(t, &tr));
  CHECK(tr == kvcommFetchTransportTcp, "plain malloc memory goes over TCP (transport %u)", (unsigned)tr);
  size_t nFailed = 7;
  OK(kvcommTransferFailedBlocks(t, NULL, 0, &nFailed));
  CHECK(nFailed == 0, "no failed blocks");
  OK(kvcommTransferDestroy(t));
  to.notify = writeMsg;
  to.notifyBytes = strlen(writeMsg);
  OK(kvcommEndpointWrite(ep, reg, remote, writeDst, writeSrc, 2, &to, &t));
  OK(waitTransfer(t, &st));
  CHECK(st.state == kvcommFetchDone, "write: state %u", (unsigned)st.state);
  OK(kvcommTransferDestroy(t));
  MPI_Barrier(MPI_COMM_WORLD); /* every rank's transfers ended */

  unsigned char* oracle = (unsigned char*)malloc(kBytes);
  unsigned char* other = (unsigned char*)malloc(kBytes);
  image(oracle, g_rank);
  image(other, next);
  copyBlocks(oracle, other, readSrc, readDst, 6);
  image(other, prev);
  copyBlocks(oracle, other, writeSrc, writeDst, 2);
  size_t diff = 0;
  for (size_t i = 0; i < kBytes; ++i) diff += mem[i] != oracle[i];
  CHECK(diff == 0, "%zu bytes differ from the oracle after the read and the write", diff);

  /* The previous rank's three notifications, in issue order, each once. */
  const char* expect[3] = {"hello from %d", "read by %d", "written by %d"};
  for (int k = 0; k < 3; ++k) {
    kvcommNotification n;
    char text[128], w[64];
    snprintf(w, sizeof(w), expect[k], prev);
    CHECK(nextText(ep, 30000, &n, text, sizeof(text)), "notification %d did not arrive", k);
    CHECK(strcmp(text, w) == 0 && n.messageBytes == strlen(w), "notification %d is '%s', expected '%s'", k, text, w);
    snprintf(w, sizeof(w), "c rank %d", prev);
    CHECK(strcmp(n.fromName, w) == 0 && n.registration == regId, "notification %d from '%s'", k, n.fromName);
  }
  {
    kvcommNotification n;
    char text[16];
    CHECK(!nextText(ep, 100, &n, text, sizeof(text)), "a fourth notification arrived");
  }
  MPI_Barrier(MPI_COMM_WORLD);

  /* ---- hostile input: refused, nothing written ---- */
  memcpy(oracle, mem, kBytes);
  int64_t outOfRange[1] = {kBlocks}, zero[1] = {0}, dup[2] = {11, 11}, two[2] = {1, 2}, minus2[1] = {-2};
  FAILS(kvcommEndpointRead(ep, reg, remote, outOfRange, zero, 1, NULL, &t), kvcommInvalidArgument, "32");
  FAILS(kvcommEndpointRead(ep, reg, remote, two, dup, 2, NULL, &t), kvcommInvalidArgument, "duplicate");
  FAILS(kvcommEndpointRead(ep, reg, remote, minus2, zero, 1, NULL, &t), kvcommInvalidArgument, "-2");
  FAILS(kvcommEndpointRead(ep, reg, remote, NULL, zero, 1, NULL, &t), kvcommInvalidArgument, "NULL");
  FAILS(kvcommEndpointRead(ep, reg, remote, zero, zero, 1, NULL, NULL), kvcommInvalidArgument, "transfer");
  FAILS(kvcommEndpointRead(ep, reg, remote, zero, zero, (size_t)KVCOMM_MAX_FETCH_PAIRS + 1, NULL, &t),
        kvcommInvalidArgument, "KVCOMM_MAX_FETCH_PAIRS");
  kvcommTransferOptions bad = to;
  bad.via = (kvcommTransferVia_t)9;
  FAILS(kvcommEndpointWrite(ep, reg, remote, writeDst, writeSrc, 2, &bad, &t), kvcommInvalidArgument, "options->via");
  bad = to;
  bad.notifyBytes = KVCOMM_MAX_NOTIFICATION_BYTES + 1;
  char* big = (char*)calloc(KVCOMM_MAX_NOTIFICATION_BYTES + 1, 1);
  bad.notify = big;
  FAILS(kvcommEndpointWrite(ep, reg, remote, writeDst, writeSrc, 2, &bad, &t), kvcommInvalidArgument,
        "KVCOMM_MAX_NOTIFICATION_BYTES");
  FAILS(kvcommEndpointNotify(ep, remote, big, KVCOMM_MAX_NOTIFICATION_BYTES + 1), kvcommInvalidArgument,
        "KVCOMM_MAX_NOTIFICATION_BYTES");
  FAILS(kvcommEndpointNotify(ep, remote, NULL, 3), kvcommInvalidArgument, "message is NULL");
  bad = to;
  bad.via = kvcommTransferViaPeer;
  FAILS(kvcommEndpointRead(ep, reg, remote, zero, zero, 1, &bad, &t), kvcommUnsupported, "");
  FAILS(kvcommEndpointRegister(ep, mem, kBytes, kvcommMemoryAuto, -1, regions, 2, 0, kvcommAccessReadWrite, NULL),
        kvcommInvalidArgument, "registration");
  kvcommRegistration_t r2 = NULL;
  FAILS(kvcommEndpointRegister(ep, mem, kBytes, kvcommMemoryAuto, -1, regions, 2, 0, kvcommAccessReadWrite, &r2),
        kvcommInvalidArgument, "kvcommMemoryAuto");
  FAILS(kvcommEndpointRegister(ep, mem, 100, kvcommMemoryHost, -1, regions, 2, 0, kvcommAccessReadWrite, &r2),
        kvcommInvalidArgument, "");
  FAILS(kvcommEndpointRegister(ep, mem, kBytes, kvcommMemoryHost, -1, regions, 2, 0, (kvcommAccess_t)2, &r2),
        kvcommInvalidArgument, "access");
  CHECK(r2 == NULL, "no handle for a refused registration");
  diff = 0;
  for (size_t i = 0; i < kBytes; ++i) diff += mem[i] != oracle[i];
  CHECK(diff == 0, "refused calls wrote %zu bytes", diff);
  MPI_Barrier(MPI_COMM_WORLD);

  /* A full message the caller's array cannot hold stays next in line. */
  memset(big, 'n', KVCOMM_MAX_NOTIFICATION_BYTES);
  OK(kvcommEndpointNotify(ep, remote, big, KVCOMM_MAX_NOTIFICATION_BYTES));
  {
    kvcommNotification n;
    int received = 0;
    char small[8];
    OK(kvcommEndpointNextNotification(ep, 30000, &n, small, sizeof(small), &received));
    CHECK(received == 1 && n.messageBytes == KVCOMM_MAX_NOTIFICATION_BYTES, "the big one is announced (%zu bytes)",
          n.messageBytes);
    char* whole = (char*)malloc(KVCOMM_MAX_NOTIFICATION_BYTES);
    OK(kvcommEndpointNextNotification(ep, 0, &n, whole, KVCOMM_MAX_NOTIFICATION_BYTES, &received));
    CHECK(received == 1 && memcmp(whole, big, KVCOMM_MAX_NOTIFICATION_BYTES) == 0, "then taken whole");
    OK(kvcommEndpointNextNotification(ep, 0, &n, whole, KVCOMM_MAX_NOTIFICATION_BYTES, &received));
    CHECK(received == 0, "and only once");
    free(whole);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  /* After a revoke the old metadata fails the transfer, and its notification never arrives. */
  OK(kvcommRegistrationRevoke(reg));
  OK(kvcommRegistrationGeneration(reg, &gen));
  CHECK(gen == 2, "generation after revoke %llu", (unsigned long long)gen);
  MPI_Barrier(MPI_COMM_WORLD);
  to.notify = "must not arrive";
  to.notifyBytes = 15;
  OK(kvcommEndpointWrite(ep, reg, remote, writeDst, writeSrc, 2, &to, &t));
  OK(waitTransfer(t, &st));
  CHECK(st.state == kvcommFetchFailed && st.numFailedBlocks == 2, "a write with revoked metadata: state %u",
        (unsigned)st.state);
  int64_t failed[4] = {-9, -9, -9, -9};
  OK(kvcommTransferFailedBlocks(t, failed, 4, &nFailed));
  CHECK(nFailed == 2 && ((failed[0] == 25 && failed[1] == 26) || (failed[0] == 26 && failed[1] == 25)),
        "failed blocks %lld %lld", (long long)failed[0], (long long)failed[1]);
  char why[512];
  OK(kvcommTransferError(t, why, sizeof(why), NULL));
  CHECK(strstr(why, "revoked") != NULL, "why: %s", why);
  OK(kvcommTransferDestroy(t));
  FAILS(kvcommEndpointNotify(ep, remote, "nor this", 8), kvcommInvalidArgument, "revoked");
  MPI_Barrier(MPI_COMM_WORLD);
  {
    kvcommNotification n;
    char text[64];
    CHECK(!nextText(ep, 200, &n, text, sizeof(text)), "a failed transfer delivered '%s'", text);
  }
  diff = 0;
  for (size_t i = 0; i < kBytes; ++i) diff += mem[i] != oracle[i];
  CHECK(diff == 0, "a refused write changed %zu bytes", diff);

  /* The new metadata works. */
  free(all);
  all = gatherMetadata(reg, size, &each);
  memcpy(&nextBytes, all + (size_t)next * each, sizeof(nextBytes) < 8 ? sizeof(nextBytes) : 8);
  kvcommRemoteMemory_t fresh = NULL;
  OK(kvcommEndpointConnect(ep, all + (size_t)next * each + 8, nextBytes, &fresh));
  OK(kvcommEndpointNotify(ep, fresh, "after", 5));
  {
    kvcommNotification n;
    char text[64];
    CHECK(nextText(ep, 30000, &n, text, sizeof(text)) && strcmp(text, "after") == 0, "after the revoke: '%s'", text);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  OK(kvcommEndpointDisconnect(ep, fresh));
  FAILS(kvcommEndpointNotify(ep, fresh, "x", 1), kvcommInvalidArgument, "disconnected");
  OK(kvcommRemoteMemoryDestroy(fresh));
  OK(kvcommRemoteMemoryDestroy(remote));
  MPI_Barrier(MPI_COMM_WORLD);
  OK(kvcommEndpointUnregister(ep, reg, -1));
  int registered = 1;
  OK(kvcommRegistrationRegistered(reg, &registered));
  CHECK(registered == 0, "unregistered");
  OK(kvcommRegistrationDestroy(reg));
  OK(kvcommEndpointDestroy(ep));
  FAILS(kvcommEndpointClose(ep), kvcommInvalidArgument, "kvcommEndpoint_t");
  free(big);
  free(all);
  free(oracle);
  free(other);
  free(mem);

  int failures = 0;
  MPI_Allreduce(&g_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) printf("capi endpoint test: %s (%d failed checks)\n", failures ? "FAILED" : "passed", failures);
  MPI_Finalize();
  return failures ? 1 : 0;
}
