// Whether this test binary is built with a sanitizer, for the few cases that thin their grids
// there. Under ASan or TSan the same code runs 5-20x slower on CI's 2 cores, and a grid's extra
// points that touch the same memory in the same order (another reduction operation, one more
// rank count between two that are kept) give a sanitizer nothing the kept points do not. The
// release build runs every point.
#pragma once

namespace optireduce::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace optireduce::testing
