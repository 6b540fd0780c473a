// Shared fixture of the per-actor unit tests: an actor system under CAF 0.17.6's testing
// scheduler (nothing runs until the test says so), helpers to step actors one message at a time
// and to peek at mailboxes, and recording test doubles for the narrow peer interfaces
// (actors/interfaces.hpp, comm/comm.hpp). The doubles share a log with the test; everything runs
// on the test thread, so the test reads and changes the logs between steps without locks.
#pragma once

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "actors/interfaces.hpp"
#include "comm/comm.hpp"
#include "messages/errors.hpp"
#include "messages/messages.hpp"
#include "messages/registry.hpp"

namespace zmuon::test {

struct test_config : caf::actor_system_config {
  test_config() {
    register_messages(*this);
    set("scheduler.policy", caf::atom("testing"));
    set("logger.verbosity", caf::atom("quiet"));
  }
};

/// The answer to one request made through actor_fixture::ask.
template <class T>
struct reply_slot {
  bool done = false;
  std::optional<T> value;
  caf::error error;
};

/// Every message the doubles received, in order of receipt: "store: apply_muon 3/1".
struct trace_log {
  std::vector<std::string> lines;
  void add(const std::string& peer, const std::string& what, uint64_t step, int index = -1) {
    lines.push_back(peer + ": " + what + " " + std::to_string(step)
                    + (index >= 0 ? "/" + std::to_string(index) : ""));
  }
};

class actor_fixture {
public:
  test_config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched{
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())};

  // Every actor a test made is shut down here, so ~actor_system never waits on one.
  ~actor_fixture() {
    for (auto& a : kept_)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// Tracks `h` for shutdown and returns it.
  template <class Handle>
  Handle keep(Handle h) {
    kept_.push_back(caf::actor_cast<caf::strong_actor_ptr>(h));
    return h;
  }

  /// Runs every pending message of every actor; returns how many ran.
  size_t run() { return sched.run(); }

  /// Runs exactly the next message of `h` (fails the test when `h` has none scheduled).
  template <class Handle>
  void run_one(const Handle& h) {
    BOOST_REQUIRE_MESSAGE(sched.prioritize(h), "the actor has no message scheduled");
    sched.run_once();
  }

  template <class Handle>
  static caf::mailbox_element* peek(const Handle& h) {
    return caf::actor_cast<caf::abstract_actor*>(h)->peek_at_next_mailbox_element();
  }

  /// The next message of `h` if it is a T (else nullptr), without consuming it.
  template <class T, class Handle>
  static const T* next_as(const Handle& h) {
    auto* me = peek(h);
    if (me == nullptr || !me->content().template match_elements<T>())
      return nullptr;
    return &me->content().template get_as<T>(0);
  }

  /// Sends `msg` to `dest` from no one (for messages without a reply).
  template <class Dest, class Msg>
  void tell(const Dest& dest, Msg msg) {
    caf::anon_send(dest, std::move(msg));
  }

  /// Sends the request `msg` to `dest` from a fresh client actor; the reply lands in the slot.
  /// The request is in dest's mailbox when this returns; nothing else has run.
  template <class Reply, class Dest, class Msg>
  std::shared_ptr<reply_slot<Reply>> ask(const Dest& dest, Msg msg) {
    auto slot = std::make_shared<reply_slot<Reply>>();
    // The values travel as spawn arguments, not captures: CAF 0.17's init_fun_factory binds a
    // reference to a null argument tuple for a function actor spawned without arguments, which
    // UndefinedBehaviorSanitizer reports (.ci/sanitize asan).
    using slot_ptr = std::shared_ptr<reply_slot<Reply>>;
    auto body = [](caf::event_based_actor* self, Dest dest, Msg msg, slot_ptr slot) {
      self->request(dest, caf::infinite, msg)
          .then(
              [slot](Reply& x) {
                slot->done = true;
                slot->value = std::move(x);
              },
              [slot](caf::error& err) {
                slot->done = true;
                slot->error = std::move(err);
              });
    };
    auto client = keep(sys.spawn(body, dest, msg, slot));
    run_one(client);
    return slot;
  }

private:
  std::vector<caf::strong_actor_ptr> kept_;
};

/// Delivers `reply` through `promise`, which the test double `owner` made, from the test thread.
/// Outside the double's own handler, its execution unit is the test scheduler's worker of the
/// last run, which no longer exists; without one, the reply goes through the scheduler.
template <class Promise, class Reply>
void deliver_from_test(caf::local_actor* owner, Promise& promise, Reply&& reply) {
  auto* unit = owner->context();
  owner->context(nullptr);
  promise.deliver(std::forward<Reply>(reply));
  owner->context(unit);
}

// -- checks --------------------------------------------------------------------------------------

template <class T>
const T& value_of(const std::shared_ptr<reply_slot<T>>& r) {
  BOOST_REQUIRE_MESSAGE(r->done, "no reply yet");
  BOOST_REQUIRE_MESSAGE(r->value.has_value(), "expected a value, got " << to_string(r->error));
  return *r->value;
}

/// The reply is an error of `code` whose message contains `needle`.
template <class T>
void check_error(const std::shared_ptr<reply_slot<T>>& r, errc code, const std::string& needle) {
  BOOST_REQUIRE_MESSAGE(r->done, "no reply yet");
  BOOST_REQUIRE_MESSAGE(!r->value.has_value(), "expected an error, got a value");
  auto err = from_caf_error(r->error);
  BOOST_CHECK_MESSAGE(err.code() == code,
                      "error " << err.to_string() << ", expected code " << to_string(code));
  BOOST_CHECK_MESSAGE(err.message().find(needle) != std::string::npos,
                      "error '" << err.message() << "' does not mention '" << needle << "'");
}

inline bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size()
         && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline std::vector<float> copy_of(const float* data, int64_t n) {
  return n > 0 ? std::vector<float>(data, data + n) : std::vector<float>{};
}

// -- the store as the reducer sees it ---------------------------------------------------------

struct accumulate_log {
  struct call {
    accumulate msg;
    std::vector<float> slice;  // the values on receipt (the sender may write them again)
  };
  std::vector<call> calls;
  caf::error fail_with;  // answered instead of ack when set
  bool hold = false;     // set: the answers wait until the test calls answer(i)
  std::vector<caf::typed_response_promise<ack>> held;  // by call, when held
  caf::local_actor* owner = nullptr;

