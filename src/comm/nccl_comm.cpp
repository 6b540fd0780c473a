#include "comm/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <set>

#include "caf/all.hpp"

#include "comm/segments.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_compute.hpp"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/owners.hpp"
#include "messages/errors.hpp"

namespace zmuon {

namespace {

using poll_atom = caf::atom_constant<caf::atom("ncclpoll")>;      // an all-reduce is pending
using health_atom = caf::atom_constant<caf::atom("ncclhealth")>;  // periodic async-error check

using nccl_comm_actor = comm_actor::extend<caf::reacts_to<poll_atom>, caf::reacts_to<health_atom>>;

constexpr size_t kMaxValues =
    64;  // doubles per all-reduce (the vote uses two: flag, sum of squares)
constexpr auto kPendingPoll = std::chrono::microseconds(20);

// Device and pinned host room for one all-reduce of doubles, and the event that says it is back.
struct reduce_slot {
  gpu::device_array<double> device{static_cast<int64_t>(kMaxValues)};
  gpu::pinned<std::array<double, kMaxValues>> host;
  gpu::cuda_event done{cudaEventDisableTiming};
};

struct pending_reduce {
  all_reduce_result result;
  caf::typed_response_promise<all_reduce_result> promise;
  std::unique_ptr<reduce_slot> slot;
};

struct nccl_state {
  int rank = 0;
  int world = 1;
  ncclComm_t comm = nullptr;
  std::shared_ptr<compute_backend> be;  // keeps the stream alive while the communicator uses it
  gpu::cuda_compute* cuda = nullptr;
  std::chrono::milliseconds health_period{100};
  std::deque<pending_reduce> pending;
  std::vector<std::unique_ptr<reduce_slot>> free_slots;
  bool polling = false;
  bool aborted = false;

