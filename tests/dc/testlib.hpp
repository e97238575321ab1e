// Helpers of the DataChannel tests: ranks as threads, random inputs that are exact in their
// dtype, and an independent reference (in double, or in the integer type with its wrap-around).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dc/reduce.hpp"
#include "pytorch_exec/dc.hpp"

namespace dctest {

using namespace pytorch_exec::dc;
using Groups = std::vector<std::shared_ptr<ProcessGroup>>;

// Runs f(group, rank) on every rank at once; returns each rank's error ("" if none).
inline std::vector<std::string> errors_of(const Groups& g,
                                          const std::function<void(ProcessGroup&, int)>& f) {
  std::vector<std::string> errors(g.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < g.size(); ++i)
    th.emplace_back([&, i] {
      try {
        f(*g[i], static_cast<int>(i));
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : th) t.join();
  return errors;
}

// The same, but an exception on a rank fails the test.
inline void on_all(const Groups& g, const std::function<void(ProcessGroup&, int)>& f) {
  auto errors = errors_of(g, f);
  for (size_t i = 0; i < g.size(); ++i)
    if (!errors[i].empty()) ADD_FAILURE() << "rank " << i << ": " << errors[i];
}

// Value i of a buffer as double.
inline double get(const void* p, size_t i, DType t) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::F64:
      return static_cast<const double*>(p)[i];
    case DType::F16:
      return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::BF16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::I32:
      return static_cast<const int32_t*>(p)[i];
    case DType::I64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::U8:
      return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

inline void put(void* p, size_t i, DType t, double v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::F64:
      static_cast<double*>(p)[i] = v;
      break;
    case DType::F16:
      static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v));
      break;
    case DType::BF16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v));
      break;
    case DType::I32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DType::I64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DType::U8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
  }
}

inline bool is_float(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}

// Random input of `count` elements: small integers for integer types (so sums and products
// neither overflow nor lose anything), values near 1 for products of floats.
inline std::vector<char> random_input(size_t count, DType t, Op op, std::mt19937_64& rng) {
  std::vector<char> b(count * dtype_size(t) + 1);
  std::uniform_int_distribution<int> small(t == DType::U8 ? 0 : -3, 3);
  std::uniform_real_distribution<double> real(-4, 4), near1(0.5, 1.5);
  for (size_t i = 0; i < count; ++i)
    put(b.data(), i, t, !is_float(t) ? small(rng) : op == Op::Prod ? near1(rng) : real(rng));
  return b;
}

// The reduction of `in` (one buffer per rank) computed element by element in double, or in the
// integer type itself (u8 wraps as the library's does).
inline std::vector<double> reference(const std::vector<std::vector<char>>& in, size_t count,
                                     DType t, Op op) {
  std::vector<double> out(count);
  int n = static_cast<int>(in.size());
  for (size_t i = 0; i < count; ++i) {
    double acc = get(in[0].data(), i, t);
    int64_t iacc = static_cast<int64_t>(acc);
    for (int r = 1; r < n; ++r) {
      double v = get(in[static_cast<size_t>(r)].data(), i, t);
      switch (op) {
        case Op::Sum:
        case Op::Avg:
          acc += v;
          iacc += static_cast<int64_t>(v);
          break;
        case Op::Prod:
          acc *= v;
          iacc *= static_cast<int64_t>(v);
          break;
        case Op::Min:
          acc = std::min(acc, v);
          iacc = std::min<int64_t>(iacc, static_cast<int64_t>(v));
          break;
        case Op::Max:
          acc = std::max(acc, v);
          iacc = std::max<int64_t>(iacc, static_cast<int64_t>(v));
          break;
      }
    }
    if (t == DType::U8) iacc = static_cast<uint8_t>(iacc);
    if (!is_float(t))
      acc = static_cast<double>(op == Op::Avg ? iacc / n : iacc);
    else if (op == Op::Avg)
      acc /= n;
    out[i] = acc;
  }
  return out;
}

// How far a float result may be from the reference: rounding of every partial result.
inline double tolerance(DType t, Op op, int n, double ref, double abs_sum) {
  double eps = t == DType::F32   ? 1.2e-7
               : t == DType::F64 ? 2.3e-16
               : t == DType::F16 ? 9.8e-4
                                 : 7.9e-3;
  double scale = op == Op::Prod ? std::fabs(ref) : op == Op::Min || op == Op::Max ? 0 : abs_sum;
  return 2 * n * eps * scale + 1e-300;
}

// Checks `got` against the reference; returns the number of bad elements (reports the first).
inline size_t check_result(const void* got, const std::vector<std::vector<char>>& in, size_t count,
                           DType t, Op op) {
  auto ref = reference(in, count, t, op);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    double abs_sum = 0;
    for (auto& b : in) abs_sum += std::fabs(get(b.data(), i, t));
    double g = get(got, i, t);
    double tol = is_float(t) ? tolerance(t, op, static_cast<int>(in.size()), ref[i], abs_sum) : 0;
    if (std::fabs(g - ref[i]) > tol) {
      if (bad++ == 0)
        ADD_FAILURE() << dtype_name(t) << " " << op_name(op) << " count " << count << ": element "
                      << i << " is " << g << ", expected " << ref[i] << " (tolerance " << tol
                      << ")";
    }
  }
  return bad;
}

}  // namespace dctest
