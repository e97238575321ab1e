"""Signals to pytorch_exec reach every worker's process group; grace, SIGKILL, second Ctrl-C."""
import os
import signal
import subprocess
import time

from harness import (EXEC, assert_no_leftovers, check, free_port, main, marker_env,
                     processes_with_marker, reaped, start, script, tmpdir, wait_until)

def agent_script():
    """A launch agent that runs the daemon here (simulated nodes)."""
    return script('#!/bin/sh\nshift\nexec "$@"\n') + " {host}"


TRAPPER = script("""#!/bin/bash
# Records which signal it got, then exits (or ignores it, with IGNORE=1).
out=$1
handle() { echo "$1" > "$out/got.$RANK"; [ "$IGNORE" = 1 ] || exit 7; }
trap 'handle TERM' TERM; trap 'handle INT' INT; trap 'handle HUP' HUP; trap 'handle USR1' USR1
trap 'handle QUIT' QUIT
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
    said = p.stderr.read().decode()
    check(f"pytorch_exec: signal {int(sig)} ({signal.strsignal(sig)}): stopping the job's 3 "
          "processes" in said, f"{name}: {said!r}")
    check(got(out, n) == {r: name for r in range(n)}, f"{name}: handlers ran: {got(out, n)}")
    assert_no_leftovers(marker)


def test_sigterm_reaches_every_worker():
    forwarded(signal.SIGTERM, "TERM", 143)


def test_sigint_reaches_every_worker():
    forwarded(signal.SIGINT, "INT", 130)


def test_sighup_reaches_every_worker():
    forwarded(signal.SIGHUP, "HUP", 129)


def test_sigquit_reaches_every_worker():
    """Ctrl-\\ (SIGQUIT, in torchrun's list of signals it handles): pytorch_exec died of it
    (and dumped core), leaving its ranks to the guard's SIGKILL."""
    forwarded(signal.SIGQUIT, "QUIT", 131)


def test_sigusr1_is_forwarded_and_the_job_goes_on():
    out, n = tmpdir(), 2
    p, marker = launch(n, out, extra=["--kill-grace", "0.3"], env_extra={"IGNORE": "1"})
    p.send_signal(signal.SIGUSR1)
    check(wait_until(lambda: got(out, n) == {0: "USR1", 1: "USR1"}, 10), f"got {got(out, n)}")
    check(p.poll() is None, "the job ended on SIGUSR1")
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert_no_leftovers(marker)


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def stopped(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def test_ctrl_z_stops_the_ranks_and_fg_continues_them():
    """SIGTSTP (Ctrl-Z) to pytorch_exec: every rank stops (their process groups are their own,
    out of the terminal's reach: they went on running), then pytorch_exec; SIGCONT (fg) goes on
    to them, and the job ends well.  Also across nodes, whose daemons do not take the stopped
    front end for lost."""
    for extra in ([], ["-H", "a:1,b:1", "--launch-agent", agent_script(), "--heartbeat-interval",
                       "0.2", "--heartbeat-timeout", "1"]):
        env = marker_env()
        # (no subshell: it would carry the rank's command line, stopped or not)
        p = start(extra + ["-n", "2", "sh", "-c", "sleep 6; echo done $RANK"],
                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ranks = lambda: [q for q in processes_with_marker(env["PE_TEST_MARKER"])
                         if cmdline(q).startswith(b"sh\0-c\0sleep 6")]
        # Each rank's shell has started its sleep: dash starts it with vfork, and a shell stopped
        # while its vfork child has not exec'd yet cannot stop until the child does (the child,
        # stopped too, shows the shell's command line: three "ranks", one not stopped).
        sleeps = lambda: [q for q in processes_with_marker(env["PE_TEST_MARKER"])
                          if cmdline(q) == b"sleep\x006\x00"]
        check(wait_until(lambda: len(ranks()) == 2 and len(sleeps()) == 2, 30),
              f"{extra}: the ranks did not start")
        p.send_signal(signal.SIGTSTP)
        all_stopped = lambda: len(ranks()) == 2 and all(stopped(q) for q in ranks())
        check(wait_until(lambda: stopped(p.pid) and all_stopped(), 10),
              f"{extra}: not stopped: pytorch_exec {stopped(p.pid)}, ranks "
              f"{[stopped(q) for q in ranks()]}")
        time.sleep(12 if extra else 1)  # past the daemons' 10 s for a silent front end
        check(p.poll() is None and all_stopped(), f"{extra}: went on")
        p.send_signal(signal.SIGCONT)
        out, err = p.communicate(timeout=60)
        check(p.returncode == 0 and sorted(out.split("\n")) == ["", "done 0", "done 1"],
              f"{extra}: exit {p.returncode}: {out} {err}")
        assert_no_leftovers(env["PE_TEST_MARKER"])


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


def test_time_limit_stops_the_job():
    """mpirun's --timeout (and MPIEXEC_TIMEOUT): the ranks get SIGTERM once the time is up, and
    pytorch_exec exits 124 with one line.  Also while it still waits for join-mode nodes, while
    a join-mode node waits for its host, and while nobody reads the job's output."""
    for how, source in ((["--timeout", "2"], "--timeout"), ([], "MPIEXEC_TIMEOUT")):
        out, n = tmpdir(), 2
        p, marker = launch(n, out, extra=how, env_extra=None if how else {"MPIEXEC_TIMEOUT": "2"})
        rc = p.wait(timeout=60)
        said = p.stderr.read().decode()
        check(rc == 124 and f"pytorch_exec: the job's time limit of 2 s was reached ({source}): "
              "stopping the job's 2 processes" in said, f"{how}: exit {rc}: {said!r}")
        check(got(out, n) == {0: "TERM", 1: "TERM"}, f"{how}: got {got(out, n)}")
        assert_no_leftovers(marker)
    env = marker_env({"PYTORCH_EXEC_RDZV_SECRET": "limit"})
    r = subprocess.run([EXEC, "--timeout", "1", "--nnodes", "2", "--rdzv-endpoint",
                        f"127.0.0.1:{free_port()}", "true"], env=env, capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 124 and r.stderr.endswith("(--timeout): stopping the job\n"),
          f"gathering: exit {r.returncode}: {r.stderr!r}")
    r = subprocess.run([EXEC, "--timeout", "1", "--nnodes", "2", "--rdzv-endpoint",
                        f"127.0.0.1:{free_port()}", "--rdzv-conf", "is_host=0", "true"], env=env,
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 124 and r.stderr.startswith(
        "pytorch_exec: the job's time limit of 1 s was reached (--timeout) before this node could "
        "join the rendezvous host"), f"joining: exit {r.returncode}: {r.stderr!r}")
    # Nobody reads the output: the limit still comes (the wait for the pipe gave way only to
    # signals, and the job ended when the reader did, 141).
    with reaped(start(["--timeout", "1", "-n", "1", "yes"], env=env, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE)) as p:
        t0 = time.monotonic()
        check(wait_until(lambda: p.poll() is not None, 30), "still running with its output unread")
        check(p.returncode == 124 and time.monotonic() - t0 < 20,
              f"unread output: exit {p.returncode} after {time.monotonic() - t0:.1f} s")
    # A rank failed and the others have a --failure-window longer than the limit: the limit cuts
    # the window short, and the job ends with the failure's status and report.
    t0 = time.monotonic()
    r = subprocess.run([EXEC, "--timeout", "2", "--failure-window", "60", "-n", "2", "sh", "-c",
                        "if [ $RANK = 1 ]; then exit 3; fi; exec sleep 60"], env=env,
                       capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    check(r.returncode == 3 and took < 20 and "reached (--timeout) during the --failure-window: "
          "stopping the job's 1 process" in r.stderr and "exited with status 3" in r.stderr,
          f"failure window: exit {r.returncode} after {took:.1f} s: {r.stderr!r}")
    for bad in (["--timeout", "x"], ["--timeout", "-1"]):
        r = subprocess.run([EXEC] + bad + ["true"], capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and "--timeout: expected a number of seconds" in r.stderr,
              f"{bad}: {r.returncode} {r.stderr!r}")


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
          test_sighup_reaches_every_worker, test_sigquit_reaches_every_worker,
          test_sigusr1_is_forwarded_and_the_job_goes_on,
          test_ctrl_z_stops_the_ranks_and_fg_continues_them, test_grace_then_sigkill,
          test_time_limit_stops_the_job,
          test_second_ctrl_c_kills_at_once])
