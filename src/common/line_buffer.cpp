#include "common/line_buffer.hpp"

namespace pe {

std::string_view LineBuffer::append(const char* data, size_t len) {
  pending_.append(data, len);
  size_t nl = pending_.rfind('\n');
  size_t take = 0;
  if (nl != std::string::npos) {
    take = nl + 1;
  } else if (pending_.size() >= kMaxLine) {
    take = kMaxLine;
  }
  out_.assign(pending_, 0, take);
  pending_.erase(0, take);
  return out_;
}

std::string LineBuffer::take_rest() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace pe
