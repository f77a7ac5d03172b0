// liboptireduce's host path over real verbs devices: rank processes alternate between rxe0 and
// rxe1 in the rxe VM, so exchanges cross the veth where netem drops them. Exact mode gives exact
// sums; bounded mode ends every call with an error within bounds.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/elem.h"
#include "collectives/optireduce.h"
#include "tests/collectives/bounded_workload.h"
#include "tests/collectives/typed_buffer.h"
#include "tests/plugin/procs.h"
#include "tests/verbs/rxe_env.h"

// OPTIREDUCE_IB_HCA picks each rank's device. RXE_TEST_LOSS=<%> says netem loss is on (then
// elements must be lost in bounded mode); rxe-loss-suite.sh runs it inside the VM.
// RXE_TEST_DATAPATH=udp dry-runs the same checks over UDP on any host.
namespace optireduce::testing {
namespace {

using coll::DType;
using coll::Elem;

// Guest under TCG emulation: deadlines sized for a machine 10-50x slower than native.
constexpr const char* kTimeoutMs = "200";

bool have_devices() {
  const std::vector<std::string> h = rxe_hcas();
  return h.size() == 2 && rxe_have_device(h[0]) && rxe_have_device(h[1]);
}

std::string temp_dir() {
  char tmpl[] = "/tmp/optireduce-rxe-coll-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d != nullptr ? d : "/tmp";
}

// Rank r's engine opens only rxe(r % 2); set in the child before the communicator exists.
void pick_device(int rank) {
  if (rxe_udp_dry_run()) {
    setenv("OPTIREDUCE_DATAPATH", "udp", 1);
    return;
  }
  setenv("OPTIREDUCE_DATAPATH", "verbs", 1);
  setenv("OPTIREDUCE_IB_HCA", rxe_hcas()[static_cast<size_t>(rank % 2)].c_str(), 1);
}

// Small integers: their sums are exact in every type, so exact mode must match bit for bit.
double int_value(int r, size_t i) {
  return double(int((i * 7 + size_t(r) * 13) % 17) - 8);
}

class RxeColl : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!have_devices())
      GTEST_SKIP() << "needs two verbs devices (RXE_TEST_HCAS, default rxe0,rxe1): run inside "
                      "the rxe VM with RXE_NETDEV=veth";
  }
};

// ---- Exact: every type, 1 to 65537 elements, in and out of place, sum and average.
TEST_P(RxeColl, ExactEveryType) {
  const int n = GetParam();
  const std::string dir = temp_dir();
  auto rank = [&](Mesh& m) {
    pick_device(m.rank);
    optiOptions_t o;
    HCHECK(optiOptionsDefault(&o) == optiSuccess, "options: %s", optiGetLastError());
    o.mode = optiExact;
    optiComm_t comm = nullptr;
    HCHECK(optiHostCommInitFile(&comm, dir.c_str(), m.rank, n, &o) == optiSuccess, "init: %s",
           optiGetLastError());
    int calls = 0;
    for (optiDataType_t t : {optiFloat32, optiFloat16, optiBfloat16, optiFloat64}) {
      for (size_t count : {size_t(1), size_t(1000), size_t(65537)}) {
        for (int in_place = 0; in_place < 2; ++in_place) {
          const optiRedOp_t op = (count + size_t(in_place)) % 2 ? optiSum : optiAvg;
          std::vector<uint8_t> in(count * esize(t)), out(count * esize(t));
          for (size_t i = 0; i < count; ++i) set(t, in, i, int_value(m.rank, i));
          void* dst = in_place ? in.data() : out.data();
          HCHECK(optiAllReduce(in.data(), dst, count, t, op, comm, nullptr) == optiSuccess,
                 "rank %d: allreduce type %d count %zu: %s", m.rank, int(t), count,
                 optiGetLastError());
          ++calls;
          const auto& res = in_place ? in : out;
          for (size_t i = 0; i < count; ++i) {
            double sum = 0;
            for (int s = 0; s < n; ++s) sum += int_value(s, i);
            std::vector<uint8_t> ref(8);
            if (t == optiFloat64)
              set(t, ref, 0, op == optiSum ? sum : sum / n);
            else
              set(t, ref, 0, op == optiSum ? float(sum) : float(sum) / float(n));
            HCHECK(get(t, res, i) == get(t, ref, 0), "rank %d type %d count %zu i %zu: %g != %g",
                   m.rank, int(t), count, i, get(t, res, i), get(t, ref, 0));
          }
        }
      }
    }
    optiStats_t total;
    HCHECK(optiGetStats(comm, nullptr, &total) == optiSuccess, "stats");
    HCHECK(int(total.calls) == calls && int(total.exactCalls) == calls, "calls %" PRIu64,
           total.calls);
    HCHECK(optiCommDestroy(comm) == optiSuccess, "destroy");
  };
  EXPECT_EQ(run_ranks(n, rank, {}, kRxeRankTimeoutS), "");
}

// ---- Bounded: every call completes, results are finite and the error is bounded, with and
// without netem loss.
struct Lost {
  uint64_t elements = 0;
  uint64_t expected = 0;
  uint64_t deadline_hits = 0;
};

