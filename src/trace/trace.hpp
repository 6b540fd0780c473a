// Recording the actors' messages (docs/DESIGN.md §9). CAF 0.17.6 as Debian builds it has logging
// and the actor profiler compiled out, so the actors record themselves through these helpers, each
// a drop-in at a send, request or handler:
//
//   state.tr = trace::track(recorder, "reducer");      // at spawn; a null recorder: tracing off
//   ZMUON_TRACE_RECV(self, msg);                        // first line of a handler: a `recv` record
//   trace::request(self, st.tr, dest, msg).then(f, g);  // instead of self->request(dest, infinite,
//                                                       // msg): `send`, then `reply` (and `span`)
//   trace::send(self, st.tr, dest, msg, peer_rank);     // instead of self->send(dest, msg)
//   trace::span s(st.tr, "ns", fields);                 // a compute phase, recorded on scope exit
//
// With tracing off each helper costs one branch on the track's recorder pointer.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "caf/detail/type_traits.hpp"
#include "caf/error.hpp"
#include "caf/local_actor.hpp"
#include "caf/mailbox_element.hpp"
#include "caf/message_id.hpp"

#include "trace/describe.hpp"
#include "trace/recorder.hpp"

namespace zmuon::trace {

/// One actor's handle on its rank's recorder.
class track {
public:
  track() = default;
  track(std::shared_ptr<recorder> rec, const char* actor) : rec_(std::move(rec)), actor_(actor) {}
  explicit operator bool() const { return rec_ != nullptr; }
  recorder* rec() const { return rec_.get(); }
  const char* actor() const { return actor_; }

private:
  std::shared_ptr<recorder> rec_;
  const char* actor_ = "";
};

/// The correlation id of a CAF request: the requester's actor id and its request number.
inline std::string request_id(caf::actor_id requester, caf::message_id mid) {
  return "r" + std::to_string(requester) + "." + std::to_string(mid.request_id().integer_value());
}

namespace detail {

// One-way messages with an id derived from their content (trace/describe.hpp) use it; requests
// use the CAF request id of the message being handled.
template <class Msg>
auto received_id(caf::local_actor*, const Msg& msg, int rank, int)
    -> decltype(async_id(msg, rank)) {
  return async_id(msg, rank);
}
template <class Msg>
std::string received_id(caf::local_actor* self, const Msg&, int, long) {
  auto* me = self->current_mailbox_element();
  if (!me || !me->sender)
    return "anon";
  return request_id(me->sender->id(), me->mid);
}

// What a recorded request remembers until its answer: who asked, the id, when, what.
struct pending_request {
  track tr;
  std::string id;
  int64_t t0 = 0;
  fields f;
};

template <class F, class R, class... Ts>
auto on_reply(F f, std::shared_ptr<const pending_request> p, caf::detail::type_list<Ts...>) {
  return [=](Ts... xs) mutable -> R {
    // The `reply` record is written when the continuation returns, with its run time as `dur`
    // (bench/step's plumbing figure reads it); `t` is when the answer was taken.
    struct on_exit {
      const pending_request& p;
      int64_t t;
      fields answer;
      ~on_exit() { p.tr.rec()->reply(p.tr.actor(), t, answer, p.id, {}, now_ns() - t); }
    } guard{*p, now_ns(), describe(xs...)};
    if (p->f.phase)
      p->tr.rec()->span(p->tr.actor(), p->f.phase, p->t0, guard.t - p->t0, p->f, nullptr, true);
    return f(std::forward<Ts>(xs)...);
  };
}

}  // namespace detail

/// Records the handling of `msg` by the current actor: `recv` with the handler's duration. Off,
/// it is a null pointer and one branch.
class receiving {
public:
  template <class Self, class Msg>
  receiving(Self* self, const track& tr, const Msg& msg) {
    if (!tr)
      return;
    on_.reset(new pending{tr.rec(), tr.actor(), now_ns(), describe(msg), {}});
    on_->id = detail::received_id(self, msg, on_->rec->rank(), 0);
  }
  ~receiving() {
    if (on_)
      on_->rec->recv(on_->actor, on_->t0, now_ns() - on_->t0, on_->f, on_->id);
  }
  receiving(const receiving&) = delete;
  receiving& operator=(const receiving&) = delete;

private:
  struct pending {
    recorder* rec;
    const char* actor;
    int64_t t0;
    fields f;
    std::string id;
  };
  std::unique_ptr<pending> on_;
};

#define ZMUON_TRACE_RECV(self, msg) \
  ::zmuon::trace::receiving zmuon_trace_receiving_((self), (self)->state.tr, (msg))

/// A request whose answer is recorded: `then` wraps the handlers (same signatures, so CAF's typed
/// response checks still apply) when tracing is on. Off, it holds a null pointer.
template <class Handle>
class traced_request {
public:
  traced_request(Handle h, std::shared_ptr<const detail::pending_request> p)
      : h_(std::move(h)), p_(std::move(p)) {}

