#include "actors/reducer.hpp"

#include <set>

#include "caf/all.hpp"

#include "messages/errors.hpp"
#include "trace/trace.hpp"

namespace zmuon {

namespace {

struct reducer_state {
  std::shared_ptr<const plan> pl;
  int rank = 0;
  store_accumulate_actor store;
  comm_actor comm;
  std::shared_ptr<compute_backend> device;  // set when the comm moves device memory
  uint64_t step = 0;         // the step whose buckets are being reduced (0: none yet)
  int64_t in_flight = 0;     // buckets handed over and not yet landed
  std::set<int32_t> micros;  // micro-batches seen in this step
  caf::error failure;        // first failure of this step
  caf::typed_response_promise<flush_done> pending_flush;
  bool flush_waiting = false;
  trace::track tr;
  static const char* name;
};
const char* reducer_state::name = "reducer";

using reducer_pointer = reducer_actor::stateful_pointer<reducer_state>;

void answer_flush_if_done(reducer_pointer self) {
  auto& st = self->state;
  if (!st.flush_waiting || st.in_flight > 0)
    return;
  st.flush_waiting = false;
  if (st.failure)
    st.pending_flush.deliver(std::move(st.failure));
  else
    st.pending_flush.deliver(flush_done{st.step, static_cast<int32_t>(st.micros.size())});
  st.failure = caf::error{};
  st.micros.clear();
  st.step = 0;
}

void record_failure(reducer_pointer self, caf::error err) {
  if (!self->state.failure)
    self->state.failure = std::move(err);
}

/// Refuses a bucket before anything is issued: the host's answer, and the flush's failure.
caf::error refuse(reducer_pointer self, caf::error err) {
  record_failure(self, err);
  return err;
}

// One bucket's reduce-scatter buffers: the packed bucket (the host's, or for a device comm a
// copy in the backend's memory when the host packed it in host memory), reduced in place: this
// rank's part of the input becomes the output (no second buffer; at world 1 under nccl nothing
// moves). Lives until the store has added the result.
struct bucket_buffers {
  std::shared_ptr<std::vector<float>> staging;
  device_buffer device_in;
  std::shared_ptr<device_buffer> device_in_shared;
  float* in = nullptr;
  bool on_host = false;

