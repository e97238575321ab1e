"""No orphans: SIGKILL pytorch_exec and every worker, and what the workers started, is gone; a
job killed whole (its orphan guard too) leaves its directories to the next job, which removes
them."""
import os
import signal
import subprocess

from harness import (EXEC, assert_no_leftovers, check, main, marker_env, processes_with_marker,
                     start, tmpdir, wait_until)


def test_sigkill_of_pytorch_exec_leaves_nothing():
    env = marker_env({"TMPDIR": tmpdir()})
    marker = env["PE_TEST_MARKER"]
    # Each worker starts two grandchildren in its process group, and one that leaves it (setsid).
    p = start(["-n", "4", "sh", "-c", "sleep 300 & setsid sleep 300 & wait"], env=env,
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    check(wait_until(lambda: len(processes_with_marker(marker)) >= 1 + 4 * 3, 30),
          f"only {len(processes_with_marker(marker))} processes started")
    check(os.listdir(env["TMPDIR"]), "pytorch_exec made no temporary directory (PMIx server)")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    assert_no_leftovers(marker, timeout=1.0)
    check(wait_until(lambda: not os.listdir(env["TMPDIR"]), 2.0),
          f"temporary files left behind: {os.listdir(env['TMPDIR'])}")


def test_ranks_started_from_several_threads():
    """A launch of many ranks starts them from several threads (child_process.hpp).  A child's
    PR_SET_PDEATHSIG fires when the *thread* that cloned it ends: the ranks live as long as the
    job does, and all die with a SIGKILLed pytorch_exec."""
    r = subprocess.run([EXEC, "-n", "24", "sh", "-c", "sleep 1; echo $RANK"], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    check(sorted(int(x) for x in r.stdout.split()) == list(range(24)), f"stdout {r.stdout!r}")
    env = marker_env({"TMPDIR": tmpdir()})
    marker = env["PE_TEST_MARKER"]
    p = start(["-n", "24", "sleep", "300"], env=env, stdout=subprocess.DEVNULL,
              stderr=subprocess.DEVNULL)
    check(wait_until(lambda: len(processes_with_marker(marker)) >= 1 + 24, 30),
          f"only {len(processes_with_marker(marker))} processes started")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    assert_no_leftovers(marker, timeout=1.0)


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


def test_daemons_in_sessions_of_their_own_end_with_the_ranks():
    """A rank's daemon (setsid: out of its process group) whose parent exited is killed, with
    what it started, when its generation has no rank left on the node: at a restart (generation
    1 sees none of generation 0's, also of one whose parent stayed in the rank's group until
    that was killed) and at the end; one that cleared PYTORCH_EXEC_JOBID is left alone."""
    env = marker_env()
    marker = env["PE_TEST_MARKER"]
    rank = ('sh -c "setsid sleep 30$TORCHELASTIC_RESTART_COUNT &"; '
            'G=$TORCHELASTIC_RESTART_COUNT; '
            'sh -c "setsid sh -c \\"sleep 3${G}5 & sleep 3${G}6\\" </dev/null & sleep 1000" & '
            # both ranks' three daemons started (on a busy machine a fork can come late, after
            # the generation's end: then it lives until the job's end, not the restart's)
            'if [ $G = 0 ]; then for i in $(seq 50); do '
            '[ $(pgrep -f "^sleep 30[056]" | wc -l) -ge 6 ] && break; sleep 0.1; done; fi; '
            'sleep 0.3; '
            '[ $TORCHELASTIC_RESTART_COUNT = 0 ] && exit 1; '
            # generation 0's are killed as generation 1 starts: a moment on a busy machine
            'for i in $(seq 50); do pgrep -f "^sleep 30[056]" >/dev/null || break; sleep 0.1; done; '
            'echo "left: $(pgrep -f "^sleep 30[056]" | wc -l)"; '
            'env -u PYTORCH_EXEC_JOBID setsid sleep 309 & sleep 0.3')
    r = subprocess.run([EXEC, "-n", "2", "--max-restarts", "1", "sh", "-c", rank],
                       env=env, capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and r.stdout.split("\n") == ["left: 0", "left: 0", ""],
          f"exit {r.returncode}: {r.stdout} {r.stderr}")
    try:
        check(wait_until(lambda: [comm_args(p) for p in processes_with_marker(marker)] ==
                         ["sleep 309"] * 2, 5),
              f"left: {[comm_args(p) for p in processes_with_marker(marker)]}")
    finally:
        for p in processes_with_marker(marker):
            os.kill(p, signal.SIGKILL)


def test_a_ranks_daemon_writes_on_after_the_rank_exits():
    """A rank's daemon (setsid) lives on while the node has ranks, and so does its output: its
    lines after the rank exited reach the terminal (as under mpirun).  They were dropped (the
    pipe closed at the rank's exit), and it died of SIGPIPE at its next line."""
    d = tmpdir()
    daemon = (f'for i in 1 2 3 4 5; do echo "daemon $i"; sleep 0.1; done; touch {d}/done')
    rank = (f'if [ $RANK = 0 ]; then setsid sh -c \'touch {d}/started; {daemon}\' & '
            f'while [ ! -e {d}/started ]; do sleep 0.01; done; exit 0; fi; '
            f'for i in $(seq 600); do [ -e {d}/done ] && break; sleep 0.05; done; echo rank 1 done')
    env = marker_env()
    r = subprocess.run([EXEC, "-n", "2", "sh", "-c", rank], env=env, capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 0 and r.stdout == "".join(f"daemon {i}\n" for i in range(1, 6)) +
          "rank 1 done\n", f"exit {r.returncode}: {r.stdout!r} {r.stderr!r}")
    assert_no_leftovers(env["PE_TEST_MARKER"])


def test_a_daemon_whose_parent_is_slow_to_die_ends_with_the_job():
    """The rank's daemon (setsid) is the child of a process in the rank's group that takes a
    while to die (it frees a large memory): that process's environment reads empty before the
    daemon comes to pytorch_exec, which must not take it for the last one and exit."""
    env = marker_env()
    marker = env["PE_TEST_MARKER"]
    ready = os.path.join(tmpdir(), "ready")
    prog = ("import subprocess, time\n"
            "b = b'x' * (256 << 20)\n"
            "subprocess.Popen(['setsid', 'sleep', '321'], stdin=subprocess.DEVNULL)\n"
            f"open('{ready}', 'w').close()\n"
            "time.sleep(1000)\n")
    rank = (f'python3 -c "{prog}" & '
            f'for i in $(seq 100); do [ -e {ready} ] && break; sleep 0.1; done; '
            f'[ -e {ready} ] || {{ echo "the daemon did not start"; exit 3; }}')
    try:
        r = subprocess.run([EXEC, "-n", "1", "sh", "-c", rank], env=env, capture_output=True,
                           text=True, timeout=60)
        check(r.returncode == 0, f"exit {r.returncode}: {r.stdout} {r.stderr}")
        check(wait_until(lambda: not processes_with_marker(marker), 1),
              f"left: {[comm_args(p) for p in processes_with_marker(marker)]}")
    finally:
        for p in processes_with_marker(marker):
            os.kill(p, signal.SIGKILL)


def comm_args(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().rstrip(b"\0").replace(b"\0", b" ").decode()
    except OSError:
        return ""


def marked_by(parent, pid):
    """The directories pytorch_exec.* in `parent` whose owner mark names `pid`."""
    found = []
    for e in os.listdir(parent):
        try:
            with open(os.path.join(parent, e, ".pytorch_exec_owner")) as f:
                if e.startswith("pytorch_exec.") and f.read().split()[1] == str(pid):
                    found.append(e)
        except (OSError, IndexError):
            pass
    return found


def test_a_later_job_removes_what_a_killed_one_left():
    # Every process of the job SIGKILLed at once (stopped first, so that none cleans up), the
    # orphan guard with them: their directories stay until the next job on the machine.
    env = marker_env({"TMPDIR": tmpdir()})
    marker = env["PE_TEST_MARKER"]
    p = start(["-n", "2", "sleep", "300"], env=env, stdout=subprocess.DEVNULL,
              stderr=subprocess.DEVNULL)
    check(wait_until(lambda: len(processes_with_marker(marker)) >= 1 + 1 + 2, 30),
          f"only {len(processes_with_marker(marker))} processes started")
    try:
        tmp = marked_by(env["TMPDIR"], p.pid)
        shm = marked_by("/dev/shm", p.pid) if os.path.isdir("/dev/shm") else []
        check(tmp, f"no marked directory of pytorch_exec in {env['TMPDIR']}: "
                   f"{os.listdir(env['TMPDIR'])}")
        pids = processes_with_marker(marker)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        p.wait(timeout=10)
        check(wait_until(lambda: not processes_with_marker(marker), 10), "processes left")
    finally:  # a failed check leaves no job behind
        for pid in processes_with_marker(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    check(marked_by(env["TMPDIR"], p.pid) == tmp, "the killed job's directory went already")
    env2 = marker_env({"TMPDIR": env["TMPDIR"]})
    r = subprocess.run([EXEC, "-n", "1", "true"], env=env2, capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0, f"the later job failed: {r.stderr}")
    check(not os.listdir(env["TMPDIR"]), f"left in the temporary directory after the later job: "
                                         f"{os.listdir(env['TMPDIR'])}")
    left = marked_by("/dev/shm", p.pid) if shm else []
    check(not left, f"left in /dev/shm after the later job: {left}")


if __name__ == "__main__":
    main([test_sigkill_of_pytorch_exec_leaves_nothing, test_ranks_started_from_several_threads,
          test_normal_end_leaves_nothing,
          test_daemons_in_sessions_of_their_own_end_with_the_ranks,
          test_a_ranks_daemon_writes_on_after_the_rank_exits,
          test_a_daemon_whose_parent_is_slow_to_die_ends_with_the_job,
          test_a_later_job_removes_what_a_killed_one_left])
