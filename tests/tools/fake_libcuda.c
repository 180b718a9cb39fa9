/* A stand-in libcuda.so.1 for tests of kvcomm's run-time driver loading on machines without a GPU driver. It exports
 * cuGetProcAddress_v2 only, like the real driver's entry for kvcomm: cuInit succeeds, cuDriverGetVersion reports
 * 12040, cuDeviceGetCount reports 0 devices; every other name resolves to a stub that fails (never called here).
 * FAKE_CUDA_MISSING="cuA,cuB" makes those names unresolvable, as an older or trimmed driver would. */
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
enum { kSuccess = 0, kNotFound = 500, kUnknown = 999 };

static CUresult fakeInit(unsigned flags) {
  (void)flags;
  return kSuccess;
}
static CUresult fakeDriverGetVersion(int* v) {
  *v = 12040;
  return kSuccess;
}
static CUresult fakeDeviceGetCount(int* n) {
  *n = 0;
  return kSuccess;
}
static CUresult fakeFails(void) {
  return kUnknown;
}

static int missing(const char* name) {
  const char* list = getenv("FAKE_CUDA_MISSING");
  size_t n = strlen(name);
  while (list && *list) {
    const char* end = strchr(list, ',');
    size_t len = end ? (size_t)(end - list) : strlen(list);
    if (len == n && strncmp(list, name, n) == 0) return 1;
    list = end ? end + 1 : NULL;
  }
  return 0;
}

CUresult cuGetProcAddress_v2(const char* name, void** fn, int version, unsigned long long flags, int* status) {
  (void)version;
  (void)flags;
  if (status) *status = 0;
  *fn = NULL;
  if (missing(name)) return kNotFound;
  if (strcmp(name, "cuInit") == 0)
    *fn = (void*)fakeInit;
  else if (strcmp(name, "cuDriverGetVersion") == 0)
    *fn = (void*)fakeDriverGetVersion;
  else if (strcmp(name, "cuDeviceGetCount") == 0)
    *fn = (void*)fakeDeviceGetCount;
  else
    *fn = (void*)fakeFails;
  return kSuccess;
}
