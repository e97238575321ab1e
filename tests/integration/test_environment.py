"""Every rank sees the torchrun, Open MPI and PYTORCH_EXEC_* environment; -x and --wdir work."""
import json
import os
import re
import shutil
import socket
import subprocess

from harness import EXEC, SYSTEM_PYTHON, check, main, run, script, tmpdir

DUMP = script("""#!/usr/bin/python3
import json, os, sys
out = sys.argv[1]
with open(os.path.join(out, "env." + os.environ["RANK"]), "w") as f:
    json.dump({"env": dict(os.environ), "cwd": os.getcwd()}, f)
""", ".py")


def load(out, n):
    ranks = {}
    for r in range(n):
        with open(os.path.join(out, f"env.{r}")) as f:
            ranks[r] = json.load(f)
    return ranks


def test_every_rank_gets_its_identity():
    out = tmpdir()
    n = 5
    r = run(["-n", str(n), SYSTEM_PYTHON, DUMP, out])
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    ranks = load(out, n)
    ports = {ranks[i]["env"]["MASTER_PORT"] for i in ranks}
    ids = {ranks[i]["env"]["PYTORCH_EXEC_JOBID"] for i in ranks}
    check(len(ports) == 1, f"ranks disagree on MASTER_PORT: {ports}")
    check(len(ids) == 1 and len(ids.pop()) >= 8, "ranks disagree on the job id")
    for i, d in ranks.items():
        e = d["env"]
        want = {"RANK": i, "WORLD_SIZE": n, "LOCAL_RANK": i, "LOCAL_WORLD_SIZE": n, "GROUP_RANK": 0,
                "GROUP_WORLD_SIZE": 1, "ROLE_RANK": i, "ROLE_WORLD_SIZE": n,
                "TORCHELASTIC_RESTART_COUNT": 0, "TORCHELASTIC_MAX_RESTARTS": 0,
                "OMPI_COMM_WORLD_RANK": i, "OMPI_COMM_WORLD_SIZE": n, "OMPI_COMM_WORLD_LOCAL_RANK": i,
                "OMPI_COMM_WORLD_LOCAL_SIZE": n, "OMPI_COMM_WORLD_NODE_RANK": i,
                "PYTORCH_EXEC_GENERATION": 0, "PYTORCH_EXEC_NODEID": 0, "OMP_NUM_THREADS": 1}
        for k, v in want.items():
            check(e.get(k) == str(v), f"rank {i}: {k}={e.get(k)!r}, expected {v}")
        check(e["ROLE_NAME"] == "default", f"ROLE_NAME={e['ROLE_NAME']}")
        check(e["TORCHELASTIC_RUN_ID"] == e["PYTORCH_EXEC_JOBID"], "run id is not the job id")
        check(e["MASTER_ADDR"] == "127.0.0.1", f"MASTER_ADDR={e['MASTER_ADDR']}")
        check("PYTORCH_EXEC_DOMAIN" in e, "no PYTORCH_EXEC_DOMAIN")
        check(e.get("PATH") == os.environ.get("PATH"), "the launching environment was not passed on")
    # The port was free: it can be bound now that the job is over.
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(ports.pop())))
    s.close()


def test_exports_wdir_and_run_id():
    out, wd = tmpdir(), tmpdir()
    env = dict(os.environ, FROM_HERE="here-value", OMP_NUM_THREADS="3")
    r = run(["-n", "2", "-x", "A=1", "-x", "FROM_HERE", "-xB=x=y", "--wdir", wd, "--run-id", "myrun",
             SYSTEM_PYTHON, DUMP, out], env=env)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    for i, d in load(out, 2).items():
        e = d["env"]
        check(e["A"] == "1" and e["B"] == "x=y" and e["FROM_HERE"] == "here-value", f"rank {i}: -x lost")
        check(e["OMP_NUM_THREADS"] == "3", "the user's OMP_NUM_THREADS was overridden")
        check(e["TORCHELASTIC_RUN_ID"] == "myrun", "--run-id ignored")
        check(os.path.realpath(d["cwd"]) == os.path.realpath(wd), f"rank {i} cwd {d['cwd']}")


