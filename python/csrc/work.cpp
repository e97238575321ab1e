// DcWork, and the tensor helpers of the backend: which DataChannel dtype and op a torch
// reduction maps to, and flat contiguous views of tensors.
#include <ATen/core/ivalue.h>

#include "backend.hpp"

namespace pytorch_dc {

namespace {

// The devices of a Future that completes with `ts`: a GPU's Future records events on its
// streams when marked completed, and makes the streams of whoever waits on it wait for them.
std::vector<c10::Device> devices(const std::vector<at::Tensor>& ts) {
  if (ts.empty() || !ts[0].is_cuda()) return {};
  return {ts[0].device()};
}

}  // namespace

void CompletionOrder::wait_turn(uint64_t ticket) {
  std::unique_lock<std::mutex> l(m_);
  cv_.wait_for(l, std::chrono::duration<double>(limit_), [&] { return next_ >= ticket; });
}

void CompletionOrder::done(uint64_t ticket) {
  {
    std::lock_guard<std::mutex> l(m_);
    next_ = std::max(next_, ticket + 1);
  }
  cv_.notify_all();
}

DcWork::DcWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
               std::shared_ptr<DeviceStage> stage, std::shared_ptr<CompletionOrder> order)
    : c10d::Work(rank, type, title),
      outputs_(std::move(outputs)),
      order_(std::move(order)),
      stage_(std::move(stage)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), devices(outputs_))) {
  // The Future's first callback, before any of the program's: the Work completes once its value
  // is there (so that after wait() it is), and the next collective's turn comes, whatever the
  // program's callbacks then do (they may wait for later collectives).  Run from complete(),
  // while this Work is alive.
  future_->addCallback(
      [this](c10::ivalue::Future& f) {
        // The callbacks that run on this thread were fixed when the Future was marked: one of
        // the program's among them needed getFuture() first.
        if (back_ && future_taken_.load()) back_ = false;
        if (back_) order_->returning.fetch_add(1);
        finish(f.hasError() ? f.exception_ptr() : nullptr);
        if (ticket_) order_->done(ticket_);
      },
      /*uses_future=*/false);
}

bool DcWork::wait(std::chrono::milliseconds timeout) {
  bool done = c10d::Work::wait(timeout);
  synchronize();
  return done;
}

void DcWork::synchronize() {
  if (!stage_) return;
  // The end event exists once the work is issued: until then, wait on
  // the host (without raising: wait() does).
  {
    std::unique_lock<std::mutex> l(issued_m_);
    issued_cv_.wait(l, [&] { return issued_; });
  }
  stage_->block_current_stream();
}

bool DcWork::isCompleted() { return c10d::Work::isCompleted() && (!stage_ || stage_->query()); }

bool DcWork::complete(std::exception_ptr error, int source, uint64_t ticket, bool back) {
  source_ = source;
  ticket_ = ticket;
  back_ = back;
  if (ticket) order_->wait_turn(ticket);
  {
    std::lock_guard<std::mutex> l(issued_m_);
    issued_ = true;
  }
  issued_cv_.notify_all();
  // The Work completes in the Future's first callback (see the constructor).
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
  return back_;  // as the first callback left it, on this thread
}

namespace {

dc::DType dtype_of(at::ScalarType s, const char* what) {
  switch (s) {
    case at::kFloat:
      return dc::DType::F32;
    case at::kDouble:
      return dc::DType::F64;
    case at::kHalf:
      return dc::DType::F16;
    case at::kBFloat16:
      return dc::DType::BF16;
    case at::kInt:
      return dc::DType::I32;
    case at::kLong:
      return dc::DType::I64;
    case at::kByte:
      return dc::DType::U8;
    default:
      throw std::invalid_argument(
          std::string("pytorch_dc: ") + what + ": dtype " + c10::toString(s) +
          " cannot be reduced (float32, float64, float16, bfloat16, int32, int64, uint8, int8, "
          "bool can)");
  }
}

dc::Op op_of(const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return dc::Op::Sum;
    case c10d::ReduceOp::PRODUCT:
      return dc::Op::Prod;
    case c10d::ReduceOp::MIN:
      return dc::Op::Min;
    case c10d::ReduceOp::MAX:
      return dc::Op::Max;
    case c10d::ReduceOp::AVG:
      return dc::Op::Avg;
    default:
      throw std::invalid_argument(std::string("pytorch_dc: ") + what +
                                  ": this ReduceOp is not supported (SUM, PRODUCT, MIN, MAX and "
                                  "AVG are)");
  }
}

}  // namespace

Reduction reduction_for(const at::Tensor& t, const c10d::ReduceOp& op, const char* what) {
  dc::Op o = op_of(op, what);
  if (t.scalar_type() == at::kBool) {  // or (sum, max) and and (product, min) over 0/1 bytes
    if (o == dc::Op::Avg)
      throw std::invalid_argument(std::string("pytorch_dc: ") + what + ": AVG of bool tensors");
    bool any = o == dc::Op::Sum || o == dc::Op::Max;
    return {dc::DType::U8, any ? dc::Op::Max : dc::Op::Min, at::kByte};
  }
  // int8 (which DataChannel lacks), and the average of uint8 (whose sum would wrap before the
  // division, as gloo refuses it): in int32.
  if (t.scalar_type() == at::kChar || (t.scalar_type() == at::kByte && o == dc::Op::Avg))
    return {dc::DType::I32, o, at::kInt};
  return {dtype_of(t.scalar_type(), what), o, t.scalar_type()};
}

size_t bytes_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

at::Tensor flat(const at::Tensor& t) { return t.contiguous().view({-1}); }

void copy_back(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.numel() == 0 || dst.data_ptr() == src.data_ptr()) return;
  dst.copy_(src.view(dst.sizes()));
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* what) {
  if (ts.size() != 1)
    throw std::invalid_argument(std::string("pytorch_dc: ") + what + ": expected one tensor, got " +
                                std::to_string(ts.size()));
  device_of(ts, what);
  return ts[0];
}

}  // namespace pytorch_dc
