// engine::create_from_json / create_from_file: an engine made from a config, with the config's
// learning-rate schedule installed (install_lr_schedule, declared in zmuon/config.hpp).
#include <algorithm>
#include <string>

#include "zmuon/config.hpp"
#include "zmuon/engine.hpp"
#include "zmuon/lr_schedule.hpp"

namespace zmuon {

void install_lr_schedule(engine& eng, const job_config& cfg) {
  if (cfg.scheduler.type == lr_schedule_type::none)
    return;
  // DeepSpeed's scheduler steps after each applied step: the step about to run follows
  // step - 1 - skipped applied ones. The engine owns these callbacks, so `eng` outlives them.
  auto schedule = [&eng, s = cfg.scheduler](int group, float group_lr) {
    return [&eng, s, group, group_lr](uint64_t step) {
      const uint64_t done = step - 1;
      const uint64_t applied = done - std::min(done, eng.skipped_steps());
      return static_cast<float>(scheduled_lr(s, group, group_lr, applied));
    };
  };
  eng.set_lr_schedules(schedule(kMuonGroup, cfg.engine.muon.lr),
                       schedule(kAdamwGroup, cfg.engine.adamw.lr));
}

namespace {

/// An engine with a parsed config's options (its message trace directory, zmuon.trace, among
/// them) and its LR schedule.
expected<std::unique_ptr<engine>> engine_of(const expected<job_config>& cfg) {
  if (!cfg)
    return cfg.err();
  engine_options opts = cfg->engine;
  if (!cfg->trace.empty())
    opts.trace_dir = cfg->trace;
  auto made = engine::create(opts);
  if (made)
    install_lr_schedule(**made, *cfg);
  return made;
}

}  // namespace

expected<std::unique_ptr<engine>> engine::create_from_json(
    const std::string& json_text, const std::vector<std::string>& overrides) {
  return engine_of(parse_config_text(json_text, overrides));
}

expected<std::unique_ptr<engine>> engine::create_from_file(
    const std::string& path, const std::vector<std::string>& overrides) {
  return engine_of(load_config_file(path, overrides));
}

}  // namespace zmuon
