"""Helpers shared by the benchmarks: find the binaries, time commands, summarise."""
import atexit
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def pytorch_exec():
    """PYTORCH_EXEC, else the in-tree build (build/ or the source tree), else PATH."""
    cands = [os.environ.get("PYTORCH_EXEC", ""),
             os.path.join(HERE, "..", "build", "src", "exec", "pytorch_exec"),
             os.path.join(HERE, "..", "src", "exec", "pytorch_exec"),
             os.path.join(os.getcwd(), "src", "exec", "pytorch_exec"),
             shutil.which("pytorch_exec") or ""]
    for c in cands:
        if c and os.access(c, os.X_OK) and not os.path.isdir(c):
            return os.path.abspath(c)
    sys.exit("bench: cannot find pytorch_exec; build it or set PYTORCH_EXEC")


def find_dc_bench(pe, explicit=""):
    """bench/allreduce's dc_bench: `explicit`, PE_DC_BENCH, else the build tree of `pe` or of
    this source tree; None when it is not built."""
    cands = [explicit or "", os.environ.get("PE_DC_BENCH", ""),
             os.path.join(os.path.dirname(pe), "..", "..", "bench", "allreduce", "dc_bench"),
             os.path.join(HERE, "..", "build", "bench", "allreduce", "dc_bench"),
             os.path.join(HERE, "allreduce", "dc_bench")]
    for c in cands:
        if c and os.access(c, os.X_OK) and not os.path.isdir(c):
            return os.path.abspath(c)
    return None


def torch_python():
    """The Python with torch: PE_TORCH_PYTHON, else the quick start's virtualenv
    (PYTORCH_EXEC_VENV, default /var/cache/pytorch_exec/venv-torch); None when it has no torch."""
    venv = os.environ.get("PYTORCH_EXEC_VENV") or "/var/cache/pytorch_exec/venv-torch"
    py = os.environ.get("PE_TORCH_PYTHON") or os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        return None
    ok = subprocess.run([py, "-c", "import torch.distributed.run"], capture_output=True).returncode == 0
    return py if ok else None


def mpirun_env():
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def timed(cmd, env, timeout):
    """Wall seconds of one run, or None if it did not finish within `timeout` (then its whole
    process group is killed)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        return None
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({p.returncode}): {err.decode()[-500:]}")
    return dt


def interleaved(variants, runs, warmup=1, timeout=30):
    """variants: {name: (cmd, env)}; runs them alternately; returns {name: [seconds]}.  A run
    that hangs past `timeout` is left out (report() counts it)."""
    for _ in range(warmup):
        for cmd, env in variants.values():
            timed(cmd, env, timeout)
    res = {k: [] for k in variants}
    for _ in range(runs):
        for name, (cmd, env) in variants.items():
            dt = timed(cmd, env, timeout)
            if dt is not None:
                res[name].append(dt)
    return res


def report(title, times, ours, theirs, budget, runs):
    """`runs`: the runs interleaved() made of each variant; the missing ones hung."""
    print(title)
    for name, ts in times.items():
        print(f"  {name:<44} median {statistics.median(ts) * 1e3:8.1f} ms   "
              f"min {min(ts) * 1e3:8.1f} ms   max {max(ts) * 1e3:8.1f} ms   ({len(ts)} runs)")
    for name, ts in times.items():
        if len(ts) < runs:
            print(f"  {name}: {runs - len(ts)} run(s) hung (no exit within the timeout; killed and left out)")
    ratio = statistics.median(times[ours]) / statistics.median(times[theirs])
    verdict = "within" if ratio <= budget else "OVER"
    print(f"  ratio {ours} / {theirs} = {ratio:.3f}  (budget <= {budget}: {verdict} budget)")
    return ratio


def core_copy():
    """bench/core_copy.c, built once into a temporary directory: a function of seconds that runs
    it and returns (median, fastest, slowest window) in microseconds to move 1 MiB between two
    processors (see core_copy.c), or None where it cannot run; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    tmp = tempfile.mkdtemp(prefix="pe_bench_core_copy_")
    atexit.register(shutil.rmtree, tmp, True)
    exe = os.path.join(tmp, "core_copy")
    r = subprocess.run([cc, "-O2", "-pthread", "-o", exe, os.path.join(HERE, "core_copy.c")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None

    def probe(seconds=0.3):
        out = subprocess.run([exe, str(seconds)], capture_output=True, text=True, timeout=60).stdout
        m = re.search(r"median (\d+) us \(windows: (\d+)\.\.(\d+)", out)
        return tuple(float(x) for x in m.groups()) if m else None
    return probe
