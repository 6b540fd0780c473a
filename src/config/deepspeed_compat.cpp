// DeepSpeed compatibility (deepspeed_compat.hpp).
#include "config/deepspeed_compat.hpp"

#include <algorithm>

#include "config/deepspeed_keys.hpp"
#include "config/schema.hpp"

namespace zmuon::config_detail {

const std::vector<std::pair<std::string, std::vector<std::string>>>& host_monitors() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> monitors = {
      {"tensorboard", {"enabled", "output_path", "job_name"}},
      {"wandb", {"enabled", "group", "team", "project"}},
      {"comet",
       {"enabled", "samples_log_interval", "project", "workspace", "api_key", "experiment_name",
        "experiment_key", "online", "mode"}},
  };
  return monitors;
}

void check_keys(const json& obj, const std::string& prefix, findings& out) {
  const bool scheduler_params = prefix == "scheduler.params";
  for (const auto& [key, value] : obj.items()) {
    const std::string path = join(prefix, key);
    if (key.find('.') != std::string::npos) {  // would otherwise pass as a path, be ignored
      out.problems.push_back("key '" + path + "' holds a '.': nest sections as objects");
      continue;
    }
    if (scheduler_params)
      continue;  // read_scheduler knows which params its type takes
    if (is_field(path) || path == "scheduler.type")
      continue;
    if (is_leaf(path) && !find_deepspeed_key(path))
      continue;  // a host monitor's key
    if (const ds_key* k = find_deepspeed_key(path)) {
      if (!has_ds_type(value, k->type)) {
        out.add(bad(path, ds_type_text(k->type), value));
        continue;
      }
      const bool off =
          is_auto(value) || k->kind == ds_kind::no_effect
          || (k->kind == ds_kind::refused
              && std::find(k->off.begin(), k->off.end(), value) != k->off.end())
          || (k->kind == ds_kind::section
              && !(value.is_object() && value.contains("enabled") && value["enabled"] == true));
      if (off)
        out.no_effect.push_back(path);
      else if (k->kind == ds_kind::section)
        out.problems.push_back(path + ".enabled is true: " + k->why);
      else
        out.problems.push_back(path + " " + describe(value) + " is refused: " + k->why);
      continue;
    }
    const std::string& name = key;  // a structured binding: C++17 lambdas cannot capture it
    const bool monitor = prefix.empty()
                         && std::any_of(host_monitors().begin(), host_monitors().end(),
                                        [&](const auto& m) { return m.first == name; });
    if (!is_section(path)) {
      out.problems.push_back(unknown_key(prefix, key));
      continue;
    }
    if (!value.is_object()) {
      out.add(bad(path, "an object", value));
      continue;
    }
    check_keys(value, path, out);
    if (monitor && value.contains("enabled") && value["enabled"] == true) {
      if (out.python_host)
        out.other.push_back(key + ": its figures go to the Python host's metrics callback");
      else
        out.problems.push_back(
            key + ".enabled is true: zmuon writes no " + key
            + " files itself; use csv_monitor or zmuon.metrics_file, or a Python host, whose "
              "metrics callback gets each step's figures");
    } else if (monitor) {
      out.no_effect.push_back(key);
    }
  }
}

void batch_shape(const json& j, int world, job_config& cfg, findings& out) {
  const bool tbs = find(j, "train_batch_size") != nullptr;
  const bool micro = find(j, "train_micro_batch_size_per_gpu") != nullptr;
  const bool gas = find(j, "gradient_accumulation_steps") != nullptr;
  const int64_t w = world;
  if (tbs && !(micro && gas)) {
    const int64_t known = micro ? int64_t{cfg.micro_batch} * w : gas ? int64_t{cfg.gas} * w : w;
    if (cfg.train_batch_size % known != 0) {
      out.problems.push_back("train_batch_size " + std::to_string(cfg.train_batch_size)
                             + " is not a multiple of " + std::to_string(known) + " ("
                             + (micro ? "micro-batch x world"
                                : gas ? "gas x world"
                                      : "world")
                             + ")");
      return;
    }
    const int64_t rest = cfg.train_batch_size / known;
    if (rest > (int64_t{1} << 20)) {
      out.problems.push_back("train_batch_size " + std::to_string(cfg.train_batch_size) + " makes "
                             + (micro ? "gradient_accumulation_steps " : "the micro-batch ")
                             + std::to_string(rest) + ", more than 1048576");
      return;
    }
    if (micro)
      cfg.gas = static_cast<int>(rest);
    else
      cfg.micro_batch = static_cast<int>(rest);  // gas given, or 1
  }
  const int64_t product = int64_t{cfg.micro_batch} * cfg.gas * w;
  if (tbs && micro && gas && cfg.train_batch_size != product)
    out.problems.push_back("train_batch_size " + std::to_string(cfg.train_batch_size)
                           + " is not train_micro_batch_size_per_gpu x "
                             "gradient_accumulation_steps x world = "
                           + std::to_string(cfg.micro_batch) + " x " + std::to_string(cfg.gas)
                           + " x " + std::to_string(world) + " = " + std::to_string(product));
  cfg.train_batch_size = product;
}

}  // namespace zmuon::config_detail
