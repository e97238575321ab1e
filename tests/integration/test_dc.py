"""DataChannel (libpytorch_dc) as real processes.

The conformance program tests/dc/dc_check (every dtype x op x count, reduce_scatter, allgather,
broadcast, send/recv, split; inputs from a fresh random seed, checked against a reference) runs
under pytorch_exec with the PMIx bootstrap on one node and on simulated nodes (PYTORCH_DC_NODE:
hierarchical allreduce, unequal ranks per node), with the shm, tcp and mpi transports, with the
env:// bootstrap, and under Open MPI's mpirun.  A rank that dies in the middle of allreduces
makes every survivor fail with an error well within the timeout (ranks started without a
launcher, env://, so that nothing else stops them), also when the shm engine runs an allreduce
in slices on several threads per rank (PYTORCH_DC_SHM_THREADS).  A /dev/shm too small for the
shm slots (root only: a tmpfs in a mount namespace) gives smaller slots, or a clear error.  The
example program runs.
"""
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time

from harness import BUILDDIR, DC_CHECK, EXEC, check, free_port, main, marker_env, run, assert_no_leftovers, skip

EXAMPLE = os.path.join(BUILDDIR, "examples", "allreduce")
NODES_BY = "PYTORCH_DC_NODE=n$((RANK{by})) exec {prog} {args}"


def conformance(n, env=None, nodes=None, launcher=None):
    seed = str(random.randrange(1 << 40))
    cmd = [DC_CHECK, "conformance", seed]
    if nodes:  # simulated nodes: a shell sets PYTORCH_DC_NODE from RANK
        cmd = ["sh", "-c", NODES_BY.format(by=nodes, prog=DC_CHECK, args=f"conformance {seed}")]
    e = marker_env(env)
    if launcher:
        r = subprocess.run(launcher + cmd, capture_output=True, text=True, env=e, timeout=300)
    else:
        r = run(["-n", str(n)] + cmd, env=e, timeout=300)
    check(r.returncode == 0 and r.stdout.startswith("ok"),
          f"conformance (seed {seed}, {env}, nodes {nodes}) failed ({r.returncode}): {r.stdout}{r.stderr[-3000:]}")
    return r.stdout.strip()


def test_one_node_shm():
    check("1 nodes, shm/tcp" in conformance(4), "expected shm inside the node")
    check("2 ranks, 1 nodes, shm/tcp" in conformance(2), "expected shm inside the node")
    # Lanes of the shm engine: allreduces of 2 MiB and more in slices on helper threads.
    conformance(3, env={"PYTORCH_DC_SHM_THREADS": "3"})


def test_two_nodes_hierarchical():
    check("2 nodes, shm/tcp" in conformance(4, nodes="/2"), "expected 2 nodes")
    # In lanes, each across nodes over connections of its own.
    conformance(4, nodes="/2", env={"PYTORCH_DC_SHM_THREADS": "2"})


def test_nodes_that_cut_calls_differently_raise():
    # PYTORCH_DC_PIPELINE_BYTES differs between the nodes (documented: the same on every rank):
    # their cross-node steps differ in size, and every rank raises instead of one node returning
    # the other's headers as data.
    prog = ('N=$((RANK / 2)); [ $N = 1 ] && export PYTORCH_DC_PIPELINE_BYTES=16384; '
            f'PYTORCH_DC_NODE=n$N exec {DC_CHECK} conformance {random.randrange(1 << 40)}')
    r = run(["-n", "4", "sh", "-c", prog], env=marker_env({"PYTORCH_DC_TIMEOUT": "20"}),
            timeout=120)
    check(r.returncode != 0 and "mismatched calls" in r.stderr and "a step of" in r.stderr
          and not r.stdout.startswith("ok"), f"{r.returncode} {r.stdout}{r.stderr[-2000:]}")


def test_unequal_nodes():
    check("2 nodes" in conformance(5, nodes="%2", env={"PYTORCH_DC_SHM_BYTES": "65536"}), "expected 2 nodes")


def test_tcp_only():
    check("tcp/tcp" in conformance(3, env={"PYTORCH_DC_TRANSPORT": "tcp"}, nodes="%2"), "expected tcp")
    conformance(2, env={"PYTORCH_DC_TRANSPORT": "tcp", "PYTORCH_DC_TCP_CONGESTION": "reno"})


