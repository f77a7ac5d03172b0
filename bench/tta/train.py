#!/usr/bin/python3
"""Time-to-accuracy workload of the tail lab: an MLP 784-1024-1024-10 (1.86 M parameters, 7.45 MB
of fp32 gradients) on Fashion-MNIST, data-parallel over WORLD_SIZE processes with PyTorch DDP on
the Gloo backend; the gradient exchange is selected by --exchange:

  ddp-gloo         DDP's own allreduce (Gloo ring), no comm hook
  opti-exact       optireduce.torch.allreduce_hook, mode="exact"
  opti-bounded     optireduce.torch.allreduce_hook, mode="bounded", hadamard=False
  opti-bounded-ht  optireduce.torch.allreduce_hook, mode="bounded", hadamard=True

Every exchange sees the same seeds, data order, initial weights and hyper-parameters; only the
exchange differs. Nothing else of the library is set here: every OPTIREDUCE_* setting is the
default unless the caller's environment sets one (run-tta.sh sets none, except the fault injector
of the loss sweep, and records it).

Rank and world come from RANK / WORLD_SIZE, the rendezvous from MASTER_ADDR / MASTER_PORT
(torch.distributed env://). Rank 0 writes one JSON per run (--out): per step the step time (max
over ranks), the hook's statistics, and the test accuracy at every --eval-every steps with the
training time it took to get there (evaluation excluded).

Run with Debian's /usr/bin/python3 (python3-torch); a python3 first on PATH may lack torch.
"""
import argparse
import gzip
import json
import math
import os
import random
import resource
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

