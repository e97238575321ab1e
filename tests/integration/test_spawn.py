"""MPI dynamic processes under pytorch_exec: MPI_Comm_spawn and MPI_Comm_spawn_multiple from C,
mpi4py's Comm.Spawn and an mpi4py.futures pool, on one node, across launch-agent "nodes" on this
machine and across network-namespace hosts, also on hosts of the host list that run no ranks (a
daemon is started there for the children).  The children exchange messages with their parents
over the intercommunicator; their output goes to --output-filename files too; failure events
reach both namespaces; a failing child ends the job with a report; a spawn beyond the slots, or
that cannot start on one node, is refused at once with one line (what started elsewhere is
stopped); nothing is left running after any of it, nor after the launcher is killed."""
import os
import re
import shutil
import signal
import subprocess
import time

import netns
from harness import (EXEC, SRCDIR, SYSTEM_PYTHON, TestFailure, assert_no_leftovers, check, main,
                     marker_env, processes_with_marker, run, script, skip, start, tmpdir,
                     wait_until)

MPI_SRC = os.path.join(SRCDIR, "tests", "mpi")
BIN = tmpdir()
HIDDEN = os.path.join(BIN, "hidden")  # a copy of spawn that some "nodes" do not see


def build():
    if not shutil.which("mpicc"):
        skip("mpicc not found (libopenmpi-dev)")
    for prog in ("spawn", "spawn_multiple"):
        r = subprocess.run(["mpicc", "-O1", "-o", os.path.join(BIN, prog),
                            os.path.join(MPI_SRC, prog + ".c")], capture_output=True, text=True)
        check(r.returncode == 0, f"mpicc {prog}.c: {r.stderr}")
    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], capture_output=True, text=True)
    r = subprocess.run(["cc", "-o", os.path.join(BIN, "pmix_spawn_events"),
                        os.path.join(MPI_SRC, "pmix_spawn_events.c")] + pc.stdout.split(),
                       capture_output=True, text=True)
    check(pc.returncode == 0 and r.returncode == 0, f"cc pmix_spawn_events.c: {pc.stderr} {r.stderr}")
    os.makedirs(HIDDEN)
    shutil.copy(os.path.join(BIN, "spawn"), HIDDEN)


def prog(name):
    return os.path.join(BIN, name)


def agent(marker):
    """Launch-agent "nodes" on this machine, started with a clean environment as ssh would."""
    return f"env -i PATH=/usr/bin:/bin PE_TEST_MARKER={marker} PE_NODE={{host}}"


def odd_agent(marker):
    """A launch agent like agent(marker), except that host $HIDE_ON (of the launcher's
    environment) does not see HIDDEN (a private mount namespace with an empty directory over it)
    and host $DEAD_ON cannot be reached."""
    return script(f"""#!/bin/sh
host=$1; shift
if [ "$host" = "$DEAD_ON" ]; then
  echo "ssh: connect to host $host port 22: No route to host" >&2
  exit 255
fi
if [ "$host" = "$HIDE_ON" ]; then
  exec unshare -m sh -c 'mount -t tmpfs none "$0" && exec "$@"' {HIDDEN} \\
    env -i PATH=/usr/bin:/bin PE_TEST_MARKER={marker} PE_NODE=$host "$@"
fi
exec env -i PATH=/usr/bin:/bin PE_TEST_MARKER={marker} PE_NODE=$host "$@"
""") + " {host}"


def tcp_env(extra=None):
    # Several "nodes" on one machine: Open MPI's shared memory would see them as one.
    env = marker_env(extra)
    env.update({"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo"})
    return env


def check_exchange(r, parents, children):
    """The parents' and children's lines of tests/mpi/spawn.c."""
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    out = r.stdout
    for p in range(parents):
        check(re.search(rf"parent {p} of {parents}: spawned {children}, sum {children}: ok", out), out)
    for c in range(children):
        check(re.search(rf"child {c} of {children}: got {100 + c}, token 42, parents {parents}, "
                        rf"sum {10 * parents}", out), out)
        check(f"parent: child {c} answered {2 * (100 + c)} from" in out, out)