def test_unusable_congestion_control_is_a_clear_error():
    r = run(["-n", "2", DC_CHECK, "info"], env=marker_env({"PYTORCH_DC_TRANSPORT": "tcp",
                                                          "PYTORCH_DC_TCP_CONGESTION": "pigeon"}),
            timeout=120)
    check(r.returncode != 0 and "PYTORCH_DC_TCP_CONGESTION=pigeon" in r.stderr
          and "Traceback" not in r.stderr and "terminate" not in r.stderr, f"{r.returncode} {r.stderr}")


def test_env_bootstrap():
    conformance(4, env={"PYTORCH_DC_BOOTSTRAP": "env"}, nodes="/2")


def test_mpi_transport():
    if not shutil.which("mpirun"):
        skip("no Open MPI")
    check("mpi/mpi" in conformance(4, env={"PYTORCH_DC_TRANSPORT": "mpi"}, nodes="/2"), "expected mpi")
    check("shm/mpi" in conformance(4, env={"PYTORCH_DC_INTER": "mpi"}, nodes="/2"), "expected shm/mpi")


def test_under_mpirun():
    if not shutil.which("mpirun"):
        skip("no Open MPI")
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PYTORCH_DC_TRANSPORT": "mpi"}
    conformance(3, env=env, launcher=["mpirun", "--oversubscribe", "-n", "3"])



def peer_death(env_extra, one_node=False):
    """4 ranks started here (env://, no launcher); rank 1 exits in the middle of allreduces.  The
    port comes from free_port(), which closes it before rank 0 binds it: when another program took
    it in between (rank 0: 'cannot listen'), the test starts again on another port."""
    for attempt in range(3):
        outs = start_peer_death(env_extra, one_node)
        if not any("cannot listen on TCP port" in text for _, text in outs):
            break
    check(outs[1][0] == 3, f"the victim should exit 3: {outs[1]}")
    for r in (0, 2, 3):
        rc, text = outs[r]
        check(rc == 4 and "error after" in text, f"rank {r} should report an error (exit 4): {rc} {text}")
        secs = float(text.split("error after ")[1].split()[0])
        check(secs < 20, f"rank {r} took {secs} s to notice (timeout 30 s): {text}")
    return [o[1].strip() for o in outs]