  /// Answers held call i (ack, or fail_with when set).
  void answer(size_t i) {
    if (fail_with)
      deliver_from_test(owner, held.at(i), fail_with);
    else
      deliver_from_test(owner, held.at(i), ack{calls.at(i).msg.step});
  }
};

inline store_accumulate_actor::behavior_type fake_accumulate_store(
    store_accumulate_actor::pointer self, std::shared_ptr<accumulate_log> log) {
  log->owner = self;
  return {
      [=](accumulate& msg) -> caf::result<ack> {
        log->calls.push_back({msg, copy_of(msg.slice.data, msg.slice.size)});
        if (log->hold) {
          log->held.push_back(self->make_response_promise<ack>());
          return log->held.back();
        }
        if (log->fail_with)
          return log->fail_with;
        return ack{msg.step};
      },
  };
}

// -- the store as the loss scaler sees it ------------------------------------------------------

struct scan_log {
  std::vector<scan_grads> calls;
  bool nonfinite = false;
  double sum_squares = 0;
  caf::error fail_with;
};

inline store_scan_actor::behavior_type fake_scan_store(store_scan_actor::pointer,
                                                       std::shared_ptr<scan_log> log) {
  return {
      [log](scan_grads& msg) -> caf::result<grad_scan> {
        log->calls.push_back(msg);
        if (log->fail_with)
          return log->fail_with;
        return grad_scan{msg.step, log->nonfinite, log->sum_squares};
      },
  };
}

// -- a comm actor that records requests and lets the test answer them -------------------------

struct comm_log {
  struct call {
    enum kind_t { reduce_scatter, all_reduce, all_to_all } kind;
    reduce_scatter_req rs;
    all_reduce_req ar;
    all_to_all_req a2a;
    caf::typed_response_promise<comm_done> done;
    caf::typed_response_promise<all_reduce_result> reduced;

    caf::local_actor* owner = nullptr;  // the comm double that holds the promise
    bool answered = false;

