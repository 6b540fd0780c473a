// What every rank's step request carries besides the step, the same on all of them: each
// hyperparameter group's values, and which parameters some rank handed a gradient (torch leaves
// a parameter without one as it is).
#include "engine/hand_over.hpp"
#include "engine/impl.hpp"
#include "engine/job.hpp"
#include "engine/registry.hpp"

#include <cmath>

#include "kernels/ns_variants.hpp"

namespace zmuon {

namespace {

/// Why NorMuon's values cannot run, or no error.
/// "a, b or c" of an enum's names table (zmuon/options.hpp).
template <size_t N>
std::string one_of(const char* const (&names)[N]) {
  std::string out = names[0];
  for (size_t i = 1; i < N; ++i)
    out += (i + 1 < N ? ", " : " or ") + std::string(names[i]);
  return out;
}

error check_normuon(const muon_options& m) {
  if (static_cast<int>(m.variant) >= kMuonVariants)
    return error{errc::invalid_argument, "variant must be " + one_of(muon_variant_names)};
  if (!(m.normuon_beta2 >= 0 && m.normuon_beta2 < 1))
    return error{errc::invalid_argument,
                 "normuon_beta2 must be in [0, 1), got " + std::to_string(m.normuon_beta2)};
  if (!(m.normuon_eps > 0) || !std::isfinite(m.normuon_eps))
    return error{errc::invalid_argument, "normuon_eps must be finite and > 0"};
  return {};
}

/// Why group `group`'s values cannot run, or no error.
error check_group(int group, const group_hparams& v, const std::string& backend) {
  const std::string where = "hyperparameter group " + std::to_string(group) + ": ";
  auto bad = [&](const std::string& what) { return error{errc::invalid_argument, where + what}; };
  auto rate = [](float x) { return std::isfinite(x) && x >= 0; };
  const auto& m = v.muon;
  const auto& a = v.adamw;
  if (!rate(m.lr) || !rate(a.lr))
    return bad("learning rates must be finite and >= 0, got " + std::to_string(m.lr) + " (Muon) "
               + std::to_string(a.lr) + " (AdamW)");
  if (!rate(m.weight_decay) || !rate(a.weight_decay))
    return bad("weight_decay must be finite and >= 0");
  if (!(m.momentum >= 0 && m.momentum < 1))
    return bad("momentum must be in [0, 1), got " + std::to_string(m.momentum));
  if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1))
    return bad("betas must be in [0, 1)");
  if (!(a.eps > 0) || !std::isfinite(a.eps))
    return bad("eps (AdamW) must be finite and > 0");
  if (!(m.ns.eps >= 0) || !std::isfinite(m.ns.eps))
    return bad("eps (Newton-Schulz) must be finite and >= 0");
  for (float c : m.ns.coefficients)
    if (!std::isfinite(c))
      return bad("ns_coefficients must be finite");
  if (auto err = check_ns_options(m.ns, backend))
    return bad(err.message());
  if (!(m.qk_clip_tau >= 0) || !std::isfinite(m.qk_clip_tau))
    return bad("qk_clip_tau must be finite and >= 0 (0: off), got "
               + std::to_string(m.qk_clip_tau));
  if (static_cast<int>(m.adjust_lr) >= kAdjustLrRules)
    return bad("adjust_lr must be " + one_of(adjust_lr_rule_names));
  if (auto err = check_normuon(m))
    return bad(err.message());
  return {};
}

}  // namespace

error engine::set_hparam_group(const std::string& name, int group) {
  auto& reg = *impl_->registry;
  if (reg.pl)
    return {errc::bad_state,
            "hyperparameter group of '" + name + "' set after the first reduce() or step()"};
  if (group < 0 || group >= kMaxHparamGroups)
    return {errc::invalid_argument, "hyperparameter group " + std::to_string(group)
                                        + " is outside [0, " + std::to_string(kMaxHparamGroups)
                                        + ")"};
  if (param_spec* spec = reg.find(name)) {
    spec->hparam_group = group;
    return {};
  }
  return {errc::unknown_parameter, "'" + name + "' is not a registered parameter"};
}

