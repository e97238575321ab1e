"""torch's store hosted by pytorch_exec on MASTER_PORT, as torchrun's agent hosts it (issue 13,
item 9): the port is bound by the launcher when it is chosen, so nothing can take it before
rank 0 would have; every rank is a client (TORCHELASTIC_USE_AGENT_STORE=True); a script's own
TCPStore(MASTER_ADDR, MASTER_PORT, is_master=rank == 0) still works; each generation gets an
empty store; strangers on the port do not disturb the job."""
import os
import socket

from harness import (TORCH_PYTHON, assert_no_leftovers, check, main, marker_env, need_torch, run,
                     script)
from test_multinode import agent, job_env

# Before torch: can the port still be taken?  A stranger (here a rank) tries to bind it as the
# old race would have let it; then strangers talk garbage to the store; then DDP trains a step.
DDP = script("""#!/usr/bin/env python3
import errno, os, socket, struct, sys, time
import torch, torch.distributed as dist
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
rank = int(os.environ["RANK"])
taken = []
for host in (addr, "0.0.0.0"):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port)); s.listen(1)
        taken.append(host)  # held for the whole run: the job would break here without the store
    except OSError as e:
        assert e.errno == errno.EADDRINUSE, e
        s.close()
strangers = []
for junk in (b"GET / HTTP/1.0\\r\\n\\r\\n", b"\\x00" + struct.pack("=I", 0x3C85F7CE) + b"\\x03" +
             struct.pack("=Q", 1 << 62), b"\\x00\\x01\\x02"):
    s = socket.create_connection((addr, port)); s.sendall(junk); strangers.append(s)
print(f"rank {rank} agent-store {os.environ.get('TORCHELASTIC_USE_AGENT_STORE')} taken {taken}",
      flush=True)
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.ones(8, 4) * (rank + 1)).sum()
loss.backward()
opt.step()
w = model.module.weight.detach().clone()
ws = [torch.zeros_like(w) for _ in range(dist.get_world_size())]
dist.all_gather(ws, w)
same = all(torch.equal(ws[0], x) for x in ws)
print(f"rank {rank} ddp step done, replicas equal {same}", flush=True)
dist.destroy_process_group()
# gloo's worker lets go of a Work (and of the Python tensors it holds, taking the GIL) only after
# wait() returned, and the DDP model keeps the group and its threads past destroy_process_group.
# Should Python be finalizing by then, the thread ends inside a destructor: std::terminate
# (core: ProcessGroupGloo::runLoop -> ~AsyncAllgatherWork -> decref_pyobject ->
# PyThread_exit_thread).  Exit only once gloo holds all_gather's tensors no more.
deadline = time.monotonic() + 30
while any(t._use_count() > 1 for t in (w, *ws)) and time.monotonic() < deadline:
    time.sleep(0.01)
""", ".py")

# A script with its own TCPStore, as under torchrun: rank 0 asks to serve, finds the port the
# launcher's, and is a client like the others.  The keys of restart 0 are gone in restart 1.
OWN_STORE = script("""#!/usr/bin/env python3
import datetime, os, sys
import torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                      is_master=rank == 0, timeout=datetime.timedelta(seconds=30))
stale = store.check([f"left-by-restart-0"])
store.set(f"hello/{rank}", f"r{rank}")
got = [store.get(f"hello/{r}").decode() for r in range(world)]
n = store.add("counter", 1)
store.wait([f"hello/{r}" for r in range(world)])
print(f"rank {rank} restart {restart} got {got} stale {stale}", flush=True)
if restart == 0:
    store.set("left-by-restart-0", "x")
    store.add("done", 1)
    store.wait(["done"])
    if rank == 1:
        sys.exit(7)
""", ".py")

# tcp:// to MASTER_ADDR:MASTER_PORT is the launcher's store too (torch checks both match).
TCP_INIT = script("""#!/usr/bin/env python3
import os
import torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                        rank=rank, world_size=world)
t = torch.ones(2) * (rank + 1)
dist.all_reduce(t)
print(f"rank {rank} tcp sum {t.tolist()}", flush=True)
dist.destroy_process_group()
""", ".py")


def test_ddp_with_the_port_held_from_its_choice():
    r = run(["-n", "3", TORCH_PYTHON, DDP], timeout=240)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    for i in range(3):
        check(f"rank {i} agent-store True taken []" in r.stdout, r.stdout)
        check(f"rank {i} ddp step done, replicas equal True" in r.stdout, r.stdout)


def test_tcp_init_method():
    r = run(["-n", "2", TORCH_PYTHON, TCP_INIT], timeout=240)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    for i in range(2):
        check(f"rank {i} tcp sum [3.0, 3.0]" in r.stdout, r.stdout)


def test_own_tcpstore_and_a_fresh_store_each_generation():
    r = run(["-n", "3", "--max-restarts", "1", TORCH_PYTHON, OWN_STORE], timeout=240)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    want = "got ['r0', 'r1', 'r2'] stale False"
    for i in range(3):
        for restart in (0, 1):
            check(f"rank {i} restart {restart} {want}" in r.stdout, r.stdout)


def test_across_nodes_with_restarts():
    env = job_env()
    r = run(["-H", "a:1,b:2", "--launch-agent", agent(env["PE_TEST_MARKER"]), "--max-restarts", "1",
             TORCH_PYTHON, OWN_STORE], env=env, timeout=240)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    for i in range(3):
        for restart in (0, 1):
            check(f"rank {i} restart {restart} got ['r0', 'r1', 'r2'] stale False" in r.stdout,
                  r.stdout)
    r = run(["-H", "a:2,b:1", "--launch-agent", agent(env["PE_TEST_MARKER"]), TORCH_PYTHON, DDP],
            env=env, timeout=240)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    for i in range(3):
        check(f"rank {i} agent-store True taken []" in r.stdout, r.stdout)
        check(f"rank {i} ddp step done, replicas equal True" in r.stdout, r.stdout)
    assert_no_leftovers(env["PE_TEST_MARKER"])


if __name__ == "__main__":
    need_torch()
    main([test_ddp_with_the_port_held_from_its_choice, test_tcp_init_method,
          test_own_tcpstore_and_a_fresh_store_each_generation, test_across_nodes_with_restarts])
