/* The C side of test_c_api: compiled as C99 against zmuon/zmuon.h only. cjob_run() trains the
 * job of c_api_data.h through the C ABI; cjob_bad_calls() makes wrong calls and records what
 * came back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/c_api_data.h"
#include "zmuon/zmuon.h"

/* Runs the job; `out` receives the final parameters, concatenated in table order. */
int cjob_run(float* out, zmuon_step_info* last_info) {
  zmuon_engine* eng = NULL;
  int st = zmuon_engine_create(CJOB_CONFIG, NULL, 0, &eng);
  if (st != ZMUON_OK)
    return st;
  float* buf[CJOB_PARAMS] = {NULL, NULL, NULL};
  for (int p = 0; p < CJOB_PARAMS && st == ZMUON_OK; ++p) {
    buf[p] = malloc(sizeof(float) * (size_t)cjob_numel(p));
    for (int64_t i = 0; i < cjob_numel(p); ++i)
      buf[p][i] = cjob_init(p, i);
    st = zmuon_engine_add_parameter(eng, cjob_names[p], cjob_shapes[p], cjob_ndim[p],
                                    ZMUON_GROUP_AUTO, cjob_heads[p], buf[p], cjob_numel(p));
  }
  zmuon_tensor t[CJOB_PARAMS];
  for (int s = 1; s <= CJOB_STEPS && st == ZMUON_OK; ++s) {
    for (int k = 0; k < CJOB_GAS && st == ZMUON_OK; ++k)
      for (int r = 0; r < CJOB_WORLD && st == ZMUON_OK; ++r) {
        for (int p = 0; p < CJOB_PARAMS; ++p) {
          for (int64_t i = 0; i < cjob_numel(p); ++i)
            buf[p][i] = cjob_grad(s, r, k, p, i);
          t[p].name = cjob_names[p];
          t[p].data = buf[p];
          t[p].numel = cjob_numel(p);
          t[p].device = ZMUON_HOST;
        }
        st = zmuon_engine_reduce(eng, r, t, CJOB_PARAMS);
      }
    if (st == ZMUON_OK)
      st = zmuon_engine_step(eng, last_info);
  }
  size_t offset = 0;
  for (int p = 0; p < CJOB_PARAMS; ++p) {
    t[p].name = cjob_names[p];
    t[p].data = out + offset;
    t[p].numel = cjob_numel(p);
    t[p].device = ZMUON_HOST;
    offset += (size_t)cjob_numel(p);
  }
  if (st == ZMUON_OK)
    st = zmuon_engine_gather_params(eng, t, CJOB_PARAMS);
  for (int p = 0; p < CJOB_PARAMS; ++p)
    free(buf[p]);
  zmuon_engine_destroy(eng);
  return st;
}

/* What one wrong call returned. */
typedef struct cjob_outcome {
  int status;
  char message[512];
} cjob_outcome;

static void record(cjob_outcome* o, int status) {
  o->status = status;
  snprintf(o->message, sizeof o->message, "%s", status == ZMUON_OK ? "" : zmuon_last_error());
}

/* Fills `o[0..8]` with the outcomes of nine wrong calls (the test knows which is which). */
int cjob_bad_calls(cjob_outcome* o) {
  zmuon_engine* eng = NULL;
  record(&o[0],
         zmuon_engine_create("{\"optimizer\": {\"params\": {\"momentun\": 0.9}}}", NULL, 0, &eng));
  record(&o[1], zmuon_engine_create("{\"zmuon\": ", NULL, 0, &eng));
  const char* bad_override = "zmuon.rank=2";
  record(&o[2], zmuon_engine_create(NULL, &bad_override, 1, &eng));
  int st = zmuon_engine_create("{\"zmuon\": {\"ranks\": 1}}", NULL, 0, &eng);
  if (st != ZMUON_OK)
    return st;
  int64_t shape[2] = {4, 6};
  record(&o[3], zmuon_engine_add_parameter(eng, "w", shape, 2, 7, 0, NULL, 0));
  st = zmuon_engine_add_parameter(eng, "w", shape, 2, ZMUON_GROUP_AUTO, 0, NULL, 0);
  if (st != ZMUON_OK)
    return st;
  record(&o[4], zmuon_engine_add_parameter(eng, "w", shape, 2, ZMUON_GROUP_AUTO, 0, NULL, 0));
  float grad[5] = {0};
  zmuon_tensor g = {"w", grad, 5, ZMUON_HOST};
  record(&o[5], zmuon_engine_reduce(eng, 0, &g, 1));
  zmuon_tensor dev = {"w", grad, 24, 0};
  record(&o[6], zmuon_engine_reduce(eng, 0, &dev, 1));
  record(&o[7], zmuon_engine_step(eng, NULL));
  zmuon_tensor unknown = {"v", grad, 5, ZMUON_HOST};
  record(&o[8], zmuon_engine_gather_params(eng, &unknown, 1));
  zmuon_engine_destroy(eng);
  return ZMUON_OK;
}
