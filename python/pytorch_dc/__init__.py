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
import os

import torch
import torch.distributed as dist

from pytorch_dc._C import DcBackend, _drain, cuda_support

__all__ = ["DcBackend", "cuda_support", "describe"]


def _flight_recorder():
    """Whether torch records this group's dc collectives in its flight recorder.  Torch 2.15 and
    later attach a generic recorder to each group whose backends do not record by themselves: a
    Python traceback per collective, about 3 us a call, kept in a ring that nothing reads unless
    the program dumps it.  Its dc entries are retired when issued (dc has no completion hook), so
    a dump cannot show a collective that hangs; dc's collectives end in an error that names them
    within the group's timeout instead.  dc groups go without it unless the program asks for
    flight recording (TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE set): then torch
    decides, as for any backend.  Decided when each group is made (torch attaches the recorder
    right after it made the group's backends)."""
    own = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if not isinstance(own, set):  # a torch without the generic recorder
        return
    if os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE"):
        own.discard("dc")
    else:
        own.add("dc")  # torch's recorder leaves a group alone whose backends are all in here


def _create(store, rank, size, timeout):
    _flight_recorder()
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
