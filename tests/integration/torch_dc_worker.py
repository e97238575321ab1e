"""One rank of the torch "dc" backend tests (test_torch_dc.py): MODE [ARGS].

collectives   every collective of the backend against gloo's result in the same run (a gloo
              group over the same ranks), dtypes x ops x sizes, sync and async, non-contiguous
              tensors, a sub-group; prints "ok N checks" on rank 0
ddp STEPS     DDP on dc and on gloo from the same start; parameters must agree
hooks STEPS   the same with DDP's comm hooks: allreduce, fp16 and bf16 compression, PowerSGD
              (whose callbacks issue collectives and wait for them)
callbacks     a Future's callback that issues a collective (sync, or async and waits for it),
              a recv inside an irecv's callback, a recv while the group's first collective
              waits for the sender, and a callback that destroys the group; results checked
unfinished    async allreduces with Python callbacks, and the program ends at once (no wait, no
              destroy_process_group): it must exit 0
autograd      copies into tensors that autograd or inference mode guards: non-contiguous and
              channels_last Parameters under no_grad (broadcast, allreduce sync and async,
              allreduce_coalesced), a non-contiguous Parameter's allreduce without no_grad, a
              recv into one, and all_gather (list), gather and a non-contiguous broadcast under
              inference_mode; against gloo on the same tensors
fsdp STEPS    the same with FSDP (fully_shard) where the installed torch has it
fail VICTIM   allreduces in a loop; rank VICTIM exits in the middle; the others must raise
mismatch      rank 0 calls allreduce, the others broadcast: every rank must raise
restart       init_process_group("dc") in every generation; rank 1 fails the first one
launcher INIT init_process_group("dc", init_method=INIT) under any launcher (env://: the
              launcher's RANK/WORLD_SIZE/MASTER_*; tcp:// and file://: rank and size from RANK/
              WORLD_SIZE or Open MPI's OMPI_COMM_WORLD_*); allreduce, allgather and broadcast
              checked; prints "ok launcher SCHEME rank R of N (description)" on every rank
devices       the devices "dc" is registered for (cuda only where pytorch_dc.cuda_support()), the
              spellings "cpu:dc,cuda:dc" and "cpu:gloo,cuda:dc" (the dc backend serves cuda,
              gloo cpu), and the error for a CUDA tensor where dc takes none; prints "ok devices"
"""
import datetime
import gc
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import pytorch_dc  # noqa: F401  (registers "dc")

SIZES = [0, 1, 1001, (1 << 20) // 4 + 3]  # elements: empty, one, odd, over 1 MiB of f32
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8, torch.int8, torch.bool]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
       dist.ReduceOp.AVG]
checks = 0


def data(n, dtype, seed, rank):
    """Small integers (exact in every dtype and under sum/product of four ranks)."""
    g = torch.Generator().manual_seed(seed * 131 + rank)
    lo, hi = (0, 2) if dtype in (torch.uint8, torch.bool) else (-2, 3)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def same(a, b, what):
    global checks
    checks += 1
    if a.dtype.is_floating_point:
        ok = torch.allclose(a.double(), b.double(), rtol=1e-2, atol=1e-2)
    else:
        ok = torch.equal(a, b)
    if not ok:
        raise SystemExit(f"rank {dist.get_rank()}: {what}: dc {a[:8].tolist()} gloo {b[:8].tolist()}")


def reference(t, op, gloo):
    """gloo's allreduce of t; AVG, and what gloo lacks (bool, bf16...), computed here from every
    rank's input gathered by gloo."""
    w = dist.get_world_size(gloo)
    if op == dist.ReduceOp.AVG or t.dtype in (torch.bool, torch.bfloat16, torch.float16):
        parts = [torch.empty_like(t) for _ in range(w)]
        dist.all_gather(parts, t, group=gloo)
        s = torch.stack([p.double() for p in parts])
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            r = s.sum(0) / (w if op == dist.ReduceOp.AVG else 1)
        elif op == dist.ReduceOp.PRODUCT:
            r = s.prod(0)
        else:
            r = s.min(0).values if op == dist.ReduceOp.MIN else s.max(0).values
        return (r != 0) if t.dtype == torch.bool else r.to(t.dtype)
    r = t.clone()
    dist.all_reduce(r, op=op, group=gloo)
    return r


def check_allreduce(gloo, seed):
    rank = dist.get_rank()
    for dtype in DTYPES:
        for op in OPS:
            if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                continue
            for n in SIZES if dtype == torch.float32 else SIZES[:3]:
                t = data(n, dtype, seed, rank)
                want = reference(t, op, gloo)
                mine = t.clone()
                work = dist.all_reduce(mine, op=op, async_op=(n % 2 == 1))
                if work is not None:
                    work.wait()
                same(mine, want, f"allreduce {dtype} {op} n={n}")
    # The average of uint8 does not wrap (its sum is taken in int32): 200 everywhere is 200.
    t = torch.full((5,), 200, dtype=torch.uint8)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    same(t, torch.full((5,), 200, dtype=torch.uint8), "allreduce AVG of uint8")
    # non-contiguous: every other column of a matrix
    m = data(40, torch.float32, seed, rank).view(4, 10)
    col = m[:, ::2]
    want = reference(col.contiguous(), dist.ReduceOp.SUM, gloo)
    dist.all_reduce(col)
    same(col.contiguous(), want, "allreduce of a non-contiguous view")
    ts = [data(n, torch.float32, seed + n, rank) for n in (3, 0, 1001)]
    wants = [reference(t, dist.ReduceOp.SUM, gloo) for t in ts]
    dist.all_reduce_coalesced(ts)
    for t, w in zip(ts, wants):
        same(t, w, "allreduce_coalesced")


