// The GPU path's contact with the CUDA runtime and NCCL: every call's status goes through
// check_cuda / check_nccl, which turn a failure into a dc::Error naming the call and the
// library's own description; and the mapping of DataChannel's types and operations onto NCCL's.
// Built only when configure finds CUDA and NCCL (HAVE_GPU_PATH).  Threads: any.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <string>

#include "pytorch_exec/dc.hpp"

namespace pytorch_exec::dc::gpu {

// "cudaMemcpyAsync: cudaErrorInvalidValue (invalid argument)".
std::string cuda_error_text(const char* call, cudaError_t e);
// "ncclAllReduce: unhandled system error (...NCCL's last error...)".
std::string nccl_error_text(const char* call, ncclResult_t r);

// Throw dc::Error with that text unless the call succeeded.
void check_cuda(cudaError_t e, const char* call);
void check_nccl(ncclResult_t r, const char* call);

// NCCL's names for DataChannel's element types and operations (every one has one; Avg is
// ncclAvg, which NCCL has had since 2.10).
ncclDataType_t nccl_type(DType t);
ncclRedOp_t nccl_op(Op o);

// NCCL before 2.29.7 leaves the last elements of a PreMulSum (ncclAvg, or an op made by
// ncclRedOpCreatePreMulSum) reduction on a one-rank communicator unwritten when the count does
// not split evenly over its one-rank kernel's blocks (min(32, ceil(bytes / 16 KiB)) blocks of
// count / blocks elements rounded down, then up to 16 bytes).  one_rank_split calls f(offset,
// count) for the elements such a call covers and, where a tail is left (fewer than 32
// elements, which one block covers), again for the tail, both in one NCCL group; otherwise once.
// `split`: the communicator has one rank and the op is PreMulSum.  Applied on every NCCL version
// (the second call costs a launch), so that each runs the same calls.
size_t one_rank_covered(size_t count, size_t elem_size);
ncclResult_t one_rank_split(bool split, size_t count, DType t,
                            const std::function<ncclResult_t(size_t, size_t)>& f);

}  // namespace pytorch_exec::dc::gpu
