"""DataChannel (libpytorch_dc) as a torch.distributed backend.

    import torch.distributed as dist, pytorch_dc     # importing registers the backend "dc"
    dist.init_process_group("dc")                     # or "cpu:dc", "cpu:dc,cuda:nccl"

"dc" takes CUDA tensors too where cuda_support() (this build has torch's CUDA and libpytorch_dc's
GPU path, and PYTORCH_DC_CUDA is not 0): then it is registered for "cuda" as well, and
"cpu:dc,cuda:dc" and "cpu:gloo,cuda:dc" work.  Collectives on CUDA tensors follow the stream
semantics of ProcessGroupNCCL: see pytorch_dc(7).

The backend bootstraps through the store that init_process_group (or new_group) gives it, finds
which ranks share a machine (PYTORCH_DC_NODE, else PYTORCH_EXEC_NODEID, else the host), and runs
every collective on its own thread in the order they were issued.  See pytorch_dc(7).
"""
import atexit

import torch
import torch.distributed as dist

from pytorch_dc._C import DcBackend, _drain, cuda_support

__all__ = ["DcBackend", "cuda_support", "describe"]


def _create(store, rank, size, timeout):
    return DcBackend(store, rank, size, timeout)


def describe(group=None):
    """The dc backend of `group` (default: the world) in words: rank, nodes, transports, and the
    shm lanes of its node where there are several."""
    pg = group or dist.group.WORLD
    for dev in ("cpu", "cuda"):
        try:
            backend = pg._get_backend(torch.device(dev))
        except RuntimeError:  # no backend for that device ("cuda:dc" alone, "cpu:dc" alone)
            continue
        if isinstance(backend, DcBackend):
            return backend.describe()
    raise ValueError("pytorch_dc.describe: the group has no dc backend")


# A program that ends with collectives still queued (no destroy_process_group, no wait()): they
# finish, and their Futures' callbacks run, while Python can still run them (bounded by each
# group's timeout).  Registered after torch's own handlers, so it runs before them.
atexit.register(_drain)

if "dc" not in dist.Backend.backend_list:
    dist.Backend.register_backend("dc", _create,
                                  devices=["cpu", "cuda"] if cuda_support() else ["cpu"])
