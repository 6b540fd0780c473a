#include "embed/job_hooks.hpp"

namespace zmuon {

expected<std::unique_ptr<job_hooks>> job_hooks::make(engine& eng, const job_config& job) {
  auto hooks = std::make_unique<job_hooks>();
  hooks->eng_ = &eng;
  hooks->job_ = job;
  for (const auto& note : job.notes)
    hooks->notes_ += note + "\n";
  install_lr_schedule(eng, job);
  if (metrics_monitor::wanted(job.monitor) && eng.first_rank() == 0) {
    auto opened = metrics_monitor::open(job.monitor, job.engine.fp16.enabled);
    if (!opened)
      return opened.err();
    hooks->monitor_.emplace(std::move(*opened));
  }
  if (hooks->monitor_)
    hooks->recorder_ = std::make_unique<step_recorder>(eng, job.micro_batch, job.gas, true);
  return hooks;
}

void job_hooks::set_callback(std::function<void(const std::string&)> callback) {
  callback_ = std::move(callback);
  if (callback_ && !recorder_)
    recorder_ = std::make_unique<step_recorder>(*eng_, job_.micro_batch, job_.gas, false);
}

void job_hooks::before_step() {
  if (recorder_)
    recorder_->before_step();
}

error job_hooks::after_step(const step_info& info) {
  if (!recorder_)
    return {};
  const step_metrics m = recorder_->after_step(info, loss_);
  loss_.reset();
  if (monitor_)
    if (auto err = monitor_->write(m))
      return err;
  if (callback_)
    callback_(metrics_record(m).dump());
  return {};
}

}  // namespace zmuon
