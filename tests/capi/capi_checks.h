/* The C tests' checks, MPI-free and shared by every C test: the includer says how a line names this process
 * (CAPI_WHO_FMT, a printf format, and CAPI_WHO, its argument) and how a failed OK() ends it (CAPI_STOP()), and keeps
 * the failure counter g_failures. */
#ifndef KVCOMM_TESTS_CAPI_CAPI_CHECKS_H_
#define KVCOMM_TESTS_CAPI_CAPI_CHECKS_H_

#include <stdio.h>
#include <string.h>

#include "kvcomm/kvcomm.h"

#define CHECK(cond, ...)                                                                                    \
  do {                                                                                                      \
    if (!(cond)) {                                                                                          \
      fprintf(stderr, "[" CAPI_WHO_FMT "] %s:%d: CHECK(%s) failed: ", CAPI_WHO, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                                         \
      fprintf(stderr, "\n");                                                                                \
      ++g_failures;                                                                                         \
    }                                                                                                       \
  } while (0)

/* A call that must succeed; on failure prints the result name and last error, and ends the test (CAPI_STOP()). */
#define OK(call)                                                                                       \
  do {                                                                                                 \
    kvcommResult_t r_ = (call);                                                                        \
    if (r_ != kvcommSuccess) {                                                                         \
      fprintf(stderr, "[" CAPI_WHO_FMT "] %s:%d: %s -> %s: %s\n", CAPI_WHO, __FILE__, __LINE__, #call, \
              kvcommGetErrorString(r_), kvcommGetLastError());                                         \
      CAPI_STOP();                                                                                     \
    }                                                                                                  \
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

#endif /* KVCOMM_TESTS_CAPI_CAPI_CHECKS_H_ */
