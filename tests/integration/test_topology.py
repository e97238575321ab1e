"""Topology in pytorch_exec: --display-topology, --dry-run --display-map of other machines,
real binding (seen in /proc/<pid>/status), PYTORCH_EXEC_* locality variables, bad requests."""
import os
import re

import shutil
import subprocess

from harness import SRCDIR, check, cpu_list, main, run, skip, tmpdir

FIX = os.path.join(SRCDIR, "tests", "fixtures", "hwloc")
DUMP = ["sh", "-c", 'echo "$RANK|$PYTORCH_EXEC_DOMAIN|${PYTORCH_EXEC_CPUS-unset}|'
        '$(grep Cpus_allowed_list /proc/self/status | cut -f2)|${PYTORCH_EXEC_GPU-unset}"']


def fixture(name):
    return os.path.join(FIX, name + ".xml")


def test_display_topology_of_another_machine():
    r = run(["--display-topology", "--topology-file", fixture("power8-4xP100-nvlink")])
    check(r.returncode == 0, r.stderr)
    check("GPU0    X     NV2   SYS   SYS" in r.stdout, r.stdout)
    check("domain 1 (nvlink): GPUs 2 3" in r.stdout, r.stdout)
    # The environment variable names the file for display and dry runs too.
    r = run(["--display-topology"], env=dict(os.environ, PYTORCH_EXEC_TOPOLOGY_FILE=fixture("relion-x1904gt-2xP100-mlx5")))
    check("NICs mlx5_0 (PIX)" in r.stdout, r.stdout)


def test_nproc_per_node_auto_and_gpu_count_gpus():
    """torchrun's --nproc-per-node auto (one per GPU, else per processor) and gpu: on a DGX-2
    16 ranks (auto counted processors); cpu counts processors; gpu without GPUs is an error."""
    for v in ("auto", "gpu"):
        r = run(["--dry-run", "--nproc-per-node", v, "--topology-file",
                 fixture("dgx2-16xV100-nvswitch"), "./train"])
        check(r.returncode == 0 and r.stdout.startswith("Job map: 16 ranks on 1 node(s)"),
              f"{v}: {r.stdout[:200]} {r.stderr}")
    r = run(["--dry-run", "--nproc-per-node", "cpu", "./train"])
    check(r.stdout.startswith(f"Job map: {os.cpu_count()} ranks"), r.stdout[:200] + r.stderr)
    if not os.path.exists("/dev/nvidia0"):
        r = run(["--nproc-per-node", "gpu", "true"])
        check(r.returncode == 2 and "--nproc-per-node gpu: this machine has no GPUs" in r.stderr,
              r.stderr)
        r = run(["--nproc-per-node", "auto", "sh", "-c", "echo $WORLD_SIZE"])
        check(r.stdout.split() == [str(os.cpu_count())] * os.cpu_count(), r.stdout + r.stderr)


def test_dry_run_maps_a_dgx2_and_starts_nothing():
    r = run(["--dry-run", "-n", "8", "--gpus-per-rank", "2", "--topology-file", fixture("dgx2-16xV100-nvswitch"),
             "/no/such/program/needed"])
    check(r.returncode == 0, r.stderr)
    lines = [l for l in r.stdout.splitlines() if l.startswith("  rank ")]
    check(len(lines) == 8, r.stdout)
    check("rank 0 (local 0): GPU 0,1, domain 0, NIC none, cpus 0-1" in r.stdout, r.stdout)
    check("rank 7 (local 7): GPU 14,15, domain 0, NIC none, cpus 24-25" in r.stdout, r.stdout)


def test_dry_run_shows_rail_aligned_nics_and_the_gpu_levels():
    # Issue 18's machine: one NVLink island, each H100 behind its own switch and mlx5.
    r = run(["--dry-run", "-n", "4", "--topology-file", fixture("xe8640-4xH100-4xmlx5"), "./train"])
    check(r.returncode == 0, r.stderr)
    check("rank 1 (local 1): GPU 1, domain 0, NIC mlx5_2 (PIX), cpus" in r.stdout, r.stdout)
    check("rank 3 (local 3): GPU 3, domain 0, NIC mlx5_3 (PIX), cpus" in r.stdout, r.stdout)
    check("GPU levels: one NCCL communicator of all 4 ranks" in r.stdout, r.stdout)
    # Two Lassen nodes: NCCL per socket, shared memory across, one ring per shard across nodes.
    r = run(["--dry-run", "-H", "a:4,b:4", "--topology-file", fixture("lassen-ac922-4xV100-4xmlx5"), "./train"])
    check(r.returncode == 0, r.stderr)
    for line in ["level 1 (nccl) node 1 domain 1: ranks 6 7", "level 2 (shm) node 0 rail 1: ranks 1 3",
                 "level 3 (tcp/mpi) shard 1: ranks 2 (mlx5_2) 6 (mlx5_2)"]:
        check(line in r.stdout, r.stdout)
    r = run(["--display-topology", "--topology-file", fixture("lassen-ac922-4xV100-4xmlx5")])
    check("With one rank per GPU:" in r.stdout and "level 2 (shm) node 0 rail 0: ranks 0 2" in r.stdout,
          r.stdout)


