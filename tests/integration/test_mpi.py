"""Unmodified Open MPI programs (built here with mpicc), a plain PMIx client and mpi4py run under
pytorch_exec as they do under mpirun."""
import os
import re
import shutil
import signal
import socket
import subprocess
import time

from harness import (SRCDIR, SYSTEM_PYTHON, assert_no_leftovers, check, main, marker_env, run, skip,
                     start, tmpdir, wait_until)

MPI_SRC = os.path.join(SRCDIR, "tests", "mpi")
BIN = tmpdir()
# Several "nodes" are not involved here; keep Open MPI on its TCP/shared-memory paths.
ENV = dict(os.environ)


def build():
    if not shutil.which("mpicc"):
        skip("mpicc not found (libopenmpi-dev)")
    for prog in ("hello", "ring", "collectives", "abort", "no_finalize", "restart", "locality",
                 "port"):
        r = subprocess.run(["mpicc", "-O1", "-o", os.path.join(BIN, prog),
                            os.path.join(MPI_SRC, prog + ".c")], capture_output=True, text=True)
        check(r.returncode == 0, f"mpicc {prog}.c: {r.stderr}")
    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], capture_output=True, text=True)
    check(pc.returncode == 0, "pkg-config pmix failed")
    r = subprocess.run(["cc", "-o", os.path.join(BIN, "pmix_client"), os.path.join(MPI_SRC, "pmix_client.c")]
                       + pc.stdout.split(), capture_output=True, text=True)
    check(r.returncode == 0, f"cc pmix_client.c: {r.stderr}")


def prog(name):
    return os.path.join(BIN, name)


def test_hello_one_to_eight_ranks():
    host = socket.gethostname()
    for n in (1, 2, 3, 8):
        r = run(["-n", str(n), prog("hello")], env=ENV, timeout=120)
        check(r.returncode == 0, f"-n {n}: exit {r.returncode}: {r.stderr}")
        got = sorted(r.stdout.splitlines())
        want = sorted(f"hello rank {i} of {n} on {host}" for i in range(n))
        check(got == want, f"-n {n}: {got}")


def test_ring():
    r = run(["-n", "4", prog("ring")], env=ENV, timeout=120)
    check(r.returncode == 0 and "ring 5 laps over 4 ranks: token 20 (ok)" in r.stdout,
          f"exit {r.returncode}: {r.stdout} {r.stderr}")


def test_allreduce_alltoall_connectivity():
    r = run(["-n", "5", prog("collectives")], env=ENV, timeout=120)
    check(r.returncode == 0 and "collectives over 5 ranks: ok" in r.stdout,
          f"exit {r.returncode}: {r.stdout} {r.stderr}")


