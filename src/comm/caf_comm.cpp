#include "comm/caf_comm.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "caf/all.hpp"

#include "comm/segments.hpp"

#include "messages/errors.hpp"
#include "trace/trace.hpp"

namespace zmuon {

namespace {

// One collective in flight: the local request (once it arrived) and the peers' contributions
// (which may arrive first).
struct pending_op {
  bool have_local = false;
  reduce_scatter_req rs;
  all_reduce_req ar;
  all_to_all_req a2a;
  caf::typed_response_promise<comm_done> done;
  caf::typed_response_promise<all_reduce_result> reduced;
  std::vector<std::vector<float>> floats;   // by source rank
  std::vector<std::vector<uint16_t>> bf16;  // by source rank (an all-to-all of bf16)
  std::vector<std::vector<double>> doubles;
  std::vector<bool> arrived;
  int received = 0;
};

struct comm_state {
  int rank = 0;
  int world = 1;
  std::vector<caf_comm_actor> peers;
  caf::error failure;  // set once a peer died; every later collective fails with it
  std::map<collective_tag, pending_op> ops;
  trace::track tr;
  // Pieces from remote peers that arrive before connect_peers (a node that finished the
  // rendezvous first); replayed once connected.
  std::vector<peer_floats> early_floats;
  std::vector<peer_doubles> early_doubles;
  static const char* name;
};
const char* comm_state::name = "caf_comm";

using comm_pointer = caf_comm_actor::stateful_pointer<comm_state>;

pending_op& op_for(comm_state& st, const collective_tag& tag) {
  auto& op = st.ops[tag];
  if (op.arrived.empty()) {
    op.arrived.assign(st.world, false);
    op.floats.resize(st.world);
    op.bf16.resize(st.world);
    op.doubles.resize(st.world);
  }
  return op;
}

caf::error fail(const collective_tag& tag, const std::string& what) {
  return make_caf_error(errc::comm_failure, to_string(tag) + ": " + what);
}

// The error a new collective fails with at once, if any: a dead peer or no connection yet.
caf::error not_ready(const comm_state& st, const collective_tag& tag) {
  if (st.failure)
    return st.failure;
  if (static_cast<int>(st.peers.size()) != st.world)
    return fail(tag, "comm actor of rank " + std::to_string(st.rank) + " not connected");
  return {};
}

// A segment's elements as T: its fp32 data (float) or its bf16 bits (uint16_t).
template <class T>
T* elements(const segment& s) {
  if constexpr (std::is_same<T, float>::value)
    return s.data;
  else
    return s.bf16;
}

template <class T = float>
std::vector<T> concat(const std::vector<segment>& segs) {
  std::vector<T> out;
  size_t n = 0;
  for (auto& s : segs)
    n += static_cast<size_t>(s.size);
  out.reserve(n);
  for (auto& s : segs)
    out.insert(out.end(), elements<T>(s), elements<T>(s) + s.size);
  return out;
}

template <class T>
void copy_out(const T* src, const std::vector<segment>& segs) {
  for (auto& s : segs) {
    std::copy(src, src + s.size, elements<T>(s));
    src += s.size;
  }
}

/// The non-empty segments of `segs` as address ranges [first, last) of T, sorted by their start.
template <class T>
std::vector<std::pair<const T*, const T*>> sorted_ranges(const std::vector<segment>& segs) {
  std::vector<std::pair<const T*, const T*>> out;
  out.reserve(segs.size());
  for (auto& s : segs)
    if (s.size > 0)
      out.emplace_back(elements<T>(s), elements<T>(s) + s.size);
  std::sort(out.begin(), out.end(), std::less<>());
  return out;
}

/// Whether any element of `a` shares memory with any of `b` (as T). Both sorted, one sweep:
/// n log n in the segment count (a step of 100k matrices has that many).
template <class T>
bool overlap(const std::vector<segment>& a, const std::vector<segment>& b) {
  const auto x = sorted_ranges<T>(a);
  const auto y = sorted_ranges<T>(b);
  size_t i = 0, j = 0;
  // A range that ends before the other list's current start meets none of that list's later
  // ranges (they start later still): skip it.
  while (i < x.size() && j < y.size()) {
    if (!std::less<>()(y[j].first, x[i].second))
      ++i;
    else if (!std::less<>()(x[i].first, y[j].second))
      ++j;
    else
      return true;
  }
  return false;
}

/// A rank's segments to itself: the elements of `from` in order into `to` in order (the same
/// total, cut differently), straight across without a staging vector. Where the two share
/// memory, through one (a copy of `from` first).
template <class T>
void copy_across(const std::vector<segment>& from, const std::vector<segment>& to) {
  if (overlap<T>(from, to)) {
    copy_out(concat<T>(from).data(), to);
    return;
  }
  for_each_stretch(from, to,
                   [](const segment& f, int64_t at_f, const segment& t, int64_t at_t, int64_t n) {
                     std::memcpy(elements<T>(t) + at_t, elements<T>(f) + at_f,
                                 static_cast<size_t>(n) * sizeof(T));
                   });
}

// The first non-empty segment without a buffer of the request's element type, if any.
caf::error check_segments(const all_to_all_req& req) {
  for (const auto* lists : {&req.sends, &req.recvs})
    for (size_t q = 0; q < lists->size(); ++q)
      for (const auto& s : (*lists)[q]) {
        bool missing = req.elem == wire_type::bf16 ? s.bf16 == nullptr : s.data == nullptr;
        if (s.size < 0 || (s.size > 0 && missing))
          return fail(req.tag, std::string("a ") + (lists == &req.sends ? "send" : "receive")
                                   + " segment for rank " + std::to_string(q) + " has no "
                                   + wire_name(req.elem) + " buffer of its "
                                   + std::to_string(s.size) + " elements");
      }
  return {};
}

bool is_all_reduce(collective_kind kind) {
  return kind == collective_kind::vote || kind == collective_kind::host;
}

int64_t total(const std::vector<segment>& segs) {
  int64_t n = 0;
  for (auto& s : segs)
    n += s.size;
  return n;
}

// Every peer sends a piece for every collective, an empty one too, so that a rank that
// expects data a peer does not send gets a size error instead of waiting forever.
int expected_pieces(const comm_state& st) {
  return st.world - 1;
}

// Runs the reduction or the copy-out once the local request and all pieces are there; returns
// an error when a contribution does not fit (ranks disagree on the collective).
caf::error complete(comm_state& st, const collective_tag& tag, pending_op& op) {
  switch (tag.kind) {
    case collective_kind::reduce_scatter: {
      auto& req = op.rs;
      for (int q = 0; q < st.world; ++q)
        if (q != st.rank && static_cast<int64_t>(op.floats[q].size()) != req.count)
          return fail(tag, "rank " + std::to_string(q) + " sent "
                               + std::to_string(op.floats[q].size()) + " floats, expected "
                               + std::to_string(req.count));
      float inv_world = 1.0f / static_cast<float>(st.world);
      const float* own = req.in + static_cast<int64_t>(st.rank) * req.count;
      for (int64_t i = 0; i < req.count; ++i) {
        float sum = 0;
        for (int q = 0; q < st.world; ++q)
          sum += q == st.rank ? own[i] : op.floats[q][i];
        req.out[i] = sum * inv_world;
      }
      return {};
    }
    case collective_kind::vote:
    case collective_kind::host: {
      auto& vals = op.ar.values;
      for (int q = 0; q < st.world; ++q)
        if (q != st.rank && op.doubles[q].size() != vals.size())
          return fail(tag, "rank " + std::to_string(q) + " sent "
                               + std::to_string(op.doubles[q].size()) + " values, expected "
                               + std::to_string(vals.size()));
      std::vector<double> out(vals.size());
      for (size_t i = 0; i < vals.size(); ++i) {
        double acc = op.ar.op == reduce_op::max ? -HUGE_VAL : 0.0;
        for (int q = 0; q < st.world; ++q) {
          double v = q == st.rank ? vals[i] : op.doubles[q][i];
          acc = op.ar.op == reduce_op::max ? std::max(acc, v) : acc + v;
        }
        out[i] = acc;
      }
      vals = std::move(out);
      return {};
    }
    case collective_kind::gather:
    case collective_kind::scatter:
    case collective_kind::params: {
      const bool bf16 = op.a2a.elem == wire_type::bf16;
      for (int q = 0; q < st.world; ++q) {
        auto& segs = op.a2a.recvs[q];
        if (q == st.rank)
          continue;
        // A piece of the other element type counts as that many of the wrong elements.
        auto got = static_cast<int64_t>(bf16 ? op.bf16[q].size() : op.floats[q].size());
        auto other = static_cast<int64_t>(bf16 ? op.floats[q].size() : op.bf16[q].size());
        if (got != total(segs) || other != 0)
          return fail(tag, "rank " + std::to_string(q) + " sent " + std::to_string(got) + " "
                               + wire_name(op.a2a.elem) + " and " + std::to_string(other) + " "
                               + wire_name(bf16 ? wire_type::fp32 : wire_type::bf16)
                               + " elements, expected " + std::to_string(total(segs)) + " "
                               + wire_name(op.a2a.elem));
        if (bf16)
          copy_out(op.bf16[q].data(), segs);
        else
          copy_out(op.floats[q].data(), segs);
      }
      return {};
    }
  }
  return fail(tag, "unknown collective");
}

void try_complete(comm_state& st, const collective_tag& tag) {
  auto it = st.ops.find(tag);
  if (it == st.ops.end() || !it->second.have_local)
    return;
  auto& op = it->second;
  if (op.received < expected_pieces(st))
    return;
  auto err = complete(st, tag, op);
  pending_op finished = std::move(op);
  st.ops.erase(it);
  // The request's buffers (its views' owners) go before the answer: the requester counts them
  // released once it hears that the collective is done.
  finished.rs = {};
  finished.a2a = {};
  bool reduce = is_all_reduce(tag.kind);
  if (err && reduce) {
    finished.reduced.deliver(std::move(err));
  } else if (err) {
    finished.done.deliver(std::move(err));
  } else if (reduce) {
    finished.reduced.deliver(all_reduce_result{tag, std::move(finished.ar.values)});
  } else {
    finished.done.deliver(comm_done{tag});
  }
}

template <class Piece>
void on_piece(comm_pointer self, Piece& piece) {
  ZMUON_TRACE_RECV(self, piece);
  auto& st = self->state;
  if (st.failure)
    return;
  if (st.peers.empty()) {
    if constexpr (std::is_same<Piece, peer_floats>::value)
      st.early_floats.push_back(std::move(piece));
    else
      st.early_doubles.push_back(std::move(piece));
    return;
  }
  if (piece.src < 0 || piece.src >= st.world || piece.src == st.rank)
    return;  // not from a peer of this group: ignore
  auto& op = op_for(st, piece.tag);
  if (op.arrived[piece.src])
    return;  // duplicate: the first one counts
  op.arrived[piece.src] = true;
  ++op.received;
  if constexpr (std::is_same<Piece, peer_floats>::value) {
    op.floats[piece.src] = std::move(piece.data);
    op.bf16[piece.src] = std::move(piece.bf16);
  } else
    op.doubles[piece.src] = std::move(piece.data);
  try_complete(st, piece.tag);
}

void fail_all(comm_pointer self, const caf::error& err) {
  auto& st = self->state;
  st.failure = err;
  auto ops = std::move(st.ops);  // the buffers go before the answers, as in try_complete
  st.ops.clear();
  for (auto& [tag, op] : ops) {
    op.rs = {};
    op.a2a = {};
    if (!op.have_local)
      continue;
    if (is_all_reduce(tag.kind))
      op.reduced.deliver(err);
    else
      op.done.deliver(err);
  }
}

caf_comm_actor::behavior_type caf_comm_impl(comm_pointer self, int rank, int world,
                                            std::shared_ptr<trace::recorder> tracer) {
  self->state.tr = trace::track(std::move(tracer), "caf_comm");
  self->state.rank = rank;
  self->state.world = world;
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    for (int q = 0; q < st.world; ++q)
      if (st.peers.size() > static_cast<size_t>(q) && st.peers[q].address() == dm.source) {
        fail_all(self, make_caf_error(errc::comm_failure, "rank " + std::to_string(q) + " is down ("
                                                              + to_string(dm.reason) + ")"));
        return;
      }
  });
  return {
      [=](connect_peers& msg) {
        auto& st = self->state;
        st.rank = msg.rank;  // a node's comm actors learn their rank and world only here
        st.world = static_cast<int>(msg.peers.size());
        st.peers.clear();
        for (auto& p : msg.peers)
          st.peers.push_back(caf::actor_cast<caf_comm_actor>(p));
        for (int q = 0; q < st.world; ++q)
          if (q != st.rank)
            self->monitor(st.peers[q]);
        auto floats = std::move(st.early_floats);
        auto doubles = std::move(st.early_doubles);
        for (auto& piece : floats)
          on_piece(self, piece);
        for (auto& piece : doubles)
          on_piece(self, piece);
      },
      [=](reduce_scatter_req& req) -> caf::result<comm_done> {
        ZMUON_TRACE_RECV(self, req);
        auto& st = self->state;
        if (auto err = not_ready(st, req.tag))
          return err;
        for (int q = 0; q < st.world; ++q)
          if (q != st.rank) {
            const float* first = req.in + static_cast<int64_t>(q) * req.count;
            trace::send(
                self, st.tr, st.peers[q],
                peer_floats{req.tag, st.rank, std::vector<float>(first, first + req.count), {}}, q);
          }
        auto tag = req.tag;
        auto& op = op_for(st, tag);
        op.have_local = true;
        op.rs = std::move(req);
        op.done = self->make_response_promise<comm_done>();
        auto promise = op.done;
        try_complete(st, tag);
        return promise;
      },
      [=](all_reduce_req& req) -> caf::result<all_reduce_result> {
        ZMUON_TRACE_RECV(self, req);
        auto& st = self->state;
        if (auto err = not_ready(st, req.tag))
          return err;
        for (int q = 0; q < st.world; ++q)
          if (q != st.rank)
            trace::send(self, st.tr, st.peers[q], peer_doubles{req.tag, st.rank, req.values}, q);
        auto tag = req.tag;
        auto& op = op_for(st, tag);
        op.have_local = true;
        op.ar = std::move(req);
        op.reduced = self->make_response_promise<all_reduce_result>();
        auto promise = op.reduced;
        try_complete(st, tag);
        return promise;
      },
      [=](all_to_all_req& req) -> caf::result<comm_done> {
        ZMUON_TRACE_RECV(self, req);
        auto& st = self->state;
        if (auto err = not_ready(st, req.tag))
          return err;
        if (static_cast<int>(req.sends.size()) != st.world
            || static_cast<int>(req.recvs.size()) != st.world)
          return fail(req.tag, "send and receive lists need one entry per rank");
        if (auto err = check_segments(req))
          return err;
        const bool bf16 = req.elem == wire_type::bf16;
        for (int q = 0; q < st.world; ++q) {
          int64_t n = total(req.sends[q]);
          if (q == st.rank) {
            if (n != total(req.recvs[q]))
              return fail(req.tag, "rank " + std::to_string(q) + " sends itself "
                                       + std::to_string(n) + " elements but expects "
                                       + std::to_string(total(req.recvs[q])));
            if (bf16)
              copy_across<uint16_t>(req.sends[q], req.recvs[q]);
            else
              copy_across<float>(req.sends[q], req.recvs[q]);
          } else if (bf16) {
            trace::send(self, st.tr, st.peers[q],
                        peer_floats{req.tag, st.rank, {}, concat<uint16_t>(req.sends[q])}, q);
          } else {
            trace::send(self, st.tr, st.peers[q],
                        peer_floats{req.tag, st.rank, concat(req.sends[q]), {}}, q);
          }
        }
        auto tag = req.tag;
        auto& op = op_for(st, tag);
        op.have_local = true;
        op.a2a = std::move(req);
        op.done = self->make_response_promise<comm_done>();
        auto promise = op.done;
        try_complete(st, tag);
        return promise;
      },
      [=](comm_abort& msg) {
        if (!self->state.failure)
          fail_all(self, make_caf_error(errc::comm_failure, msg.reason));
      },
      [=](peer_floats& piece) { on_piece(self, piece); },
      [=](peer_doubles& piece) { on_piece(self, piece); },
  };
}

}  // namespace

caf_comm_actor spawn_caf_comm(caf::actor_system& sys, int rank, int world,
                              std::shared_ptr<trace::recorder> tracer) {
  return sys.spawn(caf_comm_impl, rank, world, std::move(tracer));
}

std::vector<caf_comm_actor> spawn_caf_comm_group(
    caf::actor_system& sys, int world,
    const std::vector<std::shared_ptr<trace::recorder>>& tracers) {
  std::vector<caf_comm_actor> group;
  std::vector<caf::actor> untyped;
  for (int r = 0; r < world; ++r) {
    group.push_back(spawn_caf_comm(sys, r, world, tracers.empty() ? nullptr : tracers[r]));
    untyped.push_back(caf::actor_cast<caf::actor>(group.back()));
  }
  for (int r = 0; r < world; ++r)
    caf::anon_send(group[r], connect_peers{r, untyped});
  return group;
}

}  // namespace zmuon