void bounded_rank(Mesh& m, const std::string& dir, bool hadamard) {
  const int n = m.n;
  pick_device(m.rank);
  optiOptions_t o;
  HCHECK(optiOptionsDefault(&o) == optiSuccess, "options: %s", optiGetLastError());
  o.mode = optiBounded;
  o.hadamard = hadamard;
  o.hadamardBlock = 1024;
  o.gatherFill = optiGatherFillOwn;  // the stand-in whose per-element bound this test checks
  optiComm_t comm = nullptr;
  HCHECK(optiHostCommInitFile(&comm, dir.c_str(), m.rank, n, &o) == optiSuccess, "init: %s",
         optiGetLastError());
  const size_t count = 1 << 16;
  const double eps = 0.05;
  const int calls = 6;
  BoundedWorkload w(m.rank, n, count, calls, eps);
  for (int call = 0; call < calls; ++call) {
    HCHECK(optiAllReduce(w.bufs[size_t(call)].data(), w.bufs[size_t(call)].data(), count,
                         optiFloat32, optiSum, comm, nullptr) == optiSuccess,
           "rank %d: allreduce call %d: %s", m.rank, call, optiGetLastError());
  }
  const BoundedWorkload::Error err = w.error(1);  // call 0 runs exact
  HCHECK(err.finite, "rank %d: non-finite result at %zu", m.rank, err.first_nonfinite);
  const double rel = err.rel_l2, max_abs = err.max_abs;
  optiStats_t total;
  HCHECK(optiGetStats(comm, nullptr, &total) == optiSuccess, "stats");
  std::fprintf(stderr,
               "rank %d (%s) hadamard %d: lost %.4f%%, deadline hits %" PRIu64
               ", rel L2 error %.5f, max abs %.4f, tB %u us tC %u us\n",
               m.rank, rxe_hcas()[size_t(m.rank % 2)].c_str(), int(hadamard),
               100 * total.lostFraction, total.deadlineHits, rel, max_abs, total.tbUs, total.tcUs);
  // Loss here can be whole messages past the deadline: one peer's whole contribution to a
  // shard, estimated by rescaling the others. The inputs are independent per rank, so such an
  // estimate is off by about the missing contribution itself (relative error near 1/sqrt(N-1)
  // over that shard; with Hadamard it is spread over the shard's blocks, not reduced), and
  // netem at 5% has produced 0.55 at 3 ranks. The bound is therefore "the result is not noise"
  // (< 1); the sharp per-element bound holds without Hadamard (a lost contribution is at most
  // 2 eps off).
  HCHECK(rel < 1.0, "rank %d: relative error %g", m.rank, rel);
  if (!hadamard)
    HCHECK(max_abs <= 2 * n * eps + 1e-3, "rank %d: max abs error %g", m.rank, max_abs);
  Lost mine{total.elementsLost[0] + total.elementsLost[1],
            total.elementsExpected[0] + total.elementsExpected[1], total.deadlineHits};
  if (m.rank != 0) {
    m.channel[0]->send(mine);
  } else {
    Lost all = mine;
    for (int j = 1; j < n; ++j) {
      const Lost l = m.channel[j]->recv<Lost>();
      all.elements += l.elements;
      all.expected += l.expected;
      all.deadline_hits += l.deadline_hits;
    }
    const int loss = rxe_loss_percent();
    std::fprintf(stderr, "job: %d ranks, netem loss %d%%: %.3f%% of elements lost\n", n, loss,
                 all.expected ? 100.0 * double(all.elements) / double(all.expected) : 0.0);
    // No "something was lost" check under loss: bounded mode repairs what netem drops while
    // the deadline leaves time, so a lossy run may well lose nothing. That netem dropped is
    // checked by rxe-loss-suite.sh, that drops became repairs or holes by rxe_pair_test.
  }
  m.barrier();
  HCHECK(optiCommDestroy(comm) == optiSuccess, "destroy");
}

const Env kBoundedEnv = {{"OPTIREDUCE_TIMEOUT_MS", kTimeoutMs},
                         {"OPTIREDUCE_CALIBRATION_STEPS", "0"}};

TEST_P(RxeColl, BoundedWithoutHadamard) {
  const std::string dir = temp_dir();
  EXPECT_EQ(
      run_ranks(
          GetParam(), [&](Mesh& m) { bounded_rank(m, dir, false); }, kBoundedEnv, kRxeRankTimeoutS),
      "");
}

TEST_P(RxeColl, BoundedWithHadamard) {
  const std::string dir = temp_dir();
  EXPECT_EQ(
      run_ranks(
          GetParam(), [&](Mesh& m) { bounded_rank(m, dir, true); }, kBoundedEnv, kRxeRankTimeoutS),
      "");
}

// Two ranks: one per device, all traffic over the veth. Three: ranks 0 and 2 share rxe0, so
// one device serves both a local peer and a remote one.
INSTANTIATE_TEST_SUITE_P(Ranks, RxeColl, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + "ranks";
                         });

}  // namespace
}  // namespace optireduce::testing