  template <class F, class G>
  void then(F f, G g) {
    if (!p_) {
      h_.then(std::move(f), std::move(g));
      return;
    }
    using trait = caf::detail::get_callable_trait<F>;
    auto on_error = [p = p_, g](caf::error& err) mutable {
      p->tr.rec()->reply(p->tr.actor(), now_ns(), fields{}, p->id, caf::to_string(err));
      g(err);
    };
    h_.then(detail::on_reply<F, typename trait::result_type>(std::move(f), p_,
                                                             typename trait::arg_types{}),
            std::move(on_error));
  }

private:
  Handle h_;
  std::shared_ptr<const detail::pending_request> p_;
};

/// `self->request(dest, caf::infinite, msg)`, recorded.
template <class Self, class Dest, class Msg>
auto request(Self* self, const track& tr, const Dest& dest, Msg&& msg) {
  if (!tr) {
    auto h = self->request(dest, caf::infinite, std::forward<Msg>(msg));
    return traced_request<decltype(h)>(std::move(h), nullptr);
  }
  auto p = std::make_shared<detail::pending_request>();
  p->tr = tr;
  p->f = describe(msg);
  p->t0 = now_ns();
  auto h = self->request(dest, caf::infinite, std::forward<Msg>(msg));
  p->id = request_id(self->id(), h.id());
  tr.rec()->send(tr.actor(), p->t0, p->f, p->id, true);
  return traced_request<decltype(h)>(std::move(h), std::move(p));
}

/// `self->send(dest, msg)` of a one-way message with a content id, to rank `peer`, recorded.
template <class Self, class Dest, class Msg>
void send(Self* self, const track& tr, const Dest& dest, Msg&& msg, int peer) {
  if (tr)
    tr.rec()->send(tr.actor(), now_ns(), describe(msg), async_id(msg, peer), false, peer);
  self->send(dest, std::forward<Msg>(msg));
}

/// A compute phase on the current actor, recorded when it goes out of scope.
class span {
public:
  /// `per_param`: a span of work on named parameters (add_params); none named, none recorded.
  enum kind { plain, per_param };
  span(const track& tr, const char* phase, fields f, kind k = plain) {
    if (!tr)
      return;
    with_params_ = k == per_param;
    rec_ = tr.rec();
    actor_ = tr.actor();
    phase_ = phase;
    f_ = f;
    t0_ = now_ns();
  }
  ~span() { end(); }
  /// Records the span now (the destructor then does nothing).
  void end() {
    if (rec_ && !(with_params_ && params_.empty()))
      rec_->span(actor_, phase_, t0_, now_ns() - t0_, f_, with_params_ ? &params_ : nullptr);
    rec_ = nullptr;
  }
  /// Names parameters the phase works on (per_param spans).
  void add_params(const std::vector<int>& ps) {
    if (!rec_)
      return;
    params_.insert(params_.end(), ps.begin(), ps.end());
  }
  void add_bytes(int64_t b) { f_.bytes += b; }
  span(const span&) = delete;
  span& operator=(const span&) = delete;

private:
  recorder* rec_ = nullptr;
  const char* actor_ = "";
  const char* phase_ = "";
  int64_t t0_ = 0;
  fields f_;
  bool with_params_ = false;
  std::vector<int> params_;
};

}  // namespace zmuon::trace