def test_relative_wdir_and_program():
    """--wdir sub ./prog runs sub/prog in sub (not sub/sub/prog, which is there too), as does a
    PATH of relative directories."""
    top = tmpdir()
    os.makedirs(os.path.join(top, "sub", "sub"))
    for where, says in (("sub", "right"), ("sub/sub", "wrong")):
        with open(os.path.join(top, where, "prog"), "w") as f:
            f.write(f"#!/bin/sh\necho {says} $(pwd)\n")
        os.chmod(os.path.join(top, where, "prog"), 0o755)
    sub = os.path.realpath(os.path.join(top, "sub"))
    r = run(["-n", "2", "--wdir", "sub", "./prog"], cwd=top)
    check(r.returncode == 0 and r.stdout.split() == ["right", sub] * 2,
          f"exit {r.returncode}: {r.stdout} {r.stderr}")
    r = run(["-n", "1", "--wdir", "sub", "prog"], cwd=top,
            env=dict(os.environ, PATH="sub:/usr/bin:/bin"))
    check(r.returncode == 0 and r.stdout.split() == ["right", sub],
          f"exit {r.returncode}: {r.stdout} {r.stderr}")


def test_torchrun_single_node_command_lines():
    """torchrun's one-node lines run as they do under torchrun: --master-port is the workers'
    MASTER_PORT (the store listens there), --node-rank 0 of --nnodes 1 and --master-addr are its
    defaults, as is a c10d endpoint here; --node-rank 1 alone is refused."""
    with socket.socket() as s:  # a port free now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = ("import os, socket; e = os.environ; "
             "socket.create_connection(('127.0.0.1', int(e['MASTER_PORT'])), 5); "
             "print(e['RANK'], e['MASTER_PORT'])")
    for extra in ([], ["--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1"]):
        r = run([f"--master_port={port}", "--nproc_per_node=2"] + extra +
                [SYSTEM_PYTHON, "-c", probe])
        check(r.returncode == 0 and sorted(r.stdout.split("\n")) == ["", f"0 {port}", f"1 {port}"],
              f"{extra}: exit {r.returncode}: {r.stdout} {r.stderr}")
    r = run(["--node_rank=1", "-n", "1", "true"])
    check(r.returncode == 2 and "--node-rank 1 needs --rdzv-endpoint" in r.stderr, r.stderr)
    # A rendezvous endpoint on this machine with --nnodes 1 (its default): nobody can join, so
    # it runs here without a secret (it asked for one), port 0 too, as torchrun runs it.
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_EXEC_RDZV_SECRET"}
    for extra in (["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"],
                  ["--rdzv_backend=c10d"]):
        r = run(extra + ["--nproc-per-node", "2", SYSTEM_PYTHON, "-c", probe], env=env)
        check(r.returncode == 0 and len(r.stdout.split("\n")) == 3,
              f"{extra}: exit {r.returncode}: {r.stdout} {r.stderr}")


# Run by test_pmix_server_does_not_ask_munge in a private mount namespace: a listening socket
# where munged's would be, and a count of the connections that came to it during the job.
MUNGE_WATCH = script("""#!/usr/bin/python3
import os, socket, subprocess, sys, threading
subprocess.run(["mount", "-t", "tmpfs", "none", "/run/munge"], check=True)
s = socket.socket(socket.AF_UNIX)
s.bind("/run/munge/munge.socket.2")
s.listen(64)
n = 0
def serve():  # a munged that reads the request and hangs up: its clients give up soon
    global n
    while True:
        c = s.accept()[0]
        n += 1
        c.settimeout(2)
        try:
            c.recv(65536)
        except OSError:
            pass
        c.close()
threading.Thread(target=serve, daemon=True).start()
r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=60)
print(f"exit {r.returncode} munge connections {n}")
sys.stderr.write(r.stderr)
""", ".py")


