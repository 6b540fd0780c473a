// The example MLP, its teacher and its data; see model.hpp for the equations.
#include "zmuon-launch/model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace zmuon::example {

namespace {

const char* const embed_weight = "embed.weight";
const char* const fc1_weight = "mlp.fc1.weight";
const char* const fc1_bias = "mlp.fc1.bias";
const char* const q_proj_weight = "attn.q_proj.weight";
const char* const head_weight = "head.weight";
const char* const head_bias = "head.bias";

// -- counter-based random numbers ------------------------------------------------------------

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Folds one more coordinate into a key; different orders give unrelated keys.
uint64_t mix(uint64_t key, uint64_t value) {
  return splitmix64(key ^ splitmix64(value));
}

/// Independent streams drawn from one seed.
enum class stream : uint64_t { input = 1, teacher_in = 2, teacher_out = 3, init = 4 };

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text)
    h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

/// N(0, 1) at one point of a counter space: Box-Muller on two hashes of the key.
double standard_normal(uint64_t key) {
  const double two_pow_53 = 9007199254740992.0;
  const double pi = 3.14159265358979323846;
  double u1 = (static_cast<double>(mix(key, 0) >> 11) + 1.0) / two_pow_53;  // (0, 1]
  double u2 = static_cast<double>(mix(key, 1) >> 11) / two_pow_53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * pi * u2);
}

uint64_t stream_key(uint64_t seed, stream s) {
  return mix(splitmix64(seed), static_cast<uint64_t>(s));
}

/// A [rows, cols] matrix with entries N(0, scale^2) drawn from `key`.
std::vector<double> normal_matrix(uint64_t key, int rows, int cols, double scale) {
  std::vector<double> m(static_cast<size_t>(rows) * cols);
  for (size_t i = 0; i < m.size(); ++i)
    m[i] = scale * standard_normal(mix(key, i));
  return m;
}

// -- dense helpers -----------------------------------------------------------------------------

/// out = W · in, W [rows, cols] row-major.
template <class W>
void matvec(const W* w, int rows, int cols, const double* in, double* out) {
  for (int r = 0; r < rows; ++r) {
    const W* row = w + static_cast<size_t>(r) * cols;
    double acc = 0;
    for (int c = 0; c < cols; ++c)
      acc += static_cast<double>(row[c]) * in[c];
    out[r] = acc;
  }
}

/// out += W^T · in, W [rows, cols] row-major.
void matvec_transposed_add(const float* w, int rows, int cols, const double* in, double* out) {
  for (int r = 0; r < rows; ++r) {
    const float* row = w + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c)
      out[c] += static_cast<double>(row[c]) * in[r];
  }
}

/// G += a · b^T, G [rows, cols].
void outer_add(double* g, int rows, int cols, const double* a, const double* b) {
  for (int r = 0; r < rows; ++r) {
    double* row = g + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c)
      row[c] += a[r] * b[c];
  }
}

// -- the model ---------------------------------------------------------------------------------

struct weights {
  const float* embed;
  const float* fc1_w;
  const float* fc1_b;
  const float* q_proj;
  const float* head_w;
  const float* head_b;
};

weights bind_weights(const model_config& cfg, const tensor_map& params, const batch& b) {
  if (error e = check_params(cfg, params))
    throw std::invalid_argument(e.to_string());
  if (b.n < 0 || b.x.size() != static_cast<size_t>(b.n) * cfg.d_in
      || b.y.size() != static_cast<size_t>(b.n) * cfg.d_out)
    throw std::invalid_argument("batch of " + std::to_string(b.n) + " samples holds "
                                + std::to_string(b.x.size()) + " inputs and "
                                + std::to_string(b.y.size()) + " targets");
  return {params.at(embed_weight).data(), params.at(fc1_weight).data(),
          params.at(fc1_bias).data(),     params.at(q_proj_weight).data(),
          params.at(head_weight).data(),  params.at(head_bias).data()};
}

/// One sample's activations, kept for the backward pass.
struct activations {
  std::vector<double> x, h0, a1, h1, t, h2, yhat;
  explicit activations(const model_config& cfg)
      : x(cfg.d_in),
        h0(cfg.hidden),
        a1(cfg.ffn),
        h1(cfg.ffn),
        t(cfg.hidden),
        h2(cfg.hidden),
        yhat(cfg.d_out) {}
};

