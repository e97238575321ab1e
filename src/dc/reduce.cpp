#include "dc/reduce.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pytorch_exec::dc {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
    case DType::F16:
      return 2;
    case DType::BF16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
  }
  throw Error("unknown DType " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  static const char* names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
  return names[static_cast<int>(t)];
}

const char* op_name(Op o) {
  static const char* names[] = {"sum", "prod", "min", "max", "avg"};
  return names[static_cast<int>(o)];
}

namespace {

uint32_t bits_of(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

float float_of(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while (!(man & 0x400u));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  return float_of(bits);
}

uint16_t float_to_half(float f) {
  uint32_t x = bits_of(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (absx < 0x38800000u) {  // subnormal or zero in half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t man = (absx & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(absx >> 23);  // 14..24
    uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    uint32_t half_man = man >> shift;
    if (rem > mid || (rem == mid && (half_man & 1))) ++half_man;
    return static_cast<uint16_t>(sign | half_man);
  }
  uint32_t r = absx + 0xfffu + ((absx >> 13) & 1u) - ((127 - 15) << 23);  // round to nearest even
  return static_cast<uint16_t>(sign | (r >> 13));
}

float bf16_to_float(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

template <typename T, typename F>
void apply(void* dst, const void* src, size_t n, F f) {
  T* __restrict d = static_cast<T*>(dst);
  const T* __restrict s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = f(d[i], s[i]);
}

template <typename T>
void reduce_typed(void* dst, const void* src, size_t n, Op op) {
  switch (op) {
    case Op::Sum:
    case Op::Avg:
      return apply<T>(dst, src, n, [](T a, T b) { return static_cast<T>(a + b); });
    case Op::Prod:
      return apply<T>(dst, src, n, [](T a, T b) { return static_cast<T>(a * b); });
    case Op::Min:
      return apply<T>(dst, src, n, [](T a, T b) { return b < a ? b : a; });
    case Op::Max:
      return apply<T>(dst, src, n, [](T a, T b) { return b > a ? b : a; });
  }
}

// 16-bit floats: through f32, in blocks so the loops vectorize.
template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void reduce_16(void* dst, const void* src, size_t n, Op op) {
  constexpr size_t kBlock = 256;
  float a[kBlock], b[kBlock];
  auto* d = static_cast<uint16_t*>(dst);
  const auto* s = static_cast<const uint16_t*>(src);
  for (size_t off = 0; off < n; off += kBlock) {
    size_t m = std::min(kBlock, n - off);
    for (size_t i = 0; i < m; ++i) {
      a[i] = Load(d[off + i]);
      b[i] = Load(s[off + i]);
    }
    reduce_typed<float>(a, b, m, op);
    for (size_t i = 0; i < m; ++i) d[off + i] = Store(a[i]);
  }
}

}  // namespace

void reduce_into(void* dst, const void* src, size_t n, DType t, Op op) {
  switch (t) {
    case DType::F32:
      return reduce_typed<float>(dst, src, n, op);
    case DType::F64:
      return reduce_typed<double>(dst, src, n, op);
    case DType::I32:
      return reduce_typed<int32_t>(dst, src, n, op);
    case DType::I64:
      return reduce_typed<int64_t>(dst, src, n, op);
    case DType::U8:
      return reduce_typed<uint8_t>(dst, src, n, op);
    case DType::F16:
      return reduce_16<half_to_float, float_to_half>(dst, src, n, op);
    case DType::BF16:
      return reduce_16<bf16_to_float, float_to_bf16>(dst, src, n, op);
  }
}

void finish_avg(void* buf, size_t n, DType t, int k) {
  auto div = [k](auto* p, size_t m) {
    for (size_t i = 0; i < m; ++i)
      p[i] = static_cast<std::remove_reference_t<decltype(p[i])>>(p[i] / k);
  };
  switch (t) {
    case DType::F32:
      return div(static_cast<float*>(buf), n);
    case DType::F64:
      return div(static_cast<double*>(buf), n);
    case DType::I32:
      return div(static_cast<int32_t*>(buf), n);
    case DType::I64:
      return div(static_cast<int64_t*>(buf), n);
    case DType::U8:
      return div(static_cast<uint8_t*>(buf), n);
    case DType::F16:
    case DType::BF16: {
      auto* p = static_cast<uint16_t*>(buf);
      bool half = t == DType::F16;
      for (size_t i = 0; i < n; ++i) {
        float v = (half ? half_to_float(p[i]) : bf16_to_float(p[i])) / static_cast<float>(k);
        p[i] = half ? float_to_half(v) : float_to_bf16(v);
      }
      return;
    }
  }
}

}  // namespace pytorch_exec::dc