error engine::set_group_hparams(int group, const group_hparams& values) {
  auto& job = *impl_->job;
  auto& reg = *impl_->registry;
  if (group < 0 || group >= kMaxHparamGroups)
    return {errc::invalid_argument, "hyperparameter group " + std::to_string(group)
                                        + " is outside [0, " + std::to_string(kMaxHparamGroups)
                                        + ")"};
  if (auto err = check_group(group, values, job.opts.compute))
    return err;
  group_hparams v = values;
  v.muon.transport = job.opts.muon.transport;
  reg.group_set[group] = std::move(v);
  return {};
}

group_hparams engine::group_values(int group, uint64_t step) const {
  const auto& job = *impl_->job;
  const auto& reg = *impl_->registry;
  if (auto it = reg.group_set.find(group); it != reg.group_set.end())
    return it->second;
  group_hparams v{job.opts.muon, job.opts.adamw};
  v.muon.lr = reg.muon_lr(step);
  v.adamw.lr = reg.adam_lr(step);
  return v;
}

expected<std::vector<group_hparams>> engine::impl::step_groups(uint64_t step) const {
  const auto& job = *this->job;
  const auto& reg = *registry;
  int groups = 1;
  for (const auto& p : reg.pl->params)
    groups = std::max(groups, p.hparam_group + 1);
  std::vector<group_hparams> out;
  out.reserve(groups);
  bool checked_schedules = false;
  for (int g = 0; g < groups; ++g) {
    if (auto it = reg.group_set.find(g); it != reg.group_set.end()) {
      out.push_back(it->second);
      continue;
    }
    group_hparams v{job.opts.muon, job.opts.adamw};
    v.muon.lr = reg.muon_lr(step);
    v.adamw.lr = reg.adam_lr(step);
    if (!checked_schedules)  // the schedules' rates, checked once
      for (const auto& [name, lr] : {std::pair{"Muon", v.muon.lr}, std::pair{"AdamW", v.adamw.lr}})
        if (!std::isfinite(lr) || lr < 0)
          return error{errc::invalid_argument,
                       std::string("the ") + name + " learning rate for step "
                           + std::to_string(step) + " is " + std::to_string(lr)
                           + ": learning rates must be finite and >= 0"};
    checked_schedules = true;
    out.push_back(std::move(v));
  }
  return out;
}

expected<std::vector<uint8_t>> engine::impl::step_touched() {
  auto& job = *this->job;
  const auto& reg = *registry;
  auto& hand = *hand_over;
  const size_t n = reg.pl->params.size();
  std::vector<double> any(n, 0.0);
  for (auto& marks : hand.touched) {
    for (size_t i = 0; i < marks.size() && i < n; ++i)
      any[i] += marks[i];
    marks.assign(n, 0);
  }
  if (job.multi_node()) {  // every process learns what the others' ranks touched
    collective_tag tag{collective_kind::host, job.step, 0, job.host_collectives++};
    caf::scoped_actor self{*job.sys};
    using handle = decltype(self->request(job.comms[0], job.timeout(), all_reduce_req{}));
    std::vector<handle> pending;
    for (int i = 0; i < job.local; ++i)
      pending.push_back(self->request(
          job.comms[i], job.timeout(),
          all_reduce_req{tag, reduce_op::sum, i == 0 ? any : std::vector<double>(n, 0.0)}));
    error failed;
    for (size_t i = 0; i < pending.size(); ++i)
      pending[i].receive(
          [&](all_reduce_result& res) {
            if (i == 0)
              any = std::move(res.values);
          },
          [&](caf::error& err) {
            if (!failed)
              failed = job.reply_error(err, "the step's touched mask");
          });
    if (failed)
      return failed;
  }
  std::vector<uint8_t> out(n, 1);
  bool all = true;
  for (size_t i = 0; i < n; ++i) {
    out[i] = any[i] > 0 ? 1 : 0;
    all = all && out[i] == 1;
  }
  if (all)
    out.clear();
  return out;
}

}  // namespace zmuon
