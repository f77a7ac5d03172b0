// Whether this test binary is built with a sanitizer, for the few cases that thin their grids
// or stay out there. Under ASan or TSan the same code runs 5-20x slower on CI's 2 cores:
//  - kSanitized: a grid's extra points that touch the same memory in the same order (another
//    reduction operation, one more rank count between two that are kept) give a sanitizer
//    nothing the kept points do not;
//  - kThreadSanitizer: a case that adds volume, or checks what a result means rather than how
//    threads meet on the way, runs where it is cheap (release and ASan).
// The release build runs every point.
#pragma once

namespace optireduce::testing {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = kThreadSanitizer;
#endif
#else
inline constexpr bool kSanitized = kThreadSanitizer;
#endif

}  // namespace optireduce::testing

// In a test's body: skips it under ThreadSanitizer, saying why.
#define OR_SKIP_UNDER_TSAN(why) \
  if (optireduce::testing::kThreadSanitizer) GTEST_SKIP() << (why)
