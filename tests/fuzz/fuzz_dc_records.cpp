// libFuzzer target for the DataChannel bootstrap's record parser (parse_gathered in
// src/dc/bootstrap.cpp: the "<length>:<bytes>" records rank 0 joins into one store value).  The
// first byte picks the number of ranks; Error is the correct answer to garbage, and a parsed
// result must have exactly that many records, none longer than the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "dc/bootstrap.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  int ranks = 1 + data[0] % 16;
  std::string all(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    auto out = pytorch_exec::dc::parse_gathered(all, "g0/who/all", ranks);
    if (out.size() != static_cast<size_t>(ranks)) std::abort();
    for (auto& r : out)
      if (r.size() > all.size()) std::abort();
  } catch (const pytorch_exec::dc::Error&) {
  }
  return 0;
}
