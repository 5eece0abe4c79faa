"""A small DDP training loop that loads an MSCCL algorithm library through the environment.

    torchrun --standalone --nproc_per_node=N examples/train_ddp.py --algos DIR [--runtime executor|old|rccl]

N must be the library's GPU count (its files' ngpus): the runtimes select only files for the
world size, and msccl_environment refuses any other.

The MSCCL variables are set (backends.torch_dist.msccl_environment) before init_process_group,
which is what the runtimes need: they read them when the first communicator is created.

* CPU (no CUDA): backend gloo. The environment is set and checked, but MSCCL is not in the path:
  only NCCL/RCCL read it. The run shows the wiring and that training works; the log says so.
* GPUs: backend nccl, one GPU per process, unchanged command line. Launch with the MSCCL build of
  NCCL preloaded and its log on, e.g.

      LD_PRELOAD=$EXEC/build/lib/libnccl.so.2 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV \\
          torchrun --standalone --nproc_per_node=8 examples/train_ddp.py --algos algos

  and look for "MSCCL: Setup Kernel finished" (python -m backends.bench --check-log FILE reads it).
  DDP reduces gradients with all_reduce on its buckets, which is an in-place call: the library's
  allreduce files need inplace="1" and bands that cover the bucket sizes (printed at start).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from backends.torch_dist import RUNTIMES, export_lines, msccl_environment
from compiler.specs.errors import CompileError


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[train_ddp] {msg}", flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description="tiny DDP training with an MSCCL algorithm library")
    p.add_argument("--algos", metavar="DIR", help="algorithm library directory (for --runtime old: a file or dir)")
    p.add_argument("--runtime", default="executor", choices=RUNTIMES)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--cpu", action="store_true", help="use gloo on CPU even when CUDA is available")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size in MB (default 25)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        print("train_ddp: launch with torchrun, e.g. torchrun --standalone --nproc_per_node=4 examples/train_ddp.py "
              "--algos DIR", file=sys.stderr)
        return 2
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    gpu = torch.cuda.is_available() and not args.cpu
    try:
        env_cm = (msccl_environment(args.runtime, args.algos, world) if args.algos
                  else contextlib.nullcontext({}))
        with env_cm as env:
            for line in export_lines(env):
                log(rank, f"environment: {line}")
            if gpu:
                torch.cuda.set_device(local)
                device = torch.device("cuda", local)
                backend = "nccl"
            else:
                device = torch.device("cpu")
                backend = "gloo"
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
            try:
                if gpu:
                    log(rank, f"backend nccl; NCCL {'.'.join(map(str, torch.cuda.nccl.version()))} "
                              f"(msccl-executor-nccl reports 2.23.4; otherwise LD_PRELOAD its libnccl.so.2)")
                else:
                    log(rank, "backend gloo on CPU: MSCCL is not in the path (only NCCL/RCCL read the MSCCL "
                              "variables); this run checks the wiring and the training loop")
                train(args, rank, world, device)
                gc.collect()  # free DDP's reducer, which holds the process group, before destroying it
                dist.barrier()  # nobody tears down while a peer still talks to it
            finally:
                dist.destroy_process_group()
    except CompileError as e:
        if rank == 0:  # every rank fails the same way: say it once
            print(f"train_ddp: error: {e}{library_hint(args, world)}", file=sys.stderr)
        return 2
    return 0


def library_hint(args, world: int) -> str:
    """When the library is for another GPU count, how to make the two agree."""
    from backends.torch_dist import algorithm_files, read_header
    try:
        counts = sorted({read_header(f).ngpus for f in algorithm_files(args.algos, args.runtime)})
    except (CompileError, OSError):
        return ""
    if not counts or counts == [world]:
        return ""
    return (f" (the library is for {'/'.join(map(str, counts))} GPUs, this job has {world} ranks: launch with "
            f"--nproc_per_node={counts[0]}, or build a library for {world} GPUs, e.g. "
            f"msccl-compile library --hw fully-connected:{world} ... on CPU)")


def train(args, rank: int, world: int, device: torch.device) -> None:
    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts it)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 16)).to(device)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    log(rank, f"{world} ranks; model {nbytes} B of gradients per step, all_reduce (in place) in buckets of "
              f"<= {args.bucket_mb:g} MB")
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_mb)
    teacher = nn.Linear(64, 16).to(device)
    gen = torch.Generator(device="cpu").manual_seed(1000 + rank)  # different data per rank
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    first = last = None
    for step in range(args.steps):
        x = torch.randn(args.batch, 64, generator=gen).to(device)
        with torch.no_grad():
            y = teacher(x)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.detach().clone()
        dist.all_reduce(value)
        value = float(value) / world
        first = value if first is None else first
        last = value
        if step % max(1, args.steps // 5) == 0 or step == args.steps - 1:
            log(rank, f"step {step:4d}  loss {value:.5f}")
    # every rank must hold the same parameters after DDP's gradient averaging
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    diff = (flat - ref).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    log(rank, f"done: loss {first:.5f} -> {last:.5f}; parameters identical on all ranks: {float(diff) == 0.0}")


if __name__ == "__main__":
    sys.exit(main())
