"""The benchmarks still run (one short round each) and print their comparison.

This checks that bench/launch, bench/restart, bench/mpi_launch, bench/mpi_oversubscribe and
bench/allreduce/run work (and
that the allreduces they time give the right sums), not how fast anything is: timings are read by
people from the benchmarks' own output, never asserted in tests.
"""
import os
import shutil
import subprocess

from harness import EXEC, SRCDIR, check, main, skip


def bench(name, *args):
    env = dict(os.environ, PYTORCH_EXEC=EXEC)
    r = subprocess.run(["/usr/bin/python3", os.path.join(SRCDIR, "bench", name)] + list(args),
                       capture_output=True, text=True, env=env, timeout=300)
    check(r.returncode == 0, f"bench/{name} failed ({r.returncode}): {r.stdout}{r.stderr}")
    return r.stdout


def test_mpi_launch_benchmark_runs():
    if not shutil.which("mpicc"):
        skip("no mpicc for bench/mpi_launch")
    out = bench("mpi_launch", "--runs", "1", "--np", "2")
    check("ratio pytorch_exec -n 2 / mpirun -n 2" in out, out)


def test_mpi_oversubscribe_benchmark_runs():
    if not shutil.which("mpicc"):
        skip("no mpicc for bench/mpi_oversubscribe")
    out = bench("mpi_oversubscribe", "--runs", "1", "--np", "3", "--iters", "20")
    check("ratio pytorch_exec -n 3 / mpirun -n 3 --oversubscribe" in out, out)


def test_allreduce_benchmark_runs():
    if not shutil.which("mpicc"):
        skip("no mpicc for bench/allreduce/mpi_bench.c")
    out = bench("allreduce/run", "--quick")
    for line in ("# dc tcp", "# dc mpi", "# dc shm", "# dc shm 1 thread", "# p2p tcp",
                 "ratio dc tcp / MPI_Allreduce tcp busbw at >= 1 MiB:",
                 "dc tcp busbw / p2p tcp at >= 1 MiB:",
                 "dc tcp latency / MPI_Allreduce tcp at <= 8 KiB:",
                 "dc shm / MPI_Allreduce vader busbw at >= 1 MiB:",
                 "dc shm / dc shm 1 thread busbw at >= 1 MiB (its lanes):"):
        check(line in out, f"no '{line}' in: {out}")
    check(" n/a " not in out and "PROBLEM" not in out, out)


def test_launch_benchmark_runs():
    out = bench("launch", "--runs", "1", "--np", "4")
    check("ratio pytorch_exec -n 4 /bin/true / mpirun" in out, out)
    check("spawn_floor 4 /bin/true" in out and "floor: starting 4 processes" in out, out)


def test_restart_benchmark_runs():
    if not shutil.which("cc"):
        skip("no C compiler for bench/restart_worker.c")
    out = bench("restart", "--runs", "1")
    check("pytorch_exec median" in out, out)


if __name__ == "__main__":
    if not shutil.which("mpirun"):
        skip("mpirun not found (openmpi-bin)")
    main([test_launch_benchmark_runs, test_restart_benchmark_runs, test_mpi_launch_benchmark_runs,
          test_mpi_oversubscribe_benchmark_runs,
          test_allreduce_benchmark_runs])
