// HostExchange (collectives/host_exchange.h) across processes on loopback: what a phase that
// fails leaves behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/host_exchange.h"
#include "collectives/poll_backoff.h"
#include "collectives/store.h"
#include "tests/collectives/forked_ranks.h"

namespace optireduce::coll {
namespace {

using testing::mark;
using testing::run_ranks;
using testing::temp_dir;
using testing::wait_mark;

#define CHECK(cond, ...) FORKED_CHECK(cond, ex ? ex->error().c_str() : "", __VA_ARGS__)

constexpr size_t kBytes = 256 << 10;
constexpr uint8_t kCanary = 0xC3;

// The waiting caller's pauses: yields first, then naps that grow with the wait, so that a short
// wait ends within a few percent of its length and a long one wakes a third as often.
TEST(PollBackoff, NapsGrowWithTheWaitWithinTheirBounds) {
  using std::chrono::microseconds;
  using std::chrono::milliseconds;
  using std::chrono::nanoseconds;
  for (int p = 0; p < PollBackoff::kYields; ++p)
    EXPECT_EQ(PollBackoff::pause_after(p, milliseconds(5)), nanoseconds(0)) << p;
  const int k = PollBackoff::kYields;
  EXPECT_EQ(PollBackoff::pause_after(k, microseconds(50)), PollBackoff::kMinNap);
  EXPECT_EQ(PollBackoff::pause_after(k, microseconds(1600)), microseconds(50));
  EXPECT_EQ(PollBackoff::pause_after(k, milliseconds(25)), PollBackoff::kMaxNap);
  EXPECT_EQ(PollBackoff::kMaxNap, microseconds(60));
  // Never more than about 3% of what was waited, or the shortest nap.
  for (int us = 0; us < 10'000; us += 37) {
    const nanoseconds d = PollBackoff::pause_after(k + us, microseconds(us));
    EXPECT_LE(d, std::max(PollBackoff::kMinNap, nanoseconds(microseconds(us)) / 32)) << us;
    EXPECT_GE(d, PollBackoff::kMinNap);
  }
}

// Rank 0 posts receives from ranks 1 and 2; rank 2 goes away, so the phase fails. The caller
// then owns its buffers again (it may free them: an aborted communicator's scratch, a tensor the
// training loop drops), so rank 1's message, sent only after the failure, must not land in
// them. Before the fix the receive from rank 1 stayed posted and the progress thread wrote
// rank 1's bytes into the buffer after end_phase had returned its error.
TEST(HostExchange, AFailedPhaseLeavesNoBufferInUse) {
  const std::string dir = temp_dir();
  const std::string failed = run_ranks(3, {}, [&](int rank) {
    FileStore store(dir);
    std::unique_ptr<HostExchange> ex;
    std::string err;
    CHECK(HostExchange::create(&store, "x", rank, 3, 60'000, &ex, &err), "create: %s", err.c_str());
    if (rank == 2) {
      CHECK(wait_mark(dir, "posted"), "rank 0 never posted");
      ex.reset();  // closes its connections: rank 0's receive from it fails
      CHECK(wait_mark(dir, "checked"), "rank 0 never checked");
      return 0;
    }
    if (rank == 1) {
      CHECK(wait_mark(dir, "failed"), "rank 0's phase never failed");
      std::vector<uint8_t> data(kBytes, 0x11);
      const SendOp send{0, data.data(), data.size()};
      // Whether this send completes or fails (rank 0 closed) is not the point: where its
      // bytes go is.
      Status s = ex->begin_phase(Mode::kExact, 1, {}, {});
      if (s) s = ex->post_sends({&send, 1});
      if (s) s = ex->end_phase();
      mark(dir, "sender-done");
      CHECK(wait_mark(dir, "checked"), "rank 0 never checked");
      return 0;
    }
    std::vector<uint8_t> from1(kBytes, 0), from2(kBytes, 0);
    // Rank 2's receive first: end_phase waits in order, and that one fails.
    RecvOp recvs[2] = {{2, from2.data(), kBytes}, {1, from1.data(), kBytes}};
    const uint32_t round_end[1] = {2};
    CHECK(ex->begin_phase(Mode::kExact, 1, recvs, round_end), "begin_phase");
    CHECK(ex->post_sends({}), "post_sends");
    mark(dir, "posted");
    const Status s = ex->end_phase();
    CHECK(!s, "the phase succeeded without rank 2");
    std::memset(from1.data(), kCanary, kBytes);  // the caller's again
    mark(dir, "failed");
    CHECK(wait_mark(dir, "sender-done"), "rank 1 never finished its send");
    ::usleep(200'000);  // time for stray bytes to land, were the receive still posted
    size_t changed = 0;
    for (uint8_t b : from1) changed += b != kCanary;
    mark(dir, "checked");
    CHECK(changed == 0, "%zu bytes of a buffer written after its phase failed", changed);
    // And the exchange says so when used again, rather than touching closed connections.
    CHECK(!ex->begin_phase(Mode::kExact, 1, recvs, round_end), "a phase after the failure");
    return 0;
  });
  EXPECT_EQ(failed, "");
}

// A send posted before its bytes are written (Tar posts each shard before its Hadamard encode)
// carries the bytes as they were when released, over the real transport: the sender writes
// each piece only after the post and releases it after a pause, so a byte that left before its
// release would arrive as the filler. A send never released whole fails its phase at once, as
// the schedule's bug it is, instead of waiting for bytes that will never come.
TEST(HostExchange, AHeldSendCarriesTheBytesAsReleased) {
  const std::string dir = temp_dir();
  const std::string failed = run_ranks(2, {}, [&](int rank) {
    FileStore store(dir);
    std::unique_ptr<HostExchange> ex;
    std::string err;
    CHECK(HostExchange::create(&store, "h", rank, 2, 60'000, &ex, &err), "create: %s", err.c_str());
    std::vector<uint8_t> want(kBytes);
    for (size_t i = 0; i < kBytes; ++i) want[i] = uint8_t(i * 131 + (i >> 9));
    if (rank == 1) {
      std::vector<uint8_t> data(kBytes, 0xEE);  // not written yet
      SendOp send{0, data.data(), data.size()};
      send.ready = 0;
      CHECK(ex->begin_phase(Mode::kExact, 1, {}, {}), "begin_phase");
      CHECK(ex->post_sends({&send, 1}), "post_sends");
      for (size_t at : {size_t(40'000), size_t(100'001), kBytes}) {
        const size_t from = at == 40'000 ? 0 : at == 100'001 ? 40'000 : 100'001;
        ::usleep(20'000);
        std::memcpy(data.data() + from, want.data() + from, at - from);
        CHECK(ex->release_send(0, at), "release_send %zu", at);
      }
      CHECK(ex->end_phase(), "end_phase");
      CHECK(wait_mark(dir, "checked"), "rank 0 never checked");
      return 0;
    }
    std::vector<uint8_t> got(kBytes, 0);
    RecvOp recv{1, got.data(), kBytes};
    const uint32_t round_end[1] = {1};
    CHECK(ex->begin_phase(Mode::kExact, 1, {&recv, 1}, round_end), "begin_phase");
    CHECK(ex->post_sends({}), "post_sends");
    CHECK(ex->end_phase(), "end_phase");
    size_t wrong = 0;
    for (size_t i = 0; i < kBytes; ++i) wrong += got[i] != want[i];
    CHECK(wrong == 0, "%zu bytes differ from what was released", wrong);
    // A held send left unreleased: end_phase says so at once.
    SendOp held{1, got.data(), kBytes};
    held.ready = 1000;
    CHECK(ex->begin_phase(Mode::kExact, 2, {}, {}), "begin_phase 2");
    CHECK(ex->post_sends({&held, 1}), "post_sends 2");
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(!ex->end_phase(), "a phase ended with a send never released whole");
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1), "it waited first");
    CHECK(ex->error().find("never released") != std::string::npos, "error: %s",
          ex->error().c_str());
    mark(dir, "checked");
    return 0;
  });
  EXPECT_EQ(failed, "");
}

}  // namespace
}  // namespace optireduce::coll
