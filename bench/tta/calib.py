#!/usr/bin/python3
"""Background calibration for run-tta.sh: times torch.distributed's Gloo allreduce (what DDP over
Gloo runs) of one fp32 tensor the size of train.py's gradients, ITERS times after a barrier each,
and prints one CSV line "p50_ms,p99_ms,p99_p50" (rank 0; an iteration's figure is its slowest
rank's). Rank, world and rendezvous as train.py (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
Usage: calib.py [ITERS [ELEMENTS]]"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1863690  # 784-1024-1024-10 MLP
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    x = torch.ones(count)
    ts = []
    for i in range(iters + 3):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        dt = time.perf_counter() - t0
        if i >= 3:  # warm-up
            ts.append(dt)
    t = torch.tensor(ts, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        s = sorted(t.tolist())
        p50 = s[len(s) // 2]
        p99 = s[min(len(s) - 1, int(0.99 * len(s)))]
        print(f"{1e3 * p50:.2f},{1e3 * p99:.2f},{p99 / p50:.3f}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
    # Out as train.py leaves: freeing the Gloo group can hang with torch 1.13.
    from optireduce.torch import leave

    leave(0, barrier=False)
