// engine_lifecycle: the engine starts once, at the first call that needs its ranks, and stops at
// the first failure that may leave them in an unknown state; every later call gets that failure.
// Part of engine::impl (impl.hpp). Internal: not installed.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "node/job_end.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

struct engine_lifecycle {
  std::mutex start_mutex;
  /// The first failure that may have left the ranks in an unknown state: work of a step in
  /// flight or half applied (a bucket or a step not answered in time, a rank's step failing, a
  /// backend failure while handing over), or a start that got only part of the way. start()
  /// refuses every later call with it.
  std::string stopped;
  errc stopped_code = errc::bad_state;  // comm_failure when the job lost a node
  std::mutex stop_mutex;                // guards `stopped` (two ranks' reduce() may fail at once)

  /// Why no call may run: the engine stopped, or the job `end` (null: one process) is over.
  error refusal(const job_end* end) {
    {
      std::lock_guard<std::mutex> lock(stop_mutex);
      if (!stopped.empty())
        return {stopped_code, stopped};
    }
    if (end)
      if (auto what = end->what(); !what.empty())
        return {errc::comm_failure, job_over(what)};
    return {};
  }

  /// Latches `err` (when set) as the failure that stops the engine `when` ("in step 3",
  /// "while starting"); returns it. On a node whose job lost another node (`end` says so
  /// within a moment of `err`), the loss is the error, and the engine's from then on.
  error stop(error err, const std::string& when, const job_end* end) {
    if (err && end) {
      auto what = end->wait(kLossNoticed);
      if (!what.empty()) {
        std::lock_guard<std::mutex> lock(stop_mutex);
        if (stopped.empty()) {
          stopped = job_over(what);
          stopped_code = errc::comm_failure;
        }
        return {errc::comm_failure, what};
      }
    }
    std::lock_guard<std::mutex> lock(stop_mutex);
    if (err && stopped.empty())
      stopped = "the engine stopped " + when + " (" + err.to_string()
                + "); its ranks may be part of the way through it, so it takes no further call: "
                  "load a checkpoint into a new engine, and raise timeout_ms (zmuon.timeout_ms) if "
                  "the work only needs longer";
    return err;
  }

  /// How long a failed call waits for the node supervisor to name a lost node: a collective
  /// can fail on the dead peer's connection a moment before the supervisor hears of it.
  static constexpr std::chrono::milliseconds kLossNoticed{3000};
  /// The error of every call once the job has ended.
  static std::string job_over(const std::string& what) {
    return "the job is over (" + what + "): this engine takes no further call";
  }
  static std::string in_step(uint64_t step) { return "in step " + std::to_string(step); }
};

}  // namespace zmuon
