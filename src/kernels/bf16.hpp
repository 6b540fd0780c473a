// fp32 <-> bf16 element conversion, as bit operations shared by the host backend and the CUDA
// kernels (the same function compiles for both, so both backends give the same bits). bf16 is
// stored as its 16 bits in a uint16_t: the upper half of the fp32 encoding.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define ZMUON_HOST_DEVICE __host__ __device__
#else
#define ZMUON_HOST_DEVICE
#endif

namespace zmuon {

/// The bits of a bf16 value.
using bf16_bits = uint16_t;

ZMUON_HOST_DEVICE inline uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

ZMUON_HOST_DEVICE inline float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/// Round to nearest, ties to even. Finite values that round past the largest bf16 become inf;
/// subnormals round like any other value (no flush to zero); NaN stays NaN (sign and the upper
/// payload bits kept, the quiet bit set, so that a NaN whose payload sits only in the low 16
/// bits does not turn into inf).
ZMUON_HOST_DEVICE inline bf16_bits to_bf16(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<bf16_bits>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<bf16_bits>((u + 0x7fffu + lsb) >> 16);
}

/// Exact: every bf16 value is an fp32 value.
ZMUON_HOST_DEVICE inline float from_bf16(bf16_bits b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

}  // namespace zmuon
