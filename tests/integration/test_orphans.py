"""No orphans: SIGKILL pytorch_exec and every worker, and what the workers started, is gone."""
import os
import signal
import subprocess

from harness import (assert_no_leftovers, check, main, marker_env, processes_with_marker, start,
                     tmpdir, wait_until)


def test_sigkill_of_pytorch_exec_leaves_nothing():
    env = marker_env({"TMPDIR": tmpdir()})
    marker = env["PE_TEST_MARKER"]
    # Each worker starts two grandchildren in its process group, and one that leaves it (setsid).
    p = start(["-n", "4", "sh", "-c", "sleep 300 & sleep 300 & wait"], env=env,
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    check(wait_until(lambda: len(processes_with_marker(marker)) >= 1 + 4 * 3, 30),
          f"only {len(processes_with_marker(marker))} processes started")
    check(os.listdir(env["TMPDIR"]), "pytorch_exec made no temporary directory (PMIx server)")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    assert_no_leftovers(marker, timeout=1.0)
    check(wait_until(lambda: not os.listdir(env["TMPDIR"]), 2.0),
          f"temporary files left behind: {os.listdir(env['TMPDIR'])}")


def test_normal_end_leaves_nothing():
    env = marker_env({"TMPDIR": tmpdir()})
    marker = env["PE_TEST_MARKER"]
    # The worker exits at once and leaves a background child in its group.
    p = start(["-n", "2", "sh", "-c", "sleep 300 & exit 0"], env=env,
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rc = p.wait(timeout=30)
    check(rc == 0, f"exit {rc}")
    assert_no_leftovers(marker, timeout=1.0)
    check(not os.listdir(env["TMPDIR"]), f"temporary files left behind: {os.listdir(env['TMPDIR'])}")


if __name__ == "__main__":
    main([test_sigkill_of_pytorch_exec_leaves_nothing, test_normal_end_leaves_nothing])
