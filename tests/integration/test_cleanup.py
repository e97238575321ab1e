"""Cleanup after abnormal ends: an Open MPI job using shared memory (vader) on 4 ranks leaves
nothing in /dev/shm or the temporary directories after MPI_Abort, a segfault, or SIGKILL of
pytorch_exec or of a daemon; a PMIx client's cleanup requests (PMIx_Job_control with PMIX_REGISTER_CLEANUP,
PMIX_REGISTER_CLEANUP_DIR, PMIX_CLEANUP_RECURSIVE) are carried out when it exits or crashes."""
import os
import re
import shutil
import signal
import subprocess

from harness import (SRCDIR, assert_no_leftovers, check, main, marker_env, run, skip, start,
                     tmpdir, wait_until)

MPI_SRC = os.path.join(SRCDIR, "tests", "mpi")
BIN = tmpdir()


def build():
    if not shutil.which("mpicc"):
        skip("mpicc not found (libopenmpi-dev)")
    r = subprocess.run(["mpicc", "-O1", "-o", os.path.join(BIN, "shm_job"),
                        os.path.join(MPI_SRC, "shm_job.c")], capture_output=True, text=True)
    check(r.returncode == 0, f"mpicc shm_job.c: {r.stderr}")
    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], capture_output=True, text=True)
    r = subprocess.run(["cc", "-o", os.path.join(BIN, "pmix_cleanup"),
                        os.path.join(MPI_SRC, "pmix_cleanup.c")] + pc.stdout.split(),
                       capture_output=True, text=True)
    check(pc.returncode == 0 and r.returncode == 0, f"cc pmix_cleanup.c: {pc.stderr} {r.stderr}")


def job_env():
    """A private TMPDIR, so that "the temporary directories hold nothing new" can be checked
    while other jobs run on the machine."""
    return marker_env({"TMPDIR": tmpdir()})


def check_nothing_left(out, env, what):
    paths = sorted(set(re.findall(r"^shm_job rank \d+ maps (\S+)$", out, re.M)))
    check(len(paths) >= 4, f"{what}: the ranks did not say which shared memory they use: {out}")
    segments = [p for p in paths if "/vader_segment." in p]
    check(len(segments) >= 4, f"{what}: no vader segments among {paths}")
    # Their own directory in /dev/shm (when pytorch_exec gave them one) goes too.
    dirs = {os.path.dirname(p) for p in paths if os.path.dirname(p) != "/dev/shm"}
    ids = {os.path.basename(p).rsplit(".", 1)[0] for p in segments}
    ok = wait_until(lambda: not any(os.path.exists(p) for p in paths + sorted(dirs)), 5)
    left = [p for p in paths + sorted(dirs) if os.path.exists(p)]
    left += [e for e in os.listdir("/dev/shm") if any(e.startswith(i) for i in ids)]
    check(ok and not left, f"{what}: left in /dev/shm: {left}")
    # The guard removes its directories once it has killed what was left (a moment, after a
    # SIGKILL of pytorch_exec).
    wait_until(lambda: not os.listdir(env["TMPDIR"]), 5)
    tmp = os.listdir(env["TMPDIR"])
    check(not tmp, f"{what}: left in the temporary directory: {tmp}")
    assert_no_leftovers(env["PE_TEST_MARKER"], timeout=5)


def test_abort_and_segfault_leave_no_shared_memory():
    for how, want in (("abort", 3), ("segv", 139), ("exit", 0)):
        # Where pytorch_exec puts the segments, and where Open MPI puts them itself (then PMIx's
        # cleanup requests remove them).
        for extra in ([], ["-x", "OMPI_MCA_btl_vader_backing_directory=/dev/shm"]):
            env = job_env()
            r = run(["-n", "4", "--kill-grace", "2"] + extra +
                    [os.path.join(BIN, "shm_job"), how], env=env, timeout=120)
            check(r.returncode == want, f"{how} {extra}: exit {r.returncode}: {r.stderr[-1500:]}")
            check_nothing_left(r.stdout, env, f"{how} {extra}")


