#include "zmuon-launch/progress.hpp"

#include <string>

namespace zmuon::example {

namespace {

std::string clock_text(double seconds) {
  auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

}  // namespace

progress::progress(int total, bool tty, std::FILE* out) : total_(total), tty_(tty), out_(out) {}

void progress::step(const step_record& rec) {
  auto now = clock::now();
  double step_ms = std::chrono::duration<double, std::milli>(now - last_).count();
  last_ = now;
  ++shown_;
  if (!tty_) {
    std::fprintf(out_,
                 "step %4llu  loss %.6f  grad_norm %.6f  loss_scale %g  skipped %d  "
                 "time %.2f ms\n",
                 static_cast<unsigned long long>(rec.info.step), rec.loss, rec.info.grad_norm,
                 rec.info.loss_scale, rec.info.skipped ? 1 : 0, step_ms);
  } else {
    double elapsed = std::chrono::duration<double>(now - start_).count();
    double eta = elapsed / shown_ * (total_ - shown_);
    std::fprintf(out_, "\r\033[Kstep %llu/%d  loss %.6f  %.2f ms/step  ETA %s%s",
                 static_cast<unsigned long long>(rec.info.step), total_, rec.loss, step_ms,
                 clock_text(eta).c_str(), rec.info.skipped ? "  (skipped)" : "");
  }
  std::fflush(out_);
}

void progress::done() {
  if (tty_ && shown_ > 0) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

}  // namespace zmuon::example
