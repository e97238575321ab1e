"""DataChannel (libpytorch_dc) as a torch.distributed backend.

    import torch.distributed as dist, pytorch_dc     # importing registers the backend "dc"
    dist.init_process_group("dc")                     # or "cpu:dc", "cpu:dc,cuda:nccl"

The backend bootstraps through the store that init_process_group (or new_group) gives it, finds
which ranks share a machine (PYTORCH_DC_NODE, else PYTORCH_EXEC_NODEID, else the host), and runs
every collective on its own thread in the order they were issued.  See pytorch_dc(7).
"""
import torch
import torch.distributed as dist

from pytorch_dc._C import DcBackend

__all__ = ["DcBackend", "describe"]


def _create(store, rank, size, timeout):
    return DcBackend(store, rank, size, timeout)


def describe(group=None):
    """The dc backend of `group` (default: the world) in words: rank, nodes, transports."""
    pg = group or dist.group.WORLD
    return pg._get_backend(torch.device("cpu")).describe()


if "dc" not in dist.Backend.backend_list:
    dist.Backend.register_backend("dc", _create, devices=["cpu"])
