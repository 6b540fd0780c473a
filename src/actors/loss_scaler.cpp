#include "actors/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "caf/all.hpp"

#include "messages/errors.hpp"
#include "trace/trace.hpp"

namespace zmuon {

loss_scale_state::loss_scale_state(const fp16_options& opts)
    : opts_(opts), hysteresis_left_(std::max(1, opts.hysteresis)) {
  if (!opts_.enabled)
    scale_ = 1;
  else if (opts_.loss_scale > 0)
    scale_ = opts_.loss_scale;
  else
    scale_ = std::ldexp(1.0f, opts_.initial_scale_power);
}

float loss_scale_state::update(bool overflow) {
  bool dynamic = opts_.enabled && opts_.loss_scale <= 0;
  if (dynamic) {
    if (overflow) {
      if (opts_.hysteresis <= 1 || hysteresis_left_ == 1)
        scale_ = std::max(scale_ / opts_.scale_factor, opts_.min_loss_scale);
      else
        --hysteresis_left_;
      last_overflow_iter_ = iter_;
    } else if ((iter_ - last_overflow_iter_) % opts_.loss_scale_window == 0) {
      hysteresis_left_ = std::max(1, opts_.hysteresis);
      scale_ *= opts_.scale_factor;
    }
  }
  ++iter_;
  return scale_;
}

loss_scale_snapshot loss_scale_state::save() const {
  return {scale_, iter_, last_overflow_iter_, hysteresis_left_};
}

void loss_scale_state::restore(const loss_scale_snapshot& s) {
  scale_ = opts_.enabled ? s.scale : 1.0f;  // without fp16 the gradient is never scaled
  iter_ = s.iter;
  last_overflow_iter_ = s.last_overflow_iter;
  hysteresis_left_ = s.hysteresis_left;
}

namespace {

struct scaler_state {
  loss_scale_state scale{fp16_options{}};
  store_scan_actor store;
  comm_actor comm;
  trace::track tr;
  static const char* name;
};
const char* scaler_state::name = "loss_scaler";

using scaler_pointer = loss_scaler_actor::stateful_pointer<scaler_state>;

loss_scaler_actor::behavior_type scaler_impl(scaler_pointer self, fp16_options opts,
                                             store_scan_actor store, comm_actor comm,
                                             std::shared_ptr<trace::recorder> tracer) {
  self->state.tr = trace::track(std::move(tracer), "loss_scaler");
  self->state.scale = loss_scale_state(opts);
  self->state.store = std::move(store);
  self->state.comm = std::move(comm);
  return {
      [=](check_overflow& msg) -> caf::result<overflow_report> {
        ZMUON_TRACE_RECV(self, msg);
        auto rp = self->make_response_promise<overflow_report>();
        auto step = msg.step;
        trace::request(self, self->state.tr, self->state.store, scan_grads{step, msg.chunks_ahead})
            .then(
                [=](grad_scan& scan) mutable {
                  // The flags' sum is non-zero exactly when one is set, so the gradient norm's
                  // sum travels in the same collective (a non-finite sum only with a flag).
                  all_reduce_req vote{collective_tag{collective_kind::vote, step, 0, 0},
                                      reduce_op::sum,
                                      {scan.nonfinite ? 1.0 : 0.0, scan.sum_squares}};
                  trace::request(self, self->state.tr, self->state.comm, std::move(vote))
                      .then(
                          [=](all_reduce_result& res) mutable {
                            if (res.values.size() != 2) {
                              rp.deliver(make_caf_error(
                                  errc::bad_state,
                                  "step " + std::to_string(step) + ": the overflow vote returned "
                                      + std::to_string(res.values.size())
                                      + " values instead of 2 (flag, sum of squares)"));
                              return;
                            }
                            bool overflow = res.values[0] > 0;
                            float used = self->state.scale.scale();
                            float next = self->state.scale.update(overflow);
                            rp.deliver(overflow_report{step, overflow, used, next, res.values[1]});
                          },
                          [=](caf::error& err) mutable { rp.deliver(std::move(err)); });
                },
                [=](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [=](scale_atom) -> float { return self->state.scale.scale(); },
      [=](scaler_state_atom) -> loss_scale_snapshot { return self->state.scale.save(); },
      [=](restore_scaler& msg) -> caf::result<ack> {
        const auto& s = msg.state;
        if (!(s.scale > 0) || !std::isfinite(s.scale) || s.iter < 0 || s.hysteresis_left < 1)
          return make_caf_error(errc::invalid_argument,
                                "restore_scaler: scale " + std::to_string(s.scale) + ", iteration "
                                    + std::to_string(s.iter) + ", hysteresis "
                                    + std::to_string(s.hysteresis_left) + " is not a valid state");
        self->state.scale.restore(s);
        return ack{msg.step};
      },
  };
}

}  // namespace

loss_scaler_actor spawn_loss_scaler(caf::actor_system& sys, const fp16_options& opts,
                                    store_scan_actor store, comm_actor comm,
                                    std::shared_ptr<trace::recorder> tracer) {
  return sys.spawn(scaler_impl, opts, std::move(store), std::move(comm), std::move(tracer));
}

}  // namespace zmuon