def check_movement(gloo, seed):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.int8):
        for n in SIZES if dtype == torch.float32 else SIZES[:3]:
            t = data(n, dtype, seed, rank)
            for root in {0, world - 1}:
                a, b = t.clone(), t.clone()
                dist.broadcast(a, root)
                dist.broadcast(b, root, group=gloo)
                same(a, b, f"broadcast {dtype} n={n} root={root}")
            outs = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(outs, t)
            ref = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(ref, t, group=gloo)
            same(torch.cat(outs), torch.cat(ref), f"all_gather {dtype} n={n}")
            big = torch.empty(n * world, dtype=dtype)
            dist.all_gather_into_tensor(big, t)
            same(big, torch.cat(ref), f"all_gather_into_tensor {dtype} n={n}")
            g = [torch.empty_like(t) for _ in range(world)] if rank == 0 else None
            dist.gather(t, g, dst=0)
            if rank == 0:
                same(torch.cat(g), torch.cat(ref), f"gather {dtype} n={n}")
            out = torch.empty_like(t)
            dist.scatter(out, ref if rank == world - 1 else None, src=world - 1)
            same(out, ref[rank], f"scatter {dtype} n={n}")


def check_reduce_family(gloo, seed):
    rank, world = dist.get_rank(), dist.get_world_size()
    for dtype in (torch.float32, torch.float64, torch.int32, torch.float16):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
            for n in SIZES if dtype == torch.float32 else SIZES[:3]:
                ins = [data(n, dtype, seed + r, rank) for r in range(world)]
                full = reference(torch.cat(ins), op, gloo)
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(out, [x.clone() for x in ins], op=op)
                same(out, full[rank * n:(rank + 1) * n], f"reduce_scatter {dtype} {op} n={n}")
                out2 = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(out2, torch.cat(ins), op=op)
                same(out2, full[rank * n:(rank + 1) * n], f"reduce_scatter_tensor {dtype} {op}")
                t = torch.cat(ins)
                dist.reduce(t, dst=1 % world, op=op)
                if rank == 1 % world:
                    same(t, full, f"reduce {dtype} {op} n={n}")


def check_alltoall_p2p(gloo, seed):
    rank, world = dist.get_rank(), dist.get_world_size()
    for n in (0, 1, 7, 70000):
        t = data(n * world, torch.float32, seed, rank).view(world, n) if n else torch.empty(world, 0)
        a, b = torch.empty_like(t), torch.empty_like(t)
        dist.all_to_all_single(a, t)
        dist.all_to_all_single(b, t, group=gloo)
        same(a.reshape(-1), b.reshape(-1), f"all_to_all_single n={n}")
    # uneven splits: rank r sends r+1+j rows to rank j
    ins = [r + 1 + j for j in range(world) for r in [rank]]
    outs = [j + 1 + rank for j in range(world)]
    t = data(sum(ins) * 3, torch.int64, seed, rank).view(-1, 3)
    a = torch.empty(sum(outs), 3, dtype=torch.int64)
    b = torch.empty_like(a)
    dist.all_to_all_single(a, t, outs, ins)
    dist.all_to_all_single(b, t, outs, ins, group=gloo)
    same(a, b, "all_to_all_single with splits")
    # bad splits are one ValueError on this rank, before anything is sent: the group goes on
    if world > 1:
        t = torch.zeros(world)
        negative = [2, -1] + [1] * (world - 2)
        for bad, why in ((negative, "split size -1 for rank 1"),
                         ([world], f"1 split sizes for a group of {world}")):
            try:
                dist.all_to_all_single(torch.zeros(world), t, input_split_sizes=bad)
                raise SystemExit(f"all_to_all_single with splits {bad} did not raise")
            except ValueError as e:
                if why not in str(e):
                    raise SystemExit(f"unclear error for splits {bad}: {e}")
    lst = [data(5, torch.float64, seed + j, rank) for j in range(world)]
    o1 = [torch.empty(5, dtype=torch.float64) for _ in range(world)]
    o2 = [torch.empty(5, dtype=torch.float64) for _ in range(world)]
    dist.all_to_all(o1, lst)
    dist.all_to_all(o2, lst, group=gloo)
    same(torch.cat(o1), torch.cat(o2), "all_to_all")
    # send/recv around a ring, sizes 0, odd and large
    for n in (0, 999, 300000):
        t = data(n, torch.float32, seed, rank)
        got = torch.empty(n)
        if rank % 2 == 0:
            dist.send(t, (rank + 1) % world)
            dist.recv(got, (rank - 1) % world)
        else:
            dist.recv(got, (rank - 1) % world)
            dist.send(t, (rank + 1) % world)
        same(got, data(n, torch.float32, seed, (rank - 1) % world), f"send/recv n={n}")
    dist.barrier()