def test_mpi_abort_stops_the_job_with_its_code():
    env = marker_env({"ABORT_RANK": "2", "ABORT_CODE": "7"})
    r = run(["-n", "4", prog("abort")], env=env, timeout=60)
    check(r.returncode == 7, f"exit {r.returncode}, expected 7: {r.stderr}")
    check(re.search(r"rank 2 \(pid \d+ on \S+\) called MPI_Abort/PMIx_Abort with status 7", r.stderr),
          r.stderr)
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_exit_without_finalize_is_reported_and_does_not_hang():
    env = marker_env()
    r = run(["-n", "3", "--kill-grace", "2", prog("no_finalize")], env=env, timeout=60)
    check(r.returncode == 1, f"exit {r.returncode}, expected 1: {r.stderr}")
    check(re.search(r"rank 1 \(pid \d+ on \S+\) exited with status 0 without calling MPI_Finalize",
                    r.stderr), r.stderr)
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_plain_pmix_client():
    r = run(["-n", "4", prog("pmix_client")], env=ENV, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    for i in range(4):
        check(f"pmix_client rank {i} of 4 ok (local peers 0,1,2,3)" in r.stdout, r.stdout)


def test_oversubscribed_node_yields_and_pmix_says_so():
    """More ranks than processors on one machine: as mpirun does (and as pytorch_execd does on
    every node), ranks get OMPI_MCA_mpi_yield_when_idle=1, OMPI_MCA_mpi_oversubscribe=1,
    OMPI_MCA_rmaps_base_oversubscribe=1 and PMIx's node-oversubscribed flag; without them MPI
    ranks spin against each other (an allreduce loop took 30 s instead of 1)."""
    over = (os.cpu_count() or 1) + 1
    for n, want, v in ((over, "yes", "1"), (1, "no", "unset")):
        r = run(["-n", str(n), prog("pmix_client"), "node-info"], env=ENV, timeout=60)
        check(r.returncode == 0, f"-n {n}: exit {r.returncode}: {r.stderr}")
        for i in range(n):
            line = (f"pmix_client rank {i} oversubscribed={want} yield_when_idle={v} "
                    f"mpi_oversubscribe={v} rmaps_base_oversubscribe={v}")
            check(line in r.stdout, f"-n {n}: no '{line}' in {r.stdout}")
    # A user's own setting wins.
    r = run(["-n", str(over), "-x", "OMPI_MCA_mpi_yield_when_idle=0", "-x",
             "OMPI_MCA_mpi_oversubscribe=0", prog("pmix_client"), "node-info"], env=ENV, timeout=60)
    check(r.returncode == 0 and "oversubscribed=yes yield_when_idle=0 mpi_oversubscribe=0 "
          "rmaps_base_oversubscribe=1" in r.stdout, r.stdout)


def cpu_topology(cpu):
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    with open(base + "physical_package_id") as p, open(base + "core_id") as c:
        return int(p.read()), int(c.read())


def test_bound_ranks_know_which_peers_share_their_package_and_core():
    """--bind-to core: each rank's PMIX_CPUSET and PMIX_LOCALITY_STRING tell Open MPI which peers
    share its package and core (MPI_Comm_split_type), as under mpirun.  Unbound ranks share only
    the node, as under mpirun --bind-to none."""
    # Two ranks where there are two cores (--bind-to core refuses more ranks than cores).
    n = 2 if len({cpu_topology(c) for c in os.sched_getaffinity(0)}) >= 2 else 1
    for bind in (["--bind-to", "core"], []):
        r = run(["-n", str(n)] + bind + [prog("locality")], env=ENV, timeout=60)
        check(r.returncode == 0, f"{bind}: exit {r.returncode}: {r.stderr}")
        rows = {}
        for line in r.stdout.splitlines():
            m = re.match(r"rank (\d) cpu (\d+) of (\d+) socket (-?\d+) core (-?\d+)$", line)
            check(m, f"{bind}: bad line {line!r}")
            rows[int(m[1])] = [int(x) for x in m.groups()[1:]]
        check(sorted(rows) == list(range(n)), f"{bind}: {r.stdout}")
        where = {rank: cpu_topology(row[0]) for rank, row in rows.items()}
        for rank, (cpu, ncpus, socket_size, core_size) in rows.items():
            if bind:
                check(ncpus >= 1, f"rank {rank} not bound: {ncpus} processors")
                want_socket = sum(w[0] == where[rank][0] for w in where.values())
                want_core = sum(w == where[rank] for w in where.values())
            else:
                want_socket = want_core = 1
            check((socket_size, core_size) == (want_socket, want_core),
                  f"{bind} rank {rank} on cpu {cpu}: socket {socket_size} core {core_size}, "
                  f"expected {want_socket} {want_core}: {r.stdout}")


def test_connect_to_another_jobs_port_is_told():
    """MPI_Comm_connect to a port that another job opened never completes (each job has its own
    PMIx server; mpirun says so at once, needing an ompi-server): after 10 s the client's job
    says why it waits, naming the port, rather than waiting Open MPI's 600 s in silence."""
    env = marker_env()
    port_file = os.path.join(tmpdir(), "port")
    server = start(["-n", "1", prog("port"), "accept", port_file], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = None
    try:
        check(wait_until(lambda: os.path.exists(port_file) and open(port_file).read(), 30),
              "the server wrote no port")
        port = open(port_file).read().strip()
        client = start(["-n", "1", prog("port"), "connect", port_file], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        line = client.stderr.readline()  # the first thing the client's job says
        took = time.monotonic() - t0
        check(f"in MPI_Comm_connect for port {port}: no process of this job has accepted" in line
              and took < 30, f"after {took:.1f} s: {line!r}")
    finally:
        for p in (client, server):
            if p:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def test_clients_that_finalize_and_exit_together_are_not_failures():
    """24 PMIx clients finalize and exit at the same moment, 25 times.  Each "finalized" notice
    is posted before its client exits; a launcher that drained those notices only once per
    SIGCHLD reaped ranks that exited meanwhile without them ("exited without calling
    MPI_Finalize": 2 of 25 jobs here before the fix)."""
    for i in range(25):
        r = run(["-n", "24", prog("pmix_client")], env=ENV, timeout=60)
        check(r.returncode == 0, f"job {i}: exit {r.returncode}: {r.stderr[-600:]}")


def test_mpi_wires_up_again_after_a_group_restart():
    r = run(["-n", "3", "--max-restarts", "1", prog("restart")], env=ENV, timeout=120)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    got = sorted(r.stdout.splitlines())
    check(got == [f"restart 1 rank {i} sum 3" for i in range(3)], f"{got}")


def test_open_mpi_errors_reach_the_user():
    r = run(["-n", "2", "-x", "OMPI_MCA_btl=nosuchbtl", prog("hello")], env=ENV, timeout=60)
    check(r.returncode != 0, "a broken BTL selection did not fail")
    check("A requested component was not found" in r.stderr and "nosuchbtl" in r.stderr,
          f"Open MPI's own explanation is missing: {r.stderr[-800:]}")


def test_fences_through_the_launcher():
    # PMIx completes a fence among local clients by itself; this makes it call the host's
    # fence_nb (as on several nodes), so the launcher's modex routing is exercised.
    env = dict(ENV, PMIX_MCA_pmix_server_fence_localonly_opt="0")
    r = run(["-v", "-n", "3", prog("pmix_client")], env=env, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-800:]}")
    check(len(r.stdout.splitlines()) == 3, r.stdout)
    check(re.search(r"upcall fence_nb \S+ \(\d+ bytes, collect=true\)", r.stderr),
          f"no fence upcall: {r.stderr[-800:]}")
    r = run(["-v", "-n", "3", prog("collectives")], env=env, timeout=120)
    check(r.returncode == 0 and "collectives over 3 ranks: ok" in r.stdout, r.stderr[-800:])
    check("upcall fence_nb" in r.stderr, "MPI_Init did not fence through the launcher")


def test_mpi4py():
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import mpi4py"], capture_output=True)
    if probe.returncode != 0:
        print("(mpi4py not installed: python3-mpi4py; skipping this case)")
        return
    r = run(["-n", "3", SYSTEM_PYTHON, os.path.join(MPI_SRC, "mpi4py_check.py")], env=ENV, timeout=120)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    check(sorted(r.stdout.splitlines()) == [f"mpi4py rank {i} of 3 sum 6" for i in range(3)], r.stdout)


if __name__ == "__main__":
    build()
    main([test_hello_one_to_eight_ranks, test_ring, test_allreduce_alltoall_connectivity,
          test_mpi_abort_stops_the_job_with_its_code, test_exit_without_finalize_is_reported_and_does_not_hang,
          test_plain_pmix_client, test_oversubscribed_node_yields_and_pmix_says_so,
          test_bound_ranks_know_which_peers_share_their_package_and_core,
          test_connect_to_another_jobs_port_is_told,
          test_clients_that_finalize_and_exit_together_are_not_failures,
          test_mpi_wires_up_again_after_a_group_restart,
          test_open_mpi_errors_reach_the_user, test_fences_through_the_launcher, test_mpi4py])
