// optireduce-mpi-bench: the Open MPI MPI_Allreduce baseline of the tail lab, with the same
// command line, inputs, straggler schedule and CSV row as optireduce-bench (bench/lab_common.h).
// A separate binary so that the main bench does not link MPI. Launched by bench/lab/run-lab.sh
// through mpirun with an `ip netns exec` launch agent, one rank per namespace.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/lab_common.h"

namespace optireduce::lab {
namespace {

int mpi_main(int argc, char** argv) {
  Options o;
  if (std::string err = parse_options(argc, argv, &o); !err.empty()) {
    std::fprintf(stderr, "optireduce-mpi-bench: %s\n%s", err.c_str(), options_usage());
    return 2;
  }
  if (o.help) {
    std::printf("usage: optireduce-mpi-bench [options]\n%s", options_usage());
    return 0;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &o.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &o.world);
  if (!o.algos.empty() && o.algos != "mpi") {
    std::fprintf(stderr, "optireduce-mpi-bench: only --algo mpi\n");
    return 2;
  }
  bool wrong = false;  // an MPI allreduce is exact: a checked result off by more than rounding
  for (uint64_t bytes : size_list(o.min_bytes, o.max_bytes, o.factor)) {
    const size_t count = size_t(bytes / 4);
    std::vector<float> in(count), out(count);
    fill_input(o.seed, o.rank, in.data(), count);
    std::vector<double> exact;
    if (o.check) exact = exact_sum(o.seed, o.world, count);
    const auto sleeps = straggler_schedule(o.seed, o.iters, o.straggler_prob);
    const size_t n = size_t(o.iters);
    std::vector<double> t(n), err(n, 0.0);
    for (int i = -o.warmup; i < o.iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      if (i >= 0 && o.rank == o.straggler_rank && sleeps[size_t(i)])
        std::this_thread::sleep_for(std::chrono::microseconds(int64_t(o.straggler_ms * 1e3)));
      const double t0 = MPI_Wtime();
      MPI_Allreduce(in.data(), out.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      const double dt = MPI_Wtime() - t0;
      if (i < 0) continue;
      t[size_t(i)] = dt;
      // Checked only once every rank is past the call, as optireduce-bench does: a rank that
      // finished first would otherwise spend the check's CPU beside peers still inside theirs.
      if (o.check) {
        MPI_Barrier(MPI_COMM_WORLD);
        err[size_t(i)] = rel_l2_error(out.data(), exact);
      }
    }
    std::vector<double> tmax(n), emax(n);
    MPI_Reduce(t.data(), tmax.data(), int(n), MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(err.data(), emax.data(), int(n), MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (o.rank == 0) {
      std::vector<Iteration> it(n);
      for (size_t k = 0; k < n; ++k) {
        it[k].seconds = tmax[k];
        it[k].error = o.check ? emax[k] : NAN;
        it[k].straggle = o.straggler_rank >= 0 && sleeps[k];
      }
      const Row r = summarize(o.env, "mpi", o.world, bytes, it);
      if (wrong_exact_result(r)) wrong = true;
      append_csv(o.csv, r);
      append_samples(o.samples, r, it);
    }
  }
  return wrong ? 1 : 0;
}

}  // namespace
}  // namespace optireduce::lab

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rc = optireduce::lab::mpi_main(argc, argv);
  MPI_Finalize();
  return rc;
}
