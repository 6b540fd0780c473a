// The non-Muon group's update rules, one element at a time: the one definition that the host
// backend's loop and the CUDA backend's generic kernel both run. A new rule is a struct here
// and a case in visit_scalar_rule.
#pragma once

#include <cmath>
#include <cstdint>

#include "zmuon/options.hpp"

#if defined(__CUDACC__)
#define ZMUON_HOST_DEVICE __host__ __device__
#else
#define ZMUON_HOST_DEVICE
#endif

namespace zmuon {

/// One call's values of a non-Muon rule; `step` is the 1-based count of the parameter's
/// applied steps. `cautious`: cautious weight decay (arXiv:2510.12402, as Dion's
/// scalar_opts.adamw_update): p decays only where p and the rule's update direction agree.
struct scalar_args {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-10f;
  float weight_decay = 0.0f;
  int64_t step = 1;
  bool cautious = false;
  scalar_algorithm algorithm = scalar_algorithm::adamw;
};

/// A call's factors, formed once on the host: the bias corrections in double, as torch forms
/// them.
struct scalar_factors {
  float lr, beta1, beta2, eps;
  float decay;         // 1 - lr*wd
  float coeff;         // lr*wd (cautious decay)
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  bool cautious;
};

inline scalar_factors scalar_factors_of(const scalar_args& a) {
  const double t = static_cast<double>(a.step < 1 ? 1 : a.step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(a.beta1), t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(a.beta2), t);
  scalar_factors f{};
  f.lr = a.lr;
  f.beta1 = a.beta1;
  f.beta2 = a.beta2;
  f.eps = a.eps;
  f.decay = 1.0f - a.lr * a.weight_decay;
  f.coeff = a.lr * a.weight_decay;
  f.step_size = static_cast<float>(a.lr / bias_correction1);
  f.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  f.cautious = a.cautious;
  return f;
}

/// p decayed (everywhere, or where p * dir >= 0 when cautious), then minus `step`.
ZMUON_HOST_DEVICE inline float decayed(const scalar_factors& f, float p, float dir, float step) {
  if (f.cautious)
    return p - (p * dir >= 0.0f ? f.coeff * p : 0.0f) - step;
  return p * f.decay - step;
}

/// torch.optim.AdamW: m, v their EMAs; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
struct adamw_rule {
  ZMUON_HOST_DEVICE static void apply(const scalar_factors& f, float& p, float g, float& m,
                                      float& v) {
    const float mi = f.beta1 * m + (1.0f - f.beta1) * g;
    const float vi = f.beta2 * v + (1.0f - f.beta2) * g * g;
    m = mi;
    v = vi;
    const float denominator = sqrtf(vi) * f.inv_sqrt_bc2 + f.eps;
    p = decayed(f, p, mi / denominator, f.step_size * mi / denominator);
  }
};

/// Lion (arXiv:2302.06675; Dion's scalar_opts.lion_update): the update is the sign of m and g
/// interpolated with beta1 (0 at 0, as torch.sign); m then follows g with beta2; v unused.
struct lion_rule {
  ZMUON_HOST_DEVICE static void apply(const scalar_factors& f, float& p, float g, float& m,
                                      float& /*v*/) {
    const float c = f.beta1 * m + (1.0f - f.beta1) * g;
    const float u = static_cast<float>((c > 0.0f) - (c < 0.0f));
    m = f.beta2 * m + (1.0f - f.beta2) * g;
    p = decayed(f, p, u, f.lr * u);
  }
};

/// Calls visit(rule) with the rule struct of `algorithm`.
template <class Visit>
void visit_scalar_rule(scalar_algorithm algorithm, Visit&& visit) {
  switch (algorithm) {  // -Wswitch names a rule without its case
    case scalar_algorithm::adamw:
      return visit(adamw_rule{});
    case scalar_algorithm::lion:
      return visit(lion_rule{});
  }
  visit(adamw_rule{});  // not a value of the enum: AdamW
}

}  // namespace zmuon
