/* Shared by the C ABI test's sources: the failure counter and the CHECK / OK / FAILS macros. */
#ifndef KVCOMM_TESTS_CAPI_CAPI_TEST_H_
#define KVCOMM_TESTS_CAPI_CAPI_TEST_H_

#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "kvcomm/kvcomm.h"

extern int g_rank;
extern int g_failures;

#define CAPI_WHO_FMT "rank %d"
#define CAPI_WHO g_rank
#define CAPI_STOP() MPI_Abort(MPI_COMM_WORLD, 1)
#include "capi_checks.h"

/* Sections in test_capi_fetch.c (collective over `world`, 4 ranks). */
void testBarrier(kvcommComm_t world, int rank, int size);
void testFetch(kvcommComm_t world, int rank, int size);

#endif /* KVCOMM_TESTS_CAPI_CAPI_TEST_H_ */
