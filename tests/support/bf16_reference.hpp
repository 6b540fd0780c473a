// An fp32 -> bf16 rounding reference written with arithmetic (not bit tricks), and the inputs
// that exercise a conversion: every tie, its neighbours, inf/NaN, subnormals, overflow, and
// random bit patterns. Shared by test_kernels (host) and test_cuda_kernels (cuda vs host).
#pragma once

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace zmuon::test {

inline float float_of_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline uint32_t bits_of_float(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

/// The bf16 bits nearest to finite or infinite x, ties to even, by arithmetic: x divided by the
/// bf16 spacing at its exponent (exact in double) is rounded to an integer with nearbyint under
/// FE_TONEAREST, so ties go to the even integer, i.e. the even last mantissa bit. Subnormals use
/// the spacing of the smallest exponent; results of magnitude 2^128 or more are inf. NaN inputs
/// have no single answer: the caller checks them by class (see is_bf16_nan).
inline uint16_t reference_bf16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isinf(x))
    return static_cast<uint16_t>(sign | 0x7f80);
  if (x == 0.0f)
    return sign;
  const double v = x;
  const int exponent = std::max(std::ilogb(v), -126);    // of x's leading bit; subnormals: -126
  const double spacing = std::ldexp(1.0, exponent - 7);  // bf16 keeps 7 fraction bits
  const int saved = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const double rounded = std::nearbyint(v / spacing) * spacing;
  std::fesetround(saved);
  if (std::fabs(rounded) >= std::ldexp(1.0, 128))
    return static_cast<uint16_t>(sign | 0x7f80);
  return static_cast<uint16_t>(bits_of_float(static_cast<float>(rounded)) >> 16);
}

inline bool is_bf16_nan(uint16_t b) {
  return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0;
}

/// fp32 inputs for a conversion test: for every upper half u of a finite or infinite float,
/// the tie (u, 0x8000) and its neighbours 0x7fff and 0x8001 and u itself; special values; NaNs
/// whose payload sits only in the low bits; `random` random bit patterns from `seed`.
inline std::vector<float> bf16_test_inputs(size_t random, uint64_t seed) {
  std::vector<float> in;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    if ((hi & 0x7f80) == 0x7f80 && (hi & 0x7f) != 0)
      continue;  // NaN upper halves: covered below
    for (uint32_t lo : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      in.push_back(float_of_bits((hi << 16) | lo));
  }
  for (uint32_t u : {0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7fc00000u, 0xffc00000u, 0x7fffffffu,
                     0x7f8000ffu, 0x7fbfffffu, 0x00000001u, 0x80000001u, 0x00008000u, 0x00018000u,
                     0x007fffffu, 0x7f7fffffu, 0x7f7f7fffu, 0x7f7f8000u, 0xff7f8000u})
    in.push_back(float_of_bits(u));
  std::mt19937_64 gen(seed);
  for (size_t i = 0; i < random; ++i)
    in.push_back(float_of_bits(static_cast<uint32_t>(gen())));
  return in;
}

}  // namespace zmuon::test