  void release() {
    staging.reset();
    device_in = device_buffer{};
    device_in_shared.reset();
    in = nullptr;
  }
};

std::shared_ptr<bucket_buffers> make_buffers(compute_backend* device, const micro_grads& msg) {
  auto b = std::make_shared<bucket_buffers>();
  b->staging = msg.data;
  if (msg.device_data) {  // packed in the backend's memory by the host already
    b->device_in_shared = msg.device_data;
    b->in = msg.device_data->data();
  } else if (device == nullptr) {  // the comm moves host memory
    b->in = b->staging->data();
    b->on_host = true;
  } else {
    b->device_in = device->allocate_for_overwrite(static_cast<int64_t>(b->staging->size()));
    // Enqueued without waiting; the staging lives in `b` until the store has added the result.
    device->copy_from_host_async(b->device_in.data(), b->staging->data(), b->device_in.size());
    b->in = b->device_in.data();
  }
  return b;
}

// A bucket has landed in the store (or failed on the way): its buffers are released before the
// host is answered, so that the host, whose answered buckets bound what it hands over next, never
// finds the memory of an answered bucket still held.
void bucket_done(reducer_pointer self, bucket_buffers& buf,
                 caf::typed_response_promise<ack>& answer, uint64_t step, caf::error err) {
  buf.release();
  --self->state.in_flight;
  if (err) {
    answer.deliver(err);
    record_failure(self, std::move(err));
  } else {
    answer.deliver(ack{step});
  }
  answer_flush_if_done(self);
}

reducer_actor::behavior_type reducer_impl(reducer_pointer self, std::shared_ptr<const plan> pl,
                                          int rank, store_accumulate_actor store, comm_actor comm,
                                          std::shared_ptr<compute_backend> device,
                                          std::shared_ptr<trace::recorder> tracer) {
  auto& st = self->state;
  st.tr = trace::track(std::move(tracer), "reducer");
  st.pl = std::move(pl);
  st.rank = rank;
  st.store = std::move(store);
  st.comm = std::move(comm);
  st.device = std::move(device);
  self->set_exception_handler([](std::exception_ptr& eptr) { return error_from_exception(eptr); });
  return {
      [=](micro_grads& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        auto& st = self->state;
        const auto& pl = *st.pl;
        if (st.step != 0 && msg.step != st.step)
          return refuse(
              self, make_caf_error(errc::bad_state, "gradients for step " + std::to_string(msg.step)
                                                        + " arrived while step "
                                                        + std::to_string(st.step) + " is open"));
        if (msg.bucket < 0 || msg.bucket >= static_cast<int32_t>(pl.buckets.size())
            || (!msg.data && !msg.device_data && !msg.pieces) || (msg.device_data && !st.device)
            || (msg.pieces && !msg.reduced)
            || msg.size() != pl.buckets[msg.bucket].shard_len * (msg.reduced ? 1 : pl.world))
          return refuse(self, make_caf_error(errc::shape_mismatch,
                                             "bucket " + std::to_string(msg.bucket) + " of step "
                                                 + std::to_string(msg.step)
                                                 + " has the wrong size or index"));
        st.step = msg.step;
        st.micros.insert(msg.micro);
        ++st.in_flight;
        auto answer = self->make_response_promise<ack>();
        const auto& b = pl.buckets[msg.bucket];
        collective_tag tag{collective_kind::reduce_scatter, msg.step, msg.micro, msg.bucket};
        if (msg.pieces) {  // read by the store from the caller's gradients: no buffer here
          auto none = std::make_shared<bucket_buffers>();
          accumulate acc{tag.step, tag.micro, tag.index, {}, false, std::move(msg.pieces)};
          acc.at_step = msg.at_step;
          trace::request(self, st.tr, st.store, std::move(acc))
              .then([=](ack&) mutable { bucket_done(self, *none, answer, tag.step, {}); },
                    [=](caf::error& err) mutable {
                      bucket_done(self, *none, answer, tag.step, std::move(err));
                    });
          return answer;
        }
        auto buf = [&] {  // packing and staging: backend work, not plumbing (bench/step)
          trace::span s(st.tr, "buffers",
                        trace::stepped("buffers", msg.step, msg.micro, msg.bucket));
          return make_buffers(st.device.get(), msg);
        }();
        // In place: this rank's part of the input becomes the output (an already averaged
        // bucket is this rank's part alone).
        float* own = buf->in + (msg.reduced ? 0 : static_cast<int64_t>(st.rank) * b.shard_len);
        auto land = [=]() mutable {
          accumulate acc{
              tag.step, tag.micro, tag.index, {own, b.shard_len, nullptr, buf}, buf->on_host};
          // The buffers live until the store has added them.
          trace::request(self, self->state.tr, self->state.store, acc)
              .then([=](ack&) mutable { bucket_done(self, *buf, answer, tag.step, {}); },
                    [=](caf::error& err) mutable {
                      bucket_done(self, *buf, answer, tag.step, std::move(err));
                    });
        };
        if (msg.reduced) {
          land();
          return answer;
        }
        // The requests carry `buf` as the owner of their views: a reducer that ends (the engine
        // stopping after a timeout) frees no buffer that the comm or the store still uses.
        trace::request(self, st.tr, st.comm,
                       reduce_scatter_req{tag, buf->in, own, b.shard_len, buf})
            .then([=](comm_done&) mutable { land(); },
                  [=](caf::error& err) mutable {
                    bucket_done(self, *buf, answer, tag.step, std::move(err));
                  });
        return answer;
      },
      [=](discard_grads& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        auto& st = self->state;
        if (st.in_flight > 0 || st.flush_waiting)
          return make_caf_error(errc::bad_state, "discard of step " + std::to_string(msg.step)
                                                     + " with buckets in flight");
        st.micros.clear();  // a withdrawn hand-over: its micro-batches no longer count
        st.step = 0;
        return ack{msg.step};
      },
      [=](flush& msg) -> caf::result<flush_done> {
        ZMUON_TRACE_RECV(self, msg);
        auto& st = self->state;
        if (st.flush_waiting)
          return make_caf_error(errc::bad_state, "flush of step " + std::to_string(msg.step)
                                                     + " while another flush waits");
        if (st.step != 0 && st.step != msg.step)
          return make_caf_error(errc::bad_state, "flush of step " + std::to_string(msg.step)
                                                     + " but the open step is "
                                                     + std::to_string(st.step));
        st.step = msg.step;
        st.pending_flush = self->make_response_promise<flush_done>();
        st.flush_waiting = true;
        auto promise = st.pending_flush;
        answer_flush_if_done(self);
        return promise;
      },
  };
}

}  // namespace

reducer_actor spawn_reducer(caf::actor_system& sys, std::shared_ptr<const plan> pl, int rank,
                            store_accumulate_actor store, comm_actor comm,
                            std::shared_ptr<compute_backend> device,
                            std::shared_ptr<trace::recorder> tracer) {
  return sys.spawn(reducer_impl, std::move(pl), rank, std::move(store), std::move(comm),
                   std::move(device), std::move(tracer));
}

}  // namespace zmuon
