// The C ABI: hyperparameter groups and their update rules, Muon blocks, MuonClip pairs and logits.
#include "embed/c_api.hpp"

#include <array>
#include <string>

using namespace zmuon::c_abi;
using zmuon::errc;

namespace {

/// "0 (a), 1 (b) or 2 (c)" of an enum's names table (zmuon/options.hpp), whose values the C
/// enum repeats.
template <size_t N>
std::string numbered(const char* const (&names)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i)
    out += (i == 0 ? "" : (i + 1 < N ? ", " : " or ")) + std::to_string(i) + " (" + names[i] + ")";
  return out;
}

}  // namespace

extern "C" {

namespace {

/// The C struct as the engine's values: lr and weight_decay go to both algorithms; the NS
/// options start from the config's, whose coefficient schedule stays while the group keeps the
/// config's steps and coefficients.
zmuon::error to_group(const zmuon::engine& eng, const zmuon_group_hparams& in,
                      zmuon::group_hparams& out) {
  const auto& opts = eng.options();
  if (in.ns_variant < ZMUON_NS_STANDARD || in.ns_variant > ZMUON_NS_AUTO)
    return {errc::invalid_argument, "ns_variant must be 0 (standard), 1 (gram) or 2 (auto), got "
                                        + std::to_string(in.ns_variant)};
  if (in.adjust_lr < 0 || in.adjust_lr >= zmuon::kAdjustLrRules)
    return {errc::invalid_argument, "adjust_lr must be " + numbered(zmuon::adjust_lr_rule_names)
                                        + ", got " + std::to_string(in.adjust_lr)};
  out.muon = opts.muon;
  out.adamw = opts.adamw;
  out.muon.lr = out.adamw.lr = in.lr;
  out.muon.weight_decay = out.adamw.weight_decay = in.weight_decay;
  out.muon.momentum = in.momentum;
  out.muon.nesterov = in.nesterov != 0;
  out.adamw.beta1 = in.beta1;
  out.adamw.beta2 = in.beta2;
  out.adamw.eps = in.eps;
  auto& ns = out.muon.ns;
  const std::array<float, 3> coefficients{in.ns_coefficients[0], in.ns_coefficients[1],
                                          in.ns_coefficients[2]};
  if (in.ns_steps != ns.steps || coefficients != ns.coefficients)
    ns.schedule.clear();
  ns.steps = in.ns_steps;
  ns.coefficients = coefficients;
  ns.eps = in.ns_eps;
  ns.variant = static_cast<zmuon::ns_variant>(in.ns_variant);
  out.muon.adjust_lr = static_cast<zmuon::adjust_lr_rule>(in.adjust_lr);
  out.muon.qk_clip_tau = in.qk_clip_tau;
  return {};
}

}  // namespace

static_assert(ZMUON_NS_STANDARD == static_cast<int>(zmuon::ns_variant::standard));
static_assert(ZMUON_NS_GRAM == static_cast<int>(zmuon::ns_variant::gram));
static_assert(ZMUON_NS_AUTO == static_cast<int>(zmuon::ns_variant::automatic));
static_assert(ZMUON_ADJUST_LR_MATCH_RMS_ADAMW
              == static_cast<int>(zmuon::adjust_lr_rule::match_rms_adamw));

static_assert(ZMUON_ADJUST_LR_SPECTRAL == static_cast<int>(zmuon::adjust_lr_rule::spectral));
static_assert(ZMUON_ADJUST_LR_RMS == static_cast<int>(zmuon::adjust_lr_rule::rms));
static_assert(ZMUON_VIEW_EXPERT_STACK == static_cast<int>(zmuon::matrix_view::expert_stack));
static_assert(ZMUON_VIEW_FLATTEN == static_cast<int>(zmuon::matrix_view::flatten));

int zmuon_engine_set_muon_blocks(zmuon_engine* eng, const char* name, const int64_t* split_sizes,
                                 const int64_t* split_heads, size_t n, int32_t view) {
  const char* fn = "zmuon_engine_set_muon_blocks";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !name)
      return null_arg(fn, eng ? "name" : "eng");
    if (n > 0 && !split_sizes)
      return null_arg(fn, "split_sizes");
    if (view < ZMUON_VIEW_AUTO || view > ZMUON_VIEW_FLATTEN)
      return {errc::invalid_argument, std::string(fn) + ": view must be 0 (auto), 1 (expert "
                                                        "stack) or 2 (flatten), got "
                                          + std::to_string(view)};
    std::vector<int64_t> sizes(split_sizes, split_sizes + n);
    std::vector<int64_t> heads;
    if (split_heads)
      heads.assign(split_heads, split_heads + n);
    return eng->eng->set_muon_blocks(name, sizes, heads, static_cast<zmuon::matrix_view>(view));
  });
}