def test_spawn_exchanges_messages_over_the_intercommunicator():
    env = marker_env()
    r = run(["-n", "2", "--tag-output", prog("spawn"), "3"], env=env, timeout=60)
    check_exchange(r, 2, 3)
    # Output tagged with the spawned job's number and the children's own ranks.
    for c in range(3):
        check(re.search(rf"^\[1\.1,{c}\]<stdout>:child {c} of 3", r.stdout, re.M), r.stdout)
    check(re.search(r"^\[1,1\]<stdout>:parent 1 of 2", r.stdout, re.M), r.stdout)
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_spawn_multiple_gives_each_command_its_appnum():
    env = marker_env()
    r = run(["-n", "1", prog("spawn_multiple")], env=env, timeout=60)
    check(r.returncode == 0 and "parent: 3 children, appnum sum 2: ok" in r.stdout,
          f"exit {r.returncode}: {r.stdout} {r.stderr}")
    rows = sorted(line for line in r.stdout.splitlines() if line.startswith("child"))
    check(rows == ["child 0 of 3: appnum 0 arg first", "child 1 of 3: appnum 1 arg second",
                   "child 2 of 3: appnum 1 arg second"], rows)
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_failing_child_is_reported_and_ends_the_job():
    env = marker_env()
    r = run(["-n", "2", prog("spawn"), "2", "-", "1"], env=env, timeout=60)
    check(r.returncode == 3, f"exit {r.returncode}, expected 3: {r.stderr}")
    check(re.search(r"spawned process 1 of MPI_Comm_spawn #1 \(pid \d+\) exited with status 3",
                    r.stderr), r.stderr)
    assert_no_leftovers(env["PE_TEST_MARKER"])


def refused(args, env, free=None, why=None):
    """The spawn fails at once: MPI_ERR_SPAWN for the parent, one line saying why."""
    t0 = time.monotonic()
    r = run(args, env=env, timeout=60)
    took = time.monotonic() - t0
    check(r.returncode == 4, f"exit {r.returncode}, expected 4 (MPI_Abort): {r.stdout} {r.stderr}")
    check("spawn failed: MPI_ERR_SPAWN" in r.stdout, r.stdout)
    lines = [l for l in r.stderr.splitlines() if "MPI_Comm_spawn from rank 0" in l]
    why = why or f"have {free} free slot(s) (add --oversubscribe"
    check(len(lines) == 1 and why in lines[0], r.stderr)
    check(took < 20, f"the refusal took {took:.1f} s")
    assert_no_leftovers(env["PE_TEST_MARKER"])
    return r


