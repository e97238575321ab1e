"""The torch.distributed backend "dc" (python/pytorch_dc) as real processes under pytorch_exec,
with the torch of TORCH_PYTHON (the quick start's virtualenv) and the package the build made
(PE_BUILDDIR/python).  Every collective against gloo's result in the same run at 2, 3 and 4
ranks and on two simulated nodes of two (PYTORCH_DC_NODE), DDP (and FSDP) against gloo, a rank
that dies mid-allreduce, mismatched calls, and a restart with a fresh init.  Other launchers and
init methods: torchrun, mpirun (with tcp://), and tcp:// and file:// under pytorch_exec; srun is
in test_slurm.py.  Skips, saying why,
without torch or without the built extension.
"""
import glob
import os
import random
import re
import shutil
import subprocess
import tempfile

from harness import (EXEC, TORCH_PYTHON, TestFailure, assert_no_leftovers, check, free_port,
                     main, marker_env, need_torch, run, skip)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_dc_worker.py")
BUILD = os.environ.get("PE_BUILDDIR", os.path.join(HERE, "..", ".."))
PKG = os.path.join(BUILD, "python")
NODES_BY = "PYTORCH_DC_NODE=n$((RANK{by})) exec {py} {worker} {args}"


def env(extra=None):
    e = marker_env(extra)
    e["PYTHONPATH"] = PKG + os.pathsep + e.get("PYTHONPATH", "")
    e["PE_TEST_SEED"] = str(random.randrange(1 << 30))
    return e


def job(n, args, nodes=None, timeout=400, extra=None):
    cmd = [TORCH_PYTHON, WORKER] + args
    if nodes:  # simulated nodes: a shell sets PYTORCH_DC_NODE from RANK
        cmd = ["sh", "-c", NODES_BY.format(by=nodes, py=TORCH_PYTHON, worker=WORKER,
                                           args=" ".join(args))]
    e = env(extra)
    r = run(["-n", str(n)] + cmd, env=e, timeout=timeout)
    check(r.returncode == 0, f"{args} on {n} ranks (seed {e['PE_TEST_SEED']}) failed "
          f"({r.returncode}): {r.stdout}{r.stderr[-4000:]}")
    return r.stdout


def collectives(n, nodes=None, want=None, extra=None):
    out = job(n, ["collectives"], nodes=nodes, extra=extra)
    check("ok " in out, out)
    if want:
        check(want in out, f"expected '{want}' in: {out}")
    print("   ", out.strip().splitlines()[-1], flush=True)


def test_collectives_two_ranks():
    collectives(2, want="1 node(s), shm/tcp")


def test_collectives_three_ranks():
    collectives(3)


def test_collectives_four_ranks():
    collectives(4, want="1 node(s), shm/tcp")


def test_collectives_two_simulated_nodes_of_two():
    collectives(4, nodes="/2", want="2 node(s)")


def test_collectives_host_staged():
    """Every collective through the staging that CUDA tensors take (PYTORCH_DC_STAGE_CPU=1: each
    task works on other host tensors, copied in before and out after it; what a collective does
    not write through its stage reads back as 0x5a bytes), so that its wiring is tested here."""
    collectives(3, extra={"PYTORCH_DC_STAGE_CPU": "1"})


def test_ddp_against_gloo():
    out = job(2, ["ddp", "50"])
    check("ddp ok: 50 steps" in out, out)
    print("   ", " / ".join(line for line in out.splitlines() if "ok" in line))


def test_ddp_comm_hooks_against_gloo():
    """DDP's comm hooks: allreduce, fp16/bf16 compression, and PowerSGD, whose Future callbacks
    issue allreduces and wait for them on the backend's threads."""
    out = job(2, ["hooks", "10"])
    for name in ("allreduce", "fp16", "bf16", "powersgd"):
        check(f"hook {name} ok" in out, out)
    print("   ", " / ".join(line for line in out.splitlines() if "hook" in line))


def test_callbacks_that_issue_collectives():
    """A Future callback that makes another collective and waits for it, or a blocking recv
    inside an irecv's callback: neither waits for itself (two simulated nodes of two)."""
    out = job(4, ["callbacks"], nodes="/2", timeout=120)
    check(out.count("callbacks ok") == 4, out)