  ~nccl_state() {
    if (comm == nullptr)
      return;
    (void)cudaSetDevice(cuda->device());
    if (aborted)
      (void)ncclCommAbort(comm);
    else
      (void)ncclCommDestroy(comm);
  }
  static const char* name;
};
const char* nccl_state::name = "nccl_comm";

using nccl_pointer = nccl_comm_actor::stateful_pointer<nccl_state>;

std::string nccl_message(ncclComm_t comm, ncclResult_t code) {
  std::string text = ncclGetErrorString(code);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0')
      text += std::string(": ") + last;
  }
  return text;
}

// Aborts the communicator and answers everything pending with `err`.
void abort_all(nccl_pointer self, const caf::error& err) {
  auto& st = self->state;
  if (!st.aborted && st.comm != nullptr) {
    st.aborted = true;
    (void)cudaSetDevice(st.cuda->device());
    (void)ncclCommAbort(st.comm);
    st.comm = nullptr;
  }
  for (auto& p : st.pending)
    p.promise.deliver(err);
  st.pending.clear();
}

// abort_all, then stops the actor with `err`.
caf::error fail(nccl_pointer self, caf::error err) {
  abort_all(self, err);
  self->quit(err);
  return err;
}

caf::error failure(nccl_pointer self, const std::string& what, ncclResult_t code) {
  return make_caf_error(errc::comm_failure,
                        "rank " + std::to_string(self->state.rank) + ": nccl " + what
                            + " failed: " + nccl_message(self->state.comm, code));
}

// The error of a failed enqueue (and the actor stops), or none.
caf::error check(nccl_pointer self, ncclResult_t code, const std::string& what) {
  if (code == ncclSuccess)
    return {};
  return fail(self, failure(self, what, code));
}

caf::error usable(nccl_pointer self) {
  auto& st = self->state;
  if (st.comm == nullptr)
    return make_caf_error(errc::comm_failure,
                          "rank " + std::to_string(st.rank) + ": the nccl communicator is aborted");
  ZMUON_CUDA_CHECK(cudaSetDevice(st.cuda->device()));
  return {};
}

void check_async_error(nccl_pointer self) {
  auto& st = self->state;
  if (st.comm == nullptr)
    return;
  ncclResult_t async = ncclSuccess;
  ncclResult_t code = ncclCommGetAsyncError(st.comm, &async);
  if (code != ncclSuccess)
    fail(self, failure(self, "ncclCommGetAsyncError", code));
  else if (async != ncclSuccess && async != ncclInProgress)
    fail(self, failure(self, "communicator (asynchronous error)", async));
}

void deliver_finished(nccl_pointer self) {
  auto& st = self->state;
  while (!st.pending.empty() && st.pending.front().slot->done.done()) {
    auto& p = st.pending.front();
    auto n = p.result.values.size();
    std::copy(p.slot->host.get()->begin(), p.slot->host.get()->begin() + n,
              p.result.values.begin());
    p.promise.deliver(std::move(p.result));
    st.free_slots.push_back(std::move(p.slot));
    st.pending.pop_front();
  }
}

void schedule_poll(nccl_pointer self) {
  auto& st = self->state;
  if (st.polling || st.pending.empty())
    return;
  st.polling = true;
  self->delayed_send(self, kPendingPoll, poll_atom::value);
}

int64_t total(const std::vector<std::vector<segment>>& lists) {
  int64_t n = 0;
  for (const auto& l : lists)
    for (const auto& s : l)
      n += s.size;
  return n;
}

/// Copies this rank's segments to itself in order, as a send and a receive list to the same
/// rank pair up (piece by piece where the lists are cut differently), on `stream`: one copy
/// kernel per 64 pieces instead of NCCL's send to self (at world 1 the whole gather and scatter;
/// a cudaMemcpyAsync per piece took 0.25 ms of host time per GPT-2 chunk to enqueue). False when
/// the two lists' totals differ.
bool copy_to_self(const std::vector<segment>& sends, const std::vector<segment>& recvs, bool bf16,
                  cudaStream_t stream) {
  int64_t sent = 0;
  int64_t received = 0;
  for (const auto& s : sends)
    sent += s.size;
  for (const auto& s : recvs)
    received += s.size;
  if (sent != received)
    return false;
  const int64_t units = bf16 ? 1 : 2;  // 2-byte units an element
  const auto at = [bf16](const segment& s, int64_t offset) {
    return bf16 ? reinterpret_cast<uint16_t*>(s.bf16 + offset)
                : reinterpret_cast<uint16_t*>(s.data + offset);
  };
  std::vector<gpu::unit_piece> pieces;
  for_each_stretch(sends, recvs,
                   [&](const segment& s, int64_t at_s, const segment& r, int64_t at_r, int64_t n) {
                     pieces.push_back(gpu::unit_piece{at(s, at_s), at(r, at_r), n * units});
                   });
  gpu::launch_copy_units(gpu::launch_context{stream}, pieces);
  return true;
}

// A communicator handed to the actor at spawn (CAF cannot forward a pointer to an incomplete type).
struct communicator {
  ncclComm_t comm = nullptr;
};

nccl_comm_actor::behavior_type nccl_impl(nccl_pointer self, int rank, int world, communicator comm,
                                         std::shared_ptr<compute_backend> be, int poll_ms) {
  auto& st = self->state;
  st.rank = rank;
  st.world = world;
  st.comm = comm.comm;
  st.be = std::move(be);
  st.cuda = dynamic_cast<gpu::cuda_compute*>(st.be.get());
  st.health_period = std::chrono::milliseconds(poll_ms);
  self->set_exception_handler([=](std::exception_ptr& eptr) -> caf::error {
    caf::error err = error_from_exception(eptr);
    abort_all(self, err);
    return err;
  });
  self->delayed_send(self, st.health_period, health_atom::value);
  return {
      [=](reduce_scatter_req& req) -> caf::result<comm_done> {
        // Enqueued when the handler returns: the buffers go then (stream-ordered frees), before
        // the answer, as the requester expects of an answered request.
        const keep_alive held = std::move(req.owner);
        if (auto err = usable(self))
          return err;
        auto& st = self->state;
        if (req.count < 0 || (req.count > 0 && (req.in == nullptr || req.out == nullptr)))
          return make_caf_error(errc::invalid_argument,
                                "nccl reduce-scatter " + to_string(req.tag) + ": bad buffers");
        if (st.world == 1 && req.in == req.out)  // the mean of one rank, in place: itself
          return comm_done{req.tag};
        const auto bytes = static_cast<size_t>(req.count) * sizeof(float);
        const std::vector<gpu::touched> memory{{req.in, bytes * st.world}, {req.out, bytes}};
        cudaStream_t stream = st.cuda->stream_touching(memory);
        {
          const gpu::cuda_compute::comm_timer timer(*st.cuda, "nccl reduce_scatter", stream);
          if (auto err = check(self,
                               ncclReduceScatter(req.in, req.out, static_cast<size_t>(req.count),
                                                 ncclFloat, ncclAvg, st.comm, stream),
                               "reduce-scatter " + to_string(req.tag)))
            return err;
        }
        st.cuda->stream_done(memory);
        return comm_done{req.tag};
      },
      [=](all_to_all_req& req) -> caf::result<comm_done> {
        const auto held = take_owners(req);  // as in reduce_scatter_req
        if (auto err = usable(self))
          return err;
        auto& st = self->state;
        if (static_cast<int>(req.sends.size()) != st.world
            || static_cast<int>(req.recvs.size()) != st.world)
          return make_caf_error(errc::invalid_argument,
                                "nccl all-to-all " + to_string(req.tag) + ": needs one send and "
                                    "one receive list per rank ("
                                    + std::to_string(st.world) + ")");
        if (total(req.sends) == 0 && total(req.recvs) == 0)
          return comm_done{req.tag};
        const std::string what = "all-to-all " + to_string(req.tag);
        const bool bf16 = req.elem == wire_type::bf16;
        const ncclDataType_t type = bf16 ? ncclBfloat16 : ncclFloat;
        auto buffer = [bf16](const segment& s) -> void* {
          return bf16 ? static_cast<void*>(s.bf16) : static_cast<void*>(s.data);
        };
        for (const auto* lists : {&req.sends, &req.recvs})
          for (const auto& l : *lists)
            for (const auto& s : l)
              if (s.size < 0 || (s.size > 0 && buffer(s) == nullptr))
                return make_caf_error(errc::invalid_argument,
                                      "nccl " + what + ": a segment of " + std::to_string(s.size)
                                          + " elements has no " + wire_name(req.elem) + " buffer");
        // Ordered after the NS lanes only where they work on these buffers (the scatter after
        // its chunk's NS; the next chunk's gather alongside it: stream_set.hpp).
        std::vector<gpu::touched> memory;
        for (const auto* lists : {&req.sends, &req.recvs})
          for (const auto& l : *lists)
            for (const auto& s : l)
              memory.push_back({buffer(s), static_cast<size_t>(s.size) * (bf16 ? 2 : 4)});
        cudaStream_t stream = st.cuda->stream_touching(memory);
        {
          const gpu::cuda_compute::comm_timer timer(*st.cuda, "nccl all_to_all", stream);
          if (!copy_to_self(req.sends[st.rank], req.recvs[st.rank], bf16, stream))
            return make_caf_error(errc::invalid_argument,
                                  "nccl " + what + ": this rank sends itself "
                                      + std::to_string(total({req.sends[st.rank]}))
                                      + " elements but receives "
                                      + std::to_string(total({req.recvs[st.rank]})));
          if (auto err = check(self, ncclGroupStart(), what))
            return err;
          ncclResult_t code = ncclSuccess;
          for (int p = 0; p < st.world && code == ncclSuccess; ++p) {
            if (p == st.rank)
              continue;
            for (const auto& s : req.sends[p])
              if (code == ncclSuccess)
                code = ncclSend(buffer(s), static_cast<size_t>(s.size), type, p, st.comm, stream);
            for (const auto& s : req.recvs[p])
              if (code == ncclSuccess)
                code = ncclRecv(buffer(s), static_cast<size_t>(s.size), type, p, st.comm, stream);
          }
          ncclResult_t end = ncclGroupEnd();
          if (auto err = check(self, code != ncclSuccess ? code : end, what))
            return err;
        }
        st.cuda->stream_done(memory);  // the next NS on these buffers forks after it
        return comm_done{req.tag};
      },
      [=](all_reduce_req& req) -> caf::result<all_reduce_result> {
        if (auto err = usable(self))
          return err;
        auto& st = self->state;
        const size_t n = req.values.size();
        if (n > kMaxValues)
          return make_caf_error(errc::invalid_argument,
                                "nccl all-reduce " + to_string(req.tag) + ": " + std::to_string(n)
                                    + " values, at most " + std::to_string(kMaxValues));
        if (n == 0 || st.world == 1)  // the sum or max over one rank: the values themselves
          return all_reduce_result{req.tag, std::move(req.values)};
        std::unique_ptr<reduce_slot> slot;
        if (st.free_slots.empty()) {
          slot = std::make_unique<reduce_slot>();
        } else {
          slot = std::move(st.free_slots.back());
          st.free_slots.pop_back();
        }
        std::copy(req.values.begin(), req.values.end(), slot->host.get()->begin());
        cudaStream_t stream = st.cuda->stream_touching({});  // the slot's own buffers
        const size_t bytes = n * sizeof(double);
        {
          const gpu::cuda_compute::comm_timer timer(*st.cuda, "nccl all_reduce", stream);
          ZMUON_CUDA_CHECK(cudaMemcpyAsync(slot->device.data(), slot->host.get()->data(), bytes,
                                           cudaMemcpyHostToDevice, stream));
          if (auto err = check(
                  self,
                  ncclAllReduce(slot->device.data(), slot->device.data(), n, ncclDouble,
                                req.op == reduce_op::sum ? ncclSum : ncclMax, st.comm, stream),
                  "all-reduce " + to_string(req.tag)))
            return err;
          ZMUON_CUDA_CHECK(cudaMemcpyAsync(slot->host.get()->data(), slot->device.data(), bytes,
                                           cudaMemcpyDeviceToHost, stream));
        }
        slot->done.record(stream);
        auto promise = self->make_response_promise<all_reduce_result>();
        st.pending.push_back(pending_reduce{all_reduce_result{req.tag, std::move(req.values)},
                                            promise, std::move(slot)});
        schedule_poll(self);
        return promise;
      },
      [=](poll_atom) {
        auto& st = self->state;
        st.polling = false;
        check_async_error(self);
        if (st.comm == nullptr)
          return;
        ZMUON_CUDA_CHECK(cudaSetDevice(st.cuda->device()));
        deliver_finished(self);
        schedule_poll(self);
      },
      [=](health_atom) {
        check_async_error(self);
        if (self->state.comm != nullptr)
          self->delayed_send(self, self->state.health_period, health_atom::value);
      },
  };
}

expected<gpu::cuda_compute*> cuda_of(const std::shared_ptr<compute_backend>& be, int rank) {
  auto* cuda = dynamic_cast<gpu::cuda_compute*>(be.get());
  if (cuda == nullptr)
    return error(errc::invalid_argument, "comm backend 'nccl' needs the cuda compute backend (rank "
                                             + std::to_string(rank) + " has '"
                                             + (be ? be->name() : std::string("none")) + "')");
  return cuda;
}

}  // namespace

