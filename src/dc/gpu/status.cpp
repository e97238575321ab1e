#include "dc/gpu/status.hpp"

#include <algorithm>

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

size_t one_rank_covered(size_t count, size_t elem_size) {
  if (count == 0) return 0;
  size_t blocks = std::min<size_t>(32, (count * elem_size + (16 << 10) - 1) / (16 << 10));
  size_t pack = std::max<size_t>(1, 16 / elem_size);
  size_t per = (count / blocks + pack - 1) / pack * pack;
  return std::min(count, blocks * per);
}

ncclResult_t one_rank_split(bool split, size_t count, DType t,
                            const std::function<ncclResult_t(size_t, size_t)>& f) {
  size_t head = split ? one_rank_covered(count, dtype_size(t)) : count;
  if (head == count) return f(0, count);
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  r = f(0, head);
  if (r == ncclSuccess) r = f(head, count - head);
  ncclResult_t end = ncclGroupEnd();
  return r != ncclSuccess ? r : end;
}

}  // namespace pytorch_exec::dc::gpu
