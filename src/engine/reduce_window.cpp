#include "engine/reduce_window.hpp"

#include "messages/errors.hpp"
#include "trace/describe.hpp"

namespace zmuon {

void reduce_window::hand_over(const reducer_actor& reducer, micro_grads msg) {
  if (!box_)
    box_ = std::make_unique<caf::scoped_actor>(*sys_);
  std::string id;
  if (tracer_) {
    id = trace::async_id(msg, rank_);
    tracer_->send("host", trace::now_ns(), trace::describe(msg), id, true);
  }
  const uint64_t step = msg.step;
  const int32_t micro = msg.micro, bucket = msg.bucket;
  auto h = (*box_)->request(reducer, caf::duration{std::chrono::milliseconds(timeout_ms_)},
                            std::move(msg));
  open_.push_back(pending{std::move(h), step, micro, bucket, std::move(id)});
}

error reduce_window::wait_until(size_t keep) {
  while (open_.size() > keep) {
    auto p = std::move(open_.front());
    open_.pop_front();
    caf::error failed;
    p.h.receive(
        [&](ack& a) {
          if (tracer_)
            tracer_->reply("host", trace::now_ns(), trace::describe(a), p.id);
        },
        [&](caf::error& err) {
          if (tracer_)
            tracer_->reply("host", trace::now_ns(), {}, p.id, caf::to_string(err));
          failed = std::move(err);
        });
    // The reducer's own failures (zmuon's error codes) are the flush's to report; CAF's mean
    // that no answer came.
    if (failed && failed.category() == caf::atom("system")) {
      const bool late = failed == caf::sec::request_timeout;
      return {late ? errc::timeout : from_caf_error(failed).code(),
              "rank " + std::to_string(rank_) + ": bucket " + std::to_string(p.bucket)
                  + " of micro-batch " + std::to_string(p.micro) + " of step "
                  + std::to_string(p.step)
                  + (late ? " was not answered by the reducer within " + std::to_string(timeout_ms_)
                                + " ms (timeout_ms, zmuon.timeout_ms)"
                          : " got no answer from the reducer: " + caf::to_string(failed))};
    }
  }
  return {};
}

error reduce_window::drain() {
  auto err = wait_until(0);
  open_.clear();  // after an error: the rest is abandoned with the box (answers dropped)
  box_.reset();
  return err;
}

}  // namespace zmuon