EXCHANGES = ["ddp-gloo", "opti-exact", "opti-bounded", "opti-bounded-ht"]
DATA = "/usr/share/datasets/fashion-mnist"
# Mean and standard deviation of the Fashion-MNIST training pixels (scaled to [0, 1]).
MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    """An IDX file (gzipped): magic (0, 0, dtype 0x08, ndim), ndim big-endian uint32 sizes, data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} bytes for dimensions {dims}")
    return data.reshape(dims)


def load(split, data_dir):
    x = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    x = (x.reshape(len(x), -1).astype(np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def make_model(hidden):
    return nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def percentile(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--exchange", choices=EXCHANGES, default="ddp-gloo")
    p.add_argument("--steps", type=int, default=300, help="step budget (final accuracy after it)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--schedule", choices=["cosine", "constant"], default="cosine",
                   help="learning rate over the step budget (cosine: to 0 at the last step)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--eval-from", type=int, default=0,
                   help="before this step evaluate only every 4th interval (evaluations cost "
                        "seconds here and the target is not near at the start)")
    p.add_argument("--target", type=float, default=0.85, help="test accuracy, fixed in advance")
    p.add_argument("--stop-at-target", action="store_true",
                   help="stop once the target is reached (default: run the whole budget)")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training images")
    p.add_argument("--test-limit", type=int, default=0,
                   help="final evaluation on the first N test images (0: all 10,000)")
    p.add_argument("--eval-limit", type=int, default=2000,
                   help="periodic evaluations on the first N test images (0: as --test-limit); "
                        "the same images for every exchange (a forward pass over all 10,000 costs "
                        "about 37 GFLOP, seconds on these cores)")
    p.add_argument("--straggler-rank", type=int, default=-1)
    p.add_argument("--straggler-ms", type=float, default=0.0)
    p.add_argument("--straggler-prob", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir", default=DATA)
    p.add_argument("--env", default="", help="environment label, copied into the output")
    p.add_argument("--out", required=True, help="JSON written by rank 0")
    p.add_argument("--lib", default="",
                   help="liboptireduce.so to load (default: the package's own search, which "
                        "finds <repo>/build/collectives/liboptireduce.so)")
    p.add_argument("--timeout-s", type=float, default=300, help="process-group timeout")
    return p.parse_args(argv)


def stage(rank, what):
    """One line on stderr per phase of a rank's life, so that a rank that hangs (a test's timeout
    kills it) leaves in its log where it stood."""
    print(f"[rank {rank}] {what}", file=sys.stderr, flush=True)


def main(argv=None):
    a = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    np.random.seed(a.seed)

    x_train, y_train = load("train", a.data_dir)
    x_test, y_test = load("t10k", a.data_dir)
    if a.train_limit:
        x_train, y_train = x_train[:a.train_limit], y_train[:a.train_limit]
    if a.test_limit:
        x_test, y_test = x_test[:a.test_limit], y_test[:a.test_limit]
    # Each rank evaluates its own slice of the test set; the counts are summed (outside the timing).
    test_x, test_y = x_test[rank::world], y_test[rank::world]

    from datetime import timedelta
    t_init = time.time()
    stage(rank, "rendezvous")
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=a.timeout_s))

    model = make_model(a.hidden)  # same seed on every rank and for every exchange
    ddp = DDP(model)
    state = None
    if a.exchange != "ddp-gloo":
        import optireduce
        import optireduce.torch as ort
        if a.lib:
            optireduce.load_library(a.lib)
        mode = "exact" if a.exchange == "opti-exact" else "bounded"
        hadamard = None if mode == "exact" else (a.exchange == "opti-bounded-ht")
        state = ort.OptiReduceState(process_group=None, mode=mode, hadamard=hadamard)
        ddp.register_comm_hook(state, ort.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)
    lossf = nn.CrossEntropyLoss()
    nparams = sum(p.numel() for p in model.parameters())

    # The data order: one permutation of the training set per epoch from (seed, epoch), the same
    # for every exchange; rank r takes every world-th index, a shard of its own.
    n = len(x_train)
    per_epoch = n // (a.batch * world)

    perm_cache = {}

    def indices(step):
        epoch, i = divmod(step, per_epoch)
        if epoch not in perm_cache:
            perm_cache.clear()
            g = torch.Generator().manual_seed(a.seed * 100003 + epoch)
            perm_cache[epoch] = torch.randperm(n, generator=g)
        base = i * a.batch * world
        return perm_cache[epoch][base + rank:base + a.batch * world:world]

    # The straggler: a seeded schedule of sleeps, the same draws on every rank and exchange.
    strag = random.Random(a.seed * 7919 + 17)

    eval_n = len(test_x) if not a.eval_limit else max(1, a.eval_limit // world)

    def evaluate(limit=None):
        model.eval()
        with torch.no_grad():
            correct = 0
            tx, ty = test_x[:limit], test_y[:limit]
            for j in range(0, len(tx), 1000):
                out = model(tx[j:j + 1000])
                correct += int((out.argmax(1) == ty[j:j + 1000]).sum())
        n_eval = len(tx)
        model.train()
        t = torch.tensor([correct, n_eval], dtype=torch.float64)
        dist.all_reduce(t)  # the default group's Gloo allreduce, outside the timed steps
        return float(t[0] / t[1])

    def replica_spread():
        """How far the replicas drifted apart: max over ranks of |w_r - mean| / |mean| (0 when
        every rank holds the same parameters). Outside the timed steps, over Gloo."""
        with torch.no_grad():
            w = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
            mean = w.clone()
            dist.all_reduce(mean)
            mean /= world
            d = torch.tensor([float((w - mean).norm() / mean.norm().clamp_min(1e-30))])
            dist.all_reduce(d, op=dist.ReduceOp.MAX)
            return float(d[0])

    dist.barrier()
    stage(rank, "set up")
    setup_s = time.time() - t_init
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    steps, evals = [], []
    train_s = 0.0
    wall0 = time.time()
    acc0 = evaluate(eval_n)
    evals.append({"step": 0, "train_s": 0.0, "wall_s": time.time() - wall0, "acc": acc0})
    reached = None
    for step in range(a.steps):
        idx = indices(step)
        xb, yb = x_train[idx], y_train[idx]
        sleep_ms = 0.0
        if a.straggler_prob > 0 and strag.random() < a.straggler_prob and rank == a.straggler_rank:
            sleep_ms = a.straggler_ms
        t0 = time.perf_counter()
        if sleep_ms:
            time.sleep(sleep_ms / 1000.0)
        if a.schedule == "cosine":
            for g in opt.param_groups:
                g["lr"] = 0.5 * a.lr * (1 + math.cos(math.pi * step / a.steps))
        opt.zero_grad(set_to_none=True)
        loss = lossf(ddp(xb), yb)
        loss.backward()  # DDP's buckets are exchanged during backward, finished before it returns
        opt.step()
        dt = time.perf_counter() - t0
        train_s += dt
        rec = {"step": step + 1, "t": dt, "loss": float(loss), "sleep_ms": sleep_ms}
        if state is not None:
            s = state.step_stats()
            rec.update({k: s.get(k) for k in ("lost_fraction", "elements_lost", "elements_expected",
                                              "deadline_hits", "calls", "exact_calls")})
            ls = state.last_stats
            if ls is not None:
                for k in ("tb_us", "tc_us"):
                    rec[k] = getattr(ls, k, None)
        steps.append(rec)
        k = step + 1
        if (k % a.eval_every == 0 and (k >= a.eval_from or k % (4 * a.eval_every) == 0)) \
                or k == a.steps:
            # The training time so far is the slowest rank's (max over ranks, outside the timing).
            tt = torch.tensor([train_s], dtype=torch.float64)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            acc = evaluate(eval_n)
            evals.append({"step": step + 1, "train_s": float(tt[0]), "wall_s": time.time() - wall0,
                          "acc": acc, "spread": replica_spread()})
            if rank == 0:
                print(f"[{a.exchange} {a.env}] step {step + 1} loss {float(loss):.4f} "
                      f"test acc {acc:.4f} train {float(tt[0]):.1f} s", flush=True)
            if reached is None and acc >= a.target:
                reached = evals[-1]
                if a.stop_at_target:
                    break
    wall_s = time.time() - wall0
    # CPU time of this process (every thread: training, the hook's worker, the transport's
    # progress thread) over the steps and their evaluations: what the exchange costs the cores
    # that the ranks share.
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    final_acc = evaluate()  # the whole (or --test-limit) test set, once, after the budget

    # Per-step times of every rank; a step's figure is its slowest rank's.
    # and the hook's counts are every rank's together (each rank counts what it received).
    all_t = [None] * world
    dist.all_gather_object(all_t, [(s["t"], s.get("elements_lost") or 0,
                                    s.get("elements_expected") or 0) for s in steps])
    all_cpu = [None] * world
    dist.all_gather_object(all_cpu, cpu_s)
    for i, s in enumerate(steps):
        s["t_rank0"] = s["t"]
        s["t"] = max(ts[i][0] for ts in all_t)
        s["lost_all"] = sum(ts[i][1] for ts in all_t)
        s["expected_all"] = sum(ts[i][2] for ts in all_t)
    resyncs = state.resyncs if state is not None else 0
    if state is not None:
        state.close()

    if rank == 0:
        ts = [s["t"] for s in steps]
        lost = [s["lost_all"] for s in steps]
        expected = sum(s["expected_all"] for s in steps)
        summary = {
            "exchange": a.exchange, "env": a.env, "seed": a.seed, "world": world,
            "params": nparams, "batch_per_rank": a.batch, "lr": a.lr, "momentum": a.momentum,
            "steps_run": len(steps), "step_budget": a.steps, "target": a.target,
            "tta_s": reached["train_s"] if reached else None,
            "tta_wall_s": reached["wall_s"] if reached else None,
            "steps_to_target": reached["step"] if reached else None,
            "final_acc": final_acc, "final_acc_subset": evals[-1]["acc"],
            "eval_images": eval_n * world, "test_images": len(x_test), "best_acc": max(e["acc"] for e in evals),
            "train_s": evals[-1]["train_s"], "wall_s": wall_s, "setup_s": setup_s,
            "step_p50_ms": 1e3 * percentile(ts, 0.5), "step_p99_ms": 1e3 * percentile(ts, 0.99),
            "step_mean_ms": 1e3 * sum(ts) / max(len(ts), 1),
            "lost_per_step": sum(lost) / max(len(lost), 1),
            "lost_fraction": (sum(lost) / expected) if expected else 0.0,
            "expected_per_step": expected / max(len(steps), 1),
            "deadline_hits": sum((s.get("deadline_hits") or 0) for s in steps),
            "cpu_s": sum(all_cpu), "cpu_ms_per_step": 1e3 * sum(all_cpu) / max(len(steps), 1),
            "replica_spread_max": max(e.get("spread", 0.0) for e in evals),
            "replica_spread_final": evals[-1].get("spread", 0.0),
            "resyncs": resyncs,
            "optireduce_env": {k: v for k, v in os.environ.items() if k.startswith("OPTIREDUCE_")},
        }
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"summary": summary, "evals": evals, "steps": steps,
                       "args": vars(a)}, f)
        os.replace(tmp, a.out)
        tta = f"{summary['tta_s']:.1f} s" if reached else "not reached"
        print(f"[{a.exchange} {a.env}] done: final acc {summary['final_acc']:.4f}, "
              f"time to {a.target:.0%} {tta}, step P50 {summary['step_p50_ms']:.1f} ms "
              f"P99 {summary['step_p99_ms']:.1f} ms, lost/step {summary['lost_per_step']:.1f}, "
              f"replica spread max {summary['replica_spread_max']:.2e}, resyncs {resyncs}, "
              f"CPU {summary['cpu_ms_per_step']:.0f} ms/step (all ranks)",
              flush=True)
    stage(rank, "closing")
    dist.barrier()  # no rank leaves while a peer may still be finishing its last collective
    stage(rank, "closed")
    return 0


if __name__ == "__main__":
    rc = main()
    # Out without Python's teardown or destroy_process_group, which can hang a rank with torch
    # 1.13 (optireduce.torch.leave says why; it hung 2 of 26 runs of tests/tta, with ddp-gloo and
    # opti-exact alike). Everything this script writes is written and closed by now; no barrier,
    # since a rank that failed leaves alone.
    from optireduce.torch import leave

    leave(rc, barrier=False)