    const collective_tag& tag() const {
      return kind == reduce_scatter ? rs.tag : kind == all_reduce ? ar.tag : a2a.tag;
    }
    /// Completes a reduce-scatter or all-to-all (after the test filled its outputs).
    void finish() { deliver(done, comm_done{tag()}); }
    void reduce_scatter_result(const std::vector<float>& out) {
      BOOST_CHECK_EQUAL(static_cast<int64_t>(out.size()), rs.count);
      std::copy_n(out.begin(), std::min<int64_t>(rs.count, out.size()), rs.out);
      finish();
    }
    void all_reduce_answer(std::vector<double> values) {
      deliver(reduced, all_reduce_result{ar.tag, std::move(values)});
    }
    void fail(caf::error err) {
      if (kind == all_reduce)
        deliver(reduced, std::move(err));
      else
        deliver(done, std::move(err));
    }

  private:
    template <class Promise, class Reply>
    void deliver(Promise& promise, Reply&& reply) {
      answered = true;
      deliver_from_test(owner, promise, std::forward<Reply>(reply));
    }
  };
  std::deque<call> calls;  // deque: references stay valid while requests arrive
  std::shared_ptr<trace_log> trace;
  /// Called with each request on arrival; may answer it at once. Unset: the test answers.
  std::function<void(call&)> on_request;
};

inline comm_actor::behavior_type fake_comm(comm_actor::pointer self,
                                           std::shared_ptr<comm_log> log) {
  auto arrive = [log](comm_log::call& c) {
    if (log->trace) {
      const auto& t = c.tag();
      bool indexed = t.kind == collective_kind::gather || t.kind == collective_kind::scatter;
      log->trace->add("comm", to_string(t.kind), t.step, indexed ? t.index : -1);
    }
    if (log->on_request)
      log->on_request(c);
  };
  return {
      [=](reduce_scatter_req& req) -> caf::result<comm_done> {
        auto& c = log->calls.emplace_back();
        c.owner = self;
        c.kind = comm_log::call::reduce_scatter;
        c.rs = req;
        c.done = self->make_response_promise<comm_done>();
        auto promise = c.done;
        arrive(c);
        return promise;
      },
      [=](all_reduce_req& req) -> caf::result<all_reduce_result> {
        auto& c = log->calls.emplace_back();
        c.owner = self;
        c.kind = comm_log::call::all_reduce;
        c.ar = req;
        c.reduced = self->make_response_promise<all_reduce_result>();
        auto promise = c.reduced;
        arrive(c);
        return promise;
      },
      [=](all_to_all_req& req) -> caf::result<comm_done> {
        auto& c = log->calls.emplace_back();
        c.owner = self;
        c.kind = comm_log::call::all_to_all;
        c.a2a = req;
        c.done = self->make_response_promise<comm_done>();
        auto promise = c.done;
        arrive(c);
        return promise;
      },
  };
}

/// Sum of the sizes of a segment list.
inline int64_t total_size(const std::vector<segment>& segs) {
  int64_t n = 0;
  for (const auto& s : segs)
    n += s.size;
  return n;
}

/// The concatenated contents of a segment list.
inline std::vector<float> gather_segments(const std::vector<segment>& segs) {
  std::vector<float> out;
  for (const auto& s : segs)
    out.insert(out.end(), s.data, s.data + s.size);
  return out;
}

/// Writes `values` across a segment list, in order; the sizes must match (checked, not required:
/// this runs inside actor handlers, where a thrown Boost abort would only kill the actor).
inline void fill_segments(const std::vector<segment>& segs, const std::vector<float>& values) {
  BOOST_CHECK_EQUAL(total_size(segs), static_cast<int64_t>(values.size()));
  if (total_size(segs) != static_cast<int64_t>(values.size()))
    return;
  auto src = values.begin();
  for (const auto& s : segs)
    for (int64_t i = 0; i < s.size; ++i)
      s.data[i] = *src++;
}

// -- the coordinator's peers ---------------------------------------------------------------------

struct flush_log {
  std::vector<flush> calls;
  int32_t micros = 1;
  caf::error fail_with;
  std::shared_ptr<trace_log> trace;
};

inline reducer_flush_actor::behavior_type fake_reducer(reducer_flush_actor::pointer,
                                                       std::shared_ptr<flush_log> log) {
  return {
      [log](flush& msg) -> caf::result<flush_done> {
        log->calls.push_back(msg);
        if (log->trace)
          log->trace->add("reducer", "flush", msg.step);
        if (log->fail_with)
          return log->fail_with;
        return flush_done{msg.step, log->micros};
      },
  };
}

struct check_log {
  std::vector<check_overflow> calls;
  bool overflow = false;
  float scale = 1;
  float next_scale = 1;
  double sum_squares = 0;  // all ranks' sum of squares, as the vote would report it
  std::shared_ptr<trace_log> trace;
};

inline scaler_check_actor::behavior_type fake_scaler(scaler_check_actor::pointer,
                                                     std::shared_ptr<check_log> log) {
  return {
      [log](check_overflow& msg) -> overflow_report {
        log->calls.push_back(msg);
        if (log->trace)
          log->trace->add("scaler", "check_overflow", msg.step);
        return overflow_report{msg.step, log->overflow, log->scale, log->next_scale,
                               log->sum_squares};
      },
  };
}

struct step_store_log {
  std::shared_ptr<trace_log> trace;
  std::function<void(const muon_momentum&)> fill_u;  // writes u into the caller's view
  std::vector<unscale_clip> unscales;
  std::vector<muon_momentum> momentums;
  std::vector<std::pair<apply_muon, std::vector<float>>> applies;  // with the update's values
  std::vector<adamw_step> adamws;
  std::string fail_on;  // the message name answered with fail_with
  caf::error fail_with;
  int hold_momentum = -1;   // this chunk's muon_momentum waits for answer_held() (a busy store)
  bool hold_adamw = false;  // adamw_step waits for answer_held()
  caf::typed_response_promise<ack> held;
  caf::local_actor* owner = nullptr;