def test_binding_is_real_and_announced():
    r = run(["-n", "2", "--bind-to", "core", "--report-bindings"] + DUMP)
    check(r.returncode == 0, r.stderr)
    rows = sorted(l.split("|") for l in r.stdout.splitlines())
    for rank, (rk, domain, cpus, allowed, gpu) in enumerate(rows):
        check(rk == str(rank) and domain == "0", f"{rows}")
        check(cpus == allowed, f"rank {rank}: PYTORCH_EXEC_CPUS={cpus} but the kernel says {allowed}")
        check(gpu == "unset", "PYTORCH_EXEC_GPU set on a machine without GPUs")
        check(re.search(rf"rank {rank} on \S+: GPU none, domain 0, NIC \S+, cpus {re.escape(cpus)}$",
                        r.stderr, re.M), r.stderr)
    # Rank 0 gets the first core we may use: its hardware threads, as the kernel lists them.
    first = min(os.sched_getaffinity(0))
    with open(f"/sys/devices/system/cpu/cpu{first}/topology/thread_siblings_list") as f:
        core0 = f.read().strip()
    check(rows[0][2] == core0, f"rank 0 bound to {rows[0][2]}, expected the first core = {core0}")
    if os.sched_getaffinity(0) - cpu_list(core0):
        check(rows[0][2] != rows[1][2], f"two ranks on one core with more cores free: {rows}")


def test_no_binding_by_default_without_gpus():
    r = run(["-n", "2"] + DUMP)
    check(r.returncode == 0, r.stderr)
    for row in r.stdout.splitlines():
        rk, domain, cpus, allowed, gpu = row.split("|")
        check(cpus == "unset", f"bound without being asked: {row}")


# Open MPI's mapping lines, run as they are under mpirun and under pytorch_exec on this machine:
# each rank's processors, as the kernel has them, must be the same.  (Lines where the two differ
# by design are in the man page: mpirun's default binding with 2 ranks or fewer is core, where
# pytorch_exec binds as the --map-by object says.)
MPIRUN_LINES = [
    ["-n", "2", "--map-by", "core"],
    ["-n", "2", "--map-by", "socket"],
    ["-n", "2", "--map-by", "SOCKET"],
    ["-n", "2", "--map-by", "l3cache"],
    ["--map-by", "ppr:1:core"],
    ["-n", "2", "--map-by", "ppr:2:socket", "--bind-to", "core"],
    ["-n", "1", "--map-by", "slot:PE=2"],
    ["-n", "1", "--map-by", "socket:PE=2"],
    ["-n", "1", "--map-by", "numa:PE=2"],
    ["-n", "1", "--map-by", "ppr:1:socket:PE=2"],
    ["-n", "2", "--map-by", "slot:PE=1"],
    ["-n", "2", "--bind-to", "hwthread"],
    ["-n", "2", "--bind-to", "socket"],
    ["-n", "2", "--bind-to", "core:overload-allowed"],
    ["-n", "2", "--map-by", "core", "--rank-by", "socket"],
    ["-n", "3", "--map-by", "core", "--oversubscribe"],
    ["-n", "3", "--map-by", "core", "--bind-to", "core:overload-allowed", "--oversubscribe"],
    ["-n", "3", "--map-by", "socket:oversubscribe"],
    ["-n", "1", "--map-by", "slot:PE=2", "--use-hwthread-cpus"],
    ["-c", "2", "--map-by", "core"],
    ["-n", "2", "--map-by", "socket:PE=1,oversubscribe"],
    ["-n", "2", "--map-by", "core:PE=1"],
    ["-n", "2", "--map-by", "numa"],
    ["-n", "2", "--bind-to-core"],
    ["-n", "2", "--bind-to-socket"],
]


