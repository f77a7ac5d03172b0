"""optireduce.torch's DDP hook on CUDA tensors: the GPU path (liboptireduce's kernels and an
NCCL communicator the state builds from the store) under an unmodified PyTorch. Two processes on
one GPU, each its own NCCL node (NCCL_HOSTID), so NCCL's traffic goes through the plugin; Gloo
is the process group, as in ddp_test.py. Exact mode gives DDP's own result, every bucket dtype
is averaged, bounded mode under injected loss trains and counts its losses, and drifted
replicas are made the same bits again. Skips without
PyTorch or without a CUDA device.

    ddp_cuda_test.py LIB PLUGIN      the tests (liboptireduce.so, libnccl-net-optireduce.so)
    ddp_cuda_test.py worker SCENARIO LIB OUTDIR    one rank (launched by the tests)
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402

N = 2  # ranks, all on GPU 0


# ---------------------------------------------------------------- rank side
def _train(scenario, lib, outdir):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import optireduce
    import optireduce.torch as ort

    optireduce.load_library(lib)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    # Two NCCL nodes on one host and one GPU: NCCL reads the host id at its first init.
    os.environ["NCCL_HOSTID"] = f"optireduce-py-node-{rank}"
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    result = {"rank": rank}

    if scenario == "dtypes":
        state = ort.OptiReduceState(mode="exact")
        result.update(ranks.dtype_averages(torch, state, rank, world, 300000, dev))
        state.close()
        ranks.report(outdir, rank, result)
        return

    if scenario in ("resync", "no_resync"):
        result.update(ranks.drift_and_resync(torch, ort, DDP, dist, scenario == "resync", rank,
                                             dev))
        ranks.report(outdir, rank, result)
        return

    model = ranks.ddp_model(torch).to(dev)
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=0.1)
    state = None
    if scenario != "default":
        state = ort.OptiReduceState(mode="bounded" if scenario == "bounded_loss" else "exact")
        ddp.register_comm_hook(state, ort.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    steps = 40 if scenario == "bounded_loss" else 12
    losses, lost, expected = ranks.train(torch, ddp, opt, state, rank, steps, dev)
    result["losses"] = losses
    result["weights"] = [p.detach().flatten().cpu().tolist() for p in model.parameters()]
    result["lost"], result["expected"] = lost, expected
    if state is not None:
        result["calls"] = state.last_stats.as_dict()
        state.close()
    ranks.report(outdir, rank, result)


# ---------------------------------------------------------------- tests
LIB = None
PLUGIN = None


class DdpHookCuda(unittest.TestCase):
    def run_ranks(self, scenario, env=None):
        e = {"NCCL_NET_PLUGIN": PLUGIN, "NCCL_SOCKET_IFNAME": "lo", "OPTIREDUCE_IFNAME": "lo",
             "NCCL_DEBUG": "WARN"}
        e.update(env or {})
        return ranks.run_checked(self, __file__, scenario, N, LIB, env=e, timeout=120)

    def test_exact_mode_matches_ddps_own_allreduce(self):
        ranks.assert_same_training(self, self.run_ranks("exact"), self.run_ranks("default"))

    def test_every_bucket_dtype_is_averaged(self):
        for r in self.run_ranks("dtypes"):
            for dt in ("torch.float32", "torch.float16", "torch.bfloat16", "torch.float64"):
                self.assertTrue(r[dt], f"rank {r['rank']}: {dt} average wrong")

    def test_drifted_replicas_are_made_the_same_bits_again(self):
        ranks.assert_resynced(self, self.run_ranks("resync"), self.run_ranks("no_resync"))

    def test_bounded_mode_under_loss_trains_and_counts_its_losses(self):
        res = self.run_ranks("bounded_loss", env={"OPTIREDUCE_FAULT_DROP": "0.05"})
        lost, expected = ranks.assert_trained_under_loss(self, res)
        print(f"CUDA, bounded under 5% drops: {lost} of {expected} gradient elements lost "
              f"({100 * lost / expected:.2f}%)")


def _cuda_or_skip():
    ranks.import_torch_or_skip()
    import torch
    if not torch.cuda.is_available():
        print("skipped: no CUDA device for PyTorch")
        sys.exit(ranks.SKIP)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        _train(*sys.argv[2:5])
        ranks.leave()
    _cuda_or_skip()
    LIB = os.path.abspath(sys.argv.pop(1))
    PLUGIN = os.path.abspath(sys.argv.pop(1))
    unittest.main()
