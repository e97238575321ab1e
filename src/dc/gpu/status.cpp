#include "dc/gpu/status.hpp"

namespace pytorch_exec::dc::gpu {

std::string cuda_error_text(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

std::string nccl_error_text(const char* call, ncclResult_t r) {
  std::string s = std::string(call) + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) s += std::string(" (") + last + ")";
  return s;
}

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw Error(cuda_error_text(call, e));
}

void check_nccl(ncclResult_t r, const char* call) {
  if (r != ncclSuccess && r != ncclInProgress) throw Error(nccl_error_text(call, r));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
  }
  throw Error("nccl_type: unknown dtype " + std::to_string(static_cast<int>(t)));
}

ncclRedOp_t nccl_op(Op o) {
  switch (o) {
    case Op::Sum:
      return ncclSum;
    case Op::Prod:
      return ncclProd;
    case Op::Min:
      return ncclMin;
    case Op::Max:
      return ncclMax;
    case Op::Avg:
      return ncclAvg;
  }
  throw Error("nccl_op: unknown op " + std::to_string(static_cast<int>(o)));
}

}  // namespace pytorch_exec::dc::gpu
