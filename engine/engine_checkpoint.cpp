// engine::save_checkpoint / load_checkpoint / last_step over checkpoint/checkpoint.hpp: the
// stores' and loss scalers' state in, the files out, and back (resharded by the reader).
#include <csignal>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "engine/impl.hpp"

namespace zmuon {

error engine::save_checkpoint(const std::string& dir, const std::string& config_json) {
  auto& d = *impl_;
  if (auto err = d.start())
    return err;
  if (d.multi_node())
    return {errc::unsupported, "save_checkpoint in a multi-process job is not supported yet"};
  if (d.micros[0] != 0)
    return {errc::bad_state, "save_checkpoint with micro-batches of step "
                                 + std::to_string(d.step + 1)
                                 + " handed over (save between steps)"};
  checkpoint_manifest meta;
  meta.config = nlohmann::json::parse(config_json, nullptr, false);
  if (meta.config.is_discarded())
    return {errc::invalid_argument, "save_checkpoint: the config is not valid JSON"};
  meta.step = d.step;
  std::vector<rank_state> states;
  for (int r = 0; r < d.opts.world; ++r) {
    auto st = d.ask<rank_state>(d.ranks[r].store, snapshot_atom::value);
    if (!st)
      return st.err();
    auto sc = d.ask<loss_scale_snapshot>(d.ranks[r].scaler, scaler_state_atom::value);
    if (!sc)
      return sc.err();
    if (r == 0) {
      meta.adam_steps = st->adam_steps;
      meta.scaler = *sc;
    } else if (st->adam_steps != meta.adam_steps || sc->scale != meta.scaler.scale
               || sc->iter != meta.scaler.iter) {
      return {errc::internal, "rank " + std::to_string(r) + " disagrees with rank 0 on the AdamW "
                                  "step count or the loss scale"};
    }
    states.push_back(std::move(*st));
  }
  const auto& f = d.opts.faults;
  after_shard_file hook;
  if (f.kill_in_save_at_step != 0 && f.kill_in_save_at_step == d.step)
    hook = [after = f.kill_in_save_after_files](int written) {
      if (written >= after)
        std::raise(SIGKILL);  // fault injection: the process dies in the middle of the save
    };
  auto written = write_checkpoint(dir, *d.pl, states, std::move(meta), hook);
  return written ? error{} : written.err();
}

expected<checkpoint_info> engine::load_checkpoint(const std::string& dir) {
  auto& d = *impl_;
  if (auto err = d.start())
    return err;
  if (d.multi_node())
    return error{errc::unsupported, "load_checkpoint in a multi-process job is not supported yet"};
  if (d.micros[0] != 0)
    return error{errc::bad_state, "load_checkpoint with micro-batches of step "
                                      + std::to_string(d.step + 1) + " handed over"};
  auto loaded = read_checkpoint(dir, *d.pl);
  if (!loaded)
    return loaded.err();
  const auto& m = loaded->manifest;
  for (int r = 0; r < d.opts.world; ++r) {
    auto state = std::make_shared<const rank_state>(std::move(loaded->states[r]));
    if (auto done = d.ask<ack>(d.ranks[r].store, load_state{m.step, state}); !done)
      return done.err();
    if (auto done = d.ask<ack>(d.ranks[r].scaler, restore_scaler{m.step, m.scaler}); !done)
      return done.err();
  }
  d.step = m.step;
  return checkpoint_info{loaded->path, m.step, m.world, m.config.dump()};
}

uint64_t engine::last_step() const {
  return impl_->step;
}

}  // namespace zmuon
