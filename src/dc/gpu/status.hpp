// The GPU path's contact with the CUDA runtime and NCCL: every call's status goes through
// check_cuda / check_nccl, which turn a failure into a dc::Error naming the call and the
// library's own description; and the mapping of DataChannel's types and operations onto NCCL's.
// Built only when configure finds CUDA and NCCL (HAVE_GPU_PATH).  Threads: any.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

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

}  // namespace pytorch_exec::dc::gpu
