"""pytorch_exec under a real SLURM: four virtual nodes on this machine (contrib/slurm/testbed.sh:
munged, slurmctld and four slurmd).  `salloc -N 4 pytorch_exec` starts one pytorch_execd per node
with srun; `srun --mpi=pmix ... pytorch_exec PROGRAM` is the direct launch.  Open MPI programs and
a torch gloo allreduce run both ways, and the torch backend "dc" under srun.  Needs root and SLURM (skips otherwise)."""
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time

from harness import (BUILDDIR, EXEC, comm, SRCDIR, TORCH_PYTHON, TestFailure, assert_no_leftovers, check, main,
                     marker_env, need_torch, processes_with_marker, skip)

TESTBED = os.path.join(SRCDIR, "contrib", "slurm", "testbed.sh")
WORK = os.path.join(os.getcwd(), "slurm-work")
RANKFILE = os.path.join(WORK, "rankfile")
ENV = {}
OMPI_TCP = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo"}
# What Open MPI's TCP transport prints when it loses its connect race (see test_srun_direct_launch).
OMPI_CONNECT_RACE = ("Open MPI failed to TCP connect to a peer MPI process",
                     "mca_btl_tcp_recv_blocking")

TORCH_CHECK = r'''
import os, socket, sys
import torch, torch.distributed as dist
e = os.environ
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(e["RANK"]) and world == int(e["WORLD_SIZE"]) == 8, (rank, world)
assert int(e["LOCAL_WORLD_SIZE"]) == 2 and int(e["GROUP_WORLD_SIZE"]) == 4, e
assert int(e["GROUP_RANK"]) == rank // 2 and int(e["LOCAL_RANK"]) == rank % 2, e
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == 36.0, t
print(f"rank {rank} node {e['GROUP_RANK']} ok {e['MASTER_ADDR']}:{e['MASTER_PORT']}", flush=True)
dist.destroy_process_group()
'''


def sh(cmd, env, timeout=120):
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise TestFailure(f"{' '.join(cmd)} did not finish within {timeout} s") from e


def build():
    os.makedirs(WORK, exist_ok=True)
    if shutil.which("mpicc"):
        for p in ("hello", "collectives", "spawn"):
            r = subprocess.run(["mpicc", "-O1", "-o", os.path.join(WORK, p), os.path.join(SRCDIR, "tests", "mpi", p + ".c")],
                               capture_output=True, text=True)
            check(r.returncode == 0, r.stderr)
    with open(os.path.join(WORK, "torch_check.py"), "w") as f:
        f.write(TORCH_CHECK)


