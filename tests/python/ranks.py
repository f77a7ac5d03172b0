"""Shared by the Python tests: runs one test script as N rank processes on loopback and
collects what each rank reports, checks what they report, and holds the DDP workers' model and
dtype scenario, so that no test copies its own."""

import json
import math
import os
import socket
import subprocess
import sys
import tempfile

SKIP = 77  # meson's "skipped"
# The interpreter running the test: Debian's under meson (where python3-torch lives), or
# whichever holds a CUDA PyTorch on a GPU machine.
PYTHON = sys.executable


def import_torch_or_skip():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("skipped: no PyTorch for this interpreter (Debian: apt-get install python3-torch)")
        sys.exit(SKIP)


def repo_root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script, scenario, nranks, lib, env=None, timeout=240):
    """Runs `script worker SCENARIO LIB OUTDIR` as ranks 0..nranks-1 (torch.distributed env://
    on loopback). Returns (per-rank JSON results or None, per-rank exit codes, outputs).
    SCENARIO may name several, joined by '+', that each rank runs in turn in one process (each
    reports under OUTDIR/<scenario>/, report()); the results are then {scenario: per-rank}."""
    outdir = tempfile.mkdtemp(prefix=f"optireduce-py-{scenario}-")
    port = free_port()
    procs = []
    for r in range(nranks):
        e = dict(os.environ)
        e.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                  "WORLD_SIZE": str(nranks), "OMP_NUM_THREADS": "1",
                  "PYTHONPATH": os.path.join(repo_root(), "python")})
        e.update(env or {})
        procs.append(subprocess.Popen([PYTHON, script, "worker", scenario, lib, outdir], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"\n[rank killed after {timeout} s: a hang]"
        outputs.append(out)
        codes.append(p.returncode)
    if "+" not in scenario:
        return _read_results(outdir, nranks), codes, outputs
    return ({s: _read_results(os.path.join(outdir, s), nranks) for s in scenario.split("+")},
            codes, outputs)


def _read_results(outdir, nranks):
    results = []
    for r in range(nranks):
        path = os.path.join(outdir, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
        else:
            results.append(None)
    return results


def report(outdir, rank, result, scenario=None):
    """A rank's result; `scenario`: one of several that the same launch runs (launch())."""
    if scenario is not None:
        outdir = os.path.join(outdir, scenario)
        os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def leave():
    """Ends a rank once its result is reported (optireduce.torch.leave says why this way)."""
    import optireduce.torch as ort

    ort.leave()


def dump(outputs):
    for r, out in enumerate(outputs):
        print(f"----- rank {r} -----\n{out}")


def run_checked(test, script, scenario, nranks, lib, env=None, timeout=240):
    """launch() inside a unittest.TestCase: every rank must report and exit 0 (their output is
    printed otherwise). Returns the per-rank results."""
    results, codes, outputs = launch(script, scenario, nranks, lib, env=env, timeout=timeout)
    per = results if isinstance(results, dict) else {scenario: results}
    missing = [s for s, res in per.items() if any(r is None for r in res)]
    if missing or any(c != 0 for c in codes):
        dump(outputs)
    test.assertEqual(missing, [], "a rank reported nothing for these scenarios")
    test.assertEqual(codes, [0] * nranks, f"{scenario}: exit codes")
    return results


def assert_same_training(test, got, ref, tol=1e-5):
    """The hook's exact mode against DDP's own allreduce: replicas identical bit for bit (every
    rank receives the same reduced bytes), each within `tol` of the reference (the order of the
    additions may differ), nothing lost, and the loss going down."""
    for r, res in enumerate(got):
        test.assertEqual(res["weights"], got[0]["weights"], f"rank {r} diverged")
        for a, b in zip(res["weights"], ref[r]["weights"]):
            worst = max(abs(x - y) for x, y in zip(a, b))
            test.assertLess(worst, tol, "exact mode differs from DDP's allreduce by more than "
                            "reordering")
        test.assertEqual(res["lost"], 0)
    test.assertLess(got[0]["losses"][-1], got[0]["losses"][0])


def assert_trained_under_loss(test, results):
    """A bounded training under injected loss: every loss value and weight finite, the loss
    going down, some elements expected on every rank, and not everything lost. Returns the
    elements (lost, expected) over all ranks."""
    for r in results:
        test.assertTrue(all(math.isfinite(v) for v in r["losses"]))
        test.assertTrue(all(math.isfinite(v) for w in r["weights"] for v in w))
        test.assertLess(sum(r["losses"][-5:]) / 5, r["losses"][0])
        test.assertGreater(r["expected"], 0)
    lost = sum(r["lost"] for r in results)
    expected = sum(r["expected"] for r in results)
    test.assertLess(lost, expected)
    return lost, expected


# ---- rank side, shared by the CPU and CUDA DDP workers (torch is imported by the worker)
def ddp_model(torch):
    """The DDP tests' model, seeded: its DDP buckets (the first 1 MiB, the others bucket_cap_mb
    0.1) give several hook calls per step."""
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                               torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))


def train(torch, ddp, opt, state, rank, steps, device):
    """The DDP tests' training loop: each rank its own shard of a teacher's labels, the same
    teacher on every rank. Returns (losses, elements lost, elements expected) as the hook's
    per-step statistics count them (0, 0 without a state)."""
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    w_true = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))
    losses, lost, expected = [], 0, 0
    for _ in range(steps):
        x = torch.randn(128, 64, generator=g)
        y = (x @ w_true).argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if state is not None:
            s = state.step_stats()
            lost += s["elements_lost"]
            expected += s["elements_expected"]
    return losses, lost, expected


