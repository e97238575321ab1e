"""mpi4py under pytorch_exec: hello and an allreduce."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
assert total == size * (size + 1) // 2, total
print(f"mpi4py rank {rank} of {size} sum {total}", flush=True)
