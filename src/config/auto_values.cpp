// "auto" values (auto_values.hpp).
#include "config/auto_values.hpp"

#include <algorithm>

#include "base/json_text.hpp"
#include "config/schema.hpp"

namespace zmuon::config_detail {

json host_values(const config_context& ctx, findings& out) {
  if (ctx.host_values.find_first_not_of(" \t\r\n") == std::string::npos)
    return json::object();
  auto parsed = parse_json_text(ctx.host_values, "the host values are not valid JSON: ");
  if (!parsed) {
    out.problems.push_back(parsed.err().message());
    return json::object();
  }
  static const std::vector<std::string> keys = {"host",
                                                "lr",
                                                "muon_lr",
                                                "adam_lr",
                                                "weight_decay",
                                                "momentum",
                                                "betas",
                                                "eps",
                                                "gradient_clipping",
                                                "micro_batch",
                                                "gas",
                                                "fp16",
                                                "bf16",
                                                "reduce_bucket_size",
                                                "warmup_num_steps",
                                                "total_num_steps"};
  if (!parsed->is_object()) {
    out.problems.push_back("the host values: expected a JSON object, got " + describe(*parsed));
    return json::object();
  }
  for (const auto& item : parsed->items())
    if (std::find(keys.begin(), keys.end(), item.key()) == keys.end())
      out.problems.push_back("the host values: " + unknown_key("", item.key(), keys));
  return *parsed;
}

void resolve_auto(json& j, const json& host, findings& out) {
  // Host value names by field path.
  static const std::vector<std::pair<std::string, std::string>> from_host = {
      {"train_micro_batch_size_per_gpu", "micro_batch"},
      {"gradient_accumulation_steps", "gas"},
      {"gradient_clipping", "gradient_clipping"},
      {"fp16.enabled", "fp16"},
      {"bf16.enabled", "bf16"},
      {"zero_optimization.reduce_bucket_size", "reduce_bucket_size"},
      {"optimizer.params.lr", "lr"},
      {"optimizer.params.muon_lr", "muon_lr"},
      {"optimizer.params.adam_lr", "adam_lr"},
      {"optimizer.params.weight_decay", "weight_decay"},
      {"optimizer.params.momentum", "momentum"},
      {"optimizer.params.betas", "betas"},
      {"optimizer.params.eps", "eps"},
  };
  static const job_config defaults;
  for (const auto& f : schema()) {
    const json* v = find(j, f.path);
    if (!v || !is_auto(*v) || f.path.rfind("zmuon.", 0) == 0
        || f.path == "optimizer.params.ns_variant")
      continue;
    auto parts = split_path(f.path);
    json* parent = &j;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      parent = &(*parent)[parts[i]];
    auto it = std::find_if(from_host.begin(), from_host.end(),
                           [&](const auto& e) { return e.first == f.path; });
    if (it != from_host.end() && host.contains(it->second)) {
      (*parent)[parts.back()] = host[it->second];
      out.resolved.push_back(f.path + " = " + host[it->second].dump() + " (the host's " + it->second
                             + ")");
      continue;
    }
    parent->erase(parts.back());
    if (f.path == "train_batch_size")
      continue;  // said once the batch shape is known
    std::string becomes = "zmuon's default";
    if (f.path == "optimizer.params.lr")
      becomes = "each group's default: Muon 0.02, AdamW 3e-4";
    else if (f.path == "optimizer.params.muon_lr" || f.path == "optimizer.params.adam_lr")
      becomes = "lr's rule";
    else if (f.write)
      becomes = f.write(defaults).dump() + " (zmuon's default)";
    out.resolved.push_back(f.path + " = " + becomes);
  }
}

}  // namespace zmuon::config_detail
