#include "exec/node/error_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <optional>

namespace pe {
namespace {

// Just enough JSON to find one string in untrusted text: values are skipped except the ones on
// the path looked for; nesting is bounded.
class JsonReader {
 public:
  explicit JsonReader(const std::string& s) : s_(s) {}

  // The string at key path["message"], or at ["message"]["message"].
  std::optional<std::string> message() {
    std::optional<std::string> found;
    if (!value(0, 0, found)) return std::nullopt;
    space();
    return i_ == s_.size() ? found : std::nullopt;
  }

 private:
  static constexpr int kMaxDepth = 64;

  // Parses one value; `level` is how many keys of the path "message" lead to it (1 or 2).
  bool value(int depth, int level, std::optional<std::string>& found) {
    if (depth > kMaxDepth) return false;
    space();
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '"') {
      std::string str;
      if (!string(str)) return false;
      if (level >= 1 && !found) found = std::move(str);
      return true;
    }
    if (c == '{') return object(depth, level, found);
    if (c == '[') {
      ++i_;
      space();
      if (peek(']')) return ++i_, true;
      for (;;) {
        std::optional<std::string> ignored;
        if (!value(depth + 1, 0, ignored)) return false;
        space();
        if (peek(']')) return ++i_, true;
        if (!peek(',')) return false;
        ++i_;
      }
    }
    size_t start = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) ||
                              s_[i_] == '-' || s_[i_] == '+' || s_[i_] == '.'))
      ++i_;
    return i_ > start;
  }

  bool object(int depth, int level, std::optional<std::string>& found) {
    ++i_;
    space();
    if (peek('}')) return ++i_, true;
    for (;;) {
      space();
      std::string key;
      if (!peek('"') || !string(key)) return false;
      space();
      if (!peek(':')) return false;
      ++i_;
      // Only the top level's "message", and its own "message" below it, are wanted.
      // (`level` counts the path's keys above this object; -1: off the path.)
      bool on_path = key == "message" && level == depth && level < 2;
      std::optional<std::string> inner;
      if (!value(depth + 1, on_path ? level + 1 : -1, on_path ? found : inner)) return false;
      space();
      if (peek('}')) return ++i_, true;
      if (!peek(',')) return false;
      ++i_;
    }
  }

  bool string(std::string& out) {
    ++i_;  // the opening quote
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) return false;
      char e = s_[i_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) return false;
          unsigned v = 0;
          for (int k = 0; k < 4; ++k) {
            char h = static_cast<char>(std::tolower(static_cast<unsigned char>(s_[i_++])));
            if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
            v = v << 4 | static_cast<unsigned>(h <= '9' ? h - '0' : h - 'a' + 10);
          }
          // UTF-8 of a character of the basic plane (a surrogate's half stays as it is).
          if (v < 0x80) {
            out += static_cast<char>(v);
          } else if (v < 0x800) {
            out += static_cast<char>(0xc0 | (v >> 6));
            out += static_cast<char>(0x80 | (v & 0x3f));
          } else {
            out += static_cast<char>(0xe0 | (v >> 12));
            out += static_cast<char>(0x80 | ((v >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (v & 0x3f));
          }
          break;
        }
        default: out += e;  // \" \\ \/
      }
    }
    return false;
  }

  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  bool peek(char c) const { return i_ < s_.size() && s_[i_] == c; }

  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace

std::string error_file_message(const std::string& json) {
  return JsonReader(json).message().value_or("");
}

std::string take_error_file(const std::string& path) {
  // The rank chose what is there: a regular file is read, without following a link or waiting
  // on a FIFO (the node agent's event loop must not block).
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    text.resize(1 << 20);
    size_t got = 0;
    for (ssize_t n; got < text.size() && (n = ::read(fd, &text[got], text.size() - got)) > 0;)
      got += static_cast<size_t>(n);
    text.resize(got);
  }
  ::close(fd);
  ::unlink(path.c_str());
  return error_file_message(text);
}

}  // namespace pe
