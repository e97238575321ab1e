"""The torch "dc" backend on CUDA tensors (torch_cuda_worker.py) under pytorch_exec, one rank per
visible GPU (at most 4; NCCL takes one rank per GPU): every collective against a host reference,
stream semantics (a side stream, wait(), isCompleted(), the Future, a recv), DDP with "dc"
against "nccl", and GPU work that outlasts the timeout failing the group; and two simulated
nodes of one rank each (PYTORCH_DC_NODE; on one GPU where there is one): the collectives and
stream semantics through the host-staged step across nodes.
Skips, saying why, without torch, without a GPU (torch.cuda.is_available()), or where the
extension has no CUDA support (pytorch_dc.cuda_support()).
"""
import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.environ.get("PE_SRCDIR", os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRCDIR, "tests", "integration"))

from harness import (BUILDDIR, TORCH_PYTHON, check, main, marker_env, need_torch, run,  # noqa: E402
                     skip)

WORKER = os.path.join(HERE, "torch_cuda_worker.py")
PKG = os.path.join(BUILDDIR, "python")


def env():
    e = marker_env()
    e["PYTHONPATH"] = PKG + os.pathsep + e.get("PYTHONPATH", "")
    return e


def probe():
    """(GPUs torch sees, whether dc takes CUDA tensors), or skips saying why."""
    r = subprocess.run([TORCH_PYTHON, "-c", "import torch, pytorch_dc; print("
                        "torch.cuda.device_count() if torch.cuda.is_available() else 0, "
                        "int(pytorch_dc.cuda_support()))"],
                       env=env(), capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"probing torch and pytorch_dc failed: {r.stderr[-2000:]}")
    gpus, support = (int(x) for x in r.stdout.split())
    if not gpus:
        skip("torch.cuda.is_available() is false: no GPU visible")
    if not support:
        skip("pytorch_dc has no CUDA support (built without torch's CUDA or the GPU path, "
             "or PYTORCH_DC_CUDA=0)")
    return gpus


def job(args, timeout=600, nodes=False):
    """One rank per GPU; nodes: two ranks as two simulated nodes (GPU LOCAL_RANK % GPUs)."""
    n = 2 if nodes else min(GPUS, 4)
    cmd = [TORCH_PYTHON, WORKER] + args
    if nodes:
        cmd = ["sh", "-c", "PYTORCH_DC_NODE=n$RANK exec " + " ".join(cmd)]
    r = run(["-n", str(n)] + cmd, env=env(), timeout=timeout)
    check(r.returncode == 0, f"{args} on {n} ranks failed ({r.returncode}): "
          f"{r.stdout}{r.stderr[-4000:]}")
    oks = [line for line in r.stdout.splitlines() if line.startswith("ok ")]
    check(len(oks) == n, f"{args}: {len(oks)} of {n} ranks said ok: {r.stdout}")
    print("   ", oks[0], flush=True)


def test_collectives_on_cuda_tensors():
    job(["collectives"])


def test_stream_semantics():
    job(["streams"])


def test_ddp_against_nccl():
    job(["ddp", "20"])


def test_gpu_work_past_its_timeout():
    job(["stall"], timeout=120)


def test_simulated_nodes_on_one_gpu():
    job(["collectives"], nodes=True)
    job(["streams"], nodes=True)


if __name__ == "__main__":
    need_torch()
    if not glob.glob(os.path.join(PKG, "pytorch_dc", "_C*.so")):
        skip(f"the dc extension was not built ({PKG}/pytorch_dc)")
    GPUS = probe()
    main([test_collectives_on_cuda_tensors, test_stream_semantics, test_ddp_against_nccl,
          test_gpu_work_past_its_timeout, test_simulated_nodes_on_one_gpu])