def test_salloc_starts_daemons_mpi():
    if not shutil.which("mpicc"):
        print("  (mpicc not found: not run)")
        return
    env = marker_env(OMPI_TCP)
    env.update(ENV)
    r = sh(["salloc", "-N", "4", "--ntasks-per-node=2", EXEC, "--tag-output", os.path.join(WORK, "collectives")], env)
    check(r.returncode == 0 and "collectives over 8 ranks: ok" in r.stdout, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    r = sh(["salloc", "-N", "4", "--ntasks-per-node=2", EXEC, os.path.join(WORK, "hello")], env)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    got = sorted(l.split(" on ")[0] for l in r.stdout.splitlines())
    check(got == sorted(f"hello rank {i} of 8" for i in range(8)), f"{r.stdout}")
    # -n defaults to the allocation's tasks; each node's ranks are its own; every rank on every node
    # sees the launching shell's environment (as srun gives it), and not the job's secret.
    env["PE_CARRY_CHECK"] = "carried-" + env["PE_TEST_MARKER"][:8]
    r = sh(["salloc", "-N", "4", "--ntasks-per-node=2", EXEC, "sh", "-c",
            "echo $RANK $GROUP_RANK $LOCAL_RANK ${PE_CARRY_CHECK:-unset} ${PYTORCH_EXEC_SECRET:-no-secret}"], env)
    rows = sorted(l.split() for l in r.stdout.splitlines())
    want = sorted([str(i), str(i // 2), str(i % 2), env["PE_CARRY_CHECK"], "no-secret"] for i in range(8))
    check(rows == want, f"{r.stdout} {r.stderr}")
    # --nproc-per-node K in an allocation: K per node, torchrun's meaning (it was K in all).
    r = sh(["salloc", "-N", "2", "--ntasks-per-node=2", EXEC, "--nproc-per-node", "1", "sh", "-c",
            "echo $RANK $GROUP_RANK $LOCAL_WORLD_SIZE"], env)
    check(r.returncode == 0 and sorted(r.stdout.split("\n")) == ["", "0 0 1", "1 1 1"],
          f"exit {r.returncode}: {r.stdout} {r.stderr}")
    # -H naming nodes of the allocation: their daemons are started with srun, not ssh.
    # Each rank's SLURM_PROCID, _LOCALID, _NODEID, _NTASKS, _GTIDS and _TASKS_PER_NODE are its
    # own, as srun would give them (they were the daemon's task's: one rank id per node), and
    # SLURMD_NODENAME its node's (it was the launching shell's node's, here sbatch's n1); what
    # the daemons' own srun options set is not theirs (SLURM_JOB_NAME, SLURM_NTASKS_PER_NODE).
    out = os.path.join(WORK, "sbatch.out")
    r = sh(["sbatch", "-N", "2", "--ntasks-per-node=2", "--wait", "-o", out, "--wrap",
            f"{EXEC} -H n2:1,n1:2 sh -c 'echo $RANK $GROUP_RANK $LOCAL_WORLD_SIZE $SLURM_PROCID "
            "$SLURM_NODEID $SLURM_LOCALID $SLURM_NTASKS $SLURM_GTIDS $SLURM_TASKS_PER_NODE "
            "$SLURMD_NODENAME $SLURM_JOB_NAME $SLURM_NTASKS_PER_NODE'"], env)
    with open(out) as f:
        r.stdout = f.read()
    check(r.returncode == 0 and sorted(r.stdout.split("\n")) == [
        "", "0 0 1 0 0 0 3 0 1,2 n2 wrap 2", "1 1 2 1 1 0 3 1,2 1,2 n1 wrap 2",
        "2 1 2 2 1 1 3 1,2 1,2 n1 wrap 2"],
        f"exit {r.returncode}: {r.stdout} {r.stderr}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def test_spawn_onto_a_node_without_ranks():
    """MPI_Comm_spawn with add-host naming an allocation node that runs none of the ranks: its
    daemon is started with srun then, and the children run there."""
    if not shutil.which("mpicc"):
        print("  (mpicc not found: not run)")
        return
    env = marker_env(dict(OMPI_TCP, SPAWN_HOST_KEY="add-host"))
    env.update(ENV)
    r = sh(["salloc", "-N", "2", "--ntasks-per-node=2", EXEC, "-v", "-n", "2", "-x", "SPAWN_HOST_KEY",
            os.path.join(WORK, "spawn"), "2", "n2"], env)
    check(r.returncode == 0 and r.stdout.count("spawned 2, sum 2: ok") == 2,
          f"exit {r.returncode}: {r.stdout} {r.stderr[-3000:]}")
    check("node n2: starting its daemon for spawned processes" in r.stderr, r.stderr[-3000:])
    check(re.search(r"@n2 pmix info: namespace \S+\.spawn1 registered: 2 ranks, 2 here", r.stderr),
          r.stderr[-3000:])
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def test_the_interactive_step_is_no_direct_launch():
    """salloc with LaunchParameters=use_interactive_step runs the user's shell as the task of the
    allocation's interactive step (SLURM_STEP_ID 4294967290, what `srun --interactive` makes):
    pytorch_exec there starts a daemon on every node, as under plain salloc."""
    env = marker_env()
    env.update(ENV)
    r = sh(["salloc", "-N", "4", "--ntasks-per-node=2", "srun", "--interactive", "--preserve-env", EXEC, "sh", "-c",
            "echo $RANK $WORLD_SIZE $GROUP_RANK"], env)
    rows = sorted(l.split() for l in r.stdout.splitlines())
    check(r.returncode == 0 and rows == sorted([str(i), "8", str(i // 2)] for i in range(8)),
          f"exit {r.returncode}: {r.stdout} {r.stderr}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def test_a_shell_of_srun_pty_is_no_direct_launch():
    """`srun --pty bash` in an allocation: pytorch_exec typed in that shell starts the ranks on
    the allocation's nodes, as in salloc's shell (it took itself for a task of a direct launch
    of 1 rank); an srun from that shell (the terminal's SLURM_PTY_PORT in its environment too)
    is a direct launch still."""
    env = marker_env()
    env.update(ENV)
    inner = os.path.join(WORK, "typed_in_the_shell.sh")
    with open(inner, "w") as f:
        f.write(f"{EXEC} sh -c 'echo rank $RANK of $WORLD_SIZE node $GROUP_RANK'; echo exit $?\n"
                f"srun -n 2 --overlap {EXEC} sh -c 'echo direct $RANK of $WORLD_SIZE'; "
                "echo exit $?\n")
    r = sh(["salloc", "-N", "2", "--ntasks-per-node=2", "script", "-qec",
            f"srun -N 1 -n 1 --pty sh {inner}", "/dev/null"], env)
    # (the terminal's echo may put "^@" before a line)
    said = sorted(re.findall(r"rank \d+ of \d+ node \d+|direct \d+ of \d+|exit \d+", r.stdout))
    want = sorted([f"rank {i} of 4 node {i // 2}" for i in range(4)] +
                  ["direct 0 of 2", "direct 1 of 2", "exit 0", "exit 0"])
    check(r.returncode == 0 and said == want, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def test_join_mode_under_srun():
    """torchrun's way under SLURM: `srun -N2 --ntasks-per-node=1 pytorch_exec --nnodes 2
    --rdzv-endpoint ...`, each task its node's launcher.  Here every node's address is this
    machine's: the first task binds the endpoint and hosts, the other finds it taken and joins
    (it failed to bind), and the program is found in PATH by the tasks (`sh`: it was exec'd as
    typed, not found)."""
    env = marker_env({"PYTORCH_EXEC_RDZV_SECRET": "srun join"})
    env.update(ENV)
    r = sh(["salloc", "-N", "2", "srun", "-N", "2", "--ntasks-per-node=1", EXEC, "--nnodes", "2",
            "--nproc-per-node", "1", "--join-timeout", "30", "--rdzv-endpoint", "127.0.0.1:29557",
            "sh", "-c",
            "echo rank $RANK of $WORLD_SIZE on $SLURMD_NODENAME"], env)
    rows = sorted(l for l in r.stdout.splitlines() if l.startswith("rank "))
    check(r.returncode == 0 and [l.split(" on ")[0] for l in rows] == ["rank 0 of 2", "rank 1 of 2"]
          and len({l.split(" on ")[1] for l in rows}) == 2,  # two nodes, whichever salloc gave
          f"exit {r.returncode}: {r.stdout} {r.stderr}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def test_salloc_torch_and_failure_names_the_node():
    need_torch()
    env = marker_env()
    env.update(ENV)
    r = sh(["salloc", "-N", "4", "--ntasks-per-node=2", EXEC, TORCH_PYTHON, os.path.join(WORK, "torch_check.py")],
           env, timeout=180)
    check(r.returncode == 0 and r.stdout.count(" ok ") == 8, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    r = sh(["salloc", "-N", "4", "--ntasks-per-node=2", EXEC, "--kill-grace", "1", "sh", "-c",
            "if [ $RANK = 5 ]; then exit 4; fi; exec sleep 30"], env)
    check(r.returncode == 4 and re.search(r"rank 5 \(pid \d+ on n3\) exited with status 4", r.stderr),
          f"exit {r.returncode}: {r.stderr}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def test_srun_direct_launch():
    env = marker_env(OMPI_TCP)
    env.update(ENV)
    need_torch()
    r = sh(["srun", "--mpi=pmix", "-N", "4", "-n", "8", EXEC, TORCH_PYTHON, os.path.join(WORK, "torch_check.py")],
           env, timeout=180)
    check(r.returncode == 0 and r.stdout.count(" ok ") == 8, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    masters = {l.split()[-1] for l in r.stdout.splitlines()}
    check(len(masters) == 1 and masters.pop().startswith("n1:"), f"MASTER_ADDR/PORT: {r.stdout}")
    if shutil.which("mpicc"):
        # --kill-on-bad-exit: a task that crashes ends the step, as mpirun would (without it the
        # other tasks wait in MPI for the crashed one, and srun with them, for minutes).
        cmd = ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "-N", "4", "-n", "8", EXEC,
               os.path.join(WORK, "collectives")]
        r = sh(cmd, env)
        if r.returncode != 0 and any(m in r.stderr for m in OMPI_CONNECT_RACE):
            # Open MPI's own TCP transport lost a connection race while 8 ranks connect at once
            # on an overloaded 2-processor machine (its warning or its failed receive, then a
            # segfault in Open MPI, about 1 run in 30 with both processors busy; see
            # open-mpi/ompi#11508).  The program runs as srun's task after pytorch_exec has
            # exec'd it, so none of ours is involved: once more, said so in the log.
            print(f"    Open MPI's TCP connect race (exit {r.returncode}); running the step again",
                  flush=True)
            r = sh(cmd, env)
        check(r.returncode == 0 and "collectives over 8 ranks: ok" in r.stdout, f"exit {r.returncode}: {r.stdout} {r.stderr}")
        r = sh(["srun", "--mpi=pmix", "-N", "2", "-n", "3", EXEC, os.path.join(WORK, "hello")], env)
        check(r.returncode == 0 and r.stdout.count("of 3 on") == 3 and "MISMATCH" not in r.stdout, r.stdout + r.stderr)
    # torchrun's ${local_rank} in the arguments; MPIEXEC_TIMEOUT, exported for a script's mpirun
    # steps, is no --timeout here (it was refused as one).
    r = sh(["srun", "--mpi=none", "-N", "2", "-n", "3", EXEC, "sh", "-c",
            "echo $RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK ${local_rank}", "${local_rank}"],
           dict(env, MPIEXEC_TIMEOUT="100"))
    check(sorted(r.stdout.splitlines()) == ["0 0 2 0 0", "1 1 2 0 1", "2 0 1 1 0"], f"{r.stdout} {r.stderr}")
    r = sh(["srun", "--mpi=pmix", "-N", "1", "-n", "2", EXEC, "-n", "3", "true"], env)
    check(r.returncode != 0 and "-n 3 does not match the SLURM step's 2 tasks" in r.stderr, r.stderr)
    r = sh(["srun", "-N", "1", "-n", "1", EXEC, "--max-restarts", "1", "true"], env)
    check(r.returncode != 0 and "--max-restarts needs pytorch_exec to supervise" in r.stderr, r.stderr)
    # torchrun's spellings are checked against the step (they were ignored), and what srun does
    # itself for its tasks is refused, naming srun's option.
    r = sh(["srun", "-N", "2", "--ntasks-per-node=1", EXEC, "--nproc-per-node", "2", "true"], env)
    check(r.returncode != 0 and "--nproc-per-node 2 does not match the SLURM step's 1 tasks on "
          "this node" in r.stderr, r.stderr)
    r = sh(["srun", "-N", "2", "--ntasks-per-node=1", EXEC, "--nnodes", "2", "--nproc-per-node",
            "1", "sh", "-c", "echo $RANK"], env)
    check(r.returncode == 0 and sorted(r.stdout.split()) == ["0", "1"], f"{r.stdout} {r.stderr}")
    r = sh(["srun", "-N", "1", "-n", "1", EXEC, "--tag-output", "true"], env)
    check(r.returncode != 0 and "--tag-output (srun --label) does not apply under srun" in r.stderr,
          r.stderr)
    # mpirun's mapping options are srun's to do, named as the user gave them.
    with open(RANKFILE, "w") as f:
        f.write("rank 0=n1 slot=0\nrank 1=n1 slot=1\n")
    for args, text in [(["--map-by", "ppr:1:socket"], "--map-by ppr:1:socket (1 per node) does not apply"),
                       (["--pernode"], "--pernode does not apply under srun"),
                       (["--cpus-per-rank", "2"], "--cpus-per-rank (srun --distribution, --cpus-per-task) does not apply"),
                       (["--map-by", "core"], "--map-by (srun --distribution, --cpus-per-task) does"),
                       # and so are its placement options
                       (["--cpu-list", "0"], "--cpu-list (srun --cpu-bind=map_cpu) does not apply"),
                       (["--cpu-set", "0"], "--cpu-set (srun --cpu-bind=mask_cpu) does not apply"),
                       (["--nolocal"], "--nolocal (srun --exclude) does not apply"),
                       (["--rankfile", RANKFILE], "--rankfile does not apply under srun")]:
        r = sh(["srun", "-N", "1", "-n", "1", EXEC] + args + ["true"], env)
        check(r.returncode != 0 and text in r.stderr and
              sum(l.startswith("pytorch_exec:") for l in r.stderr.splitlines()) == 1,
              f"{args}: {r.stderr}")
    # MASTER_ADDR is rank 0's node whatever the distribution: here the second node of the step.
    hostfile = os.path.join(WORK, "arbitrary")
    with open(hostfile, "w") as f:
        f.write("n2\nn1\nn1\nn2\n")
    r = sh(["srun", "--mpi=pmix", "-n", "4", "-m", "arbitrary", EXEC, "sh", "-c",
            "echo $RANK $GROUP_RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $SLURMD_NODENAME"],
           dict(env, SLURM_HOSTFILE=hostfile))
    rows = sorted(r.stdout.splitlines())
    check(r.returncode == 0 and rows == ["0 1 0 2 n2 n2", "1 0 0 2 n2 n1", "2 0 1 2 n2 n1",
                                         "3 1 1 2 n2 n2"], f"exit {r.returncode}: {r.stdout} {r.stderr}")


def test_srun_direct_launch_agrees_on_a_dc_token():
    """Under srun --mpi=pmix there is no launcher to make the DataChannel's token: the tasks agree
    on one through SLURM's PMIx server (a fence).  Every rank has the same, a new step a new one;
    the user's own wins; without PMIx there is none.  A DataChannel job over tcp works with it,
    and a rank that has another token is kept out."""
    env = marker_env()
    env.update(ENV)
    env.pop("PYTORCH_DC_TOKEN", None)
    cmd = ["srun", "--mpi=pmix", "-N", "4", "-n", "8", EXEC, "sh", "-c", "echo $RANK ${PYTORCH_DC_TOKEN:-none}"]
    tokens = []
    for _ in range(2):
        r = sh(cmd, env)
        rows = [l.split() for l in r.stdout.splitlines()]
        check(r.returncode == 0 and sorted(int(x[0]) for x in rows) == list(range(8)), f"exit {r.returncode}: {r.stdout} {r.stderr}")
        got = {x[1] for x in rows}
        check(len(got) == 1 and re.fullmatch(r"[0-9a-f]{32}", next(iter(got))), f"tokens: {r.stdout}")
        tokens.append(got.pop())
    check(tokens[0] != tokens[1], "two steps had the same token")
    r = sh(cmd, dict(env, PYTORCH_DC_TOKEN="mine"))
    check(r.returncode == 0 and {l.split()[1] for l in r.stdout.splitlines()} == {"mine"}, f"{r.stdout} {r.stderr}")
    r = sh(["srun", "--mpi=none", "-N", "2", "-n", "2"] + cmd[6:], env)
    check(r.returncode == 0 and {l.split()[1] for l in r.stdout.splitlines()} == {"none"}, f"{r.stdout} {r.stderr}")
    dc_check = os.path.join(BUILDDIR, "tests", "dc", "dc_check")
    if not os.path.exists(dc_check):
        print("  (tests/dc/dc_check is not built: the DataChannel job not run)")
        return
    dc = "PYTORCH_DC_TRANSPORT=tcp PYTORCH_DC_TIMEOUT=8 exec " + dc_check + " info"
    r = sh(["srun", "--mpi=pmix", "-N", "4", "-n", "8", EXEC, "sh", "-c", dc], env)
    check(r.returncode == 0 and all(f"rank {i} size 8" in r.stdout for i in range(8)), f"exit {r.returncode}: {r.stdout} {r.stderr[-2000:]}")
    # Rank 3 took part in the agreement, then runs with another token: the others refuse it.
    r = sh(["srun", "--mpi=pmix", "-N", "4", "-n", "8", EXEC, "sh", "-c",
            "[ $RANK = 3 ] && export PYTORCH_DC_TOKEN=stranger; " + dc], env)
    check(r.returncode != 0 and "rank 3 size 8" not in r.stdout, f"a rank with another token joined: {r.stdout} {r.stderr[-2000:]}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


ELASTIC_WORKER = (
    'echo "gen $TORCHELASTIC_RESTART_COUNT world $WORLD_SIZE on $SLURMD_NODENAME"; '
    '[ "$WORLD_SIZE" = 3 ] && exit 0; exec sleep 100')


def sleepers(marker):
    return [p for p in processes_with_marker(marker) if comm(p) == "sleep"]


def test_elastic_job_goes_on_when_slurm_sets_a_node_down():
    """salloc --no-kill -N 4, pytorch_exec --nnodes 3:4: the daemons' step runs with --no-kill, so
    when a node is set DOWN SLURM kills only that node's daemon; the job re-forms on the other
    three (WORLD_SIZE 3) and ends well."""
    env = marker_env()
    env.update(ENV)
    p = subprocess.Popen(["salloc", "--no-kill", "-N", "4", "--ntasks-per-node=1", EXEC, "--nnodes", "3:4",
                          "sh", "-c", ELASTIC_WORKER], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    down = None
    try:
        deadline = time.monotonic() + 60
        while down is None and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.5)
            if len(sleepers(env["PE_TEST_MARKER"])) == 4:  # every node's worker is running
                down = "n3"
        check(down is not None, f"the job did not start 4 workers: {p.poll()}")
        r = sh(["scontrol", "update", f"nodename={down}", "state=down", "reason=pytorch_exec-test"], env)
        check(r.returncode == 0, f"scontrol: {r.stderr}")
        out, err = p.communicate(timeout=90)
    except subprocess.TimeoutExpired as e:
        p.kill()
        raise TestFailure("the elastic job did not end within 90 s of the node going down") from e
    finally:
        if down:  # back in service before the next test, which needs all four nodes
            sh(["scontrol", "update", f"nodename={down}", "state=resume"], env)
            for _ in range(40):
                r = sh(["sinfo", "-h", "-n", down, "-o", "%t"], env)
                if r.stdout.strip() in ("idle", "alloc", "mix"):
                    break
                time.sleep(0.25)
        if p.poll() is None:
            p.kill()
            p.wait()
    check(p.returncode == 0, f"exit {p.returncode}: {out} {err[-3000:]}")
    check(out.count("world 4 on") == 4 and out.count("world 3 on") == 3 and "world 3 on n3" not in out,
          f"expected 4 workers, then 3 without n3: {out} {err[-2000:]}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_elastic_job_starts_without_a_node_slurm_has_down():
    """A node of the allocation is DOWN before pytorch_exec --nnodes 2:3 starts: the one srun for
    every daemon cannot make its step, so each node gets an srun of its own; the job runs on the
    two others (it failed whole, blaming the first node).  Without --nnodes the job fails, and
    the message does not blame one node for the srun of three."""
    env = marker_env()
    env.update(ENV)
    hello = 'echo "world $WORLD_SIZE rank $RANK"'
    down = "scontrol update nodename=n3 state=down reason=pytorch_exec-test && "
    try:
        r = sh(["salloc", "--no-kill", "-w", "n1,n2,n3", "--ntasks-per-node=1", "sh", "-c",
                down + f"exec {EXEC} --nnodes 2:3 sh -c '{hello}'"], env, timeout=90)
        check(r.returncode == 0 and sorted(r.stdout.split("\n")) == [
            "", "world 2 rank 0", "world 2 rank 1"], f"exit {r.returncode}: {r.stdout} {r.stderr[-3000:]}")
        check("node n3: its daemon could not be started (srun exited with status 1); starting on "
              "the 2 node(s) left" in r.stderr, r.stderr[-3000:])
        sh(["scontrol", "update", "nodename=n3", "state=resume"], env)
        r = sh(["salloc", "--no-kill", "-w", "n1,n2,n3", "--ntasks-per-node=1", "sh", "-c",
                down + f"exec {EXEC} sh -c '{hello}'"], env, timeout=90)
        check(r.returncode != 0 and "the srun that starts the daemons of 3 nodes exited with status"
              in r.stderr, f"exit {r.returncode}: {r.stderr[-3000:]}")
    finally:
        sh(["scontrol", "update", "nodename=n3", "state=resume"], env)
        for _ in range(40):
            if sh(["sinfo", "-h", "-n", "n3", "-o", "%t"], env).stdout.strip() in ("idle", "alloc", "mix"):
                break
            time.sleep(0.25)
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


def test_srun_torch_dc_backend():
    """The torch backend "dc" under srun's direct launch: 8 ranks on the 4 nodes (the hierarchical
    path: shm inside each node, tcp across), bootstrapped through torch's store."""
    need_torch()
    pkg = os.path.join(BUILDDIR, "python")
    if not glob.glob(os.path.join(pkg, "pytorch_dc", "_C*.so")):
        print("  (the dc extension was not built: not run)")
        return
    env = marker_env({"PYTHONPATH": pkg})
    env.update(ENV)
    worker = os.path.join(SRCDIR, "tests", "integration", "torch_dc_worker.py")
    r = sh(["srun", "--mpi=pmix", "-N", "4", "-n", "8", EXEC, TORCH_PYTHON, worker, "launcher", "env://"],
           env, timeout=240)
    oks = [l for l in r.stdout.splitlines() if l.startswith("ok launcher env rank ")]
    check(r.returncode == 0 and len(oks) == 8 and all("4 node(s), shm/tcp" in l for l in oks),
          f"exit {r.returncode}: {r.stdout} {r.stderr[-3000:]}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def testbed(args, dirname, extra=None):
    env = dict(os.environ, PE_SLURM_DIR=dirname, **(extra or {}))
    return subprocess.run([TESTBED] + args, capture_output=True, text=True, env=env, timeout=120)


def test_a_second_test_bed_beside_the_first():
    """Another SLURM on the machine: a test bed asked for ports that are taken says which and
    fails; one left to choose takes free ports, verifies its own daemons and nodes, and its stop
    ends only what it started (the first test bed's daemons and a running step stay)."""
    with open(ENV["SLURM_CONF"]) as f:
        port = int(f.read().split("SlurmctldPort=")[1].split()[0])
    second = os.path.join(WORK, "second-testbed")
    step = None
    try:  # whatever happens, the second test bed is stopped
        r = testbed(["start"], second, {"PE_SLURM_PORT": str(port)})
        check(r.returncode == 1 and
              f"port(s) {' '.join(str(port + i) for i in range(5))} already in use" in r.stderr,
              f"exit {r.returncode}: {r.stderr}")
        first_pids = set(subprocess.run(["pgrep", "-f", "--", "-f " + ENV["SLURM_CONF"]],
                                        capture_output=True, text=True).stdout.split())
        check(len(first_pids) >= 5, f"the first test bed's daemons: {first_pids}")
        env = dict(os.environ, **ENV)
        step = subprocess.Popen(["srun", "-N", "4", "-n", "4", "sleep", "60"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = testbed(["start"], second)
        check(r.returncode == 0, f"the second test bed did not start: {r.stderr}")
        conf2 = r.stdout.strip().split("=", 1)[1]
        r = sh(["srun", "-N", "4", "-n", "4", "hostname"], dict(os.environ, SLURM_CONF=conf2))
        check(r.returncode == 0 and len(r.stdout.split()) == 4, f"srun on the second: {r.stderr}")
        check(step.poll() is None, "the step on the first test bed ended")
        r = testbed(["stop"], second)
        check(r.returncode == 0, f"stop: {r.stderr}")
        check(step.poll() is None, "stopping the second test bed ended the first one's step")
        alive = {p for p in first_pids if os.path.exists(f"/proc/{p}")}
        check(first_pids <= alive, f"the first test bed's daemons {first_pids - alive} were stopped")
        check(testbed(["status"], second).returncode == 1, "the second test bed still says it is up")
        r = sh(["sinfo", "-h", "-N", "-o", "%t"], env)
        check(sorted(set(r.stdout.split())) in (["alloc"], ["mix"]), f"the first test bed's nodes: {r.stdout} {r.stderr}")
    finally:
        if step:
            step.kill()
            step.wait()
        testbed(["stop"], second)


if __name__ == "__main__":
    if os.geteuid() != 0:
        skip("the SLURM test bed needs root")
    missing = [b for b in ("munged", "slurmctld", "slurmd", "srun", "salloc") if not shutil.which(b)]
    if missing:
        skip(f"SLURM is not installed ({', '.join(missing)} missing: apt-get install munge slurm-wlm)")
    # A test bed of this build tree's own (unless PE_SLURM_DIR names one): test runs of other trees
    # on the machine at the same time (their jobs, their node-down test) stay out of this one's way.
    tree = hashlib.sha1(os.path.abspath(BUILDDIR).encode()).hexdigest()[:10]
    os.environ.setdefault("PE_SLURM_DIR", f"/var/tmp/pytorch_exec-slurm-{tree}")
    was_up = subprocess.run([TESTBED, "status"], capture_output=True).returncode == 0
    r = subprocess.run([TESTBED, "start"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        print(f"FAIL: the SLURM test bed did not start: {r.stderr}")
        sys.exit(1)
    ENV["SLURM_CONF"] = r.stdout.strip().split("=", 1)[1]
    try:
        build()
        main([test_salloc_starts_daemons_mpi, test_salloc_torch_and_failure_names_the_node,
              test_spawn_onto_a_node_without_ranks,
              test_the_interactive_step_is_no_direct_launch,
              test_a_shell_of_srun_pty_is_no_direct_launch, test_join_mode_under_srun,
              test_srun_direct_launch,
              test_srun_direct_launch_agrees_on_a_dc_token, test_srun_torch_dc_backend,
              test_elastic_job_goes_on_when_slurm_sets_a_node_down,
              test_elastic_job_starts_without_a_node_slurm_has_down,
              test_a_second_test_bed_beside_the_first])
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
        if not was_up:
            subprocess.run([TESTBED, "stop"], capture_output=True, timeout=120)
