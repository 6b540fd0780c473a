// Three real caf comm actors (comm/caf_comm.hpp) under CAF's testing scheduler: collectives on
// integer-valued data whose results are exactly predictable, pieces that arrive before the local
// request (or before connect_peers), ranks that disagree on sizes, a peer that dies, an abort.
#define BOOST_TEST_MODULE caf_comm
#include "support/actor_fixture.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <thread>

#include "caf/binary_deserializer.hpp"
#include "caf/binary_serializer.hpp"

#include "comm/caf_comm.hpp"

namespace zmuon::test {
namespace {

constexpr int kWorld = 3;

struct comm_fixture : actor_fixture {
  std::vector<caf_comm_actor> ranks = spawn_caf_comm_group(sys, kWorld);

  comm_fixture() {
    for (auto& r : ranks)
      keep(r);
    run();  // initialization and connect_peers
  }

  /// Rank r's reduce-scatter input: world * count floats, chunk q for rank q.
  static std::vector<float> rs_input(int r, int64_t count) {
    std::vector<float> in(kWorld * count);
    for (int64_t j = 0; j < kWorld * count; ++j)
      in[j] = static_cast<float>((r + 1) * (j + 1) * (j % 2 ? -1 : 1));
    return in;
  }
  /// The exact mean over ranks of chunk `rank`: (1+2+3)/3 = 2 times the rank-free factor.
  static std::vector<float> rs_expected(int rank, int64_t count) {
    std::vector<float> out(count);
    for (int64_t i = 0; i < count; ++i) {
      int64_t j = rank * count + i;
      out[i] = static_cast<float>(2 * (j + 1) * (j % 2 ? -1 : 1));
    }
    return out;
  }
};

collective_tag tag_of(collective_kind kind, uint64_t step, int32_t index = 0) {
  return collective_tag{kind, step, 0, index};
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(caf_comm_group, comm_fixture)

BOOST_AUTO_TEST_CASE(reduce_scatter_gives_each_rank_the_exact_mean_of_its_chunk) {
  const int64_t count = 5;
  std::vector<std::vector<float>> in, out(kWorld, std::vector<float>(count, -1.0f));
  std::vector<std::shared_ptr<reply_slot<comm_done>>> replies;
  auto tag = tag_of(collective_kind::reduce_scatter, 4, 2);
  for (int r = 0; r < kWorld; ++r)
    in.push_back(rs_input(r, count));
  for (int r = 0; r < kWorld; ++r)
    replies.push_back(
        ask<comm_done>(ranks[r], reduce_scatter_req{tag, in[r].data(), out[r].data(), count}));
  run();
  for (int r = 0; r < kWorld; ++r) {
    BOOST_CHECK(value_of(replies[r]).tag == tag);
    BOOST_CHECK(out[r] == rs_expected(r, count));
  }
}

BOOST_AUTO_TEST_CASE(reduce_scatter_in_place_leaves_the_mean_in_the_ranks_own_part) {
  const int64_t count = 4;
  std::vector<std::vector<float>> in;
  std::vector<std::shared_ptr<reply_slot<comm_done>>> replies;
  auto tag = tag_of(collective_kind::reduce_scatter, 5, 1);
  for (int r = 0; r < kWorld; ++r)
    in.push_back(rs_input(r, count));
  for (int r = 0; r < kWorld; ++r) {
    float* own = in[r].data() + r * count;
    replies.push_back(ask<comm_done>(ranks[r], reduce_scatter_req{tag, in[r].data(), own, count}));
  }
  run();
  for (int r = 0; r < kWorld; ++r) {
    BOOST_CHECK(value_of(replies[r]).tag == tag);
    std::vector<float> own(in[r].begin() + r * count, in[r].begin() + (r + 1) * count);
    BOOST_CHECK(own == rs_expected(r, count));
  }
}

BOOST_AUTO_TEST_CASE(all_reduce_sum_and_max_agree_on_every_rank) {
  for (auto op : {reduce_op::sum, reduce_op::max}) {
    std::vector<std::shared_ptr<reply_slot<all_reduce_result>>> replies(kWorld);
    auto tag = tag_of(collective_kind::vote, op == reduce_op::sum ? 1 : 2);
    for (int r = kWorld - 1; r >= 0; --r)  // issued in reverse rank order
      replies[r] = ask<all_reduce_result>(
          ranks[r], all_reduce_req{tag, op, {r + 1.0, -2.0 * r, 10.0 * r, r == 1 ? 1.0 : 1e16}});
    run();
    // Sums add in rank order whatever the arrival order: (0 + 1e16) + 1 + 1e16 loses the 1.
    std::vector<double> want = op == reduce_op::sum
                                   ? std::vector<double>{6, -6, 30, ((0.0 + 1e16) + 1.0) + 1e16}
                                   : std::vector<double>{3, 0, 20, 1e16};
    for (int r = 0; r < kWorld; ++r) {
      BOOST_CHECK(value_of(replies[r]).tag == tag);
      BOOST_CHECK(value_of(replies[r]).values == want);
    }
  }
}

BOOST_AUTO_TEST_CASE(all_to_all_v_moves_every_segment_to_its_place) {
  // len[s][d]: floats rank s sends to rank d (the diagonal stays local). Value 1000s + 100d + k.
  const int len[kWorld][kWorld] = {{2, 3, 0}, {1, 0, 4}, {0, 2, 3}};
  std::vector<std::vector<float>> send_buf(kWorld), recv_buf(kWorld);
  for (int s = 0; s < kWorld; ++s)
    for (int d = 0; d < kWorld; ++d)
      for (int k = 0; k < len[s][d]; ++k)
        send_buf[s].push_back(1000.0f * s + 100.0f * d + k);
  std::vector<all_to_all_req> reqs(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    int64_t total = 0;
    for (int s = 0; s < kWorld; ++s)
      total += len[s][r];
    recv_buf[r].assign(total, -1.0f);
    auto& req = reqs[r];
    req.tag = tag_of(collective_kind::gather, 7, 1);
    req.sends.resize(kWorld);
    req.recvs.resize(kWorld);
    float* src = send_buf[r].data();
    float* dst = recv_buf[r].data();
    for (int q = 0; q < kWorld; ++q) {
      // Sends cut after the first float (with an empty segment between), receives before the
      // last one: the two sides' segments need not line up.
      int64_t n = len[r][q], m = len[q][r];
      req.sends[q] = {
          {src, std::min<int64_t>(n, 1)}, {src, 0}, {src + 1, std::max<int64_t>(n - 1, 0)}};
      req.recvs[q] = {{dst, std::max<int64_t>(m - 1, 0)}, {dst + m - 1, std::min<int64_t>(m, 1)}};
      src += n;
      dst += m;
    }
  }
  std::vector<std::shared_ptr<reply_slot<comm_done>>> replies;
  for (int r = 0; r < kWorld; ++r)
    replies.push_back(ask<comm_done>(ranks[r], reqs[r]));
  run();
  for (int d = 0; d < kWorld; ++d) {
    std::vector<float> want;
    for (int s = 0; s < kWorld; ++s)
      for (int k = 0; k < len[s][d]; ++k)
        want.push_back(1000.0f * s + 100.0f * d + k);
    BOOST_CHECK(value_of(replies[d]).tag == reqs[d].tag);
    BOOST_CHECK_MESSAGE(recv_buf[d] == want, "rank " << d << " received the wrong floats");
  }
}

// A rank's segments to itself are copied straight across; where they share memory (here each
// rank swaps the two halves of one buffer: the first 2 elements go behind the last 3) the
// result is still that of reading every send before writing any receive.
BOOST_AUTO_TEST_CASE(all_to_all_to_itself_in_place_reads_before_it_writes) {
  std::vector<std::vector<float>> buf(kWorld);
  std::vector<all_to_all_req> reqs(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    buf[r] = {10.0f * r, 10.0f * r + 1, 10.0f * r + 2, 10.0f * r + 3, 10.0f * r + 4};
    float* b = buf[r].data();
    auto& req = reqs[r];
    req.tag = tag_of(collective_kind::scatter, 9);
    req.sends.resize(kWorld);
    req.recvs.resize(kWorld);
    req.sends[r] = {{b, 2}, {b + 2, 3}};
    req.recvs[r] = {{b + 3, 2}, {b, 3}};
  }
  std::vector<std::shared_ptr<reply_slot<comm_done>>> replies;
  for (int r = 0; r < kWorld; ++r)
    replies.push_back(ask<comm_done>(ranks[r], reqs[r]));
  run();
  for (int r = 0; r < kWorld; ++r) {
    BOOST_CHECK(value_of(replies[r]).tag == reqs[r].tag);
    const std::vector<float> want = {10.0f * r + 2, 10.0f * r + 3, 10.0f * r + 4, 10.0f * r,
                                     10.0f * r + 1};
    BOOST_CHECK_MESSAGE(buf[r] == want, "rank " << r << ": a receive overwrote an unread send");
  }
}

// The same with many one-element segments in shuffled order, of which one receive (listed first)
// lands on a send read last: the overlap check (sorted, one sweep) must still find that pair.
BOOST_AUTO_TEST_CASE(all_to_all_to_itself_finds_one_overlap_among_many_segments) {
  constexpr int n = 500;
  std::vector<std::vector<float>> buf(kWorld), want(kWorld);
  std::vector<all_to_all_req> reqs(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    buf[r].resize(2 * n);
    for (int i = 0; i < 2 * n; ++i)
      buf[r][i] = static_cast<float>(1000 * r + i);
    float* b = buf[r].data();
    // Sends: elements 0..n-1 in a fixed shuffle, element 250 last. Receives: n..2n-1 shuffled,
    // but the first receive is element 250.
    std::vector<int> from(n), to(n);
    for (int i = 0; i < n; ++i) {
      from[i] = (i * 7919 + 13) % n;
      to[i] = n + (i * 104729 + 5) % n;
    }
    std::swap(from[std::find(from.begin(), from.end(), 250) - from.begin()], from[n - 1]);
    to[0] = 250;
    auto& req = reqs[r];
    req.tag = tag_of(collective_kind::scatter, 11);
    req.sends.resize(kWorld);
    req.recvs.resize(kWorld);
    for (int i = 0; i < n; ++i) {
      req.sends[r].push_back({b + from[i], 1});
      req.recvs[r].push_back({b + to[i], 1});
    }
    // Every send read before any receive is written.
    want[r] = buf[r];
    for (int i = 0; i < n; ++i)
      want[r][to[i]] = buf[r][from[i]];
  }
  std::vector<std::shared_ptr<reply_slot<comm_done>>> replies;
  for (int r = 0; r < kWorld; ++r)
    replies.push_back(ask<comm_done>(ranks[r], reqs[r]));
  run();
  for (int r = 0; r < kWorld; ++r) {
    BOOST_CHECK(value_of(replies[r]).tag == reqs[r].tag);
    BOOST_CHECK_MESSAGE(buf[r] == want[r], "rank " << r << ": a receive overwrote an unread send");
  }
}

// bf16 (the Muon phase's transport): 2-byte elements land bit for bit (NaN and inf patterns too),
// the pieces carry half the bytes of fp32, and a rank that sends fp32 where its peer expects bf16
// fails the collective naming it.
BOOST_AUTO_TEST_CASE(all_to_all_of_bf16_moves_bits_and_rejects_a_type_mismatch) {
  const int64_t n = 4;  // each rank sends n elements to every rank, itself included
  std::vector<std::vector<uint16_t>> send(kWorld), recv(kWorld);
  std::vector<all_to_all_req> reqs(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    for (int d = 0; d < kWorld; ++d)
      for (int k = 0; k < n; ++k)  // k = 3: a NaN whose payload is only in the low bits
        send[r].push_back(static_cast<uint16_t>(k == 3 ? 0x7f81 + r : 0x3f80 + 16 * r + 4 * d + k));
    recv[r].assign(kWorld * n, 0);
    reqs[r] = all_to_all_req{tag_of(collective_kind::scatter, 3), {}, {}, wire_type::bf16};
    reqs[r].sends.resize(kWorld);
    reqs[r].recvs.resize(kWorld);
    for (int q = 0; q < kWorld; ++q) {
      reqs[r].sends[q] = {segment{nullptr, n, send[r].data() + q * n}};
      reqs[r].recvs[q] = {segment{nullptr, n, recv[r].data() + q * n}};
    }
  }
  std::vector<std::shared_ptr<reply_slot<comm_done>>> replies;
  for (int r = 0; r < kWorld; ++r)
    replies.push_back(ask<comm_done>(ranks[r], reqs[r]));
  run();
  for (int d = 0; d < kWorld; ++d) {
    BOOST_CHECK(value_of(replies[d]).tag == reqs[d].tag);
    for (int s = 0; s < kWorld; ++s)
      for (int k = 0; k < n; ++k)
        BOOST_CHECK_EQUAL(recv[d][s * n + k], send[s][d * n + k]);
  }

  // Rank 0 sends fp32 to rank 1, which expects bf16.
  std::vector<float> floats(n, 1.0f);
  std::vector<std::shared_ptr<reply_slot<comm_done>>> mixed;
  for (int r = 0; r < kWorld; ++r) {
    auto req = reqs[r];
    req.tag = tag_of(collective_kind::scatter, 4);
    if (r == 0) {
      req.elem = wire_type::fp32;
      for (auto& l : req.sends)
        l = {segment{floats.data(), n}};
      for (auto& l : req.recvs)
        l = {segment{floats.data(), n}};
    }
    mixed.push_back(ask<comm_done>(ranks[r], req));
  }
  run();
  check_error(mixed[1], errc::comm_failure, "rank 0 sent 0 bf16 and 4 fp32 elements");

  // A bf16 request whose segment has only an fp32 buffer is refused at once.
  auto bad = reqs[2];
  bad.tag = tag_of(collective_kind::scatter, 5);
  bad.sends[1] = {segment{floats.data(), n}};
  auto refused = ask<comm_done>(ranks[2], bad);
  run();
  check_error(refused, errc::comm_failure, "has no bf16 buffer");
}

BOOST_AUTO_TEST_CASE(pieces_that_arrive_before_the_local_request_wait_for_it) {
  const int64_t count = 3;
  auto tag = tag_of(collective_kind::reduce_scatter, 1);
  std::vector<std::vector<float>> in, out(kWorld, std::vector<float>(count, -1.0f));
  for (int r = 0; r < kWorld; ++r)
    in.push_back(rs_input(r, count));
  auto first =
      ask<comm_done>(ranks[0], reduce_scatter_req{tag, in[0].data(), out[0].data(), count});
  run_one(ranks[0]);
  // Rank 0 sent each peer its chunk, before the peers asked for anything.
  for (int q = 1; q < kWorld; ++q) {
    const auto* piece = next_as<peer_floats>(ranks[q]);
    BOOST_REQUIRE(piece != nullptr);
    BOOST_CHECK(piece->tag == tag);
    BOOST_CHECK_EQUAL(piece->src, 0);
    BOOST_CHECK(piece->data
                == std::vector<float>(in[0].begin() + q * count, in[0].begin() + (q + 1) * count));
  }
  run();
  BOOST_CHECK(!first->done);
  auto second =
      ask<comm_done>(ranks[1], reduce_scatter_req{tag, in[1].data(), out[1].data(), count});
  run();
  BOOST_CHECK(!first->done);
  BOOST_CHECK(!second->done);
  auto third =
      ask<comm_done>(ranks[2], reduce_scatter_req{tag, in[2].data(), out[2].data(), count});
  run();
  for (const auto& r : {first, second, third})
    BOOST_CHECK(value_of(r).tag == tag);
  for (int r = 0; r < kWorld; ++r)
    BOOST_CHECK(out[r] == rs_expected(r, count));
}

BOOST_AUTO_TEST_CASE(size_mismatch_between_ranks_is_an_error_naming_the_rank) {
  std::vector<std::vector<float>> in, out;
  std::vector<std::shared_ptr<reply_slot<comm_done>>> replies;
  auto tag = tag_of(collective_kind::reduce_scatter, 2);
  for (int r = 0; r < kWorld; ++r) {
    int64_t count = r == 0 ? 2 : 3;  // rank 0 disagrees
    in.push_back(rs_input(r, count));
    out.emplace_back(count);
  }
  for (int r = 0; r < kWorld; ++r)
    replies.push_back(ask<comm_done>(
        ranks[r], reduce_scatter_req{tag, in[r].data(), out[r].data(), r == 0 ? 2 : 3}));
  run();
  check_error(replies[0], errc::comm_failure, "rank 1 sent 3 floats");
  check_error(replies[1], errc::comm_failure, "rank 0 sent 2 floats");
  check_error(replies[2], errc::comm_failure, "rank 0 sent 2 floats");
  check_error(replies[2], errc::comm_failure, "reduce_scatter(step 2");

  std::vector<std::shared_ptr<reply_slot<all_reduce_result>>> votes;
  auto vote = tag_of(collective_kind::vote, 2);
  for (int r = 0; r < kWorld; ++r)  // rank 2 votes with two values
    votes.push_back(ask<all_reduce_result>(
        ranks[r], all_reduce_req{vote, reduce_op::max, std::vector<double>(r == 2 ? 2 : 1, 0.0)}));
  run();
  check_error(votes[0], errc::comm_failure, "rank 2 sent 2 values");
  check_error(votes[1], errc::comm_failure, "rank 2 sent 2 values");
  check_error(votes[2], errc::comm_failure, "rank 0 sent 1 values");

  // The group still works for the next, agreeing collective.
  std::vector<std::shared_ptr<reply_slot<all_reduce_result>>> sums;
  for (int r = 0; r < kWorld; ++r)
    sums.push_back(ask<all_reduce_result>(
        ranks[r], all_reduce_req{tag_of(collective_kind::vote, 3), reduce_op::sum, {1.0}}));
  run();
  for (const auto& s : sums)
    BOOST_CHECK(value_of(s).values == std::vector<double>{3.0});
}

// Regression: a rank that expects floats from a peer that has nothing for it must get
// errc::comm_failure, not wait forever (every peer now sends a piece, empty or not).
BOOST_AUTO_TEST_CASE(all_to_all_expecting_floats_a_peer_does_not_send_is_an_error) {
  std::vector<float> buf(4, 0.0f);
  std::vector<std::shared_ptr<reply_slot<comm_done>>> replies;
  for (int r = 0; r < kWorld; ++r) {
    all_to_all_req req{tag_of(collective_kind::scatter, 5), {}, {}};
    req.sends.resize(kWorld);
    req.recvs.resize(kWorld);
    if (r == 1)
      req.recvs[0] = {{buf.data(), 3}};  // rank 1 expects 3 floats from rank 0, who sends none
    replies.push_back(ask<comm_done>(ranks[r], req));
  }
  run();
  BOOST_CHECK(replies[0]->done && replies[2]->done);
  BOOST_REQUIRE_MESSAGE(replies[1]->done, "rank 1 hangs waiting for floats rank 0 never sends");
  check_error(replies[1], errc::comm_failure, "rank 0");
}

BOOST_AUTO_TEST_CASE(killed_peer_fails_pending_and_later_collectives_naming_it) {
  auto tag = tag_of(collective_kind::vote, 1);
  std::vector<std::shared_ptr<reply_slot<all_reduce_result>>> pending;
  for (int r = 0; r < 2; ++r)  // rank 2 never joins
    pending.push_back(ask<all_reduce_result>(ranks[r], all_reduce_req{tag, reduce_op::max, {1.0}}));
  run();
  BOOST_CHECK(!pending[0]->done);
  BOOST_CHECK(!pending[1]->done);
  caf::anon_send_exit(ranks[2], caf::exit_reason::kill);
  run();
  check_error(pending[0], errc::comm_failure, "rank 2 is down");
  check_error(pending[1], errc::comm_failure, "rank 2 is down");

  // Later collectives of the survivors fail at once, whatever their kind.
  std::vector<float> in(kWorld * 2, 1.0f), out(2);
  auto rs = ask<comm_done>(ranks[0], reduce_scatter_req{tag_of(collective_kind::reduce_scatter, 2),
                                                        in.data(), out.data(), 2});
  auto ar = ask<all_reduce_result>(
      ranks[1], all_reduce_req{tag_of(collective_kind::vote, 2), reduce_op::sum, {1.0}});
  all_to_all_req a2a{tag_of(collective_kind::gather, 2), {}, {}};
  a2a.sends.resize(kWorld);
  a2a.recvs.resize(kWorld);
  auto aa = ask<comm_done>(ranks[0], a2a);
  run();
  check_error(rs, errc::comm_failure, "rank 2 is down");
  check_error(ar, errc::comm_failure, "rank 2 is down");
  check_error(aa, errc::comm_failure, "rank 2 is down");
}

BOOST_AUTO_TEST_CASE(comm_abort_fails_pending_and_later_collectives_with_its_reason) {
  auto tag = tag_of(collective_kind::host, 3);
  auto pending = ask<all_reduce_result>(ranks[0], all_reduce_req{tag, reduce_op::sum, {1.0}});
  run();
  BOOST_CHECK(!pending->done);
  tell(ranks[0], comm_abort{"node 1 (rank 1) lost in step 3"});
  run();
  check_error(pending, errc::comm_failure, "node 1 (rank 1) lost in step 3");
  auto later = ask<all_reduce_result>(
      ranks[0], all_reduce_req{tag_of(collective_kind::host, 4), reduce_op::sum, {1.0}});
  run();
  check_error(later, errc::comm_failure, "node 1 (rank 1) lost in step 3");
}

BOOST_AUTO_TEST_SUITE_END()

// A node's comm actors are spawned before the rendezvous (rank and world unknown) and learn both
// from connect_peers; pieces from a node that was connected first wait for it.
BOOST_FIXTURE_TEST_CASE(pieces_before_connect_peers_wait_and_rank_comes_with_it, actor_fixture) {
  std::vector<caf_comm_actor> comms;
  std::vector<caf::actor> untyped;
  for (int r = 0; r < 2; ++r) {
    comms.push_back(keep(spawn_caf_comm(sys, 0, 1)));
    untyped.push_back(caf::actor_cast<caf::actor>(comms.back()));
  }
  run();
  tell(comms[1], connect_peers{1, untyped});  // rank 1 is connected, rank 0 not yet
  run();
  const int64_t count = 2;
  std::vector<float> in0{1, 2, 3, 4}, in1{10, 20, 30, 40}, out0(count), out1(count);
  auto tag = tag_of(collective_kind::reduce_scatter, 1);
  auto r1 = ask<comm_done>(comms[1], reduce_scatter_req{tag, in1.data(), out1.data(), count});
  run();  // rank 1's piece reaches rank 0 before rank 0 knows its rank and world
  BOOST_CHECK(!r1->done);
  tell(comms[0], connect_peers{0, untyped});
  auto r0 = ask<comm_done>(comms[0], reduce_scatter_req{tag, in0.data(), out0.data(), count});
  run();
  value_of(r0);
  value_of(r1);
  BOOST_CHECK(out0 == (std::vector<float>{5.5f, 11.0f}));   // mean of chunk 0: (1+10)/2, (2+20)/2
  BOOST_CHECK(out1 == (std::vector<float>{16.5f, 22.0f}));  // chunk 1: (3+30)/2, (4+40)/2
}

// What crosses processes (BASP serializes every message) comes back bit for bit: an overflowed
// step's vote carries an infinite or NaN sum of squares, a reduce-scatter piece an infinite
// gradient. CAF 0.17's own double serialization never returns for an infinity, so the round trip
// runs on a thread and a hang is reported as a failure after 30 s.
template <class T>
T serialized_round_trip(T in) {
  auto done = std::make_shared<std::promise<T>>();
  auto result = done->get_future();
  std::thread([in = std::move(in), done]() mutable {
    std::vector<char> buf;
    caf::binary_serializer sink{nullptr, buf};
    T out;
    caf::error err = sink(in);
    if (!err) {
      caf::binary_deserializer source{nullptr, buf};
      err = source(out);
    }
    if (err)
      done->set_exception(std::make_exception_ptr(std::runtime_error(caf::to_string(err))));
    else
      done->set_value(std::move(out));
  }).detach();
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    BOOST_ERROR("serializing the message did not return within 30 s");
    std::_Exit(1);  // the serializing thread cannot be stopped
  }
  return result.get();
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

BOOST_AUTO_TEST_CASE(peer_pieces_cross_processes_bit_for_bit_infinities_and_nan_too) {
  const double nan = std::nan("0x5");  // a payload too: the bits, not just "some NaN"
  peer_doubles d{collective_tag{collective_kind::vote, 7, 0, 0},
                 2,
                 {1.0, HUGE_VAL, -HUGE_VAL, nan, 0.1, -0.0, 5e-324}};
  auto d2 = serialized_round_trip(d);
  BOOST_CHECK(d2.tag == d.tag);
  BOOST_CHECK_EQUAL(d2.src, 2);
  BOOST_CHECK(same_bits(d2.data, d.data));
  peer_floats f{collective_tag{collective_kind::reduce_scatter, 7, 1, 3},
                1,
                {1.0f, HUGE_VALF, -HUGE_VALF, std::nanf("0x7"), 1e-45f},
                {0x7f80, 0xffc1, 0x3f80}};
  auto f2 = serialized_round_trip(f);
  BOOST_CHECK(f2.tag == f.tag);
  BOOST_CHECK_EQUAL(f2.src, 1);
  BOOST_CHECK(same_bits(f2.data, f.data));
  BOOST_CHECK(f2.bf16 == f.bf16);
}

}  // namespace zmuon::test
