/* The job the C ABI test runs from C and from C++: its parameter table and a deterministic
 * pseudo-random value for every initial parameter and gradient element (C and C++ alike). */
#ifndef ZMUON_TESTS_C_API_DATA_H
#define ZMUON_TESTS_C_API_DATA_H

#include <stdint.h>

#define CJOB_PARAMS 3
#define CJOB_WORLD 2
#define CJOB_GAS 2
#define CJOB_STEPS 3

static const char* const cjob_names[CJOB_PARAMS] = {"attn.qkv.weight", "mlp.weight", "norm.bias"};
static const int64_t cjob_shapes[CJOB_PARAMS][2] = {{24, 10}, {10, 16}, {10, 1}};
static const int32_t cjob_ndim[CJOB_PARAMS] = {2, 2, 1};
static const int64_t cjob_heads[CJOB_PARAMS] = {3, 0, 0};

static inline int64_t cjob_numel(int p) {
  return cjob_ndim[p] == 2 ? cjob_shapes[p][0] * cjob_shapes[p][1] : cjob_shapes[p][0];
}

/* A value in [-1, 1) from a 64-bit mix of the key (splitmix64's finalizer). */
static inline float cjob_value(uint64_t key) {
  uint64_t z = key + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float)(z >> 40) / 8388608.0f - 1.0f;
}

static inline float cjob_init(int p, int64_t i) {
  return 0.1f * cjob_value(((uint64_t)p << 32) + (uint64_t)i);
}

static inline float cjob_grad(int step, int rank, int micro, int p, int64_t i) {
  uint64_t key = ((((uint64_t)step * 8 + (uint64_t)rank) * 8 + (uint64_t)micro) * 8 + (uint64_t)p);
  return cjob_value((key << 32) + (uint64_t)i + 0x5151);
}

/* The job's config: weight decay and clipping on, so that those paths count too. */
#define CJOB_CONFIG                                                               \
  "{\"gradient_clipping\": 1.0, \"optimizer\": {\"type\": \"Muon\", \"params\": " \
  "{\"muon_lr\": 0.02, \"adam_lr\": 0.001, \"weight_decay\": 0.1}}, \"zmuon\": {\"ranks\": 2}}"

#endif
