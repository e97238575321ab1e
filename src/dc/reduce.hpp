// Element-wise reduction kernels of the DataChannel: dst = dst OP src over n elements.  Written as
// plain loops over restrict pointers so that the compiler vectorizes them; f16 and bf16 are
// reduced in f32 and rounded back (round to nearest even).
#pragma once

#include <cstddef>
#include <cstdint>

#include "pytorch_exec/dc.hpp"

namespace pytorch_exec::dc {

// Avg reduces as Sum; finish_avg divides by the number of contributions afterwards.
void reduce_into(void* dst, const void* src, size_t n, DType t, Op op);
void finish_avg(void* buf, size_t n, DType t, int contributors);

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);

}  // namespace pytorch_exec::dc