def start_peer_death(env_extra, one_node):
    """The ranks of one peer_death run: [(exit status, output)] by rank."""
    port = free_port(2)  # the store listens on port + 1
    base = marker_env(env_extra)
    for k in list(base):
        if k.startswith("PMIX_"):
            del base[k]
    # A token of its own: without one, the ranks of another run that picked the same free port
    # (free_port() closes it before use) could join this job's store (once seen: rank 0 hung).
    # PYTORCH_DC_TIMEOUT bounds the set-up too: ranks that wait for a rank 0 that could not
    # start give up well within communicate()'s limit.
    base.update(WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTORCH_DC_BOOTSTRAP="env",
                PYTORCH_DC_TOKEN=os.urandom(8).hex(), PYTORCH_DC_TIMEOUT="30")
    procs = []
    for r in range(4):
        e = dict(base, RANK=str(r), PYTORCH_DC_NODE="n0" if one_node else f"n{r // 2}")
        procs.append(subprocess.Popen([DC_CHECK, "die", "1"], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=60)
            outs.append((p.returncode, out + err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert_no_leftovers(base["PE_TEST_MARKER"])
    return outs


def test_peer_death_is_an_error_on_every_survivor():
    peer_death({})                                  # shm inside nodes, tcp across
    peer_death({"PYTORCH_DC_TRANSPORT": "tcp"})     # tcp everywhere
    # The 16 MiB allreduces in two slices on two threads per rank (shm lanes): on one node, and
    # across two, each lane with connections of its own.
    peer_death({"PYTORCH_DC_SHM_THREADS": "2"}, one_node=True)
    peer_death({"PYTORCH_DC_SHM_THREADS": "2"})


def test_forked_child_takes_the_ranks_place():
    # A child forked after the set-up has none of the rank's threads: its allreduces of 4 MiB,
    # which shm lanes cut in slices for helper threads, run all slices on its one thread, and it
    # lets go of the group without them.  Across simulated nodes, the owners write their shards
    # into the child's buffer, not into the same address of its parent.
    for env in ({}, {"PYTORCH_DC_SHM_THREADS": "3"}):
        r = run(["-n", "2", DC_CHECK, "forked"], env=marker_env(env), timeout=120)
        check(r.returncode == 0 and r.stdout.strip() == "ok", f"{env}: {r.returncode} {r.stdout}{r.stderr}")
    for env in ({}, {"PYTORCH_DC_SHM_THREADS": "3"}):
        r = run(["-n", "4", "sh", "-c", NODES_BY.format(by="/2", prog=DC_CHECK, args="forked")],
                env=marker_env(env), timeout=120)
        check(r.returncode == 0 and r.stdout.strip() == "ok",
              f"2 nodes, {env}: {r.returncode} {r.stdout}{r.stderr}")


def small_dev_shm(size, argv, env=None, timeout=120):
    """pytorch_exec ARGV in a mount namespace of its own whose /dev/shm is a tmpfs of SIZE."""
    e = marker_env(env)
    mount = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"'
    cmd = ["unshare", "-m", "sh", "-c", mount, "sh", EXEC] + argv
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
    assert_no_leftovers(e["PE_TEST_MARKER"])
    return r


def test_small_dev_shm():
    # A /dev/shm with no room for the shm slots asked for (a container's 64 MiB, say): local
    # rank 0 reserves the segment's pages at once, halving the slot until they fit, and says so;
    # the ranks never find a page missing (SIGBUS) in an allreduce.  With no room even for the
    # smallest slot, set-up fails on every rank with an error that names /dev/shm.
    if os.geteuid() != 0 or not shutil.which("unshare"):
        skip("needs root and unshare(1) to mount a small /dev/shm in a mount namespace")
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            "mount -t tmpfs -o size=1M tmpfs /dev/shm"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        skip(f"cannot mount a tmpfs in a mount namespace here: {probe.stderr.strip()}")
    note = "/dev/shm has no room for this node's 8192 KiB shared-memory slots"
    big = os.path.join(BUILDDIR, "bench", "allreduce", "dc_bench")
    # 2 ranks asking for 8 MiB slots (32 MiB of segment) in 8 MiB: a 64 MiB allreduce touches
    # every page of the slots (it was a SIGBUS)
    r = small_dev_shm("8M", ["-n", "2", big, "--sizes", "67108864:2", "--reps", "1"],
                      env={"PYTORCH_DC_SHM_BYTES": str(8 << 20)})
    check(r.returncode == 0 and "@@ROW 67108864" in r.stdout and r.stderr.count(note) == 1,
          f"64 MiB allreduce in a small /dev/shm: {r.returncode} {r.stdout}{r.stderr[-2000:]}")
    # Correct results with the smaller slots
    r = small_dev_shm("24M", ["-n", "2", DC_CHECK, "conformance", str(random.randrange(1 << 40))],
                      env={"PYTORCH_DC_SHM_BYTES": str(8 << 20)})
    check(r.returncode == 0 and r.stdout.startswith("ok") and note in r.stderr,
          f"conformance in a small /dev/shm: {r.returncode} {r.stdout}{r.stderr[-2000:]}")
    # 2 simulated nodes of 2 whose /dev/shm differ (a mount namespace each, kept by a file):
    # 8 MiB slots on one, 1 MiB on the other; the nodes cut hierarchical allreduces into the same
    # pieces (they did not: mismatched calls)
    tmp = tempfile.mkdtemp(prefix="pe_shm_ns_")
    spaces = [os.path.join(tmp, name) for name in ("big", "small")]
    try:
        subprocess.run(["mount", "--bind", tmp, tmp], check=True, timeout=30)
        subprocess.run(["mount", "--make-private", tmp], check=True, timeout=30)
        for space, size in zip(spaces, ("40M", "6M")):
            open(space, "w").close()
            subprocess.run(["unshare", f"--mount={space}", "sh", "-c",
                            f"mount -t tmpfs -o size={size} tmpfs /dev/shm"],
                           check=True, timeout=30)
        seed = random.randrange(1 << 40)
        prog = (f'N=$((RANK / 2)); PYTORCH_DC_NODE=n$N exec nsenter --mount={tmp}/$([ $N = 0 ] && '
                f'echo big || echo small) {DC_CHECK} conformance {seed}')
        r = run(["-n", "4", "sh", "-c", prog], timeout=300,
                env=marker_env({"PYTORCH_DC_SHM_BYTES": str(8 << 20)}))
        check(r.returncode == 0 and r.stdout.startswith("ok") and r.stderr.count(note) == 1,
              f"nodes of unequal /dev/shm (seed {seed}): {r.returncode} "
              f"{r.stdout}{r.stderr[-2000:]}")
    finally:
        for m in spaces + [tmp]:
            subprocess.run(["umount", m], capture_output=True, timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    r = small_dev_shm("16k", ["-n", "4", "sh", "-c",
                              NODES_BY.format(by="/2", prog=DC_CHECK, args="info")], timeout=60)
    check(r.returncode != 0 and "/dev/shm has no room for this node's shared memory" in r.stderr
          and "PYTORCH_DC_INTRA=tcp" in r.stderr,
          f"no room at all: {r.returncode} {r.stderr[-2000:]}")
    r = small_dev_shm("16k", ["-n", "2", DC_CHECK, "info"], env={"PYTORCH_DC_INTRA": "tcp"})
    check(r.returncode == 0,
          f"PYTORCH_DC_INTRA=tcp without /dev/shm room: {r.returncode} {r.stderr}")


def test_example_runs():
    r = run(["-n", "4", EXAMPLE], env=marker_env(), timeout=120)
    check(r.returncode == 0 and "allreduce ok" in r.stdout, f"example failed: {r.stdout}{r.stderr}")


def test_split_then_exit():
    # Rank 0 serves the bootstrap's store; groups made by split() must not need it: rank 0 is in
    # none of them and exits at once, and the others split once more.
    for _ in range(5):
        r = run(["-n", "4", DC_CHECK, "split-exit"], env=marker_env(), timeout=120)
        check(r.returncode == 0 and r.stdout.strip() == "ok", f"{r.returncode} {r.stdout}{r.stderr}")


def test_groups_made_while_one_lives():
    # A second init() while the first group lives, through PMIx and env:// (where rank 0's store
    # serves both: a new one on the same port raced the old one's end, 9 runs in 10).
    for env in ({}, {"PYTORCH_DC_BOOTSTRAP": "env"}):
        for _ in range(3):
            r = run(["-n", "3", DC_CHECK, "reinit"], env=marker_env(env), timeout=120)
            check(r.returncode == 0 and r.stdout.strip() == "ok",
                  f"{env}: {r.returncode} {r.stdout}{r.stderr[-2000:]}")


def test_locality_domains():
    # pytorch_exec's own PYTORCH_EXEC_DOMAIN (one domain on this machine), then one set per rank
    # by a shell: every rank learns every rank's domain, through PMIx and through env://.
    r = run(["-n", "2", DC_CHECK, "info"], env=marker_env(), timeout=120)
    check(r.returncode == 0 and r.stdout.count("domain 0 domains 0,0 half 0") == 2, r.stdout + r.stderr)
    for env in ({}, {"PYTORCH_DC_BOOTSTRAP": "env"}):
        r = run(["-n", "4", "sh", "-c", f"PYTORCH_EXEC_DOMAIN=$((RANK % 2 * 3)) exec {DC_CHECK} info"],
                env=marker_env(env), timeout=120)
        lines = sorted(r.stdout.splitlines())
        check(r.returncode == 0 and len(lines) == 4, f"{env}: {r.returncode} {r.stdout}{r.stderr}")
        for rank, line in enumerate(lines):
            want = f"domain {rank % 2 * 3} domains 0,3,0,3 half {rank % 2 * 3},{rank % 2 * 3}"
            check(line.startswith(f"rank {rank} ") and want in line, f"{env}: rank {rank}: {line}")
    r = run(["-n", "2", "sh", "-c", f"PYTORCH_EXEC_DOMAIN=west exec {DC_CHECK} info"], env=marker_env(), timeout=120)
    check(r.returncode != 0 and "PYTORCH_EXEC_DOMAIN=west is not a number" in r.stderr, r.stderr)


def test_no_launcher_is_a_clear_error():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMIX_") and k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run([DC_CHECK, "info"], capture_output=True, text=True, env=dict(env, WORLD_SIZE="2"), timeout=60)
    check(r.returncode == 1 and "RANK/WORLD_SIZE are not set" in r.stderr, f"{r.returncode} {r.stderr}")
    r = subprocess.run([DC_CHECK, "info"], capture_output=True, text=True,
                       env=dict(env, PYTORCH_DC_TRANSPORT="pigeon"), timeout=60)
    check(r.returncode == 1 and "'pigeon' is unknown" in r.stderr, f"{r.returncode} {r.stderr}")


if __name__ == "__main__":
    if not os.path.exists(DC_CHECK):
        skip(f"{DC_CHECK} is not built")
    main([test_one_node_shm, test_two_nodes_hierarchical,
          test_nodes_that_cut_calls_differently_raise, test_unequal_nodes, test_tcp_only,
          test_unusable_congestion_control_is_a_clear_error, test_env_bootstrap, test_mpi_transport, test_under_mpirun,
          test_peer_death_is_an_error_on_every_survivor, test_forked_child_takes_the_ranks_place,
          test_small_dev_shm,
          test_example_runs, test_split_then_exit, test_groups_made_while_one_lives,
          test_locality_domains,
          test_no_launcher_is_a_clear_error])
