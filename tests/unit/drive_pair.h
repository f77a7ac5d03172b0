// Drives one sending and one receiving connection over the in-memory link with a FakeClock: the
// loop the single-connection tests share (send_zero_copy, recv_in_place).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>

#include "transport/clock.h"
#include "transport/recv.h"
#include "transport/send.h"

namespace optireduce::testing {

// Tests both requests (either may be null: not waited for) until both are done, polling both
// connections and advancing the clock 100 us per pass, for at most `rounds` passes. True when
// both are done.
inline bool drive_pair(SendConn& s, RecvConn& r, FakeClock& clock, Request* sr, Request* rr,
                       int rounds = 20000) {
  bool sd = sr == nullptr, rd = rr == nullptr;
  size_t sz = 0;
  for (int i = 0; i < rounds && !(sd && rd); ++i) {
    if (!sd) {
      EXPECT_TRUE(s.test(sr, &sd, &sz).is_ok());
    }
    if (!rd) {
      EXPECT_TRUE(r.test(rr, &rd, &sz).is_ok());
    }
    s.poll();
    r.poll();
    clock.advance_us(100);
  }
  return sd && rd;
}

}  // namespace optireduce::testing
