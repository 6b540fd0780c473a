/* The same kind of host loop over zmuon's C ABI, in C: y = W x fitted to a fixed teacher, one
 * rank, Muon on W. Exits 1 unless the loss falls to a tenth of its start. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "zmuon/zmuon.h"

enum { OUT = 8, IN = 12, BATCH = 32, STEPS = 50 };

static float lcg(unsigned* s) { /* uniform in [-1, 1) */
  *s = *s * 1664525u + 1013904223u;
  return (float)((*s >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

static int check(int status) {
  if (status != ZMUON_OK)
    fprintf(stderr, "zmuon: %s: %s\n", zmuon_status_name(status), zmuon_last_error());
  return status;
}

int main(void) {
  static float teacher[OUT * IN], w[OUT * IN], gw[OUT * IN];
  unsigned seed = 3;
  for (int i = 0; i < OUT * IN; ++i)
    teacher[i] = lcg(&seed);

  zmuon_engine* eng = NULL;
  const char* overrides[] = {"zmuon.ranks=1", "optimizer.params.muon_lr=0.05"};
  if (check(zmuon_engine_create(NULL, overrides, 2, &eng)))
    return 1;
  int64_t shape[2] = {OUT, IN};
  if (check(zmuon_engine_add_parameter(eng, "w", shape, 2, ZMUON_GROUP_AUTO, 0, NULL, 0)))
    return 1;

  double first = 0, last = 0;
  for (int step = 1; step <= STEPS; ++step) {
    zmuon_tensor p = {"w", w, OUT * IN, ZMUON_HOST};
    if (check(zmuon_engine_gather_params(eng, &p, 1)))
      return 1;
    double loss = 0;
    for (int i = 0; i < OUT * IN; ++i)
      gw[i] = 0;
    for (int s = 0; s < BATCH; ++s) {
      float x[IN];
      for (int i = 0; i < IN; ++i)
        x[i] = lcg(&seed);
      for (int o = 0; o < OUT; ++o) {
        float e = 0;
        for (int i = 0; i < IN; ++i)
          e += (w[o * IN + i] - teacher[o * IN + i]) * x[i];
        loss += 0.5 * e * e / BATCH;
        for (int i = 0; i < IN; ++i)
          gw[o * IN + i] += e * x[i] / BATCH;
      }
    }
    zmuon_tensor g = {"w", gw, OUT * IN, ZMUON_HOST};
    zmuon_step_info info;
    if (check(zmuon_engine_reduce(eng, 0, &g, 1)) || check(zmuon_engine_step(eng, &info)))
      return 1;
    if (step == 1)
      first = loss;
    last = loss;
  }
  zmuon_engine_destroy(eng);
  printf("C ABI %s: loss %.6f -> %.6f\n", zmuon_version(), first, last);
  return last < 0.1 * first ? 0 : 1;
}