/// Forward pass of sample `i`; returns its loss 0.5 * ||yhat - y||^2.
double forward(const model_config& cfg, const weights& w, const batch& b, int i, activations& act) {
  for (int k = 0; k < cfg.d_in; ++k)
    act.x[k] = b.x[static_cast<size_t>(i) * cfg.d_in + k];
  matvec(w.embed, cfg.hidden, cfg.d_in, act.x.data(), act.h0.data());
  matvec(w.fc1_w, cfg.ffn, cfg.hidden, act.h0.data(), act.a1.data());
  for (int k = 0; k < cfg.ffn; ++k) {
    act.a1[k] += w.fc1_b[k];
    act.h1[k] = act.a1[k] > 0 ? act.a1[k] : 0.0;
  }
  matvec(w.q_proj, cfg.hidden, cfg.ffn, act.h1.data(), act.t.data());
  for (int k = 0; k < cfg.hidden; ++k) {
    act.t[k] = std::tanh(act.t[k]);
    act.h2[k] = act.t[k] + act.h0[k];
  }
  matvec(w.head_w, cfg.d_out, cfg.hidden, act.h2.data(), act.yhat.data());
  double loss = 0;
  for (int k = 0; k < cfg.d_out; ++k) {
    act.yhat[k] += w.head_b[k];
    double diff = act.yhat[k] - b.y[static_cast<size_t>(i) * cfg.d_out + k];
    loss += 0.5 * diff * diff;
  }
  return loss;
}

}  // namespace

error check_config(const model_config& cfg) {
  if (cfg.d_in <= 0 || cfg.hidden <= 0 || cfg.ffn <= 0 || cfg.d_out <= 0 || cfg.heads <= 0)
    return {errc::invalid_argument,
            "model sizes must be positive: d_in " + std::to_string(cfg.d_in) + ", hidden "
                + std::to_string(cfg.hidden) + ", ffn " + std::to_string(cfg.ffn) + ", d_out "
                + std::to_string(cfg.d_out) + ", heads " + std::to_string(cfg.heads)};
  if (cfg.hidden % cfg.heads != 0)
    return {errc::invalid_argument, "heads " + std::to_string(cfg.heads)
                                        + " does not divide hidden " + std::to_string(cfg.hidden)};
  return {};
}

std::vector<param_spec> param_table(const model_config& cfg) {
  std::vector<param_spec> table = {
      {embed_weight, {cfg.hidden, cfg.d_in}, param_group::automatic, 0},
      {fc1_weight, {cfg.ffn, cfg.hidden}, param_group::automatic, 0},
      {fc1_bias, {cfg.ffn}, param_group::automatic, 0},
      {q_proj_weight, {cfg.hidden, cfg.ffn}, param_group::automatic, cfg.heads},
      {head_weight, {cfg.d_out, cfg.hidden}, param_group::automatic, 0},
      {head_bias, {cfg.d_out}, param_group::automatic, 0},
  };
  return table;
}

tensor_map init_params(const model_config& cfg, uint64_t seed) {
  tensor_map params;
  uint64_t init_key = stream_key(seed, stream::init);
  for (const param_spec& spec : param_table(cfg)) {
    size_t numel = 1;
    for (int64_t d : spec.shape)
      numel *= static_cast<size_t>(d);
    std::vector<float> values(numel, 0.0f);
    if (spec.shape.size() >= 2) {
      uint64_t key = mix(init_key, fnv1a(spec.name));
      double scale = 1.0 / std::sqrt(static_cast<double>(spec.shape[1]));
      for (size_t i = 0; i < numel; ++i)
        values[i] = static_cast<float>(scale * standard_normal(mix(key, i)));
    }
    params.emplace(spec.name, std::move(values));
  }
  return params;
}

error check_params(const model_config& cfg, const tensor_map& params) {
  if (error e = check_config(cfg))
    return e;
  for (const param_spec& spec : param_table(cfg)) {
    size_t numel = 1;
    for (int64_t d : spec.shape)
      numel *= static_cast<size_t>(d);
    auto it = params.find(spec.name);
    if (it == params.end())
      return {errc::unknown_parameter, "parameter '" + spec.name + "' is missing"};
    if (it->second.size() != numel)
      return {errc::shape_mismatch, "parameter '" + spec.name + "' has "
                                        + std::to_string(it->second.size()) + " values, expected "
                                        + std::to_string(numel)};
  }
  return {};
}