expected<nccl_unique_id> make_nccl_unique_id() {
  ncclUniqueId id;
  ncclResult_t code = ncclGetUniqueId(&id);
  if (code != ncclSuccess)
    return error(errc::comm_failure,
                 std::string("ncclGetUniqueId failed: ") + nccl_message(nullptr, code));
  return nccl_unique_id(id.internal, id.internal + sizeof(id.internal));
}

namespace {

// The communicators of ranks [first, first + backends.size()) of `world`, on the backends'
// devices, joined through `id`; grouped, so that one thread can initialize several ranks.
expected<std::vector<comm_actor>> spawn_ranks(
    caf::actor_system& sys, int first, int world, const ncclUniqueId& id,
    const std::vector<std::shared_ptr<compute_backend>>& backends, int poll_ms) {
  const int local = static_cast<int>(backends.size());
  std::vector<int> devices;
  std::set<int> distinct;
  for (int i = 0; i < local; ++i) {
    auto cuda = cuda_of(backends[i], first + i);
    if (!cuda)
      return cuda.err();
    devices.push_back((*cuda)->device());
    if (!distinct.insert(devices.back()).second)
      return error(errc::invalid_argument,
                   "comm backend 'nccl' needs one GPU per rank, but ranks share device "
                       + std::to_string(devices.back())
                       + " (use comm 'caf' to run several ranks on one GPU)");
  }
  std::vector<ncclComm_t> comms(local, nullptr);
  ncclResult_t code = ncclGroupStart();
  int bad_device = -1;
  for (int i = 0; i < local && code == ncclSuccess && bad_device < 0; ++i) {
    if (cudaSetDevice(devices[i]) != cudaSuccess)
      bad_device = i;
    else
      code = ncclCommInitRank(&comms[i], world, id, first + i);
  }
  ncclResult_t end = ncclGroupEnd();  // closes the group on every path
  if (bad_device >= 0)
    return error(errc::device_failure, "rank " + std::to_string(first + bad_device)
                                           + ": cannot use device "
                                           + std::to_string(devices[bad_device]));
  if (code == ncclSuccess)
    code = end;
  if (code != ncclSuccess)
    return error(errc::comm_failure,
                 "ranks " + std::to_string(first) + ".." + std::to_string(first + local - 1)
                     + " of " + std::to_string(world)
                     + ": ncclCommInitRank failed: " + nccl_message(nullptr, code));
  std::vector<comm_actor> out;
  for (int i = 0; i < local; ++i)
    out.push_back(comm_actor{
        sys.spawn(nccl_impl, first + i, world, communicator{comms[i]}, backends[i], poll_ms)});
  return out;
}

}  // namespace

expected<std::vector<comm_actor>> spawn_nccl_comms(
    caf::actor_system& sys, int first_rank, int world, const nccl_unique_id& id,
    const std::vector<std::shared_ptr<compute_backend>>& backends, int poll_ms) {
  ncclUniqueId uid;
  if (id.size() != sizeof(uid.internal))
    return error(errc::invalid_argument, "nccl unique id has " + std::to_string(id.size())
                                             + " bytes, expected "
                                             + std::to_string(sizeof(uid.internal)));
  std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
  return spawn_ranks(sys, first_rank, world, uid, backends, poll_ms);
}

expected<std::vector<comm_actor>> spawn_nccl_comm_group(
    caf::actor_system& sys, const std::vector<std::shared_ptr<compute_backend>>& backends,
    int poll_ms) {
  auto id = make_nccl_unique_id();
  if (!id)
    return id.err();
  return spawn_nccl_comms(sys, 0, static_cast<int>(backends.size()), *id, backends, poll_ms);
}

}  // namespace zmuon
