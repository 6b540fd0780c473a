// The reducer alone: its store and comm replaced by recording doubles (support/actor_fixture.hpp),
// stepped one message at a time under CAF's testing scheduler.
#define BOOST_TEST_MODULE reducer
#include "support/actor_fixture.hpp"

#include "actors/reducer.hpp"
#include "kernels/compute.hpp"
#include "plan/plan.hpp"

namespace zmuon::test {
namespace {

constexpr int kWorld = 2;
constexpr int kRank = 1;

// Buckets of at most 18 elements: [a, b] (9 floats per rank) and [c] (3 per rank).
std::shared_ptr<const plan> make_test_plan() {
  auto pl = make_plan({{"a", {3, 4}}, {"b", {5}}, {"c", {2, 3}}}, kWorld, 18);
  BOOST_REQUIRE(pl);
  BOOST_REQUIRE_EQUAL(pl->buckets.size(), 2u);
  BOOST_REQUIRE_EQUAL(pl->buckets[0].shard_len, 9);
  BOOST_REQUIRE_EQUAL(pl->buckets[1].shard_len, 3);
  return std::make_shared<const plan>(std::move(*pl));
}

struct reducer_fixture : actor_fixture {
  std::shared_ptr<const plan> pl = make_test_plan();
  std::shared_ptr<accumulate_log> stored = std::make_shared<accumulate_log>();
  std::shared_ptr<comm_log> comms = std::make_shared<comm_log>();
  store_accumulate_actor store = keep(sys.spawn(fake_accumulate_store, stored));
  comm_actor comm = keep(sys.spawn(fake_comm, comms));
  reducer_actor reducer = keep(spawn_reducer(sys, pl, kRank, store, comm));

  reducer_fixture() { run(); }  // the three actors' initialization

  /// A well-formed bucket: world * shard_len floats, rank-major.
  std::shared_ptr<std::vector<float>> bucket_data(int bucket, int64_t extra = 0) {
    auto n = pl->buckets[bucket].shard_len * kWorld + extra;
    auto v = std::make_shared<std::vector<float>>(n < 0 ? 0 : n);
    for (size_t i = 0; i < v->size(); ++i)
      (*v)[i] = static_cast<float>(i) + 0.25f * static_cast<float>(bucket);
    return v;
  }

  void send_grads(uint64_t step, int32_t micro, int32_t bucket) {
    tell(reducer, micro_grads{step, micro, bucket, bucket_data(bucket)});
  }

  /// What the comm double writes as the reduced slice of request i.
  std::vector<float> slice_for(size_t i) {
    std::vector<float> out(comms->calls.at(i).rs.count);
    for (size_t j = 0; j < out.size(); ++j)
      out[j] = 100.0f * static_cast<float>(i) + static_cast<float>(j) - 0.5f;
    return out;
  }

  void answer(size_t i) { comms->calls.at(i).reduce_scatter_result(slice_for(i)); }

  /// Hands bucket `bucket` of step 3 over as the host does and lets go of it: the staging then
  /// lives only as long as the reducer or a request holds it.
  std::weak_ptr<std::vector<float>> hand_over(int bucket) {
    auto data = bucket_data(bucket);
    std::weak_ptr<std::vector<float>> staging = data;
    tell(reducer, micro_grads{3, 0, bucket, std::move(data)});
    run();
    return staging;
  }
  /// The reducer's end, as at an engine's (an exit message).
  void end_reducer() {
    caf::anon_send_exit(reducer, caf::exit_reason::user_shutdown);
    run();
  }