def check_p2p(seed):
    """isend/irecv in flight together (an exchange of 4 MiB each way, as batch_isend_irecv
    does), tags received in another order than sent, recv from any source, and messages while
    a collective is in flight, issued in opposite orders on neighbouring ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    n = 1 << 20
    out, got_p, got_n = data(n, torch.float32, seed, rank), torch.empty(n), torch.empty(n)
    ops = [dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.isend, out, prv),
           dist.P2POp(dist.irecv, got_p, prv), dist.P2POp(dist.irecv, got_n, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(got_p, data(n, torch.float32, seed, prv), "exchange with the previous rank")
    same(got_n, data(n, torch.float32, seed, nxt), "exchange with the next rank")
    sends = [dist.isend(torch.full((3,), 10.0 * tag + rank), nxt, tag=tag) for tag in (1, 2, 1)]
    a, b, c = torch.empty(3), torch.empty(3), torch.empty(3)
    dist.recv(b, prv, tag=2)
    dist.recv(a, prv, tag=1)
    dist.recv(c, prv, tag=1)
    for w in sends:
        w.wait()
    same(torch.cat([a, b, c]), torch.tensor([10.0 + prv] * 3 + [20.0 + prv] * 3 + [10.0 + prv] * 3),
         "tags received in another order")
    if rank == 0:
        froms = []
        for _ in range(world - 1):
            t = torch.empty(2, dtype=torch.int64)
            src = dist.recv(t, tag=5)  # a tag of its own: later messages may come meanwhile
            same(t, torch.tensor([src, src * src]), "recv from any source")
            froms.append(src)
        if sorted(froms) != list(range(1, world)):
            raise SystemExit(f"recv from any source: senders {froms}")
    else:
        dist.send(torch.tensor([rank, rank * rank]), 0, tag=5)
    x = torch.full((100000,), float(rank))
    y = torch.empty(7)
    if rank % 2 == 0:
        w = dist.all_reduce(x, async_op=True)
        dist.send(torch.full((7,), float(rank)), nxt)
        dist.recv(y, prv)
    else:
        dist.recv(y, prv)
        dist.send(torch.full((7,), float(rank)), nxt)
        w = dist.all_reduce(x, async_op=True)
    w.wait()
    same(y, torch.full((7,), float(prv)), "a message while an allreduce is in flight")
    same(x, torch.full((100000,), float(world * (world - 1) / 2)), "that allreduce")
    dist.barrier()


def check_subgroup(seed):
    rank, world = dist.get_rank(), dist.get_world_size()
    evens = list(range(0, world, 2))
    sub = dist.new_group(evens, backend="dc")
    subg = dist.new_group(evens, backend="gloo")
    if rank in evens:
        t = data(1001, torch.float32, seed, rank)
        want = reference(t, dist.ReduceOp.SUM, subg)
        works = [dist.all_reduce(t, group=sub, async_op=True)]
        works[0].wait()
        same(t, want, "allreduce in the sub-group of even ranks")
        x = torch.full((3,), float(rank))
        dist.broadcast(x, evens[-1], group=sub)
        same(x, torch.full((3,), float(evens[-1])), "broadcast in the sub-group")
    dist.barrier()
    if world > 2:  # split_group: every rank in one of two halves
        halves = [evens, [r for r in range(world) if r not in evens]]
        sg = dist.split_group(split_ranks=halves)
        t = torch.full((5,), float(rank))
        dist.all_reduce(t, group=sg)
        mine = halves[0] if rank in evens else halves[1]
        same(t, torch.full((5,), float(sum(mine))), "allreduce in a split_group half")
        dist.destroy_process_group(sg)
    dist.barrier()


def workers():
    """The dc backends' worker threads in this process (pytorch_dc names them).  A thread that
    a worker starts (torch's intra-op pool, on a large copy) inherits the name: count them before
    anything of the sort runs."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().strip() == "pt_dc worker"
        except OSError:  # the thread ended
            pass
    return n


def collectives():
    dist.init_process_group("dc")
    gloo = dist.new_group(backend="gloo")
    seed = int(os.environ.get("PE_TEST_SEED", "1"))
    t0 = time.monotonic()
    # a loop of async calls, each waited for, keeps to the workers there are (one running, one
    # spare): the worker back from a completion takes the next call
    t = torch.ones(8)
    dist.all_reduce(t, async_op=True).wait()
    before = workers()
    for _ in range(300):
        dist.all_reduce(t, async_op=True).wait()
    if workers() != before or before < 1:
        raise SystemExit(f"300 async all_reduce().wait() went from {before} to {workers()} worker "
                         "threads")
    # async: several in flight, completed in issue order (Works and Futures; repeated, as the
    # completions are spread over several threads), futures carry the outputs
    for rep in range(40):
        ts = [torch.full((1000,), float(i + dist.get_rank())) for i in range(5)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        futs = [w.get_future() for w in works]
        fut = futs[-1]
        if rep % 2:
            works[-1].wait()
            earlier = works
        else:
            fut.wait()
            earlier = works[:-1]  # a Future is done a moment before its Work, as with gloo
        if not all(w.is_completed() for w in earlier):
            raise SystemExit("an earlier allreduce is not completed after a later one's wait()")
        if not all(f.done() for f in futs):
            raise SystemExit("an earlier allreduce's future is not done after a later one's wait()")
    w = dist.get_world_size()
    for i, t in enumerate(ts):
        same(t, torch.full((1000,), float(i * w + w * (w - 1) / 2)), "async allreduce")
    same(fut.value()[0], ts[-1], "the future's value")
    # a synchronous call after asynchronous ones runs after them
    ts = [torch.full((300000,), float(i)) for i in range(3)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    last = torch.ones(10)
    dist.all_reduce(last)
    if not all(w.is_completed() for w in works):
        raise SystemExit("a synchronous allreduce returned before the asynchronous ones before it")
    for i, t in enumerate(ts):
        same(t, torch.full((300000,), float(i * w)), "async allreduce before a sync one")
    same(last, torch.full((10,), float(w)), "sync allreduce after async ones")
    check_allreduce(gloo, seed)
    check_movement(gloo, seed)
    check_reduce_family(gloo, seed)
    check_alltoall_p2p(gloo, seed)
    check_p2p(seed)
    check_subgroup(seed)
    if dist.get_rank() == 0:
        print(f"ok {checks} checks in {time.monotonic() - t0:.1f} s ({pytorch_dc.describe()})",
              flush=True)
    dist.destroy_process_group()


def comm_hook(name, group):
    """(state, hook) of DDP's comm hook `name` on `group`.  PowerSGD from the third step,
    rank-1 approximation, its default seed: the same on both backends."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if name == "powersgd":
        return (powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2), powerSGD_hook.powerSGD_hook)
    return group, {"allreduce": default_hooks.allreduce_hook,
                   "fp16": default_hooks.fp16_compress_hook,
                   "bf16": default_hooks.bf16_compress_hook}[name]


def train_hooked(group, steps, hook):
    """train()'s model and data under DDP on `group` (None: the default, dc) with comm hook
    `hook`; the final parameters.  One bucket: with several, PowerSGD's callbacks (on the
    backend's threads) and the next bucket's allreduce (on autograd's) race for the order of the
    calls on each rank, with any backend (gloo: "collective mismatch"; dc raises naming both)."""
    model = small_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=64)
    ddp.register_comm_hook(*comm_hook(hook, group))
    steps_of(ddp, steps)
    return [p.detach().clone() for p in model.parameters()]


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def steps_of(wrapped, steps):
    """SGD steps of `wrapped` on this rank's data; the last loss."""
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    loss = None
    for _ in range(steps):
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(wrapped(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss)


def train(backend, steps, fsdp=False):
    """A small model trained from the same start; returns the final parameters."""
    model = small_model()
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        fully_shard(model)
        wrapped = model
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    loss = steps_of(wrapped, steps)
    if fsdp:
        params = [p.full_tensor().detach().clone() for p in model.parameters()]
    else:
        params = [p.detach().clone() for p in model.parameters()]
    dist.destroy_process_group()
    # The model (FSDP's is a cycle) keeps its process group alive until a collection.  Left to
    # the one at exit, gloo's worker thread could still be releasing its last work's tensors
    # while Python finalized: taking the GIL then ends that thread inside a destructor and the
    # process aborts (core: ProcessGroupGloo::runLoop -> ~AsyncAllgatherCoalescedWork ->
    # decref_pyobject -> PyThread_exit_thread).  Freed here, while Python runs.
    del model, wrapped
    gc.collect()
    return params, loss


def ddp(steps):
    a, la = train("dc", steps)
    b, lb = train("gloo", steps)
    worst = max(float((x - y).abs().max()) for x, y in zip(a, b))
    if worst > 1e-5:
        raise SystemExit(f"DDP: dc and gloo parameters differ by {worst}")
    print(f"ddp ok: {steps} steps, max difference {worst:.2e}, loss {la:.6f}", flush=True)


def hooks(steps):
    """dc (the default group) and gloo (a group over the same ranks) in one init: a process
    cannot init gloo as its default group many times (torch's rendezvous times out)."""
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    for name in ("allreduce", "fp16", "bf16", "powersgd"):
        a = train_hooked(None, steps, name)
        b = train_hooked(gloo, steps, name)
        # The models' garbage holds the groups (the hooks' state): collected here.  A collection
        # in a callback on one of gloo's threads that freed the gloo group's last reference
        # would make it join itself (std::terminate; ProcessGroupGloo in torch 2.15 does).
        gc.collect()
        worst = max(float((x - y).abs().max()) for x, y in zip(a, b))
        if worst > 1e-4:
            raise SystemExit(f"DDP with the {name} hook: dc and gloo parameters differ by {worst}")
        print(f"hook {name} ok: {steps} steps, max difference {worst:.2e}", flush=True)
    dist.destroy_process_group()


def callbacks():
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=30))
    rank, w = dist.get_rank(), dist.get_world_size()
    x, y = torch.ones(4), torch.ones(4)
    fut = dist.all_reduce(x, async_op=True).get_future()
    got = fut.then(lambda f: dist.all_reduce(y, async_op=True).get_future().wait()[0]).wait()
    same(got, torch.full((4,), float(w)), "a callback that waits for an async allreduce")
    y = torch.ones(4)
    fut = dist.all_reduce(torch.ones(4), async_op=True).get_future()
    got = fut.then(lambda f: (dist.all_reduce(y), y)[1]).wait()
    same(got, torch.full((4,), float(w)), "a callback that makes a synchronous allreduce")
    if rank == 0:
        dist.send(torch.ones(2), 1)
        dist.send(torch.full((2,), 2.0), 1)
    elif rank == 1:
        u = torch.zeros(2)
        f = dist.irecv(torch.zeros(2), 0).get_future()
        got = f.then(lambda fut: (dist.recv(u, 0), u)[1]).wait()
        same(got, torch.full((2,), 2.0), "a recv inside an irecv's callback")
    dist.barrier()
    # A fresh group whose first collective (rank 0: async) waits for rank 1, which first needs
    # rank 0's recv: the recv must complete while the allreduce runs.
    sub = dist.new_group(backend="dc")
    y, x, z = torch.ones(4), torch.zeros(4), torch.zeros(4)
    if rank == 0:
        a = dist.all_reduce(y, group=sub, async_op=True)
        dist.recv(x, 1, group=sub)
        dist.send(z, 1, group=sub)
        a.wait()
    elif rank == 1:
        time.sleep(0.3)
        dist.send(x + 1, 0, group=sub)
        dist.recv(z, 0, group=sub)
        dist.all_reduce(y, group=sub)
    else:
        dist.all_reduce(y, group=sub)
    same(y, torch.full((4,), float(w)), "an allreduce while a recv of the same group waits")
    # A group whose last reference goes in a garbage collection in a callback on one of its own
    # threads: it is destroyed there, after the callback (gloo's joins itself: std::terminate).
    g = dist.new_group(backend="dc")
    cycle = [g]
    cycle.append(cycle)
    gc.disable()  # the collection happens in the callback, not before on this thread
    f = dist.all_reduce(torch.ones(4), group=g, async_op=True).get_future()
    f = f.then(lambda f: (time.sleep(0.3), gc.collect())[1])
    dist.destroy_process_group(g)
    del g, cycle
    f.wait()
    gc.enable()
    # A callback that destroys the default group.
    ended = threading.Event()

    def destroy(f):
        dist.destroy_process_group()
        ended.set()
    dist.all_reduce(torch.ones(4), async_op=True).get_future().then(destroy)
    if not ended.wait(20):
        raise SystemExit(f"rank {rank}: a callback that destroys the group did not return")
    print(f"callbacks ok: rank {rank}", flush=True)


def unsent(how):
    """Rank 0 isends 8 MiB and 4 bytes to rank 1 and ends without waiting for them (how
    "exit": at once; "destroy": after destroy_process_group(); "waited": after waiting for the
    first); rank 1 receives them a while later: they arrive whole."""
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    big = torch.arange(2 << 20, dtype=torch.float32)
    if rank == 0:
        w = dist.isend(big, 1)
        dist.isend(torch.tensor([7]), 1, tag=3)
        if how == "waited":
            w.wait()
        if how == "destroy":
            dist.destroy_process_group()
        print(f"unsent {how}: rank 0 ends", flush=True)
        return
    time.sleep(1.5)
    got, last = torch.zeros_like(big), torch.zeros(1, dtype=torch.int64)
    dist.recv(got, 0)
    dist.recv(last, 0, tag=3)
    same(got, big, "an isend that its sender did not wait for")
    same(last, torch.tensor([7]), "a second isend that its sender did not wait for")
    print(f"unsent {how}: rank 1 received both", flush=True)


def leavers(how):
    """Ranks 2 and 3 are done early (how "destroy": destroy_process_group(); "exit": they just
    end), as pipeline stages with nothing left to do; ranks 0 and 1 go on sending to each
    other on the default group and reducing on a group of their own, as with gloo."""
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    pair = dist.new_group([0, 1])
    dist.barrier()
    if rank >= 2:
        if how == "destroy":
            dist.destroy_process_group()
        return
    try:  # rank 2 sends nothing: this receive fails once it is gone (the loss is seen)
        dist.recv(torch.zeros(1), 2)
        raise SystemExit(f"rank {rank}: a receive from rank 2, which is gone, returned")
    except RuntimeError as e:
        if "rank 2" not in str(e):
            raise
    mine, theirs = torch.full((5,), float(rank)), torch.zeros(5)
    if rank == 0:
        dist.send(mine, 1)
        dist.recv(theirs, 1)
    else:
        dist.recv(theirs, 0)
        dist.send(mine, 0)
    same(theirs, torch.full((5,), float(1 - rank)), "send/recv between the ranks left")
    t = torch.ones(3)
    dist.all_reduce(t, group=pair)
    same(t, torch.full((3,), 2.0), "allreduce on the pair's group")
    print(f"leavers {how}: rank {rank} ok", flush=True)
    dist.destroy_process_group()


def until(cond, seconds):
    """Polls cond() every 10 ms for at most `seconds`; its last value."""
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def unread(where):
    """Rank 1 destroys its group, still holding it, and stays (it reads nothing more); rank 0
    then isends 64 MiB to it, more than the sockets hold, and destroys its group: that returns
    without waiting out the group's timeout (600 s; the test's limit is shorter), the send
    failing."""
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    mark = lambda name: open(os.path.join(where, name), "w").close()  # noqa: E731

    def wait_for(name):
        if not until(lambda: os.path.exists(os.path.join(where, name)), 100):
            raise SystemExit(f"rank {rank}: {name} never came")
    if rank == 1:
        held = dist.group.WORLD  # the backend stays, shut down (as a DDP model holds it)
        dist.destroy_process_group()
        mark("destroyed")
        wait_for("done")
        del held
    else:
        wait_for("destroyed")
        w = dist.isend(torch.ones(16 << 20), 1)
        dist.destroy_process_group()
        try:
            w.wait()
            raise SystemExit("a send to a rank that destroyed its group completed")
        except RuntimeError as e:
            print(f"unread: the send failed: {str(e)[:160]}", flush=True)
        mark("done")
    print(f"unread: rank {rank} ends", flush=True)


def reaped():
    """Bursts of Future callbacks that block at once: each burst grows the workers (one per
    blocked callback, and a spare); idle for PYTORCH_DC_WORKER_IDLE (set short by the test), all
    but one end; the group goes on, and the next burst grows them again."""
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=30))
    rank, w = dist.get_rank(), dist.get_world_size()
    if workers() != 1:
        raise SystemExit(f"rank {rank}: {workers()} worker threads after init, expected 1")

    seen = []
    for k in (6, 3):
        # A callback attached to a Future already done runs at once on this thread (torch): it
        # must not block here.  Rank 0's Futures cannot be done before rank 1 calls, a second
        # later: all of its k callbacks run on the backend's threads.  Rank 1's may or may not.
        gate, lock = threading.Event(), threading.Lock()
        entered = {"worker": 0, "inline": 0}

        def blocked(f):
            inline = threading.current_thread() is threading.main_thread()
            with lock:
                entered["inline" if inline else "worker"] += 1
            if not inline:
                gate.wait(20)
            return f.value()[0]
        if rank == 1:
            time.sleep(1)
        futs = [dist.all_reduce(torch.full((4,), float(i)), async_op=True).get_future()
                .then(blocked) for i in range(k)]
        if not until(lambda: sum(entered.values()) == k, 20):
            raise SystemExit(f"rank {rank}: of {k} callbacks only {entered} ran")
        if rank == 0 and entered["worker"] != k:
            raise SystemExit(f"rank 0: {entered['inline']} of {k} callbacks ran on the caller's "
                             "thread, though rank 1 had not called yet")
        if not until(lambda: workers() >= entered["worker"] + 1, 20):
            raise SystemExit(f"rank {rank}: {entered['worker']} blocked callbacks, {workers()} "
                             "worker threads")
        grown = workers()
        gate.set()
        for i, f in enumerate(futs):
            same(f.wait(), torch.full((4,), float(i * w)), "an allreduce of a burst")
        if not until(lambda: workers() == 1, 20):
            raise SystemExit(f"rank {rank}: {workers()} worker threads left 20 s after a burst "
                             f"that grew them to {grown}")
        seen.append(f"{grown} -> 1")
        t = torch.ones(8)
        dist.all_reduce(t)  # the one left takes calls
        same(t, torch.full((8,), float(w)), "an allreduce after the workers ended")
    dist.destroy_process_group()
    print(f"reaped ok: rank {rank}: workers {', '.join(seen)}", flush=True)


def unfinished():
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=30))
    for _ in range(20):
        work = dist.all_reduce(torch.ones(1000), async_op=True)
        work.get_future().then(lambda f: f.value()[0].sum())
    print(f"unfinished: rank {dist.get_rank()} ends", flush=True)


