/* Shared by the C ABI test's sources: the failure counter and the CHECK / OK / FAILS macros. */
#ifndef KVCOMM_TESTS_CAPI_CAPI_TEST_H_
#define KVCOMM_TESTS_CAPI_CAPI_TEST_H_

#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "kvcomm/kvcomm.h"

extern int g_rank;
extern int g_failures;

#define CHECK(cond, ...)                                                                         \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "[rank %d] %s:%d: CHECK(%s) failed: ", g_rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                              \
      fprintf(stderr, "\n");                                                                     \
      ++g_failures;                                                                              \
    }                                                                                            \
  } while (0)

/* A call that must succeed; on failure prints the result name and last error, and stops this rank's test. */
#define OK(call)                                                                                                      \
  do {                                                                                                                \
    kvcommResult_t r_ = (call);                                                                                       \
    if (r_ != kvcommSuccess) {                                                                                        \
      fprintf(stderr, "[rank %d] %s:%d: %s -> %s: %s\n", g_rank, __FILE__, __LINE__, #call, kvcommGetErrorString(r_), \
              kvcommGetLastError());                                                                                  \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                                   \
    }                                                                                                                 \
  } while (0)

/* A call that must fail with `expected` and leave a message naming `word`. */
#define FAILS(call, expected, word)                                                                                 \
  do {                                                                                                              \
    kvcommResult_t r_ = (call);                                                                                     \
    CHECK(r_ == (expected), "%s returned %s, expected %s (%s)", #call, kvcommGetErrorString(r_),                    \
          kvcommGetErrorString(expected), kvcommGetLastError());                                                    \
    CHECK(strstr(kvcommGetLastError(), (word)) != NULL, "%s: message '%s' lacks '%s'", #call, kvcommGetLastError(), \
          (word));                                                                                                  \
  } while (0)

/* Sections in test_capi_fetch.c (collective over `world`, 4 ranks). */
void testBarrier(kvcommComm_t world, int rank, int size);
void testFetch(kvcommComm_t world, int rank, int size);

#endif /* KVCOMM_TESTS_CAPI_CAPI_TEST_H_ */
