// The multi-process scaffolding itself (two_procs.h, procs.h, and tests/collectives'
// forked_ranks.h on top of them): what run_pair and run_ranks return is all a CI log may keep of a
// failure, so it must name the rank whose check failed first and what that check said, not a rank
// that merely saw the first one's exit.
#include <gtest/gtest.h>

#include <signal.h>

#include <functional>

#include "tests/collectives/forked_ranks.h"
#include "tests/plugin/procs.h"

namespace optireduce::testing {
namespace {

TEST(Scaffold, RunPairNamesTheFailedCheck) {
  const std::string r = run_pair([](Channel& ch) { (void)ch.recv<uint32_t>(); },
                                 [](Channel&) { HCHECK(1 + 1 == 3, "the sum is %d", 1 + 1); });
  EXPECT_NE(r.find("rank 1 exited with status 1: "), std::string::npos) << r;
  EXPECT_NE(r.find("check failed: 1 + 1 == 3: the sum is 2"), std::string::npos) << r;
}

// Rank 2 fails; rank 1, reading from it, fails on EOF; then rank 0, reading from rank 1.
// waitpid() hands back the oldest child first, so without time stamps rank 0 was reported.
TEST(Scaffold, RunRanksNamesTheFirstFailureNotItsEchoes) {
  const std::string r = run_ranks(
      3,
      [](Mesh& m) {
        if (m.rank == 2) {
          usleep(50'000);  // the others are blocked in their reads by now
          HCHECK(m.rank != 2, "rank %d gives up", m.rank);
        }
        (void)m.channel[m.rank + 1]->recv<uint32_t>();
      },
      {}, 30);
  EXPECT_NE(r.find("rank 2 exited with status 1: "), std::string::npos) << r;
  EXPECT_NE(r.find("rank 2 gives up"), std::string::npos) << r;
}

TEST(Scaffold, CleanRanksAndAKilledVictimAreNoFailure) {
  EXPECT_EQ(run_ranks(2, [](Mesh& m) { m.barrier({0, 1}); }, {}, 30), "");
  EXPECT_EQ(run_ranks(
                2,
                [](Mesh& m) {
                  if (m.rank == 1) {
                    m.channel[0]->send<int32_t>(getpid());
                    pause();
                  }
                  const pid_t victim = m.channel[1]->recv<int32_t>();
                  HCHECK(kill(victim, SIGKILL) == 0, "kill failed");
                },
                {}, 30, 1),
            "");
}

TEST(Scaffold, AHangIsReportedAsSuch) {
  const std::string r = run_pair([](Channel&) { pause(); }, [](Channel&) {}, {}, 1);
  EXPECT_NE(r.find("rank 0 killed by signal 14 (timeout: hung)"), std::string::npos) << r;
}

// The collectives' ranks return a status instead of exiting on a check. Their failed check is
// named with the library's last error, and the ranks still waiting are killed, not left to
// sleep out their minute (before, the reaper waited for every rank and said only how many
// failed).
TEST(Scaffold, ForkedRanksNameTheFailedCheckAndStopTheOthers) {
  const double t0 = mono_s();
  const std::string r =
      run_ranks(3, Env{}, std::function<int(int)>([](int rank) {
                  FORKED_CHECK(rank != 1, "the last error", "rank %d gives up", rank);
                  ::sleep(60);
                  return 0;
                }),
                120);
  EXPECT_NE(r.find("rank 1 exited with status 1: "), std::string::npos) << r;
  EXPECT_NE(r.find("check failed: rank != 1: rank 1 gives up [the last error]"), std::string::npos)
      << r;
  EXPECT_LT(mono_s() - t0, 50.0) << "the other ranks were waited for";
}

}  // namespace
}  // namespace optireduce::testing