def kept():
    # Groups shut down by destroy_process_group() while the program still holds them (a DDP
    # model, a new_group's handle): the exit does not wait for them (the timeout is long).
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=600))
    sub = dist.new_group(backend="dc", timeout=datetime.timedelta(seconds=600))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    model(torch.ones(4, 8)).sum().backward()
    dist.all_reduce(torch.ones(4), group=sub, async_op=True).get_future().then(lambda f: None)
    rank = dist.get_rank()
    dist.destroy_process_group()
    print(f"kept: rank {rank} ends, holding {type(model).__name__} and {type(sub).__name__}",
          flush=True)


def open_sockets():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass  # the listing's own descriptor, closed meanwhile
    return n


def shm_mappings():
    with open("/proc/self/maps") as f:
        return sum("/pytorch_dc." in line for line in f)


def released(where):
    # destroy_process_group() closes the groups' connections and unmaps their shared memory at
    # once, while the program still holds them (a DDP model, a new_group's handle).  A file://
    # store: torch itself opens no socket, so every socket that comes and goes is the groups'.
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    before = (open_sockets(), shm_mappings())
    dist.init_process_group("dc", init_method=f"file://{where}/store", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    sub = dist.new_group(backend="dc")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    model(torch.ones(4, 8)).sum().backward()
    t = torch.ones(4)
    dist.all_reduce(t, group=sub)
    same(t, torch.full((4,), float(world)), "allreduce")
    peer = rank ^ 1  # a send and a receive: the mailbox's connections too
    if rank % 2 == 0:
        dist.send(torch.ones(3), peer)
    else:
        dist.recv(t[:3], peer)
    dist.barrier()
    during = (open_sockets(), shm_mappings())
    dist.destroy_process_group()
    after = (open_sockets(), shm_mappings())
    print(f"released: rank {rank} sockets {before[0]} -> {during[0]} -> {after[0]}, "
          f"shared memory mappings {before[1]} -> {during[1]} -> {after[1]}, holding "
          f"{type(model).__name__} and {type(sub).__name__}", flush=True)
    # The same when a Future's callback destroys the group (on the backend's worker thread),
    # the program still holding it.
    dist.init_process_group("dc", init_method=f"file://{where}/store2", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    held = dist.group.WORLD
    t = torch.ones(4)
    dist.all_reduce(t)
    during = (open_sockets(), shm_mappings())
    ended = threading.Event()

    def destroy(f):
        dist.destroy_process_group()
        ended.set()
    dist.all_reduce(t, async_op=True).get_future().then(destroy)
    if not ended.wait(20):
        raise SystemExit(f"rank {rank}: a callback that destroys the group did not return")
    until(lambda: (open_sockets(), shm_mappings()) == before, 10)
    after = (open_sockets(), shm_mappings())
    print(f"released by a callback: rank {rank} sockets {before[0]} -> {during[0]} -> "
          f"{after[0]}, shared memory mappings {before[1]} -> {during[1]} -> {after[1]}, "
          f"holding {type(held).__name__}", flush=True)


def autograd():
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")

    def param(shape, channels_last=False, transposed=False):
        torch.manual_seed(rank)
        t = torch.randn(*shape)
        if channels_last:
            t = t.contiguous(memory_format=torch.channels_last)
        return torch.nn.Parameter(t.t() if transposed else t)

    def both(what, fn, grad=False, inference=False):
        out = []
        for group in (None, gloo):
            ctx = (torch.inference_mode() if inference else
                   torch.enable_grad() if grad else torch.no_grad())
            with ctx:
                out.append(fn(group))
        for a, b in zip(*out):
            same(a, b, what)

    def bcast(mk):
        return lambda g: [(lambda p: (dist.broadcast(p, 0, group=g), p.detach().clone())[1])(mk())]

    def allreduce(mk, async_op):
        def f(g):
            p = mk()
            work = dist.all_reduce(p, group=g, async_op=async_op)
            if work:
                work.wait()
            return [p.detach().clone()]
        return f

    both("broadcast of a channels_last Parameter", bcast(lambda: param((2, 3, 2, 2), True)))
    both("broadcast of a transposed Parameter", bcast(lambda: param((3, 4), transposed=True)))
    both("allreduce of a channels_last Parameter",
         allreduce(lambda: param((2, 3, 2, 2), True), False))
    both("async allreduce of a channels_last Parameter",
         allreduce(lambda: param((2, 3, 2, 2), True), True))
    both("allreduce of a transposed Parameter (grad enabled)",
         allreduce(lambda: param((3, 4), transposed=True), False), grad=True)

    def coalesced(g):
        ps = [param((3,)), param((2,))]
        dist.all_reduce_coalesced(ps, group=g)
        return [p.detach().clone() for p in ps]
    both("allreduce_coalesced of Parameters", coalesced)

    def gathered(g):
        outs = [torch.empty(4) for _ in range(dist.get_world_size())]
        dist.all_gather(outs, torch.full((4,), float(rank)), group=g)
        return outs
    both("all_gather (list) in inference mode", gathered, inference=True)

    def gather(g):
        outs = [torch.empty(2) for _ in range(dist.get_world_size())] if rank == 0 else None
        dist.gather(torch.full((2,), float(rank)), outs, dst=0, group=g)
        return outs or []
    both("gather in inference mode", gather, inference=True)
    both("broadcast of a non-contiguous tensor in inference mode",
         lambda g: [(lambda t: (dist.broadcast(t, 1, group=g), t.clone())[1])(
             torch.full((4, 3), float(rank)).t())], inference=True)
    if rank < 2:
        p = param((3, 4), transposed=True)
        with torch.no_grad():
            if rank == 0:
                dist.send(torch.full((4, 3), 5.0), 1)
            else:
                dist.recv(p, 0)
                same(p.detach(), torch.full((4, 3), 5.0), "recv into a transposed Parameter")
    dist.barrier()
    print(f"autograd ok: rank {rank}", flush=True)
    dist.destroy_process_group()


def fsdp(steps):
    """fully_shard on CPU, dc then gloo (in its own process: a third init_process_group of gloo
    in one process times out in torch's own rendezvous)."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as e:
        print(f"fsdp skipped: {e}", flush=True)
        return
    a, la = train("dc", steps, fsdp=True)
    b, lb = train("gloo", steps, fsdp=True)
    worst = max(float((x - y).abs().max()) for x, y in zip(a, b))
    if worst > 1e-5 or abs(la - lb) > 1e-6:
        raise SystemExit(f"FSDP: dc and gloo differ: params by {worst}, loss {la} vs {lb}")
    print(f"fsdp ok: loss {la:.6f} (gloo {lb:.6f})", flush=True)


def fail(victim):
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=20))
    rank = dist.get_rank()
    t = torch.ones(1 << 18)
    t0 = time.monotonic()
    try:
        for i in range(100000):
            if rank == victim and i == 20:
                os._exit(3)
            dist.all_reduce(t)
            t.fill_(1)
    except Exception as e:  # the backend's error: names the collective and the rank
        print(f"rank {rank} raised after {time.monotonic() - t0:.1f} s: {e}", flush=True)
        sys.exit(0)
    sys.exit(f"rank {rank}: no error")


def mismatch():
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=10))
    rank = dist.get_rank()
    t = torch.ones(100)
    try:
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, 1)
        dist.barrier()  # the root of the broadcast may be done before anyone noticed
    except Exception as e:
        print(f"rank {rank} raised: {e}", flush=True)
        sys.exit(0)
    sys.exit(f"rank {rank}: no error")


def restart():
    dist.init_process_group("dc")
    rank, gen = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t)
    if rank == 1 and gen == 0:
        sys.exit(9)
    dist.barrier()
    print(f"rank {rank} generation {gen} dc sum {t.tolist()}", flush=True)
    dist.destroy_process_group()
    dist.init_process_group("dc")  # again in the same process
    t = torch.ones(2)
    dist.all_reduce(t)
    print(f"rank {rank} re-init sum {t.tolist()}", flush=True)
    dist.destroy_process_group()


def devices():
    cuda = pytorch_dc.cuda_support()
    want = ["cpu", "cuda"] if cuda else ["cpu"]
    got = dist.Backend.backend_capability["dc"]
    if got != want:
        raise SystemExit(f"dc registered for {got}, expected {want} (cuda_support {cuda})")
    rank = int(os.environ["RANK"])
    # the check every collective makes of its tensors' device, on a device by name (no GPU here)
    if cuda:
        assert pytorch_dc._C._device_of("allgather", "cuda:0") == "cuda:0"
    else:
        try:
            pytorch_dc._C._device_of("allgather", "cuda:0")
            raise SystemExit("a CUDA tensor was taken by a dc backend without CUDA support")
        except ValueError as e:
            if "allgather: tensor on cuda:0" not in str(e) or "CPU tensors only" not in str(e):
                raise SystemExit(f"unclear error: {e}")
            print(f"rank {rank}: {e}")
    kinds = {}
    for spelling in ("dc", "cpu:dc,cuda:dc", "cpu:gloo,cuda:dc"):
        # torch makes the backends a spelling names whatever the registration says; plain "dc"
        # covers the registered devices only (without CUDA support its CUDA tensors then raise
        # the error above, from the collective)
        dist.init_process_group(spelling, timeout=datetime.timedelta(seconds=60))
        pg = dist.group.WORLD
        by = {}
        for dev in ("cpu", "cuda"):
            try:
                by[dev] = type(pg._get_backend(torch.device(dev))).__name__
            except RuntimeError:
                by[dev] = None
        expect = {"cpu": "ProcessGroupGloo" if "gloo" in spelling else "DcBackend",
                  "cuda": "DcBackend" if cuda or "cuda" in spelling else None}
        if by != expect:
            raise SystemExit(f"{spelling}: backends {by}, expected {expect}")
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t)
        n = dist.get_world_size()
        if t.tolist() != [n * (n + 1) / 2] * 5:
            raise SystemExit(f"{spelling}: allreduce gave {t.tolist()}")
        kinds[spelling] = f"{by} ({pytorch_dc.describe()})"
        dist.destroy_process_group()
    for k, v in kinds.items():
        print(f"rank {rank}: {k}: {v}")
    print(f"ok devices rank {rank}: dc on {got}")


def recorder():
    """torch's generic flight recorder (torch >= 2.15) stays off dc groups unless the program asks
    for flight recording: checked on the world group and on groups made after the program set or
    unset TORCH_FR_BUFFER_SIZE, by the hooks torch keeps per group."""
    rank = int(os.environ["RANK"])
    c10d = dist.distributed_c10d
    if not isinstance(getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", None), set):
        print(f"recorder skipped: torch {torch.__version__} has no generic flight recorder")
        return
    asked = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
    hooked = c10d._world.pg_flight_recorder_hooks
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=60))
    got = {"world": dist.group.WORLD in hooked}
    want = {"world": any(os.environ.get(v) for v in asked), "asked": True, "unasked": False}
    for name, value in (("asked", "2000"), ("unasked", None)):
        for v in asked:
            os.environ.pop(v, None)
        if value:
            os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = value  # the older name
        g = dist.new_group([0, 1])
        t = torch.ones(3)
        dist.all_reduce(t, group=g)
        same(t, torch.full((3,), 2.0), "allreduce")
        got[name] = g in hooked
    if got != want:
        raise SystemExit(f"flight recorder hooks on {got}, expected {want}")
    print(f"ok recorder rank {rank}: {got}", flush=True)
    dist.destroy_process_group()


def launcher(init):
    e = os.environ
    rank = int(e.get("RANK", e.get("OMPI_COMM_WORLD_RANK", "-1")))
    world = int(e.get("WORLD_SIZE", e.get("OMPI_COMM_WORLD_SIZE", "-1")))
    kw = {} if init == "env://" else {"init_method": init, "rank": rank, "world_size": world}
    dist.init_process_group("dc", timeout=datetime.timedelta(seconds=60), **kw)
    r, n = dist.get_rank(), dist.get_world_size()
    if (r, n) != (rank, world):
        raise SystemExit(f"rank {r} of {n}, but the launcher said {rank} of {world}")
    t = torch.arange(1000, dtype=torch.float32) + r
    dist.all_reduce(t)
    same(t, torch.arange(1000, dtype=torch.float32) * n + n * (n - 1) / 2, "allreduce")
    out = [torch.zeros(2, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(out, torch.tensor([r, r * r]))
    same(torch.stack(out), torch.tensor([[i, i * i] for i in range(n)]), "allgather")
    b = torch.full((5,), float(r))
    dist.broadcast(b, n - 1)
    same(b, torch.full((5,), float(n - 1)), "broadcast")
    print(f"ok launcher {init.split(':')[0]} rank {r} of {n} ({pytorch_dc.describe()})", flush=True)
    dist.destroy_process_group()


MODES = {  # mode -> (function, converter of its argument, or None for none)
    "collectives": (collectives, None), "ddp": (ddp, int), "fsdp": (fsdp, int),
    "hooks": (hooks, int), "callbacks": (callbacks, None), "autograd": (autograd, None),
    "unfinished": (unfinished, None), "reaped": (reaped, None),
    "unsent": (unsent, str), "unread": (unread, str), "leavers": (leavers, str),
    "kept": (kept, None), "fail": (fail, int),
    "released": (released, str),
    "mismatch": (mismatch, None), "restart": (restart, None), "devices": (devices, None),
    "launcher": (launcher, str), "recorder": (recorder, None),
}

if __name__ == "__main__":
    if sys.argv[1] not in MODES:
        sys.exit(f"torch_dc_worker.py: unknown mode {sys.argv[1]}")
    fn, arg = MODES[sys.argv[1]]
    fn(arg(sys.argv[2])) if arg else fn()