int zmuon_engine_set_box_order(zmuon_engine* eng, const char* name, const int64_t* boxes,
                               size_t n) {
  const char* fn = "zmuon_engine_set_box_order";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !name)
      return null_arg(fn, eng ? "name" : "eng");
    if (n > 0 && !boxes)
      return null_arg(fn, "boxes");
    std::vector<zmuon::matrix_box> order(n);
    for (size_t k = 0; k < n; ++k)
      order[k] = {boxes[4 * k], boxes[4 * k + 1], boxes[4 * k + 2], boxes[4 * k + 3]};
    return eng->eng->set_box_order(name, order);
  });
}

int zmuon_engine_add_qk_clip(zmuon_engine* eng, const char* query, const char* key,
                             int64_t query_heads, int64_t key_heads) {
  const char* fn = "zmuon_engine_add_qk_clip";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !query || !key)
      return null_arg(fn, !eng ? "eng" : !query ? "query" : "key");
    return eng->eng->add_qk_clip(query, key, query_heads, key_heads);
  });
}

int zmuon_engine_report_qk_logits(zmuon_engine* eng, int32_t rank, const char* query,
                                  const float* max_logits, size_t n) {
  const char* fn = "zmuon_engine_report_qk_logits";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !query || (!max_logits && n > 0))
      return null_arg(fn, !eng ? "eng" : !query ? "query" : "max_logits");
    return eng->eng->report_qk_logits(rank, query, std::vector<float>(max_logits, max_logits + n));
  });
}

int zmuon_engine_set_hparam_group(zmuon_engine* eng, const char* name, int32_t group) {
  const char* fn = "zmuon_engine_set_hparam_group";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !name)
      return null_arg(fn, eng ? "name" : "eng");
    return eng->eng->set_hparam_group(name, group);
  });
}

int zmuon_engine_set_group_hparams(zmuon_engine* eng, int32_t group,
                                   const zmuon_group_hparams* values) {
  const char* fn = "zmuon_engine_set_group_hparams";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !values)
      return null_arg(fn, eng ? "values" : "eng");
    zmuon::group_hparams v;
    if (auto err = to_group(*eng->eng, *values, v))
      return {err.code(),
              std::string(fn) + ": group " + std::to_string(group) + ": " + err.message()};
    return eng->eng->set_group_hparams(group, v);
  });
}

static_assert(ZMUON_VARIANT_NORMUON == static_cast<int>(zmuon::muon_variant::normuon));

int zmuon_engine_set_group_rule(zmuon_engine* eng, int32_t group, const zmuon_group_hparams* values,
                                const zmuon_update_rule* rule) {
  const char* fn = "zmuon_engine_set_group_rule";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !values)
      return null_arg(fn, eng ? "values" : "eng");
    zmuon::group_hparams v;
    auto bad = [&](const zmuon::error& err) -> zmuon::error {
      return {err.code(),
              std::string(fn) + ": group " + std::to_string(group) + ": " + err.message()};
    };
    if (auto err = to_group(*eng->eng, *values, v))
      return bad(err);
    if (rule) {
      if (rule->variant < 0 || rule->variant >= zmuon::kMuonVariants)
        return bad({errc::invalid_argument, "variant must be " + numbered(zmuon::muon_variant_names)
                                                + ", got " + std::to_string(rule->variant)});
      if (rule->algorithm < 0 || rule->algorithm >= zmuon::kScalarAlgorithms)
        return bad({errc::invalid_argument,
                    "algorithm must be in [0, " + std::to_string(zmuon::kScalarAlgorithms)
                        + ") (zmuon_scalar_algorithm), got " + std::to_string(rule->algorithm)});
      v.muon.cautious_weight_decay = v.adamw.cautious_weight_decay =
          rule->cautious_weight_decay != 0;
      v.adamw.algorithm = static_cast<zmuon::scalar_algorithm>(rule->algorithm);
      v.muon.variant = static_cast<zmuon::muon_variant>(rule->variant);
      v.muon.normuon_beta2 = rule->normuon_beta2;
      v.muon.normuon_eps = rule->normuon_eps;
    }
    return eng->eng->set_group_hparams(group, v);
  });
}

}  // extern "C"
