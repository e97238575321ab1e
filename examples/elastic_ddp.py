"""Elastic DDP training that goes on when nodes leave or join: run it as

    pytorch_exec --nnodes 2:4 --hostfile hosts python elastic_ddp.py --ckpt /shared/ckpt

Every generation of the job (pytorch_exec restarts all ranks when the membership changes) reads
its WORLD_SIZE and RANK from the environment, loads the newest checkpoint from --ckpt (a
directory every node sees), and trains until --steps; rank 0 writes a checkpoint every --every
steps (atomically: a new file, then a rename).  Each step's global batch (--batch samples, made
from the step number, so every generation sees the same data) is split evenly over the ranks and
DDP averages the gradients, so the weights at the end do not depend on how often the membership
changed, nor on the world sizes it went through (--batch must be a multiple of each).

--log FILE: every rank appends "gen G world W rank R step S" per step (tests read it).
--step-time SECONDS: sleep per step (to give a test time to act).
At the end rank 0 prints "done: step S weights SUM".
"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", required=True, help="checkpoint directory (shared by the nodes)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=2, help="checkpoint every N steps")
    ap.add_argument("--batch", type=int, default=24, help="global batch (samples per step)")
    ap.add_argument("--log", help="append one line per rank and step here")
    ap.add_argument("--step-time", type=float, default=0.0)
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = int(os.environ.get("PYTORCH_EXEC_GENERATION", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    if a.batch % world:
        raise SystemExit(f"--batch {a.batch} is not a multiple of the world size {world}")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    path = os.path.join(a.ckpt, "latest.pt")
    if os.path.exists(path):
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)

    per = a.batch // world
    while step < a.steps:
        g = torch.Generator().manual_seed(1000 + step)  # the step's data, whoever runs it
        x = torch.randn(a.batch, 16, generator=g)
        y = x.sum(dim=1, keepdim=True).sin()
        lo = rank * per
        loss = torch.nn.functional.mse_loss(ddp(x[lo:lo + per]), y[lo:lo + per])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if a.log:
            with open(a.log, "a") as f:
                f.write(f"gen {gen} world {world} rank {rank} step {step}\n")
        if rank == 0 and (step % a.every == 0 or step == a.steps):
            os.makedirs(a.ckpt, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       path + ".new")
            os.replace(path + ".new", path)
        if a.step_time:
            time.sleep(a.step_time)
    if rank == 0:
        total = sum(p.detach().double().sum().item() for p in model.parameters())
        print(f"done: step {step} weights {total:.9f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
