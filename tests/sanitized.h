// Whether this test binary is built with a sanitizer, for the few cases that thin their grids
// or stay out there. Under ASan or TSan the same code runs 5-20x slower on CI's 2 cores:
//  - kSanitized: a grid's extra points that touch the same memory in the same order (another
//    reduction operation, one more rank count between two that are kept) give a sanitizer
//    nothing the kept points do not;
//  - kThreadSanitizer: a case that adds volume, or checks what a result means rather than how
//    threads meet on the way, runs where it is cheap (release and ASan).
// The release build runs every point.
#pragma once

// GCC defines __SANITIZE_*__; clang answers __has_feature, which GCC 12 does not know.
#if defined(__has_feature)
#define OR_HAS_FEATURE(x) __has_feature(x)
#else
#define OR_HAS_FEATURE(x) 0
#endif

namespace optireduce::testing {

#if defined(__SANITIZE_THREAD__) || OR_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

#if defined(__SANITIZE_ADDRESS__) || OR_HAS_FEATURE(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = kThreadSanitizer;
#endif

}  // namespace optireduce::testing

// In a test's body: skips it under ThreadSanitizer, saying why. The empty branch keeps the
// macro's `if` from taking an `else` that follows its use (gtest's own macros do the same).
#define OR_SKIP_UNDER_TSAN(why)                 \
  if (!optireduce::testing::kThreadSanitizer) { \
  } else                                        \
    GTEST_SKIP() << (why)
