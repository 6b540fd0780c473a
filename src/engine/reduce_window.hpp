// engine::reduce's window over one rank's reduce buckets (engine_options::max_buckets_in_flight):
// each bucket goes to the rank's reducer as a request, answered once it has landed in the store;
// the host waits for the oldest answer before handing over more than the window allows, so the
// buckets alive at once (host or device input, the reducer's output) stay bounded. Internal.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <string>

#include "caf/all.hpp"

#include "actors/reducer.hpp"
#include "trace/recorder.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

class reduce_window {
public:
  /// `timeout_ms`: how long a bucket may take from its hand-over to its answer.
  reduce_window(caf::actor_system& sys, int rank, int64_t timeout_ms,
                std::shared_ptr<trace::recorder> tracer)
      : sys_(&sys), rank_(rank), timeout_ms_(timeout_ms), tracer_(std::move(tracer)) {}

  /// Sends `msg` to `reducer` as a request (traced: the host's `send`, and its `reply` when
  /// taken).
  void hand_over(const reducer_actor& reducer, micro_grads msg);

  /// Takes answers, oldest first, until at most `keep` buckets are unanswered. An error only when
  /// a bucket is not answered in time or the reducer is gone (naming the rank, step, micro-batch
  /// and bucket); the reducer's own failures are kept for the step's flush, which step() reports.
  error wait_until(size_t keep);

  /// wait_until(0), then lets go of the requests' mailbox (step() start: nothing piles up in it);
  /// after an error the buckets still open are abandoned.
  error drain();

  size_t unanswered() const { return open_.size(); }

private:
  using handle = decltype(std::declval<caf::scoped_actor&>()->request(
      std::declval<const reducer_actor&>(), caf::duration{}, std::declval<micro_grads>()));
  struct pending {
    handle h;
    uint64_t step;
    int32_t micro;
    int32_t bucket;
    std::string id;  // the trace's correlation id (tracing only)
  };
  caf::actor_system* sys_;
  int rank_;
  int64_t timeout_ms_;
  std::shared_ptr<trace::recorder> tracer_;
  // The requester of this rank's buckets. CAF 0.17 leaves a request's timeout message in a
  // blocking actor's mailbox after the answer, so the box lives one step (drain() ends it).
  std::unique_ptr<caf::scoped_actor> box_;
  std::deque<pending> open_;
};

}  // namespace zmuon