def read_until_waiting(p, n):
    """The output of shm_job "hang" until its n ranks wait."""
    out = ""
    while out.count(" waiting\n") < n:
        line = p.stdout.readline()
        check(line, f"the job ended early: {out}")
        out += line
    return out


def test_killing_pytorch_exec_leaves_no_shared_memory():
    env = job_env()
    p = start(["-n", "4", os.path.join(BIN, "shm_job"), "hang"], env=env, stdout=subprocess.PIPE,
              stderr=subprocess.DEVNULL, text=True)
    try:
        out = read_until_waiting(p, 4)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    check_nothing_left(out, env, "SIGKILL of pytorch_exec")


def daemon_of(marker, node):
    """The pid of the pytorch_execd of `node` in the job carrying `marker`."""
    needle = f"PE_TEST_MARKER={marker}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if argv[0].endswith(b"pytorch_execd") and node.encode() in argv:
            return int(pid)
    raise AssertionError(f"daemon of node {node} not found")


def test_killing_a_daemon_leaves_no_shared_memory():
    """Two "nodes" on this machine, each with its daemon: the daemon of node b is killed; its
    orphan guard removes what its ranks left, the front end ends the job on node a."""
    env = job_env()
    marker = env["PE_TEST_MARKER"]
    agent = (f"env -i PATH=/usr/bin:/bin PE_TEST_MARKER={marker} TMPDIR={env['TMPDIR']} "
             "PE_NODE={host}")
    p = start(["-H", "a:4,b:4", "--launch-agent", agent, "-x", "OMPI_MCA_btl=self,vader,tcp",
               "-x", "OMPI_MCA_btl_tcp_if_include=lo", os.path.join(BIN, "shm_job"), "hang"],
              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = read_until_waiting(p, 8)
        os.kill(daemon_of(marker, "b"), signal.SIGKILL)
        rest, err = p.communicate(timeout=30)
        out += rest
        check(p.returncode != 0 and "node b: lost contact with its daemon" in err,
              f"exit {p.returncode}: {err[-1500:]}")
    finally:
        if p.poll() is None:
            p.kill()
    check_nothing_left(out, env, "SIGKILL of a daemon")


def test_pmix_cleanup_requests():
    """Each client's PMIX_REGISTER_CLEANUP requests run when it ends, normally or not; "held": a
    rank that dies while a process it left (in a session of its own, without pytorch_exec's
    marks) keeps its connection to the server open, so that the server never sees it drop: its
    requests run at the end of the job all the same (pytorch_exec ends without
    PMIx_server_finalize, which would run them; it deregisters the rank); "fence": the others are
    stopped while they wait in a fence."""
    for how, want in (("exit", 0), ("segv", 139), ("held", 139), ("fence", 139)):
        base = tmpdir()
        env = job_env()
        try:
            r = run(["-n", "3", "--kill-grace", "1", os.path.join(BIN, "pmix_cleanup"), base, how],
                    env=env, timeout=60)
        finally:
            held = os.path.join(base, "held.pid")
            if os.path.exists(held):
                try:
                    os.kill(int(open(held).read()), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
                os.unlink(held)
        check(r.returncode == want, f"{how}: exit {r.returncode}: {r.stderr[-1500:]}")
        check(r.stdout.count("registered") == 3, f"{how}: {r.stdout} {r.stderr[-1500:]}")
        left = sorted(os.path.join(d, f) for d, ds, fs in os.walk(base) for f in ds + fs)
        want_left = sorted(os.path.join(base, str(i)) for i in range(3))  # not registered
        check(left == want_left, f"{how}: left {left}, expected only {want_left}")


if __name__ == "__main__":
    build()
    main([test_abort_and_segfault_leave_no_shared_memory,
          test_killing_pytorch_exec_leaves_no_shared_memory,
          test_killing_a_daemon_leaves_no_shared_memory, test_pmix_cleanup_requests])