def dtype_averages(torch, state, rank, world, count, device):
    """The hook's average of each bucket dtype against the exact one: {str(dtype): equal}.
    Multiples of the rank count at magnitudes every dtype holds exactly, so the average is exact
    whatever the order of the additions."""
    result = {}
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        base = torch.arange(count, dtype=torch.float64).remainder(64) * world
        t = (base * (rank + 1)).to(dt).to(device)
        got = state.allreduce_async(t).wait()
        want = (base * sum(r + 1 for r in range(world)) / world).to(dt).to(device)
        result[str(dt)] = bool(torch.equal(got, want))
    return result


def subgroup_averages(torch, dist, ort, rank, world, device):
    """A state on each half of the ranks, both made first over the one store (as DDP over each
    data-parallel group of a model split by tensor or pipeline parallelism): whether each half
    averaged its own members' tensors alone, and whether a state over the half this rank is not
    in was refused with a message saying so."""
    half = world // 2
    members = [list(range(half)), list(range(half, world))]
    groups = [dist.new_group(m) for m in members]  # every rank makes every group, in order
    mine = 0 if rank < half else 1
    state = ort.OptiReduceState(process_group=groups[mine], mode="exact")
    got = state.allreduce_async(torch.full((3000,), float(rank + 1)).to(device)).wait()
    want = sum(r + 1 for r in members[mine]) / half  # 1.5 and 3.5 with 4 ranks: exact in fp32
    result = {"subgroup": bool(torch.all(got == want)), "foreign": ""}
    try:
        ort.OptiReduceState(process_group=groups[1 - mine])
    except ValueError as e:
        result["foreign"] = str(e)
    state.close()
    return result


def drift_and_resync(torch, ort, DDP, dist, resync, rank, device):
    """Bounded training in which rank 1's replica drifts after step 2 (its parameters moved, and
    its state told it lost phase-2 elements, as a straggler would have). With resync the hook
    (resync_steps=5) averages the parameters during step 5's backward pass; sync_parameters
    follows the last step either way. Returns digests of the parameters after step 5's backward
    pass and after the final sync, how far the former is from the exact average of the replicas
    before that step, and the state's resync count."""
    import hashlib
    model = ddp_model(torch).to(device)
    ddp = DDP(model, bucket_cap_mb=0.1)
    state = ort.OptiReduceState(mode="bounded", resync_steps=5 if resync else 0)
    ddp.register_comm_hook(state, ort.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    w_true = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))

    def flat():
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().clone()

    def digest(t):
        return hashlib.sha256(t.numpy().tobytes()).hexdigest()

    out = {}
    for step in range(7):
        x = torch.randn(128, 64, generator=g)
        y = (x @ w_true).argmax(dim=1)
        if step == 4:
            mean = flat()
            dist.all_reduce(mean)  # Gloo, outside the hook: the replicas' average before it
            mean /= dist.get_world_size()
        loss = torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        if step == 4:  # the resync step: the hook averaged the parameters during backward
            got = flat()
            out["at_resync"] = digest(got)
            out["at_resync_off_mean"] = float((got - mean).abs().max())
        opt.step()
        if step == 1 and rank == 1:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            state._drifted = True  # the worker is idle between steps
    state.sync_parameters(model.parameters())
    out["after_sync"] = digest(flat())
    out["resyncs"] = state.resyncs
    state.close()
    return out


def assert_resynced(test, on, off):
    """drift_and_resync's results with and without the resync: with it, every rank holds the
    same bits after the resync step, and they are the replicas' average; without it, rank 1
    stays off (so the first check can fail); sync_parameters ends the drift either way."""
    for r in on:
        test.assertEqual(r["at_resync"], on[0]["at_resync"],
                         f"rank {r['rank']} differs from rank 0 after the resync step")
        test.assertLess(r["at_resync_off_mean"], 1e-6, "the resync is not the average")
        test.assertGreaterEqual(r["resyncs"], 1)
    test.assertNotEqual(off[1]["at_resync"], off[0]["at_resync"])
    test.assertGreater(off[1]["at_resync_off_mean"], 1e-3)
    for res in (on, off):
        for r in res:
            test.assertEqual(r["after_sync"], res[0]["after_sync"],
                             f"rank {r['rank']} differs from rank 0 after sync_parameters")
    for r in off:
        test.assertEqual(r["resyncs"], 0)
