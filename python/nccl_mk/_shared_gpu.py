"""Ranks sharing one GPU, for the 2-GPU tests and benchmarks on a 1-GPU machine: with
MK_SHARE_GPU=1 (set by scripts/mps.sh beside a running MPS server), as the C harnesses do
(test/perf/common/perf_launch.h), local rank r runs on device r % count and each process is
its own NCCL node, because NCCL refuses two ranks of one node on one GPU. Timings taken so
share one GPU's SMs and memory and have no NVLink: they are not 2-GPU figures."""
import os


def gpus_shared() -> bool:
    return os.environ.get("MK_SHARE_GPU") == "1"


def gpus_needed(nranks: int) -> int:
    """The GPUs nranks ranks need here: one each, or one when they may share."""
    return 1 if gpus_shared() else nranks


def claim_rank_device(local_rank: int):
    """This rank's torch device; with shared GPUs also makes this process its own NCCL node
    (NCCL_HOSTID), so call it before init_process_group."""
    import torch
    if not gpus_shared():
        return torch.device("cuda", local_rank)
    os.environ["NCCL_HOSTID"] = f"mk-torch-host-{local_rank}"
    return torch.device("cuda", local_rank % torch.cuda.device_count())