def test_program_ends_with_callbacks_pending():
    """A program that ends with async collectives and their Python callbacks still pending
    exits 0: they run before Python finalizes (a callback run during finalization ends its
    thread inside C++: std::terminate, as gloo does today)."""
    for _ in range(3):
        out = job(2, ["unfinished"], timeout=120)
        check(out.count("ends") == 2, out)


def test_idle_workers_end():
    """The worker threads that a burst of blocking callbacks started end once idle for
    PYTORCH_DC_WORKER_IDLE, all but one; the group goes on.  A bad value is one error."""
    out = job(2, ["reaped"], timeout=120, extra={"PYTORCH_DC_WORKER_IDLE": "0.3"})
    check(out.count("reaped ok") == 2, out)
    print("   ", out.strip().splitlines()[-1], flush=True)
    e = env({"PYTORCH_DC_WORKER_IDLE": "soon"})
    r = run(["-n", "1", TORCH_PYTHON, WORKER, "reaped"], env=e, timeout=120)
    check(r.returncode != 0 and "PYTORCH_DC_WORKER_IDLE=soon: expected" in r.stderr,
          f"a bad PYTORCH_DC_WORKER_IDLE: exit {r.returncode}: {r.stderr[-2000:]}")


def test_sends_not_waited_for_arrive():
    """A rank that isends (8 MiB and 4 bytes) and ends without waiting for them, at once or after
    destroy_process_group(): its peer receives both whole a while later (gloo loses them:
    "Connection closed by peer")."""
    for how in ("exit", "destroy"):
        out = job(2, ["unsent", how], timeout=120)
        check(f"unsent {how}: rank 1 received both" in out, out)
    # A send to a rank whose group was destroyed (it reads no more) does not hold up the
    # sender's destroy_process_group() for the group's timeout (600 s; the job's limit: 120 s).
    with tempfile.TemporaryDirectory() as where:
        out = job(2, ["unread", where], timeout=120)
    check(out.count("ends") == 2 and "unread: the send failed" in out, out)


def test_ranks_that_are_done_early_leave_the_others_talking():
    """Ranks 2 and 3 of 4 destroy their group (or end) while ranks 0 and 1 go on with send and
    recv on the default group: a lost peer fails only what involves it (it failed every send
    and receive of the process)."""
    for how in ("destroy", "exit"):
        out = job(4, ["leavers", how], timeout=120)
        check(f"leavers {how}: rank 0 ok" in out and f"leavers {how}: rank 1 ok" in out, out)


def test_program_ends_holding_destroyed_groups():
    """A program that still holds groups after destroy_process_group() (a DDP model, a
    new_group's handle) exits at once, not after their timeout (600 s here; the job's limit is
    120 s): the exit waits only for callbacks and for a group that a callback destroyed."""
    out = job(2, ["kept"], timeout=120)
    check(out.count("kept: rank") == 2, out)


def test_destroy_releases_connections_and_shared_memory():
    """destroy_process_group() closes every connection of the groups and unmaps their shared
    memory at once, though the program still holds them (a DDP model, a new_group's handle),
    also when a Future's callback destroys the group: two simulated nodes of two, so that both
    tcp and shm are used, with one shm lane and with two (their own segments and connections)."""
    for extra in ({}, {"PYTORCH_DC_SHM_THREADS": "2"}):
        with tempfile.TemporaryDirectory() as where:
            out = job(4, ["released", where], nodes="/2", timeout=120, extra=extra)
        seen = re.findall(r"released(?: by a callback)?: rank (\d) sockets (\d+) -> (\d+) -> "
                          r"(\d+), shared memory mappings (\d+) -> (\d+) -> (\d+)", out)
        check(len(seen) == 8 and out.count("released by a callback") == 4, out)
        for rank, *counts in seen:
            s0, s1, s2, m0, m1, m2 = map(int, counts)
            what = f"rank {rank} ({extra or 'one lane'})"
            check(s1 > s0 and m1 > m0, f"{what}: the groups opened no socket or mapping: {out}")
            check(s2 == s0, f"{what}: {s2 - s0} socket(s) still open after destroy: {out}")
            check(m2 == m0, f"{what}: shared memory still mapped after destroy: {out}")
        print("   ", extra or "one lane:", seen[0])


