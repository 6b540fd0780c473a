// A host training loop over zmuon's C++ API: a linear model y = W x + b fitted to a fixed
// random teacher, with 2 in-process ranks and 2 micro-batches per step. W (a matrix) gets Muon,
// b (a vector) gets AdamW. Exits 1 unless the loss falls to a tenth of its start.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "zmuon/engine.hpp"

namespace {

constexpr int out_dim = 16, in_dim = 32, batch = 64, ranks = 2, gas = 2, steps = 60;

struct teacher {
  std::vector<float> w, b;
};

// Loss and gradients of 0.5 * mean ||W x + b - y||^2 on `batch` samples drawn from `seed`.
double loss_and_grads(const std::vector<float>& w, const std::vector<float>& b, const teacher& t,
                      unsigned seed, std::vector<float>& gw, std::vector<float>& gb) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  gw.assign(w.size(), 0.0f);
  gb.assign(b.size(), 0.0f);
  double loss = 0;
  std::vector<float> x(in_dim), err(out_dim);
  for (int s = 0; s < batch; ++s) {
    for (auto& v : x)
      v = normal(gen);
    for (int o = 0; o < out_dim; ++o) {
      float pred = b[o], target = t.b[o];
      for (int i = 0; i < in_dim; ++i) {
        pred += w[o * in_dim + i] * x[i];
        target += t.w[o * in_dim + i] * x[i];
      }
      err[o] = pred - target;
      loss += 0.5 * err[o] * err[o] / batch;
    }
    for (int o = 0; o < out_dim; ++o) {
      gb[o] += err[o] / batch;
      for (int i = 0; i < in_dim; ++i)
        gw[o * in_dim + i] += err[o] * x[i] / batch;
    }
  }
  return loss;
}

int fail(const zmuon::error& err) {
  std::fprintf(stderr, "zmuon: %s\n", err.to_string().c_str());
  return 1;
}

}  // namespace

int main() {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  teacher t{std::vector<float>(out_dim * in_dim), std::vector<float>(out_dim)};
  for (auto& v : t.w)
    v = normal(gen) / std::sqrt(float(in_dim));
  for (auto& v : t.b)
    v = normal(gen);

  auto made = zmuon::engine::create_from_json(R"({
    "optimizer": {"type": "Muon", "params": {"muon_lr": 0.02, "adam_lr": 0.05}},
    "zmuon": {"ranks": 2}
  })");
  if (!made)
    return fail(made.err());
  auto& eng = **made;
  if (auto err = eng.add_parameter({"fc.weight", {out_dim, in_dim}}))  // zeros
    return fail(err);
  if (auto err = eng.add_parameter({"fc.bias", {out_dim}}))
    return fail(err);

  std::vector<float> w(out_dim * in_dim), b(out_dim), gw, gb;
  double first = 0, last = 0;
  for (int step = 1; step <= steps; ++step) {
    // The forward pass needs the full parameters: gathered into the host's own buffers.
    if (auto err = eng.gather_params(
            {{"fc.weight", w.data(), int64_t(w.size())}, {"fc.bias", b.data(), int64_t(b.size())}}))
      return fail(err);
    double loss = 0;
    for (int k = 0; k < gas; ++k)
      for (int r = 0; r < ranks; ++r) {
        loss += loss_and_grads(w, b, t, unsigned(step * 1000 + r * 10 + k), gw, gb) / (ranks * gas);
        // Each micro-batch's gradients, read from the host's buffers during the call.
        if (auto err = eng.reduce(
                r, std::vector<zmuon::tensor_view>{{"fc.weight", gw.data(), int64_t(gw.size())},
                                                   {"fc.bias", gb.data(), int64_t(gb.size())}}))
          return fail(err);
      }
    auto info = eng.step();
    if (!info)
      return fail(info.err());
    if (step == 1)
      first = loss;
    last = loss;
    if (step % 10 == 0 || step == 1)
      std::printf("step %3d  loss %.6f  grad_norm %.4f  ns_matrices %lld\n", step, loss,
                  info->grad_norm, static_cast<long long>(info->ns_matrices));
  }
  std::printf("loss %.6f -> %.6f\n", first, last);
  if (!(last < 0.1 * first)) {
    std::fprintf(stderr, "the loss did not fall to a tenth of its start\n");
    return 1;
  }
  return 0;
}
