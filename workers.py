"""torchrun's workers, loaded only under torchrun (its WORLD_SIZE): joining the group, and the collectives a run takes.

`torchrun --nproc_per_node W` runs W copies of a script (docs/torchrun.md): each steps num_envs / W envs, the workers
average every gradient, and only rank 0 prints, logs and saves. harness.py calls these, and in one process its own
paths of them, which do nothing; this module imports none of the project's.
"""
import os
import sys

import torch
import torch.distributed as dist

SHARED_KEYS = ("args", "models", "optimizers", "global_step", "iteration", "num_iterations", "episode_returns",
               "script", "wandb_run_id")  # a checkpoint's keys that are the same on every worker (checkpoints.py's)


def take_gpu(cuda: bool) -> None:
    """Make this worker's GPU (LOCAL_RANK) the default, before anything touches CUDA, or every worker opens a context
    on GPU 0; NCCL needs one GPU per worker."""
    if cuda:
        local_rank, local_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
        if local_size > torch.cuda.device_count():
            raise SystemExit(f"torchrun started {local_size} workers on a machine with {torch.cuda.device_count()} "
                             f"GPUs; NCCL needs one GPU per worker (lower --nproc_per_node, or pass --no-cuda).")
        torch.cuda.set_device(local_rank)  # torch.device("cuda") is now this worker's GPU


def join(cuda: bool, rank: int, world_size: int, num_envs: int, adjusted: int, worker_share, check_share) -> None:
    """Join the other workers (NCCL with one GPU each, Gloo on CPU) once this worker's share, worker_share(rank),
    passes the script's checks, check_share(share), as a run of its own (num_envs: the total of the flags; adjusted:
    the script's); only rank 0 prints."""
    total = f"--num-envs {num_envs}" + (f", adjusted to {adjusted}," if adjusted != num_envs else "")
    if adjusted % world_size != 0:
        raise SystemExit(f"{total} is the total over all workers, so it must be a multiple of the {world_size} "
                         f"torchrun workers.")
    share, first, last = worker_share(rank), worker_share(0), worker_share(world_size - 1)  # these may stop too, e.g.
    if last.seed > 2**32 - 1:  # on a total that W does not divide; NumPy takes seeds below 2**32
        raise SystemExit(f"--seed {first.seed}: torchrun worker {world_size - 1} seeds with --seed + "
                         f"{last.seed - first.seed}, beyond 4294967295: lower --seed.")
    try:  # e.g. the minibatches must now split each worker's envs
        check_share(share)
    except SystemExit as error:
        raise SystemExit(f"With {world_size} torchrun workers each one runs {adjusted // world_size} of the "
                         f"{total.rstrip(',')} envs: {error}") from None
    dist.init_process_group("nccl" if cuda else "gloo")
    if rank != 0:
        sys.stdout = open(os.devnull, "w")


@torch.no_grad()
def broadcast_weights(*modules) -> None:
    """Copy rank 0's parameters to every worker (the workers' seeds, and so their initializations, differ)."""
    params = [p for module in modules for p in module.parameters()]
    flat = torch.cat([p.reshape(-1) for p in params])
    dist.broadcast(flat, src=0)
    for param, new in zip(params, flat.split([p.numel() for p in params])):
        param.copy_(new.view_as(param))


@torch.no_grad()
def average_gradients(*modules) -> None:
    """Replace every gradient by its mean over the workers (one all-reduce). Each worker's loss is a mean over its
    equal share of the minibatch, so this is the gradient of the whole minibatch."""
    grads = [p.grad for module in modules for p in module.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)  # sum over workers
    flat /= dist.get_world_size()
    for grad, mean in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(mean.view_as(grad))


def largest(value: int, device) -> int:
    """The largest of every worker's int (one all-reduce; NCCL reduces GPU tensors only)."""
    tensor = torch.tensor([value], device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor)


def own_part(x):
    """This worker's rows of a global_batch(): x [W * B] -> [B]."""
    return x.chunk(dist.get_world_size())[dist.get_rank()]


def mean_over_workers(x):
    """x averaged over the workers (one all-reduce), so that all take the same decision."""
    x = x.clone()
    dist.all_reduce(x)
    return x / dist.get_world_size()


def global_batch(x):
    """x [B] of every worker, concatenated in rank order: [W * B], the same on every worker."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def every_workers(value) -> list:
    """Every worker's Python value (lists of episodes, refusals), in rank order, on every worker."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def worker_part(checkpoint: dict) -> dict:
    """A worker's own part of its checkpoint (envs, random state, statistics, keys), which rank 0 writes."""
    return {key: value for key, value in checkpoint.items() if key not in SHARED_KEYS}


def parts_at_rank_0(checkpoint: dict):
    """Every worker's part of its checkpoint (worker_part), at rank 0 (in rank order; None on the others)."""
    parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(worker_part(checkpoint), parts, dst=0)
    return parts


def leave() -> None:
    """Leave the group of workers."""
    dist.destroy_process_group()


def described(world_size: int, args) -> str:
    """The start-up block's line on the workers (args: rank 0's share)."""
    return (f"{world_size:,} torchrun workers ({dist.get_backend()}), each with {args.num_envs} envs and seed "
            f"{args.seed} + {args.num_envs} x rank; the flags printed and logged are rank 0's share")
