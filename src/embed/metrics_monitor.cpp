// csv_monitor in DeepSpeed's layout (output_path/job_name/Train_Samples_<name>.csv, a "step,name"
// header, a row per step keyed by samples seen) and the JSON Lines stream.
#include "embed/metrics_monitor.hpp"

#include <chrono>
#include <filesystem>

namespace zmuon {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

nlohmann::json metrics_record(const step_metrics& m) {
  nlohmann::json r;
  r["step"] = m.info.step;
  r["samples"] = m.samples;
  r["loss"] = m.loss ? nlohmann::json(*m.loss) : nlohmann::json();
  r["grad_norm"] = m.info.grad_norm;
  r["loss_scale"] = m.info.loss_scale;
  r["skipped"] = m.info.skipped;
  r["lr"] = {{"muon", m.muon_lr}, {"adamw", m.adam_lr}};
  r["step_ms"] = m.step_ms;
  r["ns_ms"] = m.ns_ms < 0 ? nlohmann::json() : nlohmann::json(m.ns_ms);
  r["memory_bytes"] = m.memory_bytes;
  return r;
}

bool metrics_monitor::wanted(const monitor_options& opts) {
  return opts.csv || !opts.metrics_file.empty();
}

expected<metrics_monitor> metrics_monitor::open(const monitor_options& opts, bool fp16) {
  namespace fs = std::filesystem;
  metrics_monitor m;
  m.opts_ = opts;
  m.fp16_ = fp16;
  std::error_code ec;
  if (opts.csv) {
    m.csv_dir_ = (fs::path(opts.csv_output_path) / opts.csv_job_name).string();
    fs::create_directories(m.csv_dir_, ec);
    if (ec)
      return error{errc::io_error,
                   "csv_monitor: cannot create '" + m.csv_dir_ + "': " + ec.message()};
  }
  if (!opts.metrics_file.empty()) {
    const fs::path parent = fs::path(opts.metrics_file).parent_path();
    if (!parent.empty())
      fs::create_directories(parent, ec);
    m.jsonl_.open(opts.metrics_file, std::ios::app);
    if (!m.jsonl_)
      return error{errc::io_error,
                   "zmuon.metrics_file: cannot open '" + opts.metrics_file + "' for writing"};
  }
  return m;
}

error metrics_monitor::write_csv(const std::string& name, int64_t samples, double value) {
  auto it = csv_.find(name);
  if (it == csv_.end()) {
    const std::string path = csv_dir_ + "/Train_Samples_" + name + ".csv";
    const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
    it = csv_.emplace(name, std::ofstream(path, std::ios::app)).first;
    if (!it->second)
      return {errc::io_error, "csv_monitor: cannot open '" + path + "' for writing"};
    if (fresh)
      it->second << "step," << name << "\n";
  }
  it->second << samples << "," << value << "\n";
  it->second.flush();
  return it->second ? error{} : error{errc::io_error, "csv_monitor: writing " + name + " failed"};
}

error metrics_monitor::write(const step_metrics& m) {
  if (opts_.csv) {
    if (m.loss)
      if (auto err = write_csv("train_loss", m.samples, *m.loss))
        return err;
    // DeepSpeed's lr is its first group's: Muon's.
    for (const auto& [name, value] : {std::pair<std::string, double>{"lr", m.muon_lr},
                                      {"adam_lr", m.adam_lr},
                                      {"grad_norm", m.info.grad_norm}})
      if (auto err = write_csv(name, m.samples, value))
        return err;
    if (fp16_)
      if (auto err = write_csv("loss_scale", m.samples, m.info.loss_scale))
        return err;
    if (opts_.wall_clock_breakdown)
      if (auto err = write_csv("elapsed_time_ms_step", m.samples, m.step_ms))
        return err;
  }
  if (jsonl_.is_open()) {
    jsonl_ << metrics_record(m).dump() << "\n";
    jsonl_.flush();
    if (!jsonl_)
      return {errc::io_error, "zmuon.metrics_file: writing '" + opts_.metrics_file + "' failed"};
  }
  return {};
}

step_recorder::step_recorder(engine& eng, int micro_batch, int gas, bool time_ns)
    : eng_(&eng),
      samples_per_step_(int64_t{micro_batch} * gas * eng.world()),
      time_ns_(time_ns),
      last_ns_(now_ns()) {
  if (time_ns_)
    eng.time_backend_calls(true);
}

void step_recorder::before_step() {
  lrs_ = eng_->next_lrs();
}

step_metrics step_recorder::after_step(const step_info& info, std::optional<double> loss) {
  step_metrics m;
  m.info = info;
  m.loss = loss;
  m.muon_lr = lrs_[0];
  m.adam_lr = lrs_[1];
  const int64_t t = now_ns();
  m.step_ms = static_cast<double>(t - last_ns_) / 1e6;
  last_ns_ = t;
  m.samples = static_cast<int64_t>(info.step) * samples_per_step_;
  const int rank = eng_->first_rank();
  if (time_ns_)
    if (auto times = eng_->take_backend_call_times(rank)) {
      auto it = times->find("newton_schulz");
      m.ns_ms = it == times->end() ? 0.0 : it->second.busy_ms;
    }
  if (auto mem = eng_->memory(rank))
    m.memory_bytes = mem->in_use;
  return m;
}

}  // namespace zmuon