def test_mapping_lines_bind_as_under_mpirun():
    """Each of MPIRUN_LINES under mpirun and under pytorch_exec: the same ranks on the same
    processors (Cpus_allowed_list) on this machine."""
    if not shutil.which("mpirun"):
        skip("mpirun not found (openmpi-bin)")
    cores = int(subprocess.run(["sh", "-c", "lscpu -p=core | grep -v '^#' | sort -u | wc -l"],
                               capture_output=True, text=True).stdout or 0)
    if cores != 2:
        skip(f"the lines are chosen for a machine of 2 cores; this one has {cores}")
    prog = ["sh", "-c", 'echo "${OMPI_COMM_WORLD_RANK}:$(grep Cpus_allowed_list /proc/self/status | cut -f2)"']
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for line in MPIRUN_LINES:
        want = subprocess.run(["mpirun"] + line + prog, capture_output=True, text=True, timeout=60, env=env)
        check(want.returncode == 0, f"mpirun {line}: {want.stderr}")
        got = run(line + prog)
        check(got.returncode == 0, f"pytorch_exec {line}: {got.stderr}")
        check(sorted(got.stdout.split()) == sorted(want.stdout.split()),
              f"{' '.join(line)}: mpirun {sorted(want.stdout.split())}, pytorch_exec {sorted(got.stdout.split())}")
    # --cpus-per-rank (mpirun's deprecated --cpus-per-proc) is numa:PE=n.
    got = run(["-n", "1", "--cpus-per-rank", "2"] + prog)
    check(got.stdout.split() == ["0:" + run(["-n", "1", "--map-by", "numa:PE=2"] + prog).stdout.split()[0][2:]],
          got.stdout + got.stderr)


# Lines whose placement on the real servers of tests/fixtures/hwloc must be mpirun's own:
# (ranks, args), for machines with at least `ranks` cores.
SERVER_LINES = [
    (8, ["--map-by", "socket"]),
    (8, ["--map-by", "core"]),
    (4, ["--map-by", "hwthread"]),
    (4, ["--map-by", "l3cache"]),
    (4, ["--map-by", "socket:PE=2"]),
    (4, ["--map-by", "numa:PE=2"]),
    (4, ["--map-by", "slot:PE=2"]),
    (4, ["--map-by", "ppr:2:socket:PE=2"]),
    (8, ["--map-by", "socket", "--bind-to", "core"]),
    (8, ["--map-by", "socket", "--bind-to", "numa"]),
    (4, ["--map-by", "core", "--bind-to", "socket"]),
    (4, ["--map-by", "hwthread", "--bind-to", "core"]),
    (8, ["--map-by", "ppr:4:socket", "--rank-by", "socket", "--bind-to", "core"]),
    (8, ["--map-by", "core", "--rank-by", "socket"]),
]


