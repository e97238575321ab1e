"""One rank of test_torch_cuda.py: the torch "dc" backend on CUDA tensors, one GPU per rank
(LOCAL_RANK).  MODE:

collectives  every collective on CUDA tensors against a host reference (each rank's input is
             known to all: a function of rank and seed), several dtypes and sizes, sync and
             async; the native allreduce (float dtypes, contiguous) and the host-staged ones
streams      stream semantics: a collective issued on a side stream after a long kernel
             (torch.cuda._sleep) sees that kernel's result; wait() returns before the GPU is
             done (on one node: across nodes the host-staged step waits for the kernel, as
             gloo's) and makes the current stream wait; isCompleted() and the Future follow the
             GPU; a recv on a side stream lands after that stream's earlier work
ddp STEPS    DDP on CUDA with "dc" and with "nccl" from the same start; parameters must agree
stall        (a 3 s timeout) an allreduce whose GPU work waits behind a 12 s kernel: issuing it
             does not wait, and a later call raises once the work outlasts the timeout, before
             the kernel ends, naming it (the backend's watcher aborts the NCCL communicators)
The GPU is LOCAL_RANK's, modulo the GPUs there are (simulated nodes share one: PYTORCH_DC_NODE).
Prints "ok MODE ..." on every rank.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import pytorch_dc

SIZES = [0, 1, 1001, (1 << 20) // 4 + 3]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
          torch.int8]
checks = 0


def data(n, dtype, seed, rank, dev):
    g = torch.Generator().manual_seed(seed * 131 + rank)
    return torch.randint(-2, 3, (n,), generator=g).to(dtype).to(dev)


def same(a, b, what):
    global checks
    checks += 1
    a, b = a.cpu(), b.cpu()
    ok = (torch.allclose(a.double(), b.double(), rtol=1e-2, atol=1e-2)
          if a.dtype.is_floating_point else torch.equal(a, b))
    if not ok:
        raise SystemExit(f"rank {dist.get_rank()}: {what}: dc {a[:8].tolist()} "
                         f"expected {b[:8].tolist()}")


def inputs(n, dtype, seed, w, dev):
    return [data(n, dtype, seed, r, dev) for r in range(w)]


def collectives(dev):
    rank, w = dist.get_rank(), dist.get_world_size()
    seed = 0
    for dtype in DTYPES:
        for n in SIZES:
            for async_op in (False, True):
                seed += 1
                mine = inputs(n, dtype, seed, w, "cpu")
                stack = torch.stack([m.double() for m in mine])
                what = f"{dtype} n={n} async={async_op}"
                # allreduce: sum and max (native for the float dtypes, staged for the rest)
                for op, ref in ((dist.ReduceOp.SUM, stack.sum(0)), (dist.ReduceOp.MAX,
                                                                    stack.max(0).values)):
                    t = mine[rank].to(dev)
                    work = dist.all_reduce(t, op=op, async_op=async_op)
                    if async_op:
                        work.wait()
                    same(t, ref.to(dtype), f"allreduce {op} {what}")
                # broadcast from the last rank
                t = mine[rank].to(dev)
                work = dist.broadcast(t, src=w - 1, async_op=async_op)
                if async_op:
                    work.wait()
                same(t, mine[w - 1], f"broadcast {what}")
                # allgather (list) and allgather_into_tensor
                outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(w)]
                work = dist.all_gather(outs, mine[rank].to(dev), async_op=async_op)
                if async_op:
                    work.wait()
                for r in range(w):
                    same(outs[r], mine[r], f"allgather from {r} {what}")
                flat = torch.empty(n * w, dtype=dtype, device=dev)
                work = dist.all_gather_into_tensor(flat, mine[rank].to(dev), async_op=async_op)
                if async_op:
                    work.wait()
                same(flat, torch.cat(mine), f"allgather_into_tensor {what}")
                # reduce_scatter_tensor: rank r's input is all ranks' blocks of n
                big = inputs(n * w, dtype, seed + 1000, w, "cpu")
                out = torch.empty(n, dtype=dtype, device=dev)
                work = dist.reduce_scatter_tensor(out, big[rank].to(dev), async_op=async_op)
                if async_op:
                    work.wait()
                ref = torch.stack([b.double() for b in big]).sum(0)[rank * n:(rank + 1) * n]
                same(out, ref.to(dtype), f"reduce_scatter_tensor {what}")
                # reduce to rank 0
                t = mine[rank].to(dev)
                work = dist.reduce(t, dst=0, async_op=async_op)
                if async_op:
                    work.wait()
                if rank == 0:
                    same(t, stack.sum(0).to(dtype), f"reduce {what}")
    # alltoall_base, gather, scatter, coalesced allreduce, send/recv: f32, one size
    n = 1001
    mine = inputs(n * w, torch.float32, 7, w, "cpu")
    out = torch.empty(n * w, device=dev)
    dist.all_to_all_single(out, mine[rank].to(dev))
    same(out, torch.cat([m[rank * n:(rank + 1) * n] for m in mine]), "alltoall_base")
    parts = [torch.empty(n * w, device=dev) for _ in range(w)] if rank == 0 else None
    dist.gather(mine[rank].to(dev), parts, dst=0)
    if rank == 0:
        for r in range(w):
            same(parts[r], mine[r], f"gather from {r}")
    got = torch.empty(n * w, device=dev)
    dist.scatter(got, [m.to(dev) for m in mine] if rank == 0 else None, src=0)
    same(got, mine[rank], "scatter")
    ts = [mine[rank][:5].clone().to(dev), mine[rank][5:9].clone().to(dev)]
    dist.all_reduce_coalesced(ts)
    total = torch.stack(mine).sum(0)
    same(torch.cat(ts), total[:9], "allreduce_coalesced")
    if w > 1:
        t = mine[rank].to(dev)
        if rank == 0:
            dist.send(t, dst=1)
        elif rank == 1:
            r = torch.empty_like(t)
            dist.recv(r, src=0)
            same(r, mine[0], "recv")
    dist.barrier()
    print(f"ok collectives rank {rank}: {checks} checks on {dev} "
          f"({pytorch_dc.describe()})", flush=True)


def streams(dev):
    rank, w = dist.get_rank(), dist.get_world_size()
    n = 1 << 20
    side = torch.cuda.Stream(dev)
    warm = torch.ones(1, device=dev)
    dist.all_reduce(warm)  # the NCCL communicator is made at the first native call
    with torch.cuda.stream(side):
        x = torch.zeros(n, device=dev)
        torch.cuda._sleep(int(2e9))  # about a second of GPU time, on the side stream
        x.fill_(rank + 1)  # after the sleep: the collective must see it
        t0 = time.monotonic()
        work = dist.all_reduce(x, async_op=True)
        work.wait()  # the side stream waits; the host does not wait for the GPU
        host = time.monotonic() - t0
        done_early = work.is_completed()
        y = x * 2  # ordered after the allreduce by wait()
    side.synchronize()
    expect = float(w * (w + 1))
    if not torch.all(y == expect):
        raise SystemExit(f"rank {rank}: after wait() on the side stream: {y[:4].tolist()}, "
                         f"expected {expect}")
    # across nodes the host-staged step holds wait() until the kernel is done, so the work may
    # be complete when wait() returns
    one_node = "PYTORCH_DC_NODE" not in os.environ
    if one_node and (host > 0.5 or done_early):
        raise SystemExit(f"rank {rank}: wait() held the host {host:.3f} s (completed: "
                         f"{done_early}) while the GPU slept")
    if not work.is_completed():
        raise SystemExit(f"rank {rank}: not completed after the stream synchronized")
    # the Future completes with the output on the device, ordered after the GPU work
    with torch.cuda.stream(side):
        z = torch.full((n,), float(rank + 1), device=dev)
        torch.cuda._sleep(int(1e9))
        fut = dist.all_reduce(z, async_op=True).get_future()
        v = fut.wait()[0]
        s = v.sum()
    side.synchronize()
    if v.device != z.device or float(s) != expect / 2 * n:
        raise SystemExit(f"rank {rank}: future value on {v.device}, sum {float(s)}")
    # a host-staged collective (int8 goes through host memory) keeps the same ordering
    with torch.cuda.stream(side):
        b = torch.zeros(n, dtype=torch.int8, device=dev)
        torch.cuda._sleep(int(1e9))
        b.fill_(1)
        dist.all_reduce(b, async_op=True).wait()
        c = b.to(torch.int32).sum()
    side.synchronize()
    if int(c) != w * n:
        raise SystemExit(f"rank {rank}: staged int8 allreduce on the side stream: {int(c)}")
    # a recv on a side stream lands after the work queued there before it (a fill after a sleep)
    if w > 1 and rank < 2:
        with torch.cuda.stream(side):
            r = torch.zeros(n, device=dev)
            if rank == 0:
                dist.send(torch.full((n,), 7.0, device=dev), dst=1)
            else:
                torch.cuda._sleep(int(1e9))
                r.fill_(-5.0)
                dist.recv(r, src=0)
                r2 = r * 1  # ordered after the recv by its wait()
        side.synchronize()
        if rank == 1 and not torch.all(r2 == 7.0):
            raise SystemExit(f"rank 1: recv on the side stream: {r2[:4].tolist()}, expected 7.0 "
                             "(the copy landed before the stream's earlier fill)")
    print(f"ok streams rank {rank}: wait() held the host {host * 1e3:.1f} ms of a ~1 s kernel",
          flush=True)


def train(backend, steps, dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 8)).to(dev)
    pg = None if backend == "world" else dist.new_group(backend=backend)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index],
                                                    process_group=pg, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(32, 64, generator=g).to(dev)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return [p.detach().cpu().clone() for p in model.parameters()]


def ddp(steps, dev):
    a = train("world", steps, dev)  # "cpu:gloo,cuda:dc": dc serves the CUDA tensors
    b = train("nccl", steps, dev)
    worst = max(float((x - y).abs().max()) for x, y in zip(a, b))
    if worst > 1e-4:
        raise SystemExit(f"rank {dist.get_rank()}: dc and nccl differ by {worst}")
    print(f"ok ddp rank {dist.get_rank()}: {steps} steps, max difference to nccl {worst:.2e}",
          flush=True)


def stall(dev):
    rank = dist.get_rank()
    x = torch.ones(1024, device=dev)
    dist.all_reduce(x)  # the NCCL communicator, made within the timeout
    torch.cuda.synchronize()
    t0 = time.monotonic()
    torch.cuda._sleep(int(2e8))
    torch.cuda.synchronize()
    per_cycle = (time.monotonic() - t0) / 2e8
    kernel = 12.0  # seconds of GPU time on the current stream, well past the 3 s timeout
    torch.cuda._sleep(int(kernel / per_cycle))
    t0 = time.monotonic()
    dist.all_reduce(x)  # its GPU work waits for the kernel
    issued = time.monotonic() - t0
    if issued > 0.5:
        raise SystemExit(f"rank {rank}: issuing the allreduce held the host {issued:.2f} s")
    error = None
    while error is None and time.monotonic() - t0 < 40:
        time.sleep(0.2)
        try:
            dist.all_reduce(torch.ones(1, device=dev))
        except RuntimeError as e:
            error = str(e)
    took = time.monotonic() - t0
    if error is None:
        raise SystemExit(f"rank {rank}: no error {took:.0f} s after GPU work began to outlast "
                         "the 3 s timeout")
    if "allreduce did not finish within its timeout (3 s)" not in error:
        raise SystemExit(f"rank {rank}: after {took:.1f} s: {error}")
    # raised once the timeout passed, not when the kernel ended (an abort waits for the GPU)
    if not 2.5 < took < kernel * 0.75:
        raise SystemExit(f"rank {rank}: raised {took:.1f} s after the allreduce (timeout 3 s, "
                         f"kernel {kernel:.0f} s): {error}")
    print(f"ok stall rank {rank}: a call raised {took:.1f} s after the stalled one (timeout 3 s, "
          f"a {kernel:.0f} s kernel ahead of it): {error}", flush=True)


def main():
    mode = sys.argv[1]
    local = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("cpu:gloo,cuda:dc" if mode == "ddp" else "dc",
                            timeout=datetime.timedelta(seconds=3 if mode == "stall" else 60))
    if mode == "collectives":
        collectives(dev)
    elif mode == "streams":
        streams(dev)
    elif mode == "ddp":
        ddp(int(sys.argv[2]), dev)
    elif mode == "stall":
        stall(dev)
    else:
        raise SystemExit(f"unknown mode {mode}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
