"""Ranks of one node in different PID namespaces (a container per rank that shares /dev/shm).

The shm engine looks at its local ranks' pids to notice one that died, and writes reduced shards
straight into their memory (process_vm_writev) after checking their pids; a pid from another PID
namespace names nothing, or another process, here.  Rank 1 runs in a PID namespace of its own
(unshare --pid --fork) and the conformance program (tests/dc/dc_check: every dtype x op x count
against a reference) must pass on one node and on two simulated nodes.  A rank there that is
killed outright must be noticed by the others at once (its life lock on the segment is gone),
not at the deadline: its pid means nothing to them.  Needs root and unshare (skips otherwise).
"""
import os
import random
import shutil
import subprocess

from harness import DC_CHECK, check, main, marker_env, run, skip



def conformance(n, nodes_of=""):
    seed = random.randrange(1 << 40)
    inner = (f"{nodes_of} if [ $RANK = 1 ]; then exec unshare --pid --fork --kill-child {DC_CHECK} conformance {seed}; "
             f"else exec {DC_CHECK} conformance {seed}; fi")
    r = run(["-n", str(n), "sh", "-c", inner], env=marker_env(), timeout=300)
    check(r.returncode == 0 and r.stdout.startswith("ok"),
          f"seed {seed}: {r.returncode} {r.stdout}{r.stderr[-3000:]}")
    return r.stdout


def test_one_node():
    check("1 nodes, shm" in conformance(2), "expected shm on one node")


def test_two_simulated_nodes():
    out = conformance(4, "export PYTORCH_DC_NODE=n$((RANK / 2));")
    check("2 nodes, shm" in out, f"expected two nodes over shm: {out}")


def test_killed_rank_in_another_namespace_is_noticed():
    # dc_check die 1: rank 1 _exits in the middle of its fourth allreduce (deadline 30 s).  Its
    # wrapper lives on, so pytorch_exec sees no failure of rank 1: rank 0 must find out itself.
    inner = (f"if [ $RANK = 1 ]; then unshare --pid --fork --kill-child {DC_CHECK} die 1; sleep 100; "
             f"else exec {DC_CHECK} die 1; fi")
    r = run(["-n", "2", "sh", "-c", inner], env=marker_env(), timeout=120)
    line = [l for l in r.stdout.splitlines() if l.startswith("rank 0: error after")]
    check(r.returncode == 4 and line and "local rank 1" in line[0] and "died" in line[0],
          f"{r.returncode} {r.stdout}{r.stderr[-2000:]}")
    seconds = float(line[0].split()[4])
    check(seconds < 10, f"noticed after {seconds} s, not before the 30 s deadline: {line[0]}")


if __name__ == "__main__":
    if not os.path.exists(DC_CHECK):
        skip(f"{DC_CHECK} is not built")
    if os.geteuid() != 0:
        skip("a PID namespace of its own needs root")
    if not shutil.which("unshare"):
        skip("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        skip(f"cannot create a PID namespace: {probe.stderr.strip()}")
    main([test_one_node, test_two_simulated_nodes, test_killed_rank_in_another_namespace_is_noticed])
