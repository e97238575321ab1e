"""Multi-node jobs through pytorch_execd daemons, on this machine: the "nodes" are names given
with -H, and each daemon is started by a launch agent (`env -i ... PE_NODE={host}`), so the
daemons, the authenticated control plane, the PMIx traffic between nodes, stdio, signals,
restarts and failures are the real ones.  Separate network hosts are in test_netns.py, SLURM
in test_slurm.py."""
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import time

from harness import (SRCDIR, TORCH_PYTHON, assert_no_leftovers, check, control_port, control_protocol, cpu_list, main,
                     marker_env, processes_with_marker, run, script, start, tmpdir, torch_missing,
                     wait_until)

BIN = tmpdir()
MPI_SRC = os.path.join(SRCDIR, "tests", "mpi")


def agent(marker, extra=""):
    """A launch agent that starts the daemon with a clean environment, as ssh would."""
    return (f"env -i PATH=/usr/bin:/bin PE_TEST_MARKER={marker} PE_NODE={{host}} {extra}").strip()


def job_env(extra=None):
    env = marker_env(extra)
    env.update({"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo"})
    return env


def test_environment_on_unequal_nodes():
    env = job_env({"NOT_CARRIED": "1", "TORCH_CARRIED": "yes"})
    show = script("#!/bin/sh\necho \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK "
                  "$GROUP_WORLD_SIZE $PE_NODE $MASTER_ADDR:$MASTER_PORT ${NOT_CARRIED:-unset} "
                  "$TORCH_CARRIED $EXPORTED $OMPI_COMM_WORLD_RANK $PYTORCH_EXEC_NODE\"\n")
    r = run(["-H", "a:1,b:3", "--launch-agent", agent(env["PE_TEST_MARKER"]), "-x", "EXPORTED=x1",
             show], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    rows = sorted(line.split() for line in r.stdout.splitlines())
    check(len(rows) == 4, f"output: {r.stdout!r}")
    masters = {row[7] for row in rows}
    check(len(masters) == 1 and not masters.pop().endswith(":0"), f"MASTER_ADDR/PORT differ: {rows}")
    want = [["0", "4", "0", "1", "0", "2", "a"], ["1", "4", "0", "3", "1", "2", "b"],
            ["2", "4", "1", "3", "1", "2", "b"], ["3", "4", "2", "3", "1", "2", "b"]]
    check([row[:7] for row in rows] == want, f"rank table: {rows}")
    for row in rows:
        check(row[8:12] == ["unset", "yes", "x1", row[0]], f"carried environment: {row}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_mpiruns_nolocal_prefix_and_allocation():
    """mpirun's --nolocal: no rank on this machine, though -H lists it first; --prefix DIR: the
    program is found in DIR/bin only, and every rank on the other nodes has DIR/bin first in its
    PATH and DIR/lib first in LD_LIBRARY_PATH (the daemons start with a clean environment, as
    over ssh); --display-allocation prints the nodes left."""
    env = job_env()
    prefix = tmpdir()
    os.makedirs(os.path.join(prefix, "bin"))
    prog = os.path.join(prefix, "bin", "pe_prefixed_program")
    with open(prog, "w") as f:
        f.write("#!/bin/sh\necho \"rank $RANK node ${PE_NODE:-here} path $PATH lib $LD_LIBRARY_PATH\"\n")
    os.chmod(prog, 0o755)
    r = run(["-H", f"{socket.gethostname()}:4,a:1,b:2", "--nolocal", "--prefix", prefix + "/",
             "--display-allocation", "--launch-agent", agent(env["PE_TEST_MARKER"]),
             "pe_prefixed_program"], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    check(r.stdout.startswith(f"allocation (-H {socket.gethostname()}:4,a:1,b:2): 2 node(s)\n"
                              "  a slots=1\n  b slots=2\n"), r.stdout)
    rows = sorted(line for line in r.stdout.splitlines() if line.startswith("rank "))
    want = [f"rank {k} node {n} path {prefix}/bin:/usr/bin:/bin lib {prefix}/lib"
            for k, n in ((0, "a"), (1, "b"), (2, "b"))]
    check(rows == want, f"ranks: {rows}")
    # Without --prefix the program is not found; --nolocal with only this machine is refused.
    r = run(["-H", "a:1", "--launch-agent", agent(env["PE_TEST_MARKER"]), "pe_prefixed_program"],
            env=env, timeout=60)
    check(r.returncode == 127 and "not found" in r.stderr, f"exit {r.returncode}: {r.stderr}")
    r = run(["--nolocal", "-n", "2", "true"], env=env, timeout=60)
    check(r.returncode == 2 and r.stderr.count("\n") == 1 and "--nolocal" in r.stderr,
          f"exit {r.returncode}: {r.stderr}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def hwloc_calc(*args):
    """hwloc-calc's output (hwloc-nox, which the quick start installs)."""
    tool = shutil.which("hwloc-calc")
    check(tool, "hwloc-calc is not installed (hwloc-nox)")
    return subprocess.run([tool, *args], check=True, capture_output=True, text=True).stdout.strip()


def cores_here():
    return int(hwloc_calc("--number-of", "core", "machine:0"))


def pus(obj):
    """The OS numbers of the processors of an hwloc object (logical: core:1, socket:0.core:1)."""
    return {int(x) for x in hwloc_calc("-I", "pu", "--physical-output", obj).split(",")}


SHOW_CPUS = ("#!/bin/sh\necho \"rank $RANK local $LOCAL_RANK node $PE_NODE cpus "
             "$(grep Cpus_allowed_list /proc/self/status | cut -f2)\"\n")


def test_cpu_set_and_cpu_list_on_every_node():
    """mpirun's --cpu-set: the ranks of every node (the daemons get the list over the control
    plane) stay on those processors, bound to them where the mapping binds none; -n defaults to
    them on one machine.  --cpu-list with --bind-to cpu-list:ordered: local rank k on the kth."""
    if cores_here() < 2:
        print(f"skip test_cpu_set_and_cpu_list_on_every_node: this machine has {cores_here()} "
              "core(s)")
        return
    env = job_env()
    show = script(SHOW_CPUS)
    r = run(["-H", "a:2,b:1", "--cpu-set", "1", "--launch-agent", agent(env["PE_TEST_MARKER"]),
             show], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    rows = sorted(line.split() for line in r.stdout.splitlines() if line.startswith("rank "))
    check([(row[1], row[5], cpu_list(row[7])) for row in rows] ==
          [("0", "a", pus("core:1")), ("1", "a", pus("core:1")), ("2", "b", pus("core:1"))],
          f"ranks: {rows}")
    r = run(["-H", "a:2,b:2", "--cpu-list", "0-1", "--bind-to", "cpu-list:ordered",
             "--launch-agent", agent(env["PE_TEST_MARKER"]), show], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    rows = sorted(line.split() for line in r.stdout.splitlines() if line.startswith("rank "))
    check([(row[3], cpu_list(row[7])) for row in rows] ==
          [("0", pus("core:0")), ("1", pus("core:1"))] * 2, f"ranks: {rows}")
    # One machine: -n is the set's processors.
    r = run(["--cpu-set", "0", "sh", "-c", "echo $WORLD_SIZE"], env=env, timeout=60)
    check(r.returncode == 0 and r.stdout.split() == [str(len(pus("core:0")))] * len(pus("core:0")),
          f"exit {r.returncode}: {r.stdout!r} {r.stderr}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_rankfile_places_and_binds_every_rank():
    """mpirun's --rankfile on two nodes: each rank on the node its line names (by name or +nK,
    in any line order), bound to its slot list's cores there (the daemons on other nodes get
    them over the control plane), unbound without one; a slot list the node lacks is one line."""
    env = job_env()
    rf = os.path.join(tmpdir(), "rankfile")
    with open(rf, "w") as f:
        f.write("# rank 3 first\nrank 3=+n1 slot=0:1\nrank 0 = b slot = 0\n"
                "rank 1=a slot=1\nrank 2=a\n")
    show = script(SHOW_CPUS)
    if cores_here() < 2:
        print(f"skip test_rankfile_places_and_binds_every_rank: this machine has {cores_here()} "
              "core(s); the rankfile names cores 0 and 1")
        return
    allcpus = cpu_list(open("/proc/self/status").read().split("Cpus_allowed_list:")[1].split()[0])
    r = run(["-H", "a:2,b:2", "-rf", rf, "--launch-agent", agent(env["PE_TEST_MARKER"]), show],
            env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    rows = sorted(line.split() for line in r.stdout.splitlines() if line.startswith("rank "))
    got = [(row[1], row[3], row[5], cpu_list(row[7])) for row in rows]
    want = [("0", "0", "b", pus("core:0")), ("1", "0", "a", pus("core:1")),
            ("2", "1", "a", allcpus), ("3", "1", "b", pus("socket:0.core:1"))]
    check(got == want, f"ranks: {got}, want {want}")
    with open(rf, "w") as f:
        f.write("rank 0=a slot=0\nrank 1=b slot=7:0\n")
    r = run(["-H", "a,b", "--rankfile", rf, "--launch-agent", agent(env["PE_TEST_MARKER"]), show],
            env=env, timeout=60)
    check(r.returncode != 0 and "no socket 7" in r.stderr, f"exit {r.returncode}: {r.stderr}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_map_by_node_places_ranks_round_robin():
    """--map-by node on a:2,b:2: ranks 0 and 2 on a, 1 and 3 on b, as --display-map shows them,
    in generation 0 and in the generation a restart starts."""
    env = job_env()
    # Generation 0: every rank says where it is; rank 3 fails a second later (the others are
    # still there, their lines out), and the group restarts.
    show = script("#!/bin/sh\necho \"gen $PYTORCH_EXEC_GENERATION rank $RANK local $LOCAL_RANK "
                  "node $PE_NODE group $GROUP_RANK mpi $OMPI_COMM_WORLD_RANK\"\n"
                  "[ \"$PYTORCH_EXEC_GENERATION\" = 0 ] || exit 0\n"
                  "if [ \"$RANK\" = 3 ]; then sleep 1; exit 1; fi\nexec sleep 30\n")
    r = run(["-H", "a:2,b:2", "--map-by", "node", "--display-map", "--max-restarts", "1",
             "--launch-agent", agent(env["PE_TEST_MARKER"]), show], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    check("node 0 (a): 2 ranks\n  rank 0 (local 0)\n  rank 2 (local 1)\nnode 1 (b): 2 ranks\n"
          "  rank 1 (local 0)\n  rank 3 (local 1)" in r.stdout, r.stdout)
    rows = sorted(line for line in r.stdout.splitlines() if line.startswith("gen "))
    want = sorted(f"gen {g} rank {rank} local {local} node {node} group {group} mpi {rank}"
                  for g in (0, 1)
                  for rank, local, node, group in ((0, 0, "a", 0), (2, 1, "a", 0),
                                                   (1, 0, "b", 1), (3, 1, "b", 1)))
    check(rows == want, f"ranks: {rows}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_torch_gloo_allreduce_across_nodes():
    reason = torch_missing()
    if reason:
        print(f"skip test_torch_gloo_allreduce_across_nodes: {reason}")
        return
    env = job_env()
    r = run(["-H", "a:1,b:3", "--launch-agent", agent(env["PE_TEST_MARKER"]), TORCH_PYTHON,
             os.path.join(SRCDIR, "examples", "hello_allreduce.py")], env=env, timeout=120)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
    check("allreduce over 4 ranks: [6.0, 10.0, 14.0, 18.0] (correct)" in r.stdout, r.stdout)


def build_mpi():
    if not shutil.which("mpicc"):
        return False
    for p in ("collectives", "abort", "ring"):
        r = subprocess.run(["mpicc", "-O1", "-o", os.path.join(BIN, p), os.path.join(MPI_SRC, p + ".c")],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"mpicc {p}.c: {r.stderr}")
    return True


def test_mpi_programs_wire_up_across_nodes():
    if not build_mpi():
        print("  (mpicc not found: MPI part not run)")
        return
    env = job_env()
    ag = agent(env["PE_TEST_MARKER"], "OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo")
    r = run(["-H", "a:2,b:1,c:3", "--launch-agent", ag, "-vv", os.path.join(BIN, "collectives")],
            env=env, timeout=120)
    check(r.returncode == 0 and "collectives over 6 ranks: ok" in r.stdout, f"exit {r.returncode}: {r.stdout} {r.stderr[-3000:]}")
    check(re.search(r"fence \S+ #0 complete: \d+ bytes from 3 nodes", r.stderr),
          "the PMIx fence did not go through the control plane")
    r = run(["-H", "a:2,b:2", "--launch-agent", ag, os.path.join(BIN, "ring")], env=env, timeout=120)
    check(r.returncode == 0 and "token 20 (ok)" in r.stdout, f"ring: {r.stdout} {r.stderr}")
    # Values of ranks on another node without a collecting fence: direct modex between nodes.
    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], capture_output=True, text=True)
    dm = os.path.join(BIN, "pmix_client")
    r = subprocess.run(["cc", "-o", dm, os.path.join(MPI_SRC, "pmix_client.c")] + pc.stdout.split(),
                       capture_output=True, text=True)
    check(pc.returncode == 0 and r.returncode == 0, f"cc pmix_client.c: {pc.stderr} {r.stderr}")
    r = run(["-H", "a:2,b:2", "--launch-agent", ag, "-v", dm, "dmodex"], env=env, timeout=60)
    check(r.returncode == 0 and r.stdout.count("ok") == 4, f"exit {r.returncode}: {r.stdout} {r.stderr[-3000:]}")
    check(re.search(r"@a pmix info: upcall direct_modex \S+:[23]", r.stderr), "no direct modex from node a")
    # A node with more ranks than processors says so as mpirun does; the other node does not.
    over = (os.cpu_count() or 1) + 1
    r = run(["-H", f"a:1,b:{over}", "--launch-agent", ag, dm, "dmodex", "node-info"], env=env,
            timeout=60)
    check(r.returncode == 0, f"oversubscribed node: exit {r.returncode}: {r.stderr[-2000:]}")
    for i in range(over + 1):
        v = "1" if i else "unset"
        line = (f"pmix_client rank {i} oversubscribed={'yes' if i else 'no'} yield_when_idle={v} "
                f"mpi_oversubscribe={v} rmaps_base_oversubscribe={v}")
        check(line in r.stdout, f"no '{line}' in {r.stdout}")
    # Issue 13, item 10: each node contributes 18 MB to a fence (above one frame's 16 MiB); the
    # node's daemon failed ("a field of 18000222 bytes") and the node was reported lost.
    r = run(["-H", "a:6,b:6", "--launch-agent", ag, dm, "big", "3000000"], env=env, timeout=120)
    check(r.returncode == 0 and r.stdout.count("ok") == 12, f"big fence: exit {r.returncode}: {r.stdout} {r.stderr[-3000:]}")
    env2 = job_env({"ABORT_RANK": "3", "ABORT_CODE": "7"})
    ag2 = agent(env2["PE_TEST_MARKER"], "OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo ABORT_RANK=3 ABORT_CODE=7")
    r = run(["-H", "a:2,b:2", "--launch-agent", ag2, os.path.join(BIN, "abort")], env=env2, timeout=60)
    check(r.returncode == 7, f"MPI_Abort: exit {r.returncode}: {r.stderr}")
    check(re.search(r"rank 3 \(pid \d+ on b\)", r.stderr), f"abort message: {r.stderr}")
    assert_no_leftovers(env2["PE_TEST_MARKER"])


TREE_HOSTS = "a:1,b:1,c:2,d:1,e:1,f:1,g:1"  # with --tree-radix 2: a, b talk to us; c, d via a; e, f via b; g via c


def test_control_plane_tree():
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    r = run(["-v", "--tree-radix", "2", "-H", TREE_HOSTS, "--launch-agent", agent(marker), "--tag-output",
             "sh", "-c", "echo $RANK $PE_NODE $GROUP_RANK"], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}")
    rows = sorted(l.split(":", 1)[1] for l in r.stdout.splitlines())
    check(rows == ["0 a 0", "1 b 1", "2 c 2", "3 c 2", "4 d 3", "5 e 4", "6 f 5", "7 g 6"], f"{rows}")
    for child, parent in (("c", "a"), ("d", "a"), ("e", "b"), ("f", "b"), ("g", "c")):
        check(re.search(rf"@{parent} ctrl info: child node \d \({child}\) connected", r.stderr),
              f"{child} did not connect through {parent}: {r.stderr[-3000:]}")
    check(len(re.findall(r"@vm ctrl info: node \d \(\w\) connected from", r.stderr.replace(socket.gethostname(), "vm"))) == 2,
          "more than 2 daemons talk to the front end")
    if build_mpi():
        r = run(["--tree-radix", "2", "-H", TREE_HOSTS, "--launch-agent",
                 agent(marker, "OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo"), os.path.join(BIN, "collectives")],
                env=env, timeout=120)
        check(r.returncode == 0 and "collectives over 8 ranks: ok" in r.stdout, f"{r.stdout} {r.stderr[-3000:]}")
    # Losing a relay loses the nodes below it; the job ends naming it, nothing is left anywhere.
    p = start(["--tree-radix", "2", "-H", TREE_HOSTS, "--launch-agent", agent(marker), "sh", "-c",
               "echo up; exec sleep 60"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(8):
        p.stdout.readline()
    os.kill(daemon_of(marker, "a"), signal.SIGKILL)
    out, err = p.communicate(timeout=30)
    check(p.returncode == 1 and "node a: lost contact with its daemon" in err, f"exit {p.returncode}: {err}")
    assert_no_leftovers(marker, timeout=5)


def test_failure_names_rank_and_node():
    env = job_env()
    fail = script("#!/bin/sh\nif [ \"$RANK\" = 2 ]; then echo boom-on-$PE_NODE >&2; exit 3; fi\nsleep 30\n")
    t0 = time.monotonic()
    r = run(["-H", "a:2,b:2", "--launch-agent", agent(env["PE_TEST_MARKER"]), "--kill-grace", "1", fail],
            env=env, timeout=60)
    check(r.returncode == 3, f"exit {r.returncode}: {r.stderr}")
    check(re.search(r"rank 2 \(pid \d+ on b\) exited with status 3", r.stderr), r.stderr)
    check("boom-on-b" in r.stderr, f"stderr tail missing: {r.stderr}")
    check(time.monotonic() - t0 < 20, "the other ranks were not stopped")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_group_restart_across_nodes():
    env = job_env()
    d = tmpdir()
    body = (f"#!/bin/sh\nif [ \"$RANK\" = 3 ] && [ ! -e {d}/failed ]; then touch {d}/failed; exit 1; fi\n"
            "echo \"rank $RANK restart $TORCHELASTIC_RESTART_COUNT gen $PYTORCH_EXEC_GENERATION\"\n")
    r = run(["-H", "a:2,b:2", "--launch-agent", agent(env["PE_TEST_MARKER"]), "--max-restarts", "2",
             "--kill-grace", "1", script(body)], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    lines = sorted(l for l in r.stdout.splitlines() if l.endswith("gen 1"))
    check(lines == [f"rank {i} restart 1 gen 1" for i in range(4)], f"output: {r.stdout}")
    check("restarting all 4 ranks (restart 1 of 2)" in r.stderr, r.stderr)


def test_output_volume_and_line_integrity_across_nodes():
    env = job_env()
    writer = script(
        "#!/usr/bin/python3\nimport os, sys\nr = os.environ['RANK']\n"
        "line = (r + ':' + 'x' * 97 + '\\n')\n"
        "for i in range(50000):\n    sys.stdout.write(line)\n"
        "sys.stderr.write('err-' + r)\n", suffix=".py")
    r = run(["-H", "a:2,b:2", "--launch-agent", agent(env["PE_TEST_MARKER"]), writer], env=env, timeout=120)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}")
    lines = r.stdout.split("\n")
    check(lines[-1] == "", "output does not end with a newline")
    counts = {}
    for line in lines[:-1]:
        rank, _, body = line.partition(":")
        check(body == "x" * 97, f"a mixed or cut line: {line[:120]!r}")
        counts[rank] = counts.get(rank, 0) + 1
    check(counts == {str(i): 50000 for i in range(4)}, f"line counts {counts}")
    check(sorted(r.stderr.split()) == ["err-0", "err-1", "err-2", "err-3"], f"partial last lines: {r.stderr!r}")


def test_stdin_reaches_a_rank_on_another_node():
    env = job_env()
    data = "".join(f"line {i}\n" for i in range(20000))
    r = run(["-H", "a:1,b:2", "--launch-agent", agent(env["PE_TEST_MARKER"]), "--stdin", "2",
             "sh", "-c", "if [ $RANK = 2 ]; then wc -l; fi"], env=env, input=data, timeout=60)
    check(r.returncode == 0 and r.stdout.strip() == "20000", f"exit {r.returncode}: {r.stdout!r} {r.stderr}")


def test_signal_reaches_every_node():
    env = job_env()
    body = "#!/bin/sh\ntrap 'echo term-$RANK-$PE_NODE; exit 0' TERM\necho up\nwhile :; do sleep 0.1; done\n"
    p = start(["-H", "a:1,b:2", "--launch-agent", agent(env["PE_TEST_MARKER"]), script(body)], env=env,
              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    for _ in range(3):
        out.append(p.stdout.readline())
    p.send_signal(signal.SIGTERM)
    rest, err = p.communicate(timeout=30)
    got = sorted(l for l in (rest.splitlines()) if l.startswith("term"))
    check(got == ["term-0-a", "term-1-b", "term-2-b"], f"{out} {rest!r} {err}")
    check(p.returncode == 143, f"exit {p.returncode}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def frame(ftype, payload):
    return b"PEX1" + struct.pack("<HHI", ftype, 0, len(payload)) + payload


def test_strangers_are_dropped_and_the_job_goes_on():
    env = job_env()
    d = tmpdir()
    body = f"#!/bin/sh\nwhile [ ! -e {d}/go ]; do sleep 0.05; done\necho done-$RANK\n"
    p = start(["-v", "-H", "a:1,b:1", "--launch-agent", agent(env["PE_TEST_MARKER"]), script(body)],
              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port, _ = control_port(p)
        # Garbage bytes.
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(os.urandom(64))
        s.settimeout(5)
        try:
            while s.recv(4096):
                pass
        except (ConnectionResetError, socket.timeout):
            pass
        s.close()
        # A well-formed hello with a wrong proof, claiming to be node a.
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.settimeout(5)
        challenge = s.recv(4096)
        check(challenge[:4] == b"PEX1", f"no challenge: {challenge!r}")
        name = b"a"
        payload = struct.pack("<II", control_protocol(), len(name)) + name + struct.pack("<I", 32) + os.urandom(32) \
            + struct.pack("<I", 32) + os.urandom(32) + struct.pack("<ii", -1, -1)
        s.sendall(frame(2, payload))
        # The only answer is a refused frame (type 70, saying why), then the connection closes.
        answer = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except ConnectionResetError:
            pass
        check(answer == b"" or (answer[:4] == b"PEX1" and struct.unpack("<H", answer[4:6])[0] == 70
                                 and b"authentication failed" in answer),
              f"a wrong proof got an answer: {answer!r}")
        s.close()
        # Frames that only an authenticated peer may send, before authenticating: output for a
        # rank, and a signal routed to every node.  Dropped unread; no worker sees a signal.
        for ftype, payload in ((31, struct.pack("<iiB", 0, 0, 1) + struct.pack("<I", 4) + b"fake"),
                               (40, struct.pack("<IH", 0xFFFFFFFF, 12) + struct.pack("<I", 4) + struct.pack("<i", 9))):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.settimeout(5)
            check(s.recv(4096)[:4] == b"PEX1", "no challenge")
            s.sendall(frame(ftype, payload))
            try:
                check(s.recv(4096) == b"", f"an out-of-order frame of type {ftype} got an answer")
            except ConnectionResetError:
                pass
            except socket.timeout:
                check(False, f"an out-of-order frame of type {ftype} left the connection open")
            s.close()
        # An oversized frame header.
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.recv(4096)
        s.sendall(b"PEX1" + struct.pack("<HHI", 2, 0, 1 << 30))
        s.settimeout(5)
        try:
            check(s.recv(4096) == b"", "an oversized frame was not dropped")
        except ConnectionResetError:
            pass
        s.close()
        open(os.path.join(d, "go"), "w").close()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    check(p.returncode == 0, f"exit {p.returncode}: {err[-2000:]}")
    check(sorted(out.split()) == ["done-0", "done-1"], f"output: {out!r}")
    check(err.count("dropped connection") >= 5, f"drops not logged: {err[-3000:]}")
    check("authentication failed" in err, err[-3000:])
    for name in ("output", "routed"):
        check(f"out-of-order {name} frame before authentication" in err, f"{name}: {err[-3000:]}")


def proc_file(pid, name):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def test_the_secret_is_in_no_command_line_environment_or_log():
    """The job's secret reaches each daemon on its standard input.  A launch agent that keeps a copy
    learns it; then no daemon's or worker's command line or environment, and no log line, holds it."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    d = tmpdir()
    keep = script(f"#!/bin/sh\nIFS= read -r secret\nprintf '%s\\n' \"$secret\" > {d}/secret.$1\nshift\n"
                  "printf '%s\\n' \"$secret\" | \"$@\"\n")
    p = start(["-vvv", "-H", "a:2,b:2", "--launch-agent", f"{keep} {{host}} {agent(marker)}", "sh", "-c",
               "echo up; exec sleep 60"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(4):
            check(p.stdout.readline() == "up\n", "the ranks did not start")
        secrets = {open(os.path.join(d, f"secret.{n}")).read().strip() for n in ("a", "b")}
        check(len(secrets) == 1 and re.fullmatch(r"[0-9a-f]{64}", next(iter(secrets))), f"secrets: {secrets}")
        secret = next(iter(secrets)).encode()
        seen = {}

        def look():  # a rank between its echo and its exec may show no environment for a moment
            seen["procs"] = procs = processes_with_marker(marker)
            seen["daemons"] = [pid for pid in procs if proc_file(pid, "cmdline").split(b"\0")[0].endswith(b"pytorch_execd")]
            seen["workers"] = [pid for pid in procs if re.search(rb"(^|\0)RANK=\d", proc_file(pid, "environ"))]
            return len(seen["daemons"]) >= 2 and len(seen["workers"]) >= 4  # daemons fork helpers
        check(wait_until(look, 10), f"daemons {seen['daemons']}, workers {seen['workers']}")
        procs = seen["procs"]
        for pid in procs:
            argv, environ = proc_file(pid, "cmdline"), proc_file(pid, "environ")
            check(secret not in argv and secret not in environ, f"pid {pid} holds the secret: {argv!r}")
            check(b"PYTORCH_EXEC_SECRET" not in environ, f"pid {pid} has PYTORCH_EXEC_SECRET: {argv!r}")
            check(not re.search(rb"(^|\0)[0-9a-fA-F]{64}(\0|$)", argv), f"pid {pid}: a secret-like argument: {argv!r}")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    check("control plane on port" in err and "@a agent debug" in err, f"no logs to look at: {err[-2000:]}")
    check(secret.decode() not in out + err, "the secret is in the output or the log")
    assert_no_leftovers(marker)


def daemon_of(marker, node):
    """The pid of the pytorch_execd of `node`."""
    for pid in processes_with_marker(marker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except FileNotFoundError:
            continue
        if argv and argv[0].endswith(b"pytorch_execd") and node.encode() in argv:
            return pid
    raise AssertionError(f"daemon of node {node} not found")


def start_running_job(command, stderr=subprocess.PIPE):
    """A 2 x 2 job whose ranks each print one line and then keep running; returns (Popen, marker)."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    p = start(["-H", "a:2,b:2", "--launch-agent", agent(marker), "sh", "-c", command],
              env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    for _ in range(4):
        p.stdout.readline()
    return p, marker


def test_losing_a_daemon_ends_the_job_naming_the_node():
    """Nothing is left of it either: not the ranks' processes in sessions of their own, whose
    subreaper the daemon was (its orphan guard finds them by the job's id)."""
    p, marker = start_running_job("setsid sleep 60 </dev/null >/dev/null 2>&1 & echo up; exec sleep 60")

    pid = daemon_of(marker, "b")
    os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=30)
    check(p.returncode != 0, f"exit {p.returncode}")
    check("node b: lost contact with its daemon" in err, f"stderr: {err}")
    assert_no_leftovers(marker, timeout=5)


def test_killing_the_front_end_leaves_nothing_on_any_node():
    p, marker = start_running_job("setsid sleep 60 </dev/null >/dev/null 2>&1 & echo up; sleep 60 & wait",
                                  stderr=subprocess.DEVNULL)
    check(len(processes_with_marker(marker)) >= 10, "expected daemons, workers and their children")
    p.kill()
    p.wait()
    assert_no_leftovers(marker, timeout=5)


def test_a_daemon_that_cannot_start_is_named():
    env = job_env()
    t0 = time.monotonic()
    r = run(["-H", "a:1,b:1", "--launch-agent", "false", "true"], env=env, timeout=30)
    check(r.returncode != 0, "exit 0")
    check(re.search(r"node (a|b): its daemon could not be started \(false exited with status 1\)", r.stderr),
          r.stderr)
    check(time.monotonic() - t0 < 10, "slow to notice")
    r = run(["-H", "a:1,b:1", "--launch-agent", "no-such-agent-xyz {host}", "true"], env=env, timeout=30)
    check(r.returncode != 0 and "no-such-agent-xyz" in r.stderr and r.stderr.count("\n") <= 3, r.stderr)
    r = run(["-H", "a:1", "--launch-agent", "  ", "true"], env=env, timeout=30)
    check(r.returncode == 2 and "--launch-agent" in r.stderr, r.stderr)
    r = run(["-H", "a:1", "--launch-agent", "env 'x", "true"], env=env, timeout=30)
    check(r.returncode == 2 and "unterminated quote" in r.stderr, r.stderr)
    assert_no_leftovers(env["PE_TEST_MARKER"])


if __name__ == "__main__":
    main([test_environment_on_unequal_nodes, test_mpiruns_nolocal_prefix_and_allocation,
          test_rankfile_places_and_binds_every_rank, test_cpu_set_and_cpu_list_on_every_node, test_map_by_node_places_ranks_round_robin,
          test_torch_gloo_allreduce_across_nodes,
          test_mpi_programs_wire_up_across_nodes, test_control_plane_tree, test_failure_names_rank_and_node,
          test_group_restart_across_nodes, test_output_volume_and_line_integrity_across_nodes, test_stdin_reaches_a_rank_on_another_node,
          test_signal_reaches_every_node, test_strangers_are_dropped_and_the_job_goes_on,
          test_the_secret_is_in_no_command_line_environment_or_log,
          test_losing_a_daemon_ends_the_job_naming_the_node,
          test_killing_the_front_end_leaves_nothing_on_any_node, test_a_daemon_that_cannot_start_is_named])
