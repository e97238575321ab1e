"""Failure events: when a rank fails, the ranks that registered a PMIx event handler are told
(PMIX_ERR_PROC_ABORTED for MPI_Abort or a signal, PMIX_EVENT_PROC_TERMINATED for a non-zero exit,
with the failed process and its exit code) before they are stopped, and --failure-window gives
them time; on one node and across nodes (the event then travels to every daemon)."""
import os
import re
import subprocess
import time

from harness import SRCDIR, assert_no_leftovers, check, main, marker_env, run, tmpdir

BIN = tmpdir()
PROG = os.path.join(BIN, "pmix_events")


def build():
    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], capture_output=True, text=True)
    r = subprocess.run(["cc", "-o", PROG, os.path.join(SRCDIR, "tests", "mpi", "pmix_events.c")]
                       + pc.stdout.split(), capture_output=True, text=True)
    check(pc.returncode == 0 and r.returncode == 0, f"cc pmix_events.c: {pc.stderr} {r.stderr}")


def check_told(out, survivors, event, failed, exit_code, what):
    for r in survivors:
        pat = (rf"^pmix_events rank {r} got {re.escape(event)} source (\S+):{failed} "
               rf"affected \1:{failed} exit_code {exit_code}$")
        check(re.search(pat, out, re.M), f"{what}: rank {r} was not told: {out}")


def test_survivors_are_told_within_the_window():
    for how, event, code in (("abort", "PROC-ABORTED", 5), ("exit", "PROC TERMINATED", 3),
                             ("segv", "PROC-ABORTED", 139)):
        env = marker_env()
        t0 = time.monotonic()
        r = run(["-n", "4", "--failure-window", "1.5", PROG, "2", how], env=env, timeout=60)
        took = time.monotonic() - t0
        check(r.returncode == code, f"{how}: exit {r.returncode}: {r.stderr[-1500:]}")
        check_told(r.stdout, (0, 1, 3), event, 2, code, how)
        check(took >= 1.5, f"{how}: the job ended after {took:.2f} s, before the window was over")
        assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def test_without_a_window_the_job_stops_at_once():
    env = marker_env()
    t0 = time.monotonic()
    r = run(["-n", "3", "--kill-grace", "5", PROG, "1", "exit"], env=env, timeout=60)
    check(r.returncode == 3, f"exit {r.returncode}: {r.stderr[-1500:]}")
    check(time.monotonic() - t0 < 3, "the default window is not 0")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)
    r = run(["--failure-window", "soon", "true"], timeout=30)
    check(r.returncode == 2 and r.stderr.count("\n") == 1 and "--failure-window" in r.stderr,
          f"exit {r.returncode}: {r.stderr}")


def test_survivors_on_other_nodes_are_told():
    env = marker_env({"OMPI_MCA_btl": "self,tcp"})
    marker = env["PE_TEST_MARKER"]
    agent = f"env -i PATH=/usr/bin:/bin PE_TEST_MARKER={marker} PE_NODE={{host}}"
    r = run(["-H", "a:2,b:2", "--launch-agent", agent, "--failure-window", "1", PROG, "3", "abort"],
            env=env, timeout=60)
    check(r.returncode == 5, f"exit {r.returncode}: {r.stderr[-1500:]}")
    check_told(r.stdout, (0, 1, 2), "PROC-ABORTED", 3, 5, "across nodes")
    assert_no_leftovers(marker, timeout=5)


if __name__ == "__main__":
    build()
    main([test_survivors_are_told_within_the_window, test_without_a_window_the_job_stops_at_once,
          test_survivors_on_other_nodes_are_told])