  std::shared_ptr<reply_slot<flush_done>> flush_step(uint64_t step) {
    return flush_step_of(reducer, step);
  }
  std::shared_ptr<reply_slot<flush_done>> flush_step_of(const reducer_actor& r, uint64_t step) {
    auto f = ask<flush_done>(r, flush{step});
    run();
    return f;
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(reducer_alone, reducer_fixture)

BOOST_AUTO_TEST_CASE(bucket_is_reduce_scattered_then_accumulated) {
  auto data = bucket_data(1);
  tell(reducer, micro_grads{7, 2, 1, data});
  BOOST_REQUIRE(next_as<micro_grads>(reducer) != nullptr);
  run_one(reducer);
  // The reducer's only message: a reduce-scatter request to the comm; nothing to the store yet.
  BOOST_CHECK(peek(store) == nullptr);
  BOOST_REQUIRE(peek(comm) != nullptr);
  BOOST_CHECK(peek(comm)->mid.is_request());
  const auto* req = next_as<reduce_scatter_req>(comm);
  BOOST_REQUIRE(req != nullptr);
  BOOST_CHECK(req->tag == (collective_tag{collective_kind::reduce_scatter, 7, 2, 1}));
  BOOST_CHECK_EQUAL(req->count, pl->buckets[1].shard_len);
  BOOST_CHECK(req->in == data->data());  // the host's staging itself, not a copy
  // In place: this rank's part of the bucket is the output.
  BOOST_CHECK(req->out == data->data() + kRank * pl->buckets[1].shard_len);
  run_one(comm);
  BOOST_REQUIRE_EQUAL(comms->calls.size(), 1u);
  BOOST_CHECK(peek(reducer) == nullptr);  // waiting for the comm

  auto reduced = slice_for(0);
  answer(0);
  BOOST_REQUIRE(next_as<comm_done>(reducer) != nullptr);
  run_one(reducer);
  // Now the slice goes to the store.
  const auto* acc = next_as<accumulate>(store);
  BOOST_REQUIRE(acc != nullptr);
  BOOST_CHECK(peek(store)->mid.is_request());
  BOOST_CHECK_EQUAL(acc->step, 7u);
  BOOST_CHECK_EQUAL(acc->micro, 2);
  BOOST_CHECK_EQUAL(acc->bucket, 1);
  BOOST_CHECK_EQUAL(acc->slice.size, pl->buckets[1].shard_len);
  run_one(store);
  BOOST_REQUIRE_EQUAL(stored->calls.size(), 1u);
  BOOST_CHECK(stored->calls[0].slice == reduced);
  BOOST_REQUIRE(next_as<ack>(reducer) != nullptr);
  run_one(reducer);
  BOOST_CHECK(!sched.has_job());

  auto f = flush_step(7);
  BOOST_CHECK_EQUAL(value_of(f).step, 7u);
  BOOST_CHECK_EQUAL(value_of(f).micros, 1);
}

BOOST_AUTO_TEST_CASE(flush_waits_for_every_bucket_and_counts_micro_batches) {
  for (int32_t micro = 0; micro < 2; ++micro)
    for (int32_t bucket = 0; bucket < 2; ++bucket)
      send_grads(3, micro, bucket);
  run();
  BOOST_REQUIRE_EQUAL(comms->calls.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    auto micro = static_cast<int32_t>(i / 2);
    auto bucket = static_cast<int32_t>(i % 2);
    BOOST_CHECK(comms->calls[i].rs.tag
                == (collective_tag{collective_kind::reduce_scatter, 3, micro, bucket}));
    BOOST_CHECK_EQUAL(comms->calls[i].rs.count, pl->buckets[bucket].shard_len);
  }
  auto f = flush_step(3);
  BOOST_CHECK(!f->done);
  for (size_t i : {2, 0, 3}) {  // out of order: landing order does not matter
    answer(i);
    run();
    BOOST_CHECK_MESSAGE(!f->done, "flush answered with a bucket still in flight");
  }
  BOOST_CHECK_EQUAL(stored->calls.size(), 3u);
  answer(1);
  run();
  BOOST_CHECK_EQUAL(value_of(f).step, 3u);
  BOOST_CHECK_EQUAL(value_of(f).micros, 2);
  BOOST_REQUIRE_EQUAL(stored->calls.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {  // every slice reached the store with its own values
    const auto& c = stored->calls[k];
    auto i = static_cast<size_t>(c.msg.micro * 2 + c.msg.bucket);
    BOOST_CHECK_EQUAL(c.msg.step, 3u);
    BOOST_CHECK(c.slice == slice_for(i));
  }
  // The next step starts from a clean count.
  send_grads(4, 0, 1);
  run();
  answer(4);
  auto g = flush_step(4);
  BOOST_CHECK_EQUAL(value_of(g).step, 4u);
  BOOST_CHECK_EQUAL(value_of(g).micros, 1);
}

BOOST_AUTO_TEST_CASE(flush_of_an_empty_step_answers_zero_micro_batches) {
  auto f = flush_step(5);
  BOOST_CHECK_EQUAL(value_of(f).step, 5u);
  BOOST_CHECK_EQUAL(value_of(f).micros, 0);
  BOOST_CHECK(comms->calls.empty());
  BOOST_CHECK(stored->calls.empty());
}

BOOST_AUTO_TEST_CASE(failing_reduce_scatter_fails_the_flush) {
  send_grads(3, 0, 0);
  send_grads(3, 0, 1);
  run();
  BOOST_REQUIRE_EQUAL(comms->calls.size(), 2u);
  auto f = flush_step(3);
  answer(0);
  run();
  BOOST_CHECK(!f->done);
  comms->calls[1].fail(make_caf_error(errc::comm_failure, "reduce_scatter: rank 0 is down"));
  run();
  check_error(f, errc::comm_failure, "rank 0 is down");
  BOOST_CHECK_EQUAL(stored->calls.size(), 1u);  // the failed bucket never reached the store
  // The failure belongs to step 3 only.
  send_grads(4, 0, 0);
  run();
  answer(2);
  auto g = flush_step(4);
  BOOST_CHECK_EQUAL(value_of(g).micros, 1);
}

BOOST_AUTO_TEST_CASE(failing_accumulate_fails_the_flush) {
  stored->fail_with = make_caf_error(errc::shape_mismatch, "accumulate refused by the test");
  send_grads(3, 0, 0);
  run();
  answer(0);
  auto f = flush_step(3);
  check_error(f, errc::shape_mismatch, "refused by the test");
}

BOOST_AUTO_TEST_CASE(gradients_of_another_step_while_one_is_open_fail_the_flush) {
  send_grads(3, 0, 0);
  run();
  send_grads(4, 0, 0);
  run();
  BOOST_CHECK_EQUAL(comms->calls.size(), 1u);  // step 4's bucket is not reduced
  auto f4 = flush_step(4);                     // nor can step 4 be flushed while 3 is open
  check_error(f4, errc::bad_state, "open step is 3");
  answer(0);
  auto f3 = flush_step(3);
  check_error(f3, errc::bad_state, "step 4");
}

BOOST_AUTO_TEST_CASE(bucket_of_wrong_size_or_index_is_an_error) {
  tell(reducer, micro_grads{3, 0, 0, bucket_data(0, -1)});
  run();
  check_error(flush_step(3), errc::shape_mismatch, "bucket 0");
  tell(reducer, micro_grads{4, 0, 0, bucket_data(0, +1)});
  run();
  check_error(flush_step(4), errc::shape_mismatch, "bucket 0");
  tell(reducer, micro_grads{5, 0, 2, bucket_data(1)});  // there is no bucket 2
  run();
  check_error(flush_step(5), errc::shape_mismatch, "bucket 2");
  tell(reducer, micro_grads{6, 0, 1, nullptr});
  run();
  check_error(flush_step(6), errc::shape_mismatch, "bucket 1");
  BOOST_CHECK(comms->calls.empty());
  BOOST_CHECK(stored->calls.empty());
}

// A reduced bucket of the caller's gradients (engine::hand_over_reduced) travels as its pieces:
// straight to the store, which reads them in its accumulate; nothing to the comm, no buffer.
// Pieces of a bucket not yet reduced are refused. A reducer of the host backend (no device
// backend) passes host pieces on too, with their `at_step` (a hand-over ahead of the step), and
// discard_grads (that hand-over withdrawn) makes it forget the step's micro-batches.
BOOST_AUTO_TEST_CASE(pieces_of_a_reduced_bucket_go_to_the_store_as_they_are) {
  const float grads[12] = {};
  auto pieces = std::make_shared<const std::vector<copy_piece>>(
      std::vector<copy_piece>{{grads, 0, 6}, {grads + 6, 6, 3}});
  const int64_t n = pl->buckets[0].shard_len;
  auto made = make_compute_backend("host");  // any backend: the reducer only needs one
  BOOST_REQUIRE(made);
  std::shared_ptr<compute_backend> device = std::move(*made);
  auto on_device = keep(spawn_reducer(sys, pl, kRank, store, comm, device));
  run();
  tell(on_device, micro_grads{3, 0, 0, nullptr, nullptr, n, true, pieces});
  run();
  BOOST_CHECK(comms->calls.empty());
  BOOST_REQUIRE_EQUAL(stored->calls.size(), 1u);
  BOOST_CHECK(stored->calls[0].msg.pieces == pieces);  // the same table, not a copy
  BOOST_CHECK(stored->calls[0].msg.slice.data == nullptr);
  BOOST_CHECK_EQUAL(stored->calls[0].msg.bucket, 0);
  auto landed = ask<flush_done>(on_device, flush{3});
  run();
  BOOST_CHECK_EQUAL(value_of(landed).micros, 1);
  tell(on_device, micro_grads{4, 0, 0, nullptr, nullptr, n, false, pieces});  // not reduced
  run();
  check_error(flush_step_of(on_device, 4), errc::shape_mismatch, "bucket 0");
  for (int32_t micro : {0, 1}) {  // two micro-batches, then withdrawn
    micro_grads ahead{5, micro, 0, nullptr, nullptr, n, true, pieces};
    ahead.at_step = true;
    tell(reducer, ahead);
  }
  run();
  BOOST_REQUIRE_EQUAL(stored->calls.size(), 3u);
  BOOST_CHECK(stored->calls[1].msg.at_step);
  BOOST_CHECK(stored->calls[2].msg.pieces == pieces);
  auto discarded = ask<ack>(reducer, discard_grads{5});
  run();
  BOOST_CHECK_EQUAL(value_of(discarded).step, 5u);
  tell(reducer, micro_grads{5, 0, 0, nullptr, nullptr, n, true, pieces});
  run();
  auto flushed = flush_step(5);
  run();
  BOOST_CHECK_EQUAL(value_of(flushed).micros, 1);  // the withdrawn two no longer count
}

BOOST_AUTO_TEST_CASE(second_flush_while_one_waits_is_refused) {
  send_grads(3, 0, 1);
  run();
  auto first = flush_step(3);
  auto second = flush_step(3);
  check_error(second, errc::bad_state, "another flush waits");
  BOOST_CHECK(!first->done);
  answer(0);
  run();
  BOOST_CHECK_EQUAL(value_of(first).micros, 1);
}

// -- the answer to each bucket: the host's back-pressure (engine_options::max_buckets_in_flight) --

BOOST_AUTO_TEST_CASE(bucket_is_answered_only_once_the_store_has_acknowledged_it) {
  stored->hold = true;
  auto landed = ask<ack>(reducer, micro_grads{7, 1, 0, bucket_data(0)});
  run();
  BOOST_REQUIRE_EQUAL(comms->calls.size(), 1u);
  BOOST_CHECK_MESSAGE(!landed->done, "answered before its reduce-scatter finished");
  answer(0);
  run();
  BOOST_REQUIRE_EQUAL(stored->calls.size(), 1u);  // the slice is with the store ...
  BOOST_CHECK_MESSAGE(!landed->done, "answered before the store acknowledged the slice");
  auto f = flush_step(7);
  BOOST_CHECK(!f->done);
  stored->answer(0);  // ... which now says it has added it
  run();
  BOOST_CHECK_EQUAL(value_of(landed).step, 7u);
  BOOST_CHECK_EQUAL(value_of(f).micros, 1);
}

// A reducer that ends while the comm or the store still holds a bucket's request (an engine
// stopping after a timeout) frees nothing that they read or write: each request's views own the
// bucket's buffers. Here the buffer is the host's staging (a host comm), whose host reference is
// gone (hand_over); it goes only with the last request that points into it.
BOOST_AUTO_TEST_CASE(an_ended_reducer_frees_no_buffer_the_comm_still_writes) {
  const auto staging = hand_over(0);
  BOOST_REQUIRE_EQUAL(comms->calls.size(), 1u);
  const reduce_scatter_req rs = comms->calls[0].rs;  // what the comm still holds
  comms->calls.clear();
  end_reducer();
  BOOST_REQUIRE_MESSAGE(!staging.expired(), "the reduce-scatter's buffer was freed");
  std::fill_n(rs.out, rs.count, 1.0f);  // the comm's late write lands in memory still allocated
  BOOST_CHECK_EQUAL(staging.lock()->at(kRank * rs.count), 1.0f);
}

BOOST_AUTO_TEST_CASE(an_ended_reducer_frees_no_buffer_the_store_still_reads) {
  stored->hold = true;
  const auto staging = hand_over(1);
  answer(0);
  run();
  BOOST_REQUIRE_EQUAL(stored->calls.size(), 1u);
  comms->calls.clear();  // answered: the comm is done with it
  end_reducer();
  BOOST_REQUIRE_MESSAGE(!staging.expired(), "the accumulate's slice was freed");
  const float_view& slice = stored->calls[0].msg.slice;  // what the store still reads
  BOOST_CHECK(slice.data == staging.lock()->data() + kRank * slice.size);
  stored->calls.clear();  // the store is done: the last reference goes
  BOOST_CHECK(staging.expired());
}

BOOST_AUTO_TEST_CASE(buckets_are_answered_in_the_order_they_land) {
  stored->hold = true;
  auto first = ask<ack>(reducer, micro_grads{3, 0, 0, bucket_data(0)});
  auto second = ask<ack>(reducer, micro_grads{3, 0, 1, bucket_data(1)});
  run();
  answer(1);
  answer(0);
  run();
  BOOST_REQUIRE_EQUAL(stored->calls.size(), 2u);
  BOOST_REQUIRE_EQUAL(stored->calls[0].msg.bucket, 1);
  stored->answer(0);  // bucket 1 lands first
  run();
  BOOST_CHECK(second->done);
  BOOST_CHECK(!first->done);
  stored->answer(1);
  run();
  BOOST_CHECK_EQUAL(value_of(first).step, 3u);
  BOOST_CHECK_EQUAL(value_of(second).step, 3u);
}

BOOST_AUTO_TEST_CASE(failures_come_back_as_answers_and_at_the_flush) {
  // Refused at once: wrong size, no such bucket, another step open.
  auto wrong = ask<ack>(reducer, micro_grads{3, 0, 0, bucket_data(0, +1)});
  run();
  check_error(wrong, errc::shape_mismatch, "bucket 0");
  BOOST_CHECK(comms->calls.empty());
  check_error(flush_step(3), errc::shape_mismatch, "bucket 0");
  auto none = ask<ack>(reducer, micro_grads{4, 0, 2, bucket_data(1)});
  run();
  check_error(none, errc::shape_mismatch, "bucket 2");
  check_error(flush_step(4), errc::shape_mismatch, "bucket 2");
  auto open = ask<ack>(reducer, micro_grads{5, 0, 0, bucket_data(0)});
  auto other = ask<ack>(reducer, micro_grads{6, 0, 0, bucket_data(0)});
  run();
  check_error(other, errc::bad_state, "step 5 is open");
  BOOST_CHECK(!open->done);
  // A failed reduce-scatter, and a failed accumulate.
  auto failing = ask<ack>(reducer, micro_grads{5, 0, 1, bucket_data(1)});
  run();
  BOOST_REQUIRE_EQUAL(comms->calls.size(), 2u);
  comms->calls[1].fail(make_caf_error(errc::comm_failure, "reduce_scatter: rank 0 is down"));
  run();
  check_error(failing, errc::comm_failure, "rank 0 is down");
  stored->fail_with = make_caf_error(errc::shape_mismatch, "accumulate refused by the test");
  answer(0);
  run();
  check_error(open, errc::shape_mismatch, "refused by the test");
  // The flush reports the step's first failure, as before.
  check_error(flush_step(5), errc::bad_state, "step 6");
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace zmuon::test
