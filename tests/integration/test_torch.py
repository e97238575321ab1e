"""A real torch.distributed gloo job through env://, and a group restart under torch."""
import os
import re
import subprocess
import time

from harness import (EXEC, SRCDIR, TORCH_PYTHON, assert_no_leftovers, check, finish, free_port,
                     main, marker_env, need_torch, run, script, start, tmpdir)

EXAMPLE = os.path.join(SRCDIR, "examples", "hello_allreduce.py")

FLAKY = script("""#!/usr/bin/env python3
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, restart = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if rank == 1 and restart == 0:
    sys.exit(9)
t = torch.ones(3) * (rank + 1)
dist.all_reduce(t)
print(f"rank {rank} restart {restart} sum {t.tolist()}", flush=True)
dist.destroy_process_group()
""", ".py")

RECORD = script("""#!/usr/bin/env python3
import os, time
from torch.distributed.elastic.multiprocessing.errors import record
@record
def main():
    rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"rank {rank} restart {restart} nccl {os.environ['TORCH_NCCL_ASYNC_ERROR_HANDLING']}",
          flush=True)
    if (rank, restart) == (1, 0):
        raise ValueError("first generation's error\\nsecond line")
    if (rank, restart) == (0, 1):
        raise RuntimeError("second generation's error")
    time.sleep(60)
main()
""", ".py")


def test_gloo_allreduce_four_ranks():
    r = run(["-n", "4", TORCH_PYTHON, EXAMPLE], timeout=240)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    for i in range(4):
        check(f"rank {i} of 4 (local rank {i} of 4)" in r.stdout, f"rank {i} missing:\n{r.stdout}")
    check("allreduce over 4 ranks: [6.0, 10.0, 14.0, 18.0] (correct)" in r.stdout, r.stdout)


def test_gloo_wires_up_again_after_a_restart():
    r = run(["-n", "2", "--max-restarts", "1", TORCH_PYTHON, FLAKY], timeout=240)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    for i in range(2):
        check(f"rank {i} restart 1 sum [3.0, 3.0, 3.0]" in r.stdout, r.stdout)
    check("rank 1 (pid" in r.stderr and "exited with status 9; restarting" in r.stderr, r.stderr)


def test_record_names_the_exception_of_each_generation():
    """As torchrun: TORCHELASTIC_ERROR_FILE, where torch's @record writes the exception."""
    r = run(["-n", "2", "--max-restarts", "1", TORCH_PYTHON, RECORD], timeout=240)
    check(r.returncode == 1, f"exit {r.returncode}: {r.stderr}")
    check("rank 0 restart 1 nccl 1" in r.stdout, r.stdout)
    check(re.search(r"rank 1 \(pid \d+ on \S+\) exited with status 1: ValueError: first "
                    r"generation's error; restarting", r.stderr), r.stderr)
    # The report names this generation's exception, not the file of the one before.
    check(re.search(r"pytorch_exec: rank 0 \(pid \d+ on \S+\) exited with status 1: "
                    r"RuntimeError: second generation's error\n", r.stderr), r.stderr)


def test_torchruns_log_options_side_by_side():
    """One torchrun line, with its logging options, run by torchrun and by pytorch_exec: the
    same lines on the terminal and the same files, with the same contents, in the run
    directory (torchtitan's run_train.sh uses --local-ranks-filter, --role and --tee)."""
    opts = ["--nproc_per_node=3", "--rdzv_backend", "c10d", "--rdzv_endpoint=localhost:0",
            "--rdzv-id", "titan", "--local-ranks-filter", "0,2", "--role", "rank",
            "--tee", "0:3,1:1", "-r", "2:2", "--log-line-prefix-template", "${role_name}:${rank}|"]
    prog = ["--no-python", "sh", "-c",
            'echo "out $RANK $ROLE_NAME $ROLE_RANK"; echo "err $RANK" >&2']
    got = {}
    for name, cmd in (("torchrun", [TORCH_PYTHON, "-m", "torch.distributed.run"]),
                      ("pytorch_exec", [EXEC])):
        base = os.path.join(tmpdir(), "logs")
        r = subprocess.run(cmd + opts + ["--log-dir", base] + prog, capture_output=True,
                           text=True, timeout=180, stdin=subprocess.DEVNULL)
        check(r.returncode == 0, f"{name}: exit {r.returncode}: {r.stderr}")
        runs = os.listdir(base)
        check(len(runs) == 1 and runs[0].startswith("titan_"), f"{name}: {runs}")
        files = {}
        for root, _, names in os.walk(os.path.join(base, runs[0])):
            for f in names:
                with open(os.path.join(root, f)) as fh:
                    files[os.path.relpath(os.path.join(root, f), os.path.join(base, runs[0]))] = fh.read()
        # The ranks' lines (not the launchers' own: torchrun's warnings, pytorch_exec's run
        # directory).
        err = [ln for ln in r.stderr.splitlines() if re.search(r"err \d$", ln)]
        got[name] = (sorted(r.stdout.splitlines()), sorted(err), files)
    check(got["torchrun"] == got["pytorch_exec"], f"torchrun {got['torchrun']}\n"
          f"pytorch_exec {got['pytorch_exec']}")
    check(got["torchrun"][0] == ["out 2 rank 2", "rank:0|out 0 rank 0"], got["torchrun"])


def test_two_launchers_on_one_machine_are_two_nodes():
    """torchrun's way to try a multi-node job on one machine: the same command twice (c10d:
    the first binds the endpoint and hosts the job, the second finds it taken and joins;
    static: node ranks 0 and 1).  They make a job of two nodes (the second was refused as 'a
    second pytorch_exec on that host', or failed to bind the endpoint)."""
    prog = os.path.join(SRCDIR, "examples", "hello_allreduce.py")
    env = marker_env({"PYTORCH_EXEC_RDZV_SECRET": "one machine"})
    for style in ("c10d", "static"):
        port = free_port()
        common = ["--nnodes", "2", "--nproc-per-node", "2", "--join-timeout", "30"]
        if style == "c10d":
            args = [common + ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "pair"]] * 2
        else:
            args = [common + ["--master-addr", "127.0.0.1", "--master-port", str(port),
                              "--node-rank", str(i)] for i in (0, 1)]
        procs = []
        for a in args:
            procs.append(start(a + [TORCH_PYTHON, prog], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True))
            time.sleep(0.5)
        res = [(out, err) for _, out, err in finish(procs, timeout=180)]
        for p, (out, err) in zip(procs, res):
            check(p.returncode == 0, f"{style}: exit {p.returncode}: {out} {err[-2000:]}")
        check("allreduce over 4 ranks: [6.0, 10.0, 14.0, 18.0] (correct)" in res[0][0],
              f"{style}: {res[0][0]}")
        ranks = sorted(int(r) for out, _ in res for r in re.findall(r"rank (\d) of 4", out))
        check(ranks == [0, 1, 2, 3] and "complete: 2 node(s)" in res[0][1], f"{style}: {res}")
        assert_no_leftovers(env["PE_TEST_MARKER"], timeout=10)


if __name__ == "__main__":
    need_torch()
    main([test_gloo_allreduce_four_ranks, test_gloo_wires_up_again_after_a_restart,
          test_record_names_the_exception_of_each_generation,
          test_torchruns_log_options_side_by_side,
          test_two_launchers_on_one_machine_are_two_nodes])
