// Which sanitizer this test binary was built with. Their allocators keep freed memory (ASan's quarantine) and map
// regions of their own, so process-wide memory counts (RSS, /proc/self/maps lines) mean something else there.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define KVTEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVTEST_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define KVTEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVTEST_TSAN 1
#endif
#endif

namespace kvtest {

#if defined(KVTEST_ASAN) || defined(KVTEST_TSAN)
/// True when a sanitizer's allocator stands between the code and the kernel (RSS does not fall when memory is freed).
inline constexpr bool kSanitizerAllocator = true;
#else
inline constexpr bool kSanitizerAllocator = false;
#endif

}  // namespace kvtest