def mpirun_bindings(xml, line, pus):
    """{rank: [cpus]} of `mpirun --display-map` mapping for the machine `xml` (Open MPI reads it
    with HWLOC_XMLFILE; the program is true), or None where mpirun refuses the line."""
    env = dict(os.environ, HWLOC_XMLFILE=xml, HWLOC_THISSYSTEM="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # (The map is printed before anything starts; binding to processors this machine lacks then
    # fails, so mpirun's status says nothing: a refusal is a map without ranks.)
    r = subprocess.run(["mpirun", "--display-map"] + line + ["true"],
                       capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    got = {}
    for m in re.finditer(r"Process rank: (\d+) Bound: (.*)", r.stdout):
        mask = "".join(c for c in m.group(2)[m.group(2).rindex(":[") + 1:] if c in "B.")
        got[int(m.group(1))] = sorted(pus[i] for i, c in enumerate(mask) if c == "B")
    return got or None


def test_placement_on_real_servers_is_mpiruns():
    """SERVER_LINES on each real server: pytorch_exec --dry-run --topology-file and mpirun
    --display-map (reading the same hwloc XML) bind every rank to the same processors."""
    if not shutil.which("mpirun") or not shutil.which("lstopo-no-graphics"):
        skip("mpirun or lstopo-no-graphics not found (openmpi-bin, hwloc-nox)")
    compared = 0
    for name in sorted(os.listdir(FIX)):
        if not name.endswith(".xml"):
            continue
        xml = os.path.join(FIX, name)
        pus = [int(p) for p in re.findall(r"PU L#\d+ \(P#(\d+)\)", subprocess.run(
            ["lstopo-no-graphics", "-i", xml, "--only", "pu"], capture_output=True, text=True).stdout)]
        cores = int(subprocess.run(["lstopo-no-graphics", "-i", xml, "--only", "core"],
                                   capture_output=True, text=True).stdout.count("Core"))
        for n, line in SERVER_LINES:
            if n > cores:
                continue
            args = ["-n", str(n)] + line
            want = mpirun_bindings(xml, args, pus)
            r = run(["--dry-run", "--topology-file", xml] + args + ["true"])
            compared += 1
            if want is None:  # refused by mpirun (more cores asked than there are): here too
                check(r.returncode == 2 and len(r.stderr.splitlines()) == 1,
                      f"{name} {args}: mpirun refuses, pytorch_exec {r.returncode} {r.stdout[:300]}")
                continue
            check(r.returncode == 0, f"{name} {args}: {r.stderr}")
            got = {int(m.group(1)): sorted(cpu_list(m.group(2))) for m in re.finditer(
                r"rank (\d+) \(local \d+\): .*cpus (\S+)$", r.stdout, re.M)}
            check(got == want and len(got) == n,
                  f"{name} {' '.join(args)}:\n  mpirun       {want}\n  pytorch_exec {got}")
    check(compared >= 40, f"only {compared} lines compared")


def test_mpiruns_placement_on_real_servers():
    """--dry-run on real GPU servers: ranks dealt over sockets, ppr with PE cores, each rank's GPU
    near its socket."""
    r = run(["--dry-run", "--map-by", "ppr:4:socket:PE=8", "--topology-file",
             fixture("xe8640-4xH100-4xmlx5"), "./train"])
    check(r.returncode == 0 and r.stdout.startswith("Job map: 8 ranks on 1 node(s)"), r.stdout + r.stderr)
    for line in ["rank 0 (local 0): GPU 0, domain 0, NIC mlx5_0,mlx5_1 (PIX), cpus 0-7,112-119",
                 "rank 4 (local 4): GPU 2, domain 0, NIC mlx5_3 (SYS), cpus 56-63,168-175"]:
        check(line in r.stdout, r.stdout)
    r = run(["--dry-run", "-n", "4", "--map-by", "socket", "--bind-to", "core", "--topology-file",
             fixture("relion-x1904gt-2xP100-mlx5"), "./train"])
    check("rank 1 (local 1): GPU 1, domain 0, NIC mlx5_0 (PIX), cpus 18,54" in r.stdout, r.stdout + r.stderr)
    # On several nodes, ppr counts per node (the nodes taken to be like this one).
    r = run(["--dry-run", "-H", "a:64,b:64", "--npersocket", "3", "--topology-file",
             fixture("relion-x1904gt-2xP100-mlx5"), "./train"])
    check(r.stdout.startswith("Job map: 12 ranks on 2 node(s)"), r.stdout + r.stderr)


def test_topology_cache():
    """This machine's topology is kept in the cache directory (0600, named by host and
    fingerprint) at the first launch and used by the next; bindings and the map are the same as
    with the cache off; a damaged file is discovered and written anew; another fingerprint (a
    HWLOC_ variable) has a file of its own; a FIFO, a file in a directory others may write in,
    and HWLOC_XMLFILE are not used; PYTORCH_EXEC_TOPOLOGY_CACHE=0 keeps none."""
    home = tmpdir()
    cache = os.path.join(home, ".cache", "pytorch_exec")
    base = dict(os.environ, HOME=home)
    base.pop("XDG_CACHE_HOME", None)
    base.pop("PYTORCH_EXEC_TOPOLOGY_CACHE", None)
    line = ["-n", "2", "--bind-to", "core", "--display-map"] + DUMP

    def files():
        return sorted(f for f in os.listdir(cache)) if os.path.isdir(cache) else []

    def rows(r):
        check(r.returncode == 0, r.stderr)
        return sorted(r.stdout.splitlines())

    off = rows(run(line, env=dict(base, PYTORCH_EXEC_TOPOLOGY_CACHE="0")))
    check(files() == [], f"a cache with PYTORCH_EXEC_TOPOLOGY_CACHE=0: {files()}")
    first = rows(run(line, env=base))
    kept = files()
    check(len(kept) == 1 and re.fullmatch(r"topology-[\w.-]+-[0-9a-f]{16}\.xml", kept[0]), kept)
    path = os.path.join(cache, kept[0])
    check(os.stat(path).st_mode & 0o777 == 0o600 and os.stat(cache).st_mode & 0o777 == 0o700,
          f"modes {oct(os.stat(path).st_mode)} {oct(os.stat(cache).st_mode)}")
    mtime = os.stat(path).st_mtime_ns
    check(first == off and rows(run(line, env=base)) == off, f"{first} / {off}")
    check(os.stat(path).st_mtime_ns == mtime, "the cache was written again though it was there")
    with open(path, "w") as f:
        f.write("<topology")  # damaged
    check(rows(run(line, env=base)) == off, "a damaged cache changed the map")
    with open(path) as f:
        check("<topology" in f.read() and os.path.getsize(path) > 100, "the damaged cache stayed")
    other = rows(run(line, env=dict(base, HWLOC_PE_TEST_FINGERPRINT="1")))
    check(other == off and len(files()) == 2 and kept[0] in files(),
          f"another fingerprint: {files()} (was {kept})")
    # Not ours to trust: a FIFO at the file's place (it would block), a file in a directory
    # others may write in, a machine hwloc is told to read elsewhere (HWLOC_XMLFILE).
    os.unlink(path)
    os.mkfifo(path, 0o600)
    check(rows(run(line, env=base, timeout=30)) == off, "a FIFO as the cache")
    os.unlink(path)
    os.chmod(cache, 0o777)
    try:
        with open(path, "w") as f:
            f.write(open(fixture("relion-x1904gt-2xP100-mlx5")).read())
        check(rows(run(line, env=base)) == off, "a planted file in a directory others may write in")
    finally:
        os.chmod(cache, 0o700)
    relion = fixture("relion-x1904gt-2xP100-mlx5")
    dry = ["--dry-run", "-n", "4", "--map-by", "socket", "true"]
    want = run(dry, env=dict(base, PYTORCH_EXEC_TOPOLOGY_CACHE="0", HWLOC_XMLFILE=relion))
    got = run(dry, env=dict(base, HWLOC_XMLFILE=relion))
    check(got.returncode == 0 and got.stdout == want.stdout, f"{got.stdout} / {want.stdout}")


def test_bad_mapping_requests():
    cases = [
        (["--map-by", "diagonal", "true"], "--map-by: expected one of"),
        (["--bind-to", "board", "true"], "--bind-to: expected one of"),
        (["--map-by", "ppr:2", "true"], "--map-by: expected ppr:N:OBJECT"),
        (["--map-by", "core:PE=2", "true"], "PE=n gives each rank n cores of a wider object"),
        (["--map-by", "socket:span", "true"], "unknown modifier 'span'"),
        (["-n", "9", "--map-by", "ppr:1:socket", "true"], "places at most"),
        (["-n", "1", "--map-by", "slot:PE=64", "true"], "1 rank of 64 cores need 64"),
        (["-n", "3", "--map-by", "core", "--bind-to", "core", "true"], "use --bind-to core:overload-allowed"),
        (["--cpus-per-rank", "2", "--map-by", "hwthread", "true"], "--cpus-per-rank 2 with --map-by hwthread"),
        (["-n", "3", "--nooversubscribe", "true"], "no oversubscription allows at most"),
        (["--map-by", "socket:PE=1", "--bind-to", "socket", "true"], "contradicts it"),
        (["-machinefile_typo", "x", "true"], "unknown option -machinefile_typo"),
        (["--dry-run", "--map-by", "ppr:1:socket", "--topology-file", "/no/such.xml", "true"],
         "topology file '/no/such.xml'"),
        (["--rank-by", "x", "true"], "--rank-by"),
        (["--gpus-per-rank", "0", "true"], "--gpus-per-rank"),
        (["--topology-file", fixture("relion-x1904gt-2xP100-mlx5"), "true"], "describes another machine"),
        (["--dry-run", "--topology-file", "/no/such.xml", "true"], "topology file '/no/such.xml'"),
        (["--dry-run", "--gpus-per-rank", "3", "--topology-file", fixture("relion-x1904gt-2xP100-mlx5"), "true"],
         "has only 2 GPUs"),
    ]
    for args, text in cases:
        r = run(args)
        check(r.returncode == 2 and len(r.stderr.splitlines()) == 1 and text in r.stderr,
              f"{args}: {r.returncode} {r.stderr!r}")


if __name__ == "__main__":
    main([test_display_topology_of_another_machine, test_dry_run_maps_a_dgx2_and_starts_nothing,
          test_nproc_per_node_auto_and_gpu_count_gpus,
          test_binding_is_real_and_announced, test_no_binding_by_default_without_gpus,
          test_mapping_lines_bind_as_under_mpirun, test_placement_on_real_servers_is_mpiruns,
          test_mpiruns_placement_on_real_servers, test_topology_cache,
          test_bad_mapping_requests])
