"""A real torch.distributed gloo job through env://, and a group restart under torch."""
import os
import re

from harness import SRCDIR, TORCH_PYTHON, check, main, need_torch, run, script

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


if __name__ == "__main__":
    need_torch()
    main([test_gloo_allreduce_four_ranks, test_gloo_wires_up_again_after_a_restart,
          test_record_names_the_exception_of_each_generation])
