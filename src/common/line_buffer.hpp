// Splits a byte stream into whole lines.  Used for every rank's stdout and stderr so that a
// line is always written out whole, never mixed with another rank's.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pe {

class LineBuffer {
 public:
  // A line longer than this without a newline is passed on in pieces of this size.
  static constexpr size_t kMaxLine = 1 << 20;

  // Appends data; returns the longest prefix of buffered data that ends with '\n' (possibly
  // several lines), or a forced piece of kMaxLine bytes.  The view is valid until the next call.
  std::string_view append(const char* data, size_t len);
  // At EOF: the partial last line (without a newline), emptied.
  std::string take_rest();
  bool empty() const { return pending_.empty(); }

 private:
  std::string pending_;
  std::string out_;
};

}  // namespace pe