def test_spawn_beyond_the_slots_is_refused_at_once():
    env = marker_env()
    refused(["-H", "localhost:2", "-n", "2", prog("spawn"), "1"], env, 0)
    refused(["-H", "localhost:3", "-n", "1", prog("spawn"), "3"], env, 2)
    # As for the job's own ranks, --oversubscribe lets it place more than the slots.
    r = run(["-H", "localhost:2", "--oversubscribe", "-n", "2", prog("spawn"), "2"], env=env,
            timeout=60)
    check_exchange(r, 2, 2)
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_killing_the_launcher_leaves_no_children():
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for multi in (False, True):
            env = tcp_env({"SPAWN_CHILD_SLEEP": "60"})
            marker = env["PE_TEST_MARKER"]
            nodes = ["-H", "a:2,b:2", "--map-by", "node", "--launch-agent", agent(marker)]
            # The launcher, its daemons, two parents and two children.
            want = 7 if multi else 5
            p = start((nodes if multi else []) + ["-n", "2", prog("spawn"), "2"], env=env,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                check(wait_until(lambda: len(processes_with_marker(marker)) >= want, 30),
                      f"the children did not start: {processes_with_marker(marker)}")
                p.send_signal(sig)
                p.wait(timeout=30)
            finally:
                if p.poll() is None:
                    p.kill()
            assert_no_leftovers(marker, timeout=10)


def mpi4py_missing():
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import mpi4py.futures"], capture_output=True)
    return "mpi4py not installed (python3-mpi4py)" if probe.returncode else None


def test_mpi4py_comm_spawn():
    why = mpi4py_missing()
    if why:
        print(f"  ({why}: not run)")
        return
    code = script(
        "import sys\nfrom mpi4py import MPI\n"
        "parent = MPI.Comm.Get_parent()\n"
        "if parent == MPI.COMM_NULL:\n"
        "    inter = MPI.COMM_WORLD.Spawn(sys.executable, [__file__], maxprocs=3)\n"
        "    root = MPI.ROOT if MPI.COMM_WORLD.rank == 0 else MPI.PROC_NULL\n"
        "    got = inter.gather(None, root=root)\n"
        "    inter.bcast('from the parents', root=root)\n"
        "    if MPI.COMM_WORLD.rank == 0:\n"
        "        print('parent got', got)\n"
        "    inter.Disconnect()\n"
        "else:\n"
        "    parent.gather((MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size), root=0)\n"
        "    print('child', MPI.COMM_WORLD.rank, parent.bcast(None, root=0))\n"
        "    parent.Disconnect()\n", suffix=".py")
    env = marker_env()
    r = run(["-n", "2", SYSTEM_PYTHON, code], env=env, timeout=90)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    check("parent got [(0, 3), (1, 3), (2, 3)]" in r.stdout, r.stdout)
    for c in range(3):
        check(f"child {c} from the parents" in r.stdout, r.stdout)
    assert_no_leftovers(env["PE_TEST_MARKER"])


def futures_pool(args, env):
    code = script(
        "from mpi4py.futures import MPIPoolExecutor\n"
        "import os\n"
        "def work(x):\n"
        "    return x * x, os.getpid()\n"
        "if __name__ == '__main__':\n"
        "    with MPIPoolExecutor(max_workers=2) as pool:\n"
        "        got = list(pool.map(work, range(20)))\n"
        "    print('sum', sum(v for v, _ in got), 'workers', len({p for _, p in got}))\n",
        suffix=".py")
    r = run(args + [SYSTEM_PYTHON, code], env=env, timeout=90)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    m = re.search(r"sum 2470 workers (\d)", r.stdout)
    check(m and 1 <= int(m.group(1)) <= 2, r.stdout)
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_mpi4py_futures_pool():
    why = mpi4py_missing()
    if why:
        print(f"  ({why}: not run)")
        return
    futures_pool(["-n", "1"], marker_env())
    # As under mpirun, MPI_UNIVERSE_SIZE is the allocation's slots: a default pool fills them.
    code = script(
        "from mpi4py import MPI\nfrom mpi4py.futures import MPIPoolExecutor\n"
        "if __name__ == '__main__':\n"
        "    print('universe', MPI.COMM_WORLD.Get_attr(MPI.UNIVERSE_SIZE))\n"
        "    with MPIPoolExecutor() as pool:\n"
        "        print('sum', sum(pool.map(abs, range(-10, 10))))\n", suffix=".py")
    env = marker_env()
    r = run(["-H", "localhost:3", "-n", "1", SYSTEM_PYTHON, code], env=env, timeout=90)
    check(r.returncode == 0 and "universe 3" in r.stdout and "sum 100" in r.stdout,
          f"exit {r.returncode}: {r.stdout} {r.stderr}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_spawn_across_nodes():
    env = tcp_env()
    la = ["--launch-agent", agent(env["PE_TEST_MARKER"])]
    nodes = ["-H", "a:2,b:2", "--map-by", "node"] + la
    # A free slot on each node: one child on each, messages across them.
    r = run(nodes + ["-v", "-n", "2", prog("spawn"), "2"], env=env, timeout=60)
    check_exchange(r, 2, 2)
    for host in "ab":
        check(re.search(rf"@{host} pmix info: namespace \S+\.spawn1 registered: 2 ranks, 1 here",
                        r.stderr), r.stderr)
    # "host" puts them where it says.
    r = run(nodes + ["-v", "-n", "2", prog("spawn"), "1", "b"], env=env, timeout=60)
    check_exchange(r, 2, 1)
    check(re.search(r"@b pmix info: namespace \S+\.spawn1 registered: 1 ranks, 1 here", r.stderr),
          r.stderr)
    # So does "add-host" (here a node of the job; test_spawn_on_hosts_without_ranks: others).
    r = run(nodes + ["-v", "-x", "SPAWN_HOST_KEY=add-host", "-n", "2", prog("spawn"), "1", "b"],
            env=env, timeout=60)
    check_exchange(r, 2, 1)
    check(re.search(r"@b pmix info: namespace \S+\.spawn1 registered: 1 ranks, 1 here", r.stderr),
          r.stderr)
    r = run(["-H", "a:3,b:3", "--map-by", "node"] + la + ["-n", "2", prog("spawn_multiple")],
            env=env, timeout=60)
    check(r.returncode == 0 and "parent: 3 children, appnum sum 2: ok" in r.stdout,
          f"exit {r.returncode}: {r.stdout} {r.stderr}")
    r = run(nodes + ["-n", "2", prog("spawn"), "2", "-", "0"], env=env, timeout=60)
    check(r.returncode == 3 and "spawned process 0 of MPI_Comm_spawn #1" in r.stderr,
          f"exit {r.returncode}: {r.stderr}")
    refused(nodes + ["-n", "2", prog("spawn"), "3"], env, 2)
    # Through relaying daemons (a tree of radix 1).
    r = run(["-H", "a:2,b:2,c:2", "--map-by", "node", "--tree-radix", "1"] + la +
            ["-n", "3", prog("spawn"), "3"], env=env, timeout=60)
    check_exchange(r, 3, 3)
    if not mpi4py_missing():
        futures_pool(["-H", "a:1,b:1", "--oversubscribe"] + la + ["-n", "2"], env)
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_spawn_on_hosts_without_ranks():
    """A host of the -H list that runs none of the ranks: its daemon is started for the children
    only (the ranks' world and the group stay as they are)."""
    env = tcp_env()
    la = ["--launch-agent", agent(env["PE_TEST_MARKER"])]
    nodes = ["-H", "a:2,b:2"] + la  # both ranks on a, none on b
    hostfile = script("b slots=2\n", suffix=".hosts")
    for key, where in (("add-host", "b"), ("host", "b"), ("add-hostfile", hostfile)):
        r = run(nodes + ["-v", "-x", f"SPAWN_HOST_KEY={key}", "-n", "2", prog("spawn"), "2", where],
                env=env, timeout=60)
        check_exchange(r, 2, 2)
        check(re.search(r"@b pmix info: namespace \S+\.spawn1 registered: 2 ranks, 2 here",
                        r.stderr), f"{key}: {r.stderr}")
        check("node b: starting its daemon for spawned processes" in r.stderr, r.stderr)
        check(not re.search(r"re-form|joined|generation 1", r.stderr), f"{key}: {r.stderr}")
    # Its slots count; a host in no list is refused in one line.
    refused(nodes + ["-x", "SPAWN_HOST_KEY=add-host", "-n", "2", prog("spawn"), "3", "b"], env, 2)
    refused(nodes + ["-x", "SPAWN_HOST_KEY=add-host", "-n", "2", prog("spawn"), "1", "zz"], env,
            why="host zz is not in the job's host list (its nodes: a; the host list's: b)")
    # Two spawns, the second to where the first started a daemon (mpi4py: one each).
    if not mpi4py_missing():
        code = script(
            "import sys\nfrom mpi4py import MPI\n"
            "if MPI.Comm.Get_parent() == MPI.COMM_NULL:\n"
            "    for k in range(2):\n"
            "        info = MPI.Info.Create(); info.Set('add-host', 'b')\n"
            "        inter = MPI.COMM_WORLD.Spawn(sys.executable, [__file__], 1, info)\n"
            "        print('spawn', k, 'answered', inter.recv(source=0)); inter.Disconnect()\n"
            "else:\n"
            "    p = MPI.Comm.Get_parent(); p.send(MPI.Get_processor_name(), dest=0)\n"
            "    p.Disconnect()\n", suffix=".py")
        r = run(nodes + ["-v", "-n", "1", SYSTEM_PYTHON, code], env=env, timeout=90)
        check(r.returncode == 0 and "spawn 1 answered" in r.stdout,
              f"exit {r.returncode}: {r.stdout} {r.stderr}")
        check(len(re.findall(r"@b pmix info: namespace \S+\.spawn\d registered: 1 ranks, 1 here",
                             r.stderr)) == 2, r.stderr)
        check(r.stderr.count("starting its daemon for spawned processes") == 1, r.stderr)
        # Two spawns at once (one per rank, MPI_COMM_SELF) of 2 each to b (2 slots), while b's
        # daemon starts: the first placed counts against the second, which is refused.
        code = script(
            "import sys\nfrom mpi4py import MPI\n"
            "if MPI.Comm.Get_parent() == MPI.COMM_NULL:\n"
            "    info = MPI.Info.Create(); info.Set('add-host', 'b')\n"
            "    try:\n"
            "        inter = MPI.COMM_SELF.Spawn(sys.executable, [__file__], 2, info)\n"
            "        print('placed', inter.Get_remote_size(), flush=True); inter.Disconnect()\n"
            "    except MPI.Exception as e:\n"
            "        print('refused', e.Get_error_class() == MPI.ERR_SPAWN, flush=True)\n"
            "else:\n"
            "    MPI.Comm.Get_parent().Disconnect()\n", suffix=".py")
        r = run(nodes + ["-n", "2", SYSTEM_PYTHON, code], env=env, timeout=90)
        got = sorted(re.findall(r"^(?:placed|refused) .*$", r.stdout, re.M))
        check(r.returncode == 0 and got == ["placed 2", "refused True"],
              f"exit {r.returncode}: {r.stdout} {r.stderr}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_a_job_on_this_machine_spawns_on_another_listed_host():
    """-H localhost:2,b:2 -n 2: every rank runs here, b is in the list: the job has daemons (one
    here, b's started when the spawn asks for it), as mpirun has, and the children run on b.
    Likewise an elastic job (--nnodes 1:1 -H a:2,b:2) for b, a host of its list beyond MAX."""
    for args in (["-H", "localhost:2,b:2", "-n", "2"], ["--nnodes", "1:1", "-H", "a:2,b:2"]):
        env = tcp_env()
        r = run(args + ["--launch-agent", agent(env["PE_TEST_MARKER"]), "-v", "-x",
                        "SPAWN_HOST_KEY=add-host", prog("spawn"), "2", "b"], env=env, timeout=60)
        check_exchange(r, 2, 2)
        check(re.search(r"@b pmix info: namespace \S+\.spawn1 registered: 2 ranks, 2 here",
                        r.stderr), r.stderr)
        check("node b: starting its daemon for spawned processes" in r.stderr, r.stderr)
        assert_no_leftovers(env["PE_TEST_MARKER"])


def test_spawned_output_goes_to_output_files():
    """--output-filename DIR: a spawned job's processes write DIR/G.N/rank.R/{stdout,stderr}, as
    their lines are tagged [G.N,R] (the ranks keep DIR/rank.R)."""
    env = marker_env()
    d = os.path.join(tmpdir(), "out")
    r = run(["-n", "2", "--output-filename", d, prog("spawn"), "2"], env=env, timeout=60)
    check_exchange(r, 2, 2)  # the terminal gets a copy
    for c in range(2):
        path = os.path.join(d, "1.1", f"rank.{c}", "stdout")
        check(os.path.isfile(path), f"no {path}: {os.listdir(d)}")
        with open(path) as f:
            text = f.read()
        check(text.startswith(f"child {c} of 2: got {100 + c}"), text)
        check(os.path.isfile(os.path.join(d, "1.1", f"rank.{c}", "stderr")), os.listdir(d))
    with open(os.path.join(d, "rank.1", "stdout")) as f:
        text = f.read()
    check(text == "parent 1 of 2: spawned 2, sum 2: ok\n", text)
    # Across nodes, files only: children on a host without ranks.
    env = tcp_env()
    d = os.path.join(tmpdir(), "out")
    r = run(["-H", "a:2,b:2", "--launch-agent", agent(env["PE_TEST_MARKER"]),
             "--output-filename", d + ":nocopy", "-x", "SPAWN_HOST_KEY=add-host", "-n", "2",
             prog("spawn"), "1", "b"], env=env, timeout=60)
    check(r.returncode == 0 and "child" not in r.stdout, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    path = os.path.join(d, "1.1", "rank.0", "stdout")
    check(os.path.isfile(path), f"no {path}: {os.listdir(d)}")
    with open(path) as f:
        text = f.read()
    check(text.startswith("child 0 of 1: got 100, token 42, parents 2"), text)
    assert_no_leftovers(env["PE_TEST_MARKER"])


def told(out, who, event, affected, exit_code):
    return f"{who} got {event} affected {affected} exit_code {exit_code}" in out


def event_case(args, env, fails, event="PROC TERMINATED"):
    """Runs pmix_spawn_events (2 parents, 2 children, `fails` exits 3, or aborts with 3 first)
    with a failure window: every other process is told `event`, with the failed process's own
    namespace."""
    r = run(args + ["--failure-window", "3", "-n", "2", prog("pmix_spawn_events"), "2", fails],
            env=env, timeout=60)
    check(r.returncode == 3, f"exit {r.returncode}: {r.stdout} {r.stderr[-1500:]}")
    m = re.search(r"^spawned (\S+)$", r.stdout, re.M)
    check(m, r.stdout)
    child, parent = m.group(1), m.group(1).rsplit(".spawn", 1)[0]
    everyone = [f"{parent}:0", f"{parent}:1", f"{child}:0", f"{child}:1"]
    failed = (child if fails.startswith("child") else parent) + ":1"
    for who in everyone:
        if who != failed:
            check(told(r.stdout, who, event, failed, 3), f"{who} not told: {r.stdout}")
    if fails.endswith("/abort"):
        check(re.search(r"\(pid \d+[^)]*\) called MPI_Abort/PMIx_Abort with status 3: it aborts",
                        r.stderr), r.stderr[-1500:])
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def test_failure_events_reach_spawned_namespaces():
    """PMIX_EVENT_PROC_TERMINATED of a failed child reaches the parents (and the other children),
    naming the child in its own namespace; a failed parent's reaches the children, on this node,
    on other nodes and on a host started for the children only."""
    event_case([], marker_env(), "child:1")
    event_case([], marker_env(), "parent:1")
    # A child's PMIx_Abort (MPI_Abort) is an abort, as a rank's is.
    event_case([], marker_env(), "child:1/abort", "PROC-ABORTED")
    event_case([], marker_env(), "parent:1/abort", "PROC-ABORTED")
    env = tcp_env()
    la = ["--launch-agent", agent(env["PE_TEST_MARKER"])]
    event_case(["-H", "a:2,b:2", "--map-by", "node"] + la, env, "child:1")
    on_b = ["-H", "a:2,b:2", "-x", "SPAWN_EVENTS_HOST=b"] + la
    event_case(on_b, env, "child:1")
    event_case(on_b, env, "child:1/abort", "PROC-ABORTED")  # from another node's daemon
    event_case(on_b, env, "parent:1")


def test_spawn_failing_on_one_node_stops_the_rest():
    """One node cannot start its part (the program is not there, or its daemon cannot be
    started): the parent's MPI_Comm_spawn fails at once with one line naming the node and the
    cause, and the children already started elsewhere are stopped then, not at the job's end."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("  (needs root and unshare: not run)")
        return
    env = tcp_env({"HIDE_ON": "b", "DEAD_ON": "c"})
    marker = env["PE_TEST_MARKER"]
    la = ["--launch-agent", odd_agent(marker)]
    hidden = os.path.join(HIDDEN, "spawn")
    out_path = os.path.join(tmpdir(), "stdout")
    with open(out_path, "w") as out:
        # One child on a, one on b (which does not see the program); the parent lingers 8 s.
        p = start(["-H", "a:2,b:2", "--map-by", "node", "-v"] + la +
                  ["-x", f"SPAWN_CHILD_PROGRAM={hidden}", "-x", "SPAWN_FAIL_LINGER=8", "-n", "2",
                   prog("spawn"), "2"], env=env, stdout=out, stderr=subprocess.PIPE, text=True)
        try:
            check(wait_until(lambda: "spawn failed" in open(out_path).read(), 30),
                  "the spawn did not fail")
            t0 = time.monotonic()

            def children():
                return [pid for pid in processes_with_marker(marker)
                        if open(f"/proc/{pid}/cmdline", "rb").read().startswith(hidden.encode())]
            check(wait_until(lambda: not children(), 2),
                  f"children still running {time.monotonic() - t0:.1f} s after the failed spawn")
            err = p.communicate(timeout=30)[1]
        finally:
            if p.poll() is None:
                p.kill()
    check(p.returncode == 4, f"exit {p.returncode}: {err}")
    lines = [l for l in err.splitlines() if "MPI_Comm_spawn from rank 0" in l]
    check(len(lines) == 1 and f"node b: cannot run {hidden}: not an executable file" in lines[0],
          err)
    check(re.search(r"@a agent info: spawned job 1 rank 0 \(pid \d+\): stopped", err), err)
    assert_no_leftovers(marker)
    # A host without ranks whose daemon cannot be started: the spawn fails, the job goes on.
    refused(["-H", "a:2,c:2"] + la + ["-x", "SPAWN_HOST_KEY=add-host", "-n", "2", prog("spawn"),
                                      "1", "c"], env, why="node c: ")


def test_spawn_across_netns_hosts():
    why = netns.available()
    if why:
        print(f"  ({why}: not run)")
        return
    with netns.NetnsBed(2) as bed:
        env = marker_env({"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "pe0"})
        h1, h2 = bed.nodes
        cmd = ["ip", "netns", "exec", bed.front, EXEC, "--launch-agent", "ip netns exec {host}",
               "-H", f"{h1}:1,{h2}:2", "-n", "2", prog("spawn"), "1", h2]
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
        except subprocess.TimeoutExpired as e:
            raise TestFailure("the spawn across hosts did not finish within 90 s") from e
        check_exchange(r, 2, 1)
        net = subprocess.run(["ip", "netns", "exec", h2, "readlink", "/proc/self/ns/net"],
                             capture_output=True, text=True).stdout.strip()
        check(f"answered 200 from" in r.stdout and net in r.stdout,
              f"the child is not on {h2} ({net}): {r.stdout}")
        # A host without ranks: its daemon is started for the child.
        cmd[cmd.index("-H") + 1] = f"{h1}:2,{h2}:1"
        cmd[cmd.index("-n"):cmd.index("-n")] = ["-x", "SPAWN_HOST_KEY=add-host"]
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
        except subprocess.TimeoutExpired as e:
            raise TestFailure("the spawn to a host without ranks did not finish within 90 s") from e
        check_exchange(r, 2, 1)
        check(net in r.stdout, f"the child is not on {h2} ({net}): {r.stdout}")
        assert_no_leftovers(env["PE_TEST_MARKER"])


if __name__ == "__main__":
    build()
    main([test_spawn_exchanges_messages_over_the_intercommunicator,
          test_spawn_multiple_gives_each_command_its_appnum,
          test_failing_child_is_reported_and_ends_the_job,
          test_spawn_beyond_the_slots_is_refused_at_once,
          test_killing_the_launcher_leaves_no_children,
          test_mpi4py_comm_spawn, test_mpi4py_futures_pool,
          test_spawn_across_nodes, test_spawn_on_hosts_without_ranks,
          test_a_job_on_this_machine_spawns_on_another_listed_host,
          test_spawned_output_goes_to_output_files, test_failure_events_reach_spawned_namespaces,
          test_spawn_failing_on_one_node_stops_the_rest, test_spawn_across_netns_hosts])
