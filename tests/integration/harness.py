"""Shared helpers for the integration tests: run the built pytorch_exec against real programs.

Each test is a script run by `make check` (automake's test driver): exit 0 passes, 77 skips
(with the reason printed), anything else fails.  Every child run has a timeout.
"""
import atexit
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

EXEC = os.environ.get("PYTORCH_EXEC", "pytorch_exec")
SRCDIR = os.environ.get("PE_SRCDIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILDDIR = os.environ.get("PE_BUILDDIR", os.path.join(os.path.dirname(EXEC), "..", ".."))
# The DataChannel test program (tests/dc/dc_check), for the tests that run it under pytorch_exec.
DC_CHECK = os.path.join(BUILDDIR, "tests", "dc", "dc_check")
SYSTEM_PYTHON = "/usr/bin/python3"
# The Python with torch for the torch tests: PE_TORCH_PYTHON (configure --with-torch), else the
# quick start's virtualenv (PYTORCH_EXEC_VENV, default /var/cache/pytorch_exec/venv-torch).
TORCH_VENV = os.environ.get("PYTORCH_EXEC_VENV") or "/var/cache/pytorch_exec/venv-torch"
TORCH_PYTHON = os.environ.get("PE_TORCH_PYTHON") or os.path.join(TORCH_VENV, "bin", "python")
SKIP = 77


class TestFailure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise TestFailure(msg)


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


def torch_missing():
    """Why TORCH_PYTHON cannot run the torch tests, or None when it can."""
    if not os.access(TORCH_PYTHON, os.X_OK):
        return f"no torch: {TORCH_PYTHON} does not exist (./contrib/quickstart.sh creates it)"
    r = subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return f"{TORCH_PYTHON} has no torch with gloo ({r.stderr.strip().splitlines()[-1:]})"
    return None


def need_torch():
    reason = torch_missing()
    if reason:
        skip(reason)


def control_protocol():
    """ctrl::kProtocol, the first field of a control-plane challenge or hello: its version as
    pytorch_exec --version says it."""
    out = subprocess.run([EXEC, "--version"], capture_output=True, text=True).stdout
    return 0x50430000 | int(re.search(r"control protocol (\d+)", out).group(1))


def free_port(span=1):
    """A port P such that nothing listens on P..P+span-1 (the DataChannel's env:// store takes
    MASTER_PORT+1: span=2), chosen below the kernel's ephemeral range.  Binding port 0 would give
    an ephemeral port, which any outgoing connection on the machine (another test run beside
    this one) may take between this check and the program's bind."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    for _ in range(500):
        p = random.randrange(10000, max(10001, lo - span))
        socks = []
        try:
            for q in range(p, p + span):
                s = socket.socket()
                socks.append(s)
                s.bind(("0.0.0.0", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise TestFailure("no free port below the ephemeral range")


def marker_env(extra=None):
    """An environment carrying a unique marker, so leftover processes can be found."""
    env = dict(os.environ)
    env["PE_TEST_MARKER"] = uuid.uuid4().hex
    if extra:
        env.update(extra)
    return env


def run(args, timeout=120, env=None, stdin=subprocess.DEVNULL, input=None, cwd=None):
    """Runs pytorch_exec ARGS; returns CompletedProcess with text stdout/stderr."""
    kw = dict(capture_output=True, env=env, cwd=cwd, timeout=timeout)
    if input is not None:
        kw["input"] = input.encode() if isinstance(input, str) else input
    else:
        kw["stdin"] = stdin
    try:
        r = subprocess.run([EXEC] + list(args), **kw)
    except subprocess.TimeoutExpired as e:
        raise TestFailure(f"pytorch_exec {' '.join(args)} did not finish within {timeout} s") from e
    r.stdout = r.stdout.decode(errors="replace")
    r.stderr = r.stderr.decode(errors="replace")
    return r


def start(args, env=None, **kw):
    return subprocess.Popen([EXEC] + list(args), env=env, **kw)


def finish(procs, timeout=60):
    """Waits for every process: [(returncode, stdout, stderr)]; kills them all on a timeout."""
    out = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            try:
                o, e = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired as ex:
                raise TestFailure(f"a pytorch_exec did not finish within {timeout} s") from ex
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


class reaped:
    """`with reaped(start(...)) as p:` kills and reaps p if the block leaves it running."""

    def __init__(self, p):
        self.p = p

    def __enter__(self):
        return self.p

    def __exit__(self, *exc):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        return False


def processes_with_marker(marker):
    """PIDs of live (non-zombie) processes whose environment holds PE_TEST_MARKER=marker."""
    found = []
    needle = f"PE_TEST_MARKER={marker}".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{d}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            found.append(int(d))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def wait_until(pred, timeout, step=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def assert_no_leftovers(marker, timeout=2.0):
    ok = wait_until(lambda: not processes_with_marker(marker), timeout)
    left = processes_with_marker(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    check(ok, f"processes left behind: {left}")


_SCRATCH = tempfile.mkdtemp(prefix="pe_test_")
# pytorch_exec keeps this machine's topology in ~/.cache: the tests keep theirs in the scratch
# directory instead (test_topology sets its own to test the cache).
os.environ.setdefault("PYTORCH_EXEC_TOPOLOGY_CACHE", os.path.join(_SCRATCH, "topology-cache"))
atexit.register(shutil.rmtree, _SCRATCH, True)


def comm(pid):
    """The process's name (/proc/PID/comm), "" when it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def tmpdir():
    """A fresh directory, removed when the test script ends."""
    return tempfile.mkdtemp(dir=_SCRATCH)


def script(body, suffix=".sh"):
    """Writes an executable script into a temporary file; returns its path."""
    fd, path = tempfile.mkstemp(dir=_SCRATCH, suffix=suffix)
    with os.fdopen(fd, "w") as f:
        f.write(body)
    os.chmod(path, 0o755)
    return path


def cpu_list(text):
    """The set of CPUs in a kernel/hwloc list such as "0-3,8" (Cpus_allowed_list)."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def control_port(p):
    """Reads pytorch_exec -v's stderr until the control-plane line; returns (port, lines read)."""
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"control plane on port (\d+)", line)
        if m:
            return int(m.group(1)), seen
    raise AssertionError(f"no control-plane line: {seen}")


def main(tests):
    """Runs the test functions in order; prints one line each."""
    failed = 0
    for t in tests:
        t0 = time.monotonic()
        try:
            t()
            print(f"ok   {t.__name__} ({time.monotonic() - t0:.2f} s)", flush=True)
        except TestFailure as e:
            failed += 1
            print(f"FAIL {t.__name__}: {e}", flush=True)
    sys.exit(1 if failed else 0)