def test_copies_into_guarded_tensors():
    """Results copied into Parameters (non-contiguous, channels_last; no_grad and grad enabled)
    and into tensors under inference_mode, as gloo does them."""
    out = job(3, ["autograd"], timeout=120)
    check(out.count("autograd ok") == 3, out)


def test_fsdp_against_gloo():
    out = job(2, ["fsdp", "10"])
    check("fsdp ok" in out or "fsdp skipped" in out, out)
    print("   ", " / ".join(line for line in out.splitlines() if "fsdp" in line))



def test_devices_and_spellings():
    """"dc" is registered for cuda only where the build takes CUDA tensors; "cpu:dc,cuda:dc" and
    "cpu:gloo,cuda:dc" make the backends they name; a CUDA tensor where dc takes none is a clear
    error (PYTORCH_DC_CUDA=0 turns CUDA support off in a build that has it)."""
    for extra in ({}, {"PYTORCH_DC_CUDA": "0"}):
        out = job(2, ["devices"], extra=extra, timeout=120)
        check("ok devices rank 0" in out and "ok devices rank 1" in out, out)
        if extra:
            check("dc on ['cpu']" in out and "allgather: tensor on cuda:0" in out, out)
        for line in out.splitlines():
            if line.startswith("rank 0:") or line.startswith("ok devices rank 0"):
                print("   ", line)


def test_flight_recorder_only_when_asked():
    """torch's generic flight recorder (a Python traceback per collective) is not attached to dc
    groups unless TORCH_FR_BUFFER_SIZE asks for it, at start or set by the program later."""
    for extra in ({}, {"TORCH_FR_BUFFER_SIZE": "2000"}):
        out = job(2, ["recorder"], extra=extra, timeout=120)
        check(out.count("ok recorder") == 2 or "recorder skipped" in out, out)
        print("   ", extra or "default:", out.strip().splitlines()[-1])


