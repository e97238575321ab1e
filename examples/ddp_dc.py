#!/usr/bin/env python3
"""Demo: a few DDP training steps over DataChannel, the torch.distributed backend "dc".

Run it with:  pytorch_exec -n 4 python3 examples/ddp_dc.py   (a python3 with torch, and the
pytorch_dc package on its path: PYTHONPATH=build/python in the build tree, see README)
"""
import torch
import torch.distributed as dist

import pytorch_dc  # registers the backend "dc"


def main():
    dist.init_process_group("dc")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    if rank == 0:
        print(f"backend {dist.get_backend()} ({pytorch_dc.describe()}): allreduce of rank+1 over "
              f"{world} ranks = {t.tolist()}", flush=True)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(5):
        x = torch.randn(32, 64, generator=g)
        loss = (model(x) - x.sum(1, keepdim=True) * 0.1).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # gradients averaged over the ranks by dc, overlapped with backward
        opt.step()
        if rank == 0:
            print(f"DDP step {step}: loss {loss.item():.4f}", flush=True)
    w = model.module.weight.detach().clone()
    dist.all_reduce(w, op=dist.ReduceOp.MAX)
    same = torch.equal(w, model.module.weight.detach())
    if rank == 0:
        print(f"parameters identical on all {world} ranks: {same}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