batch make_batch(const model_config& cfg, uint64_t seed, int64_t step, int64_t first_sample,
                 int n) {
  batch b;
  b.n = n > 0 ? n : 0;
  b.x.resize(static_cast<size_t>(b.n) * cfg.d_in);
  b.y.resize(static_cast<size_t>(b.n) * cfg.d_out);
  std::vector<double> t1 = normal_matrix(stream_key(seed, stream::teacher_in), cfg.hidden, cfg.d_in,
                                         1.0 / std::sqrt(cfg.d_in));
  std::vector<double> t2 = normal_matrix(stream_key(seed, stream::teacher_out), cfg.d_out,
                                         cfg.hidden, 1.0 / std::sqrt(cfg.hidden));
  uint64_t step_key = mix(stream_key(seed, stream::input), static_cast<uint64_t>(step));
  std::vector<double> x(cfg.d_in), hidden(cfg.hidden), y(cfg.d_out);
  for (int i = 0; i < b.n; ++i) {
    uint64_t sample_key = mix(step_key, static_cast<uint64_t>(first_sample + i));
    for (int k = 0; k < cfg.d_in; ++k) {
      // Round first so that the teacher sees exactly the input the student gets.
      float xk = static_cast<float>(standard_normal(mix(sample_key, k)));
      b.x[static_cast<size_t>(i) * cfg.d_in + k] = xk;
      x[k] = xk;
    }
    matvec(t1.data(), cfg.hidden, cfg.d_in, x.data(), hidden.data());
    for (double& h : hidden)
      h = std::tanh(h);
    matvec(t2.data(), cfg.d_out, cfg.hidden, hidden.data(), y.data());
    for (int k = 0; k < cfg.d_out; ++k)
      b.y[static_cast<size_t>(i) * cfg.d_out + k] = static_cast<float>(y[k]);
  }
  return b;
}

loss_and_grads forward_backward(const model_config& cfg, const tensor_map& params, const batch& b) {
  weights w = bind_weights(cfg, params, b);
  const int hidden = cfg.hidden, ffn = cfg.ffn, d_in = cfg.d_in, d_out = cfg.d_out;
  std::vector<double> g_embed(static_cast<size_t>(hidden) * d_in);
  std::vector<double> g_fc1_w(static_cast<size_t>(ffn) * hidden), g_fc1_b(ffn);
  std::vector<double> g_q_proj(static_cast<size_t>(hidden) * ffn);
  std::vector<double> g_head_w(static_cast<size_t>(d_out) * hidden), g_head_b(d_out);
  std::vector<double> d_yhat(d_out), d_h2(hidden), d_a2(hidden), d_a1(ffn), d_h0(hidden);
  activations act(cfg);
  double loss_sum = 0;
  const double inv_n = b.n > 0 ? 1.0 / b.n : 0.0;
  for (int i = 0; i < b.n; ++i) {
    loss_sum += forward(cfg, w, b, i, act);
    for (int k = 0; k < d_out; ++k)
      d_yhat[k] = (act.yhat[k] - b.y[static_cast<size_t>(i) * d_out + k]) * inv_n;
    // yhat = head.weight · h2 + head.bias
    outer_add(g_head_w.data(), d_out, hidden, d_yhat.data(), act.h2.data());
    for (int k = 0; k < d_out; ++k)
      g_head_b[k] += d_yhat[k];
    std::fill(d_h2.begin(), d_h2.end(), 0.0);
    matvec_transposed_add(w.head_w, d_out, hidden, d_yhat.data(), d_h2.data());
    // h2 = tanh(q_proj · h1) + h0
    for (int k = 0; k < hidden; ++k)
      d_a2[k] = d_h2[k] * (1.0 - act.t[k] * act.t[k]);
    outer_add(g_q_proj.data(), hidden, ffn, d_a2.data(), act.h1.data());
    std::fill(d_a1.begin(), d_a1.end(), 0.0);
    matvec_transposed_add(w.q_proj, hidden, ffn, d_a2.data(), d_a1.data());
    // h1 = relu(fc1 · h0 + b1)
    for (int k = 0; k < ffn; ++k)
      d_a1[k] = act.a1[k] > 0 ? d_a1[k] : 0.0;
    outer_add(g_fc1_w.data(), ffn, hidden, d_a1.data(), act.h0.data());
    for (int k = 0; k < ffn; ++k)
      g_fc1_b[k] += d_a1[k];
    d_h0 = d_h2;  // the residual branch
    matvec_transposed_add(w.fc1_w, ffn, hidden, d_a1.data(), d_h0.data());
    // h0 = embed · x
    outer_add(g_embed.data(), hidden, d_in, d_h0.data(), act.x.data());
  }
  auto to_float = [](const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  };
  loss_and_grads out;
  out.loss = loss_sum * inv_n;
  out.grads.emplace(embed_weight, to_float(g_embed));
  out.grads.emplace(fc1_weight, to_float(g_fc1_w));
  out.grads.emplace(fc1_bias, to_float(g_fc1_b));
  out.grads.emplace(q_proj_weight, to_float(g_q_proj));
  out.grads.emplace(head_weight, to_float(g_head_w));
  out.grads.emplace(head_bias, to_float(g_head_b));
  return out;
}

double evaluate(const model_config& cfg, const tensor_map& params, const batch& b) {
  weights w = bind_weights(cfg, params, b);
  activations act(cfg);
  double loss_sum = 0;
  for (int i = 0; i < b.n; ++i)
    loss_sum += forward(cfg, w, b, i, act);
  return b.n > 0 ? loss_sum / b.n : 0.0;
}

}  // namespace zmuon::example