def direct(n, args, timeout=90, extra=None):
    """n ranks started without a launcher (env://), so that nothing but the backend stops them."""
    port = free_port()
    procs = []
    for r in range(n):
        e = env(dict(extra or {}, RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n)))
        procs.append(subprocess.Popen([TORCH_PYTHON, WORKER] + args, env=e, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = []
    for p in procs:
        try:
            outs.append((p.wait(timeout=timeout), p.stdout.read()))
        except subprocess.TimeoutExpired as e:
            for q in procs:
                q.kill()
            raise TestFailure(f"{args}: a rank hung past {timeout} s") from e
    return outs


def test_dead_rank_makes_the_others_raise():
    outs = direct(3, ["fail", "1"])
    check(outs[1][0] == 3, f"the victim: {outs[1]}")
    for r in (0, 2):
        rc, out = outs[r]
        check(rc == 0 and f"rank {r} raised after" in out, f"rank {r}: {rc} {out}")
        check("allreduce" in out and f"rank {r} of 3" in out, f"error names no call/rank: {out}")
        secs = float(out.split("raised after ")[1].split()[0])
        print(f"    rank {r}: {out.strip()[:300]}")
        check(secs < 20, f"rank {r} took {secs} s (timeout 20 s)")


def test_mismatched_collectives_raise():
    # over tcp every call starts with a header: the rank that compares them names the mismatch,
    # the other (here the root of the broadcast, done at once) sees the group break
    outs = direct(2, ["mismatch"], extra={"PYTORCH_DC_TRANSPORT": "tcp"})
    for r, (rc, out) in enumerate(outs):
        check(rc == 0 and f"rank {r} raised" in out, f"rank {r}: {rc} {out}")
        print(f"    {out.strip()[:300]}")
    check("mismatched calls: rank 1 called broadcast" in outs[0][1], f"rank 0: {outs[0][1]}")
    # shm allreduce against tcp broadcast: every rank raises, at the latest at the timeout
    outs = direct(3, ["mismatch"])
    for r, (rc, out) in enumerate(outs):
        check(rc == 0 and f"rank {r} raised" in out, f"rank {r}: {rc} {out}")


def launched(cmd, n, scheme, timeout=300, extra=None):
    """Runs cmd (a launcher and the worker's launcher mode); every rank must report ok."""
    e = env(extra)
    try:
        r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout,
                           start_new_session=True)
    except subprocess.TimeoutExpired as ex:
        raise TestFailure(f"{' '.join(cmd[:4])}... did not finish within {timeout} s") from ex
    # torchrun and mpirun forward the ranks' output without keeping lines whole
    oks = re.findall(rf"ok launcher {scheme} rank \d+ of {n} \([^)]*\)", r.stdout)
    check(r.returncode == 0 and len(oks) == n, f"{' '.join(cmd[:6])}...: exit {r.returncode}: "
          f"{r.stdout}{r.stderr[-3000:]}")
    print(f"    {oks[0]}")
    assert_no_leftovers(e["PE_TEST_MARKER"])


def test_torchrun():
    """torchrun starts the ranks (its own TCPStore, env://)."""
    launched([TORCH_PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
              WORKER, "launcher", "env://"], 3, "env")


def test_tcp_and_file_init_methods():
    """tcp:// and file:// under pytorch_exec (ranks from RANK/WORLD_SIZE; the store from the URL)."""
    launched([EXEC, "-n", "2", TORCH_PYTHON, WORKER, "launcher", f"tcp://127.0.0.1:{free_port()}"],
             2, "tcp")
    with tempfile.TemporaryDirectory() as d:
        launched([EXEC, "-n", "3", TORCH_PYTHON, WORKER, "launcher", f"file://{d}/store"], 3, "file")


def test_mpirun():
    """Open MPI's mpirun: ranks from OMPI_COMM_WORLD_*, the store from a tcp:// URL."""
    if not shutil.which("mpirun"):
        skip("no Open MPI mpirun")
    launched(["mpirun", "--oversubscribe", "-n", "2", "-x", "PYTHONPATH", "-x", "PE_TEST_MARKER",
              TORCH_PYTHON, WORKER, "launcher", f"tcp://127.0.0.1:{free_port()}"], 2, "tcp",
             extra={"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})


def test_restart_with_a_fresh_init():
    r = run(["-n", "2", "--max-restarts", "1", TORCH_PYTHON, WORKER, "restart"], env=env(),
            timeout=300)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout}{r.stderr[-3000:]}")
    for i in range(2):
        check(f"rank {i} generation 1 dc sum [3.0, 3.0, 3.0]" in r.stdout, r.stdout)
        check(f"rank {i} re-init sum [2.0, 2.0]" in r.stdout, r.stdout)
    check("exited with status 9; restarting" in r.stderr, r.stderr)


if __name__ == "__main__":
    need_torch()
    if not glob.glob(os.path.join(PKG, "pytorch_dc", "_C*.so")):
        skip(f"the dc extension was not built ({PKG}/pytorch_dc: configure found no torch, "
             "see --with-torch)")
    main([test_collectives_two_ranks, test_collectives_three_ranks, test_collectives_four_ranks,
          test_collectives_two_simulated_nodes_of_two, test_collectives_host_staged,
          test_ddp_against_gloo, test_ddp_comm_hooks_against_gloo,
          test_callbacks_that_issue_collectives, test_program_ends_with_callbacks_pending,
          test_idle_workers_end, test_sends_not_waited_for_arrive,
          test_ranks_that_are_done_early_leave_the_others_talking,
          test_program_ends_holding_destroyed_groups,
          test_destroy_releases_connections_and_shared_memory,
          test_copies_into_guarded_tensors,
          test_fsdp_against_gloo, test_devices_and_spellings,
          test_flight_recorder_only_when_asked,
          test_dead_rank_makes_the_others_raise, test_mismatched_collectives_raise,
          test_restart_with_a_fresh_init, test_torchrun, test_tcp_and_file_init_methods, test_mpirun])
