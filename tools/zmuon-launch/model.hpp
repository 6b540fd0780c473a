// The example model zmuon-launch trains: a small MLP with a hand-written backward pass, and the
// synthetic regression data it learns (a fixed "teacher" network applied to Gaussian inputs).
// Every number here is a pure function of the seed, so any rank can regenerate any sample.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/plan.hpp"
#include "zmuon/status.hpp"
#include "zmuon/tensor.hpp"

namespace zmuon::example {

struct model_config {
  int d_in = 32;
  int hidden = 64;
  int ffn = 128;
  int d_out = 16;
  int heads = 4;  // attn.q_proj.weight is Muon'd per head: hidden = heads * head_dim
};

/// All sizes positive and `heads` dividing `hidden`.
zmuon::error check_config(const model_config& cfg);

/// The parameters, in forward order, as the engine registers them:
///   embed.weight [hidden, d_in]        AdamW (default rule: the name contains "embed")
///   mlp.fc1.weight [ffn, hidden]       Muon
///   mlp.fc1.bias [ffn]                 AdamW
///   attn.q_proj.weight [hidden, ffn]   Muon per head, heads = cfg.heads
///   head.weight [d_out, hidden]        Muon
///   head.bias [d_out]                  AdamW
/// Every group is `automatic`; only attn.q_proj.weight has heads > 0.
std::vector<zmuon::param_spec> param_table(const model_config& cfg);

/// Student initialisation: weights ~ N(0, 1/fan_in), biases zero. A pure function of the seed,
/// drawn from a different stream than the teacher, so the student never starts at the answer.
zmuon::tensor_map init_params(const model_config& cfg, uint64_t seed);

/// Every parameter present with the size param_table gives it; the precondition of
/// forward_backward and evaluate.
zmuon::error check_params(const model_config& cfg, const zmuon::tensor_map& params);

/// `n` samples, row-major: x is [n, d_in], y is [n, d_out].
struct batch {
  int n = 0;
  std::vector<float> x;
  std::vector<float> y;
};

/// Samples first_sample .. first_sample + n - 1 of `step`. Sample j of step s depends only on
/// (seed, s, j): x ~ N(0, 1) from a counter-based generator, y = T2 · tanh(T1 · x) with teacher
/// weights T1 [hidden, d_in] ~ N(0, 1/d_in), T2 [d_out, hidden] ~ N(0, 1/hidden) drawn from the
/// seed alone. So a batch splits over any number of ranks and micro-batches without changing.
/// Precondition: check_config(cfg) is ok. x is rounded to fp32 before the teacher sees it.
batch make_batch(const model_config& cfg, uint64_t seed, int64_t step, int64_t first_sample, int n);

struct loss_and_grads {
  double loss = 0;          // mean over the batch of 0.5 * ||yhat - y||^2
  zmuon::tensor_map grads;  // d loss / d param, one entry per parameter in param_table
};

/// Forward and backward pass over the whole batch, accumulated in double. Gradients are those of
/// the *mean* loss: for equal-size micro-batches, averaging their gradients gives the gradient of
/// the whole batch. Precondition: check_params(cfg, params) is ok (violations throw
/// std::invalid_argument, as a bug would), and b.x, b.y hold n * d_in and n * d_out values.
loss_and_grads forward_backward(const model_config& cfg, const zmuon::tensor_map& params,
                                const batch& b);

/// The loss of forward_backward without the backward pass.
double evaluate(const model_config& cfg, const zmuon::tensor_map& params, const batch& b);

}  // namespace zmuon::example
