"""Elastic membership (--nnodes MIN:MAX): a node's daemon dies in the middle of a job; the others
are stopped and the group re-forms on the nodes left, with a new generation and WORLD_SIZE, and
finishes.  Below MIN the job fails naming the node.  The "nodes" are names given with -H, their
daemons started by a launch agent on this machine (as in test_multinode.py)."""
import os
import re
import shutil

from harness import assert_no_leftovers, check, main, run, script
from test_multinode import BIN, agent, build_mpi, job_env

# Generation 0: the first rank of node b kills its own daemon (its parent); every other rank
# waits to be stopped.  Later generations report who they are, and run $PE_THEN when given.
WORKER = script("""#!/bin/sh
if [ "$PYTORCH_EXEC_GENERATION" = 0 ]; then
  if [ "$PE_NODE" = b ] && [ "$LOCAL_RANK" = 0 ]; then kill -9 $PPID; fi
  exec sleep 60
fi
echo "gen $PYTORCH_EXEC_GENERATION rank $RANK of $WORLD_SIZE node $PE_NODE group $GROUP_RANK/$GROUP_WORLD_SIZE restarts $TORCHELASTIC_RESTART_COUNT"
if [ -n "$PE_THEN" ]; then exec "$PE_THEN"; fi
""")


def test_a_lost_node_reforms_the_group():
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    r = run(["--nnodes", "2:3", "-H", "a:2,b:2,c:2", "--launch-agent", agent(marker), WORKER],
            env=env, timeout=90)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}")
    check(re.search(r"node b: lost contact with its daemon .*; re-forming the group on the 2 node\(s\) left",
                    r.stderr), r.stderr[-2000:])
    rows = sorted(r.stdout.splitlines())
    want = sorted(f"gen 1 rank {i} of 4 node {n} group {g}/2 restarts 1"
                  for i, (n, g) in enumerate([("a", 0), ("a", 0), ("c", 1), ("c", 1)]))
    check(rows == want, f"re-formed group: {rows}")
    assert_no_leftovers(marker, timeout=5)


def test_mpi_programs_run_in_the_reformed_group():
    if not build_mpi():
        print("  (mpicc not found: MPI part not run)")
        return
    env = job_env({"PE_THEN": os.path.join(BIN, "collectives")})
    marker = env["PE_TEST_MARKER"]
    r = run(["--nnodes", "2:3", "-H", "a:1,b:1,c:2", "--launch-agent",
             agent(marker, "OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo"), "-x", "PE_THEN",
             WORKER], env=env, timeout=120)
    check(r.returncode == 0 and "collectives over 3 ranks: ok" in r.stdout,
          f"exit {r.returncode}: {r.stdout} {r.stderr[-2000:]}")
    assert_no_leftovers(marker, timeout=5)


def test_below_the_minimum_the_job_fails():
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    r = run(["--nnodes", "3:3", "-H", "a,b,c", "--launch-agent", agent(marker), WORKER],
            env=env, timeout=90)
    check(r.returncode == 1, f"exit {r.returncode}: {r.stderr[-2000:]}")
    check("node b: lost contact with its daemon" in r.stderr and
          "2 node(s) left, --nnodes needs at least 3" in r.stderr, r.stderr[-2000:])
    assert_no_leftovers(marker, timeout=5)
    r = run(["--nnodes", "2:3", "--max-scale-events", "0", "-H", "a,b,c", "--launch-agent",
             agent(marker), WORKER], env=env, timeout=90)
    check(r.returncode == 1 and "no scale events left (--max-scale-events 0)" in r.stderr,
          f"exit {r.returncode}: {r.stderr[-2000:]}")
    assert_no_leftovers(marker, timeout=5)


def test_node_counts_are_checked_against_the_allocation():
    r = run(["--nnodes", "4:5", "-H", "a,b,c", "true"], timeout=30)
    check(r.returncode == 2 and "--nnodes 4:5 needs at least 4 nodes; -H a,b,c has 3" in r.stderr,
          f"exit {r.returncode}: {r.stderr}")


if __name__ == "__main__":
    main([test_a_lost_node_reforms_the_group, test_mpi_programs_run_in_the_reformed_group,
          test_below_the_minimum_the_job_fails, test_node_counts_are_checked_against_the_allocation])
