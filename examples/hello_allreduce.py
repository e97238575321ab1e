#!/usr/bin/env python3
"""Demo worker: report who this rank is, then a small torch.distributed gloo allreduce.

Run it with:  pytorch_exec -n 4 python3 examples/hello_allreduce.py   (a python3 with torch)
init_process_group("gloo") needs no arguments: pytorch_exec sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (the env:// method).
"""
import os
import socket

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} (local rank {os.environ['LOCAL_RANK']} of "
          f"{os.environ['LOCAL_WORLD_SIZE']}) on {socket.gethostname()}, pid {os.getpid()}, "
          f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
    t = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    expected = torch.arange(4, dtype=torch.float32) * world + world * (world - 1) / 2
    if not torch.equal(t, expected):
        raise SystemExit(f"rank {rank}: allreduce gave {t.tolist()}, expected {expected.tolist()}")
    if rank == 0:
        print(f"allreduce over {world} ranks: {t.tolist()} (correct)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
