"""Ranks of one node in different PID namespaces (a container per rank that shares /dev/shm).

The shm engine looks at its local ranks' pids to notice one that died, and writes reduced shards
straight into their memory (process_vm_writev) after checking their pids; a pid from another PID
namespace names nothing, or another process, here.  Rank 1 runs in a PID namespace of its own
(unshare --pid --fork) and the conformance program (tests/dc/dc_check: every dtype x op x count
against a reference) must pass on one node and on two simulated nodes.  Needs root and unshare
(skips otherwise).
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
    main([test_one_node, test_two_simulated_nodes])