  void answer_held(uint64_t step) { deliver_from_test(owner, held, ack{step}); }

  caf::error record(const std::string& what, uint64_t step, int index = -1) {
    if (trace)
      trace->add("store", what, step, index);
    return what == fail_on ? fail_with : caf::error{};
  }
};

inline store_step_actor::behavior_type fake_step_store(store_step_actor::pointer self,
                                                       std::shared_ptr<step_store_log> log) {
  log->owner = self;
  return {
      [log](discard_grads& m) -> caf::result<ack> {
        if (auto err = log->record("discard_grads", m.step))
          return err;
        return ack{m.step};
      },
      [log](unscale_clip& m) -> caf::result<ack> {
        log->unscales.push_back(m);
        if (auto err = log->record("unscale_clip", m.step))
          return err;
        return ack{m.step};
      },
      [log, self](muon_momentum& m) -> caf::result<ack> {
        log->momentums.push_back(m);
        if (auto err = log->record("muon_momentum", m.step, m.chunk))
          return err;
        if (m.chunk == log->hold_momentum) {  // the test writes u (fill_u on momentums.back())
          log->held = self->make_response_promise<ack>();
          return log->held;
        }
        if (log->fill_u)
          log->fill_u(m);
        return ack{m.step};
      },
      [log](apply_muon& m) -> caf::result<ack> {
        log->applies.emplace_back(m, copy_of(m.update.data, m.update.size));
        if (auto err = log->record("apply_muon", m.step, m.chunk))
          return err;
        return ack{m.step};
      },
      [log, self](adamw_step& m) -> caf::result<ack> {
        log->adamws.push_back(m);
        if (auto err = log->record("adamw_step", m.step))
          return err;
        if (log->hold_adamw) {
          log->held = self->make_response_promise<ack>();
          return log->held;
        }
        return ack{m.step};
      },
      [log](finish_step& m) -> caf::result<ack> {
        if (auto err = log->record("finish_step", m.step))
          return err;
        return ack{m.step};
      },
      [log](qk_clip_scale& m) -> caf::result<ack> {
        if (auto err = log->record("qk_clip_scale", m.step))
          return err;
        return ack{m.step};
      },
      [log](normuon_step& m) -> caf::result<ack> {
        if (auto err = log->record("normuon_step", m.step, m.chunk))
          return err;
        return ack{m.step};
      },
  };
}

}  // namespace zmuon::test
