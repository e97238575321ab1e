"""Signals to pytorch_exec reach every worker's process group; grace, SIGKILL, second Ctrl-C."""
import os
import signal
import subprocess
import time

from harness import (assert_no_leftovers, check, main, marker_env, start, script, tmpdir,
                     wait_until)

TRAPPER = script("""#!/bin/bash
# Records which signal it got, then exits (or ignores it, with IGNORE=1).
out=$1
handle() { echo "$1" > "$out/got.$RANK"; [ "$IGNORE" = 1 ] || exit 7; }
trap 'handle TERM' TERM; trap 'handle INT' INT; trap 'handle HUP' HUP; trap 'handle USR1' USR1
touch "$out/ready.$RANK"
while true; do sleep 0.05; done
""")


def launch(n, out, extra=(), env_extra=None):
    env = marker_env(env_extra)
    p = start(list(extra) + ["-n", str(n), TRAPPER, out], env=env,
              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ok = wait_until(lambda: all(os.path.exists(f"{out}/ready.{r}") for r in range(n)), 30)
    check(ok, "workers did not start")
    return p, env["PE_TEST_MARKER"]


def got(out, n):
    res = {}
    for r in range(n):
        try:
            with open(f"{out}/got.{r}") as f:
                res[r] = f.read().strip()
        except FileNotFoundError:
            res[r] = None
    return res


def forwarded(sig, name, status):
    out, n = tmpdir(), 3
    p, marker = launch(n, out)
    p.send_signal(sig)
    rc = p.wait(timeout=30)
    check(rc == status, f"{name}: exit {rc}, expected {status}")
    check(got(out, n) == {r: name for r in range(n)}, f"{name}: handlers ran: {got(out, n)}")
    assert_no_leftovers(marker)


def test_sigterm_reaches_every_worker():
    forwarded(signal.SIGTERM, "TERM", 143)


def test_sigint_reaches_every_worker():
    forwarded(signal.SIGINT, "INT", 130)


def test_sighup_reaches_every_worker():
    forwarded(signal.SIGHUP, "HUP", 129)


def test_sigusr1_is_forwarded_and_the_job_goes_on():
    out, n = tmpdir(), 2
    p, marker = launch(n, out, extra=["--kill-grace", "0.3"], env_extra={"IGNORE": "1"})
    p.send_signal(signal.SIGUSR1)
    check(wait_until(lambda: got(out, n) == {0: "USR1", 1: "USR1"}, 10), f"got {got(out, n)}")
    check(p.poll() is None, "the job ended on SIGUSR1")
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert_no_leftovers(marker)


def test_grace_then_sigkill():
    out, n = tmpdir(), 2
    p, marker = launch(n, out, extra=["--kill-grace", "0.5"], env_extra={"IGNORE": "1"})
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=30)
    elapsed = time.monotonic() - t0
    check(rc == 143, f"exit {rc}")
    check(got(out, n) == {0: "TERM", 1: "TERM"}, f"got {got(out, n)}")
    check(elapsed >= 0.5, f"SIGKILL came before the grace period ({elapsed:.2f} s)")
    assert_no_leftovers(marker)


def test_second_ctrl_c_kills_at_once():
    out, n = tmpdir(), 2
    p, marker = launch(n, out, extra=["--kill-grace", "60"], env_extra={"IGNORE": "1"})
    p.send_signal(signal.SIGINT)
    check(wait_until(lambda: got(out, n) == {0: "INT", 1: "INT"}, 10), f"got {got(out, n)}")
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=10)  # far less than the 60 s grace
    check(rc == 130, f"exit {rc}")
    check(b"second signal" in p.stderr.read(), "no message for the second signal")
    assert_no_leftovers(marker)


if __name__ == "__main__":
    main([test_sigterm_reaches_every_worker, test_sigint_reaches_every_worker,
          test_sighup_reaches_every_worker, test_sigusr1_is_forwarded_and_the_job_goes_on,
          test_grace_then_sigkill, test_second_ctrl_c_kills_at_once])
