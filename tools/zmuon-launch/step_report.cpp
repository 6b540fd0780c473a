#include "step_report.hpp"

namespace zmuon::example {

step_report::step_report(engine& eng, const job_config& job, bool lead)
    : eng_(&eng), job_(job), lead_(lead) {
  install_lr_schedule(eng, job);
}

error step_report::open() {
  if (!lead_ || !metrics_monitor::wanted(job_.monitor))
    return {};
  auto opened = metrics_monitor::open(job_.monitor, job_.engine.fp16.enabled);
  if (!opened)
    return opened.err();
  monitor_.emplace(std::move(*opened));
  recorder_ = std::make_unique<step_recorder>(*eng_, job_.micro_batch, job_.gas, true);
  return {};
}

void step_report::started() {
  if (recorder_)
    recorder_->before_step();
}

expected<bool> step_report::finished(const step_record& rec, int total) {
  if (recorder_)
    if (auto err = monitor_->write(recorder_->after_step(rec.info, rec.loss)))
      return err;
  const auto step = static_cast<int64_t>(rec.info.step);
  return job_.steps_per_print <= 0 || step % job_.steps_per_print == 0 || step == total;
}

}  // namespace zmuon::example