def test_pmix_server_does_not_ask_munge():
    """The PMIx server and its clients use psec "native" (socket credentials), not munge: where
    munge is installed but munged does not answer, munge's module took 2.3 s of retries to start
    every daemon and every MPI rank.  Checked by who connects to munged's socket; a user who
    asks for munge (PMIX_MCA_psec) gets it, which shows the check would see it."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not os.path.isdir("/run/munge"):
        print("  (needs root, unshare and munge's /run/munge: not run)")
        return
    env = dict(os.environ)
    env.pop("PMIX_MCA_psec", None)
    for psec, want in ((None, "munge connections 0"), ("munge,native", "munge connections [1-9]")):
        e = dict(env, PMIX_MCA_psec=psec) if psec else env
        r = subprocess.run(["unshare", "-m", "--propagation", "private", SYSTEM_PYTHON, MUNGE_WATCH,
                            EXEC, "-n", "2", "true"], env=e, capture_output=True, text=True,
                           timeout=90)
        check(re.search("exit 0 " + want, r.stdout), f"PMIX_MCA_psec={psec}: {r.stdout} {r.stderr}")


def test_many_ranks_without_slot_limit():
    n = 3 * (os.cpu_count() or 2) + 1
    r = run(["-n", str(n), "sh", "-c", 'echo "$RANK/$WORLD_SIZE"'])
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    got = sorted(r.stdout.split())
    check(got == sorted(f"{i}/{n}" for i in range(n)), f"output {got}")


def test_only_the_standard_descriptors_reach_the_ranks():
    """A descriptor the launching shell left open (exec 7>file) does not reach the ranks, as
    with mpirun and torchrun; on one node and on a daemon's."""
    with open(os.path.join(tmpdir(), "open"), "w") as f:
        for extra in ([], ["-H", "a:1", "--launch-agent", script('#!/bin/sh\nshift\nexec "$@"\n')]):
            r = subprocess.run([EXEC] + extra + ["-n", "1", "sh", "-c", "ls /proc/$$/fd"],
                               pass_fds=(f.fileno(),), capture_output=True, text=True, timeout=60)
            check(r.returncode == 0 and r.stdout.split() == ["0", "1", "2"],
                  f"{extra}: exit {r.returncode}: {r.stdout} {r.stderr}")


def test_omp_num_threads_as_torchrun():
    """OMP_NUM_THREADS=1 with more than one rank on the node, as torchrun: one rank keeps
    OpenMP's own choice."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    for n, want in ((1, "[unset]"), (2, "[1]")):
        r = run(["-n", str(n), "sh", "-c", "echo [${OMP_NUM_THREADS-unset}]"], env=env)
        check(r.returncode == 0 and set(r.stdout.split()) == {want}, f"-n {n}: {r.stdout} {r.stderr}")


def test_python_prints_show_at_once_on_a_terminal():
    """The ranks' output is a pipe to pytorch_exec: with a terminal as pytorch_exec's output,
    they get PYTHONUNBUFFERED=1 (Python held a rank's prints until it exited), unless set."""
    if not shutil.which("script"):
        print("  (script not found: not run)")
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    cmd = f"{EXEC} -n 1 sh -c 'echo [$PYTHONUNBUFFERED]'"
    r = subprocess.run(["script", "-qec", cmd, "/dev/null"], env=env, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    check(r.returncode == 0 and "[1]" in r.stdout, f"on a terminal: {r.stdout!r} {r.stderr}")
    r = run(["-n", "1", "sh", "-c", "echo [$PYTHONUNBUFFERED]"], env=env)
    check(r.stdout == "[]\n", f"on a pipe: {r.stdout!r}")
    r = subprocess.run(["script", "-qec", cmd, "/dev/null"], env=dict(env, PYTHONUNBUFFERED="0"),
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    check("[0]" in r.stdout, f"the user's value: {r.stdout!r}")


if __name__ == "__main__":
    main([test_every_rank_gets_its_identity, test_exports_wdir_and_run_id,
          test_relative_wdir_and_program, test_torchrun_single_node_command_lines,
          test_pmix_server_does_not_ask_munge, test_many_ranks_without_slot_limit,
          test_only_the_standard_descriptors_reach_the_ranks, test_omp_num_threads_as_torchrun,
          test_python_prints_show_at_once_on_a_terminal])
