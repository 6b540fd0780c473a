// engine::reduce: the hand-over of one micro-batch's gradients, packed into reduce buckets
// (rank-major, for the reduce-scatter) and sent to the rank's reducer, within the bound on
// buckets in flight; device gradients read before reduce() returns, or ordered on the caller's
// stream. engine::reduce_all: every local rank's at once, a thread each. A hand-over ahead of
// the step: its reads begun (begin_step, and the step), or withdrawn. report_qk_logits:
// MuonClip's logits per micro-batch, kept per local rank until the step carries them to the
// rank's coordinator.
#include "zmuon/engine.hpp"

#include "engine/hand_over.hpp"
#include "engine/impl.hpp"
#include "engine/job.hpp"
#include "engine/lifecycle.hpp"
#include "engine/registry.hpp"
#include "engine/views.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "actors/staging.hpp"
#include "plan/ownership.hpp"

namespace zmuon {

namespace {

/// Fault injection: poison element 0 of a parameter's gradient (it lives in rank 0's part of the
/// bucket's rank-major staging).
void inject_nonfinite(const fault_options& faults, const plan& pl, const bucket_layout& bucket,
                      uint64_t step, int rank, int micro, std::vector<float>& staging) {
  for (const auto& f : faults.nonfinite) {
    if (f.step != step || f.rank != rank || f.micro != micro)
      continue;
    int i = pl.find(f.param);
    if (i >= bucket.first_param && i < bucket.end_param)
      staging[pl.params[i].shard_offset - bucket.shard_offset] = f.value;
  }
}

/// reduce()'s bound on a rank's unanswered buckets (0: none). One local rank only: with
/// several, the host hands over rank after rank and a bucket lands only once all did
/// (reduce_all hands over on a thread per rank and keeps the bound).
size_t buckets_in_flight(const engine_job& job) {
  return job.local == 1 ? static_cast<size_t>(job.opts.max_buckets_in_flight) : 0;
}

/// Views of host tensors by name, for the buffer-based calls.
std::vector<tensor_view> host_views(const tensor_map& grads) {
  std::vector<tensor_view> views;
  views.reserve(grads.size());
  for (const auto& [name, data] : grads)
    views.push_back({name, data.data(), static_cast<int64_t>(data.size())});
  return views;
}

/// One rank's micro-batch of gradients packed bucket by bucket. Rank-major: rank q's part holds
/// shard q of every parameter of the bucket, for q in [first_q, end_q) (an already averaged
/// gradient: this rank's part alone).
struct packer {
  packer(const plan& plan, compute_backend& backend, host_buckets& buffers, int first, int end)
      : pl(plan), be(backend), host_buffers(buffers), first_q(first), end_q(end) {}

  const plan& pl;
  compute_backend& be;
  host_buckets& host_buffers;
  std::vector<const float*> source;  // by parameter: the gradient, or null
  std::vector<bool> on_device;
  std::vector<bool> whole;  // the whole tensor, else the rank's shard alone
  int first_q;
  int end_q;
  bool on_device_packing = false;  // into a device buffer, else a host buffer
  bool read_in_store = false;      // not packed: the store reads the pieces in its accumulate
  bool read_on_device = false;     // by copies queued on the rank's stream

  /// The elements of bucket `bucket` the gradients cover (the rest is shard padding or
  /// parameters without a gradient).
  int64_t covered(const bucket_layout& bucket) const {
    int64_t n = 0;
    for (int i = bucket.first_param; i < bucket.end_param; ++i)
      for (int q = first_q; source[i] && q < end_q; ++q)
        n += valid_len(pl.params[i], q);
    return n;
  }

  /// Bucket `b` into `msg`: a device buffer or a host one, zero-filled only where the copies
  /// leave gaps (most buckets are covered whole and skip the fill's pass over the memory).
  void bucket(size_t b, micro_grads& msg) {
    const auto& bk = pl.buckets[b];
    const int64_t size = bk.shard_len * (end_q - first_q);
    const bool gaps = !read_in_store && covered(bk) != size;
    std::shared_ptr<std::vector<float>> host;
    if (read_in_store) {
      msg.device_size = size;
    } else if (on_device_packing) {
      msg.device_data = std::make_shared<device_buffer>(gaps ? be.allocate(size)
                                                             : be.allocate_for_overwrite(size));
      msg.device_size = size;
    } else {
      host = host_buffers.take(b, static_cast<size_t>(size), gaps);
    }
    std::vector<copy_piece> device_pieces;  // within the backend's memory: one copy_pieces call
    for (int i = bk.first_param; i < bk.end_param; ++i) {
      const auto& p = pl.params[i];
      for (int q = first_q; source[i] && q < end_q; ++q) {
        const int64_t n = valid_len(p, q);
        if (n <= 0)
          continue;
        const int64_t at = (q - first_q) * bk.shard_len + (p.shard_offset - bk.shard_offset);
        const float* src = source[i] + (whole[i] ? q * p.shard_len : 0);
        if (read_in_store || (on_device_packing && on_device[i]))
          device_pieces.push_back(copy_piece{src, at, n});
        else if (on_device_packing)
          be.copy_from_host_async(msg.device_data->data() + at, src, n);
        else if (on_device[i])
          be.copy_to_host(host->data() + at, src, n);
        else
          std::memcpy(host->data() + at, src, n * sizeof(float));
      }
    }
    if (read_in_store) {
      msg.pieces = std::make_shared<const std::vector<copy_piece>>(std::move(device_pieces));
    } else if (!device_pieces.empty()) {
      be.copy_pieces(msg.device_data->data(), device_pieces);
      read_on_device = true;
    }
    msg.data = std::move(host);
  }
};

/// 1 in `marks` (by parameter) where `source` has a gradient.
void mark_touched(std::vector<uint8_t>& marks, const std::vector<const float*>& source) {
  marks.resize(source.size(), 0);
  for (size_t i = 0; i < source.size(); ++i)
    marks[i] |= source[i] != nullptr ? 1 : 0;
}

}  // namespace

error engine::reduce(int rank, const tensor_map& grads) {
  return reduce(rank, host_views(grads));
}

error engine::reduce(int rank, const std::vector<tensor_view>& grads) {
  return reduce_views(rank, grads, std::nullopt, buckets_in_flight(*impl_->job));
}

error engine::reduce(int rank, const std::vector<tensor_view>& grads, void* cuda_stream) {
  return reduce_views(rank, grads, cuda_stream, buckets_in_flight(*impl_->job));
}

error engine::hand_over_reduced(int rank, const std::vector<tensor_view>& grads) {
  return reduce_views(rank, grads, std::nullopt, buckets_in_flight(*impl_->job), true);
}

error engine::hand_over_reduced(int rank, const std::vector<tensor_view>& grads,
                                void* cuda_stream) {
  return reduce_views(rank, grads, cuda_stream, buckets_in_flight(*impl_->job), true);
}

error engine::hand_over(int rank, const std::vector<tensor_view>& grads, void* cuda_stream,
                        bool reduced, bool kept_until_step, bool ahead_of_step) {
  if (ahead_of_step && !kept_until_step)
    return {errc::invalid_argument,
            "hand_over: a hand-over ahead of the step must keep its gradients until the step"};
  return reduce_views(rank, grads, cuda_stream, buckets_in_flight(*impl_->job), reduced,
                      kept_until_step, ahead_of_step);
}

expected<int> engine::handed_over(int rank) {
  auto& d = *impl_;
  if (auto err = d.start_for(rank))
    return err;
  return d.hand_over->micros[rank - d.job->first_rank];
}

error engine::reduce_all(const std::vector<tensor_map>& grads) {
  std::vector<std::vector<tensor_view>> views;
  views.reserve(grads.size());
  for (const auto& g : grads)
    views.push_back(host_views(g));
  return reduce_all(views);
}

error engine::reduce_all(const std::vector<std::vector<tensor_view>>& grads) {
  auto& d = *impl_;
  auto& job = *d.job;
  auto& reg = *d.registry;
  if (auto err = d.start())
    return err;
  if (static_cast<int>(grads.size()) != job.local)
    return {errc::invalid_argument, "reduce_all(): " + std::to_string(grads.size())
                                        + " gradient sets for " + std::to_string(job.local)
                                        + " local rank(s)"};
  for (int i = 0; i < job.local; ++i) {  // all checked before any rank hands over
    std::vector<const float*> source;
    std::vector<bool> on_device;
    if (auto err = index_views(*reg.pl, job.opts, grads[i], "gradient of", "gradient for", source,
                               on_device))
      return {err.code(),
              "reduce_all(): rank " + std::to_string(job.first_rank + i) + ": " + err.message()};
  }
  if (job.local == 1)
    return reduce_views(job.first_rank, grads[0], std::nullopt, buckets_in_flight(job));
  const auto window = static_cast<size_t>(job.opts.max_buckets_in_flight);
  std::vector<error> failed(static_cast<size_t>(job.local));
  std::vector<std::thread> hand_over;
  for (int i = 0; i < job.local; ++i)
    hand_over.emplace_back(
        [&, i] { failed[i] = reduce_views(job.first_rank + i, grads[i], std::nullopt, window); });
  for (auto& t : hand_over)
    t.join();
  for (auto& err : failed)
    if (err)
      return err;
  return {};
}

error engine::reduce_views(int rank, const std::vector<tensor_view>& grads,
                           std::optional<void*> caller_stream, size_t window, bool reduced,
                           bool kept_until_step, bool ahead_of_step) {
  auto& d = *impl_;
  auto& job = *d.job;
  auto& hand = *d.hand_over;
  if (auto err = d.start_for(rank))
    return err;
  const auto& pl = *d.registry->pl;
  const int local = rank - job.first_rank;
  compute_backend& be = *job.ranks[local].backend;
  const host_call_timer timed(be, "hand_over");
  // 1. Everything is checked before anything is sent.
  packer pack(pl, be, hand.packed[local], reduced ? rank : 0, reduced ? rank + 1 : pl.world);
  if (auto err = index_views(pl, job.opts, grads, "gradient of", "gradient for", pack.source,
                             pack.on_device, reduced ? rank : -1, &pack.whole))
    return err;
  // The mean over a world of one rank is the gradient itself: no reduce-scatter to issue.
  reduced = reduced || pl.world == 1;
  // Device gradients under the nccl comm are packed on the device (the rank's stream orders the
  // copies before the reduce-scatter); everything else is packed in host memory.
  const bool any_on_device =
      std::find(pack.on_device.begin(), pack.on_device.end(), true) != pack.on_device.end();
  pack.on_device_packing = !comm_on_host(job.opts.comm) && any_on_device;
  // This rank's part alone, every gradient in the backend's memory (on the device under the
  // nccl comm, or on the host backend in host memory) and kept by the caller until the step
  // ends: the store reads the gradients where they lie in its accumulate (one pass over them
  // instead of a packed copy and then the add), after the caller's stream (1.), and step()
  // returns after those reads.
  const bool host_backend = !be.device_memory() && !any_on_device;
  pack.read_in_store = kept_until_step && reduced && (pack.on_device_packing || host_backend);
  for (size_t i = 0; i < pack.source.size(); ++i)
    pack.read_in_store =
        pack.read_in_store && (!pack.source[i] || pack.on_device[i] == !host_backend);
  if (ahead_of_step && !pack.read_in_store)
    return {errc::unsupported,
            "hand_over ahead of the step: rank " + std::to_string(rank)
                + "'s step cannot read these gradients where they lie (that needs its part "
                  "alone, every gradient in the memory of the rank's backend and, on a device, "
                  "the nccl comm)"};
  if (ahead_of_step && hand.micros[local] > 0 && !hand.ahead[local])
    return {errc::bad_state, "hand_over ahead of the step: rank " + std::to_string(rank)
                                 + " already handed over " + std::to_string(hand.micros[local])
                                 + " micro-batch(es) of step " + std::to_string(job.step + 1)};
  if (caller_stream && any_on_device) {  // every read below comes after the caller's writes
    if (auto err = be.check_caller_stream(*caller_stream))
      return {err.code(), "reduce(): rank " + std::to_string(rank) + ": " + err.message()};
    if (auto err = on_backend("reduce", rank, [&] { be.wait_for_stream(*caller_stream); }))
      return err;
  }
  // 2. A hand-over made ahead of the step counts no more; the micro-batch counted, its
  //    parameters marked touched.
  if (auto err = d.withdraw_ahead(local))
    return d.stop(err, engine_lifecycle::in_step(job.step + 1));
  const int micro = hand.micros[local]++;
  hand.kept[local] = hand.kept[local] || pack.read_in_store;
  hand.only_kept[local] = hand.only_kept[local] && pack.read_in_store;
  hand.ahead[local] = ahead_of_step ? 1 : 0;       // the rank's only hand-over of the step (above)
  mark_touched(hand.touched[local], pack.source);  // this rank's thread alone writes them
  const uint64_t step = job.step + 1;
  // 3. Bucket after bucket packed and handed to the reducer, within the window. A backend
  //    failure here (a CUDA error) is returned like any other, the buckets handed over so far
  //    stay with their reducer.
  auto& in_flight = hand.windows[local];
  error failed;
  const error device = on_backend("reduce", rank, [&] {
    for (size_t b = 0; b < pl.buckets.size(); ++b) {
      // Back-pressure: the oldest buckets land (and free their buffers) before this one is packed.
      if (window > 0)
        if ((failed = in_flight.wait_until(window - 1)))
          break;
      micro_grads msg{step, micro, static_cast<int32_t>(b), nullptr, nullptr, 0, reduced};
      msg.at_step = ahead_of_step;
      pack.bucket(b, msg);
      if (msg.data)  // fault injection (tests) acts on host-packed gradients
        inject_nonfinite(d.registry->faults, pl, pl.buckets[b], step, rank, micro, *msg.data);
      in_flight.hand_over(job.ranks[local].reducer, std::move(msg));
    }
    // 4. Device copies read the caller's buffers after they are queued, and the caller may write
    //    or free them once reduce() returns (the next backward pass accumulates into them): they
    //    have run by then, on every way out, or the caller's stream waits for them. Gradients
    //    the store reads in place stay as they are until step() returns: nothing to wait for.
    if (pack.read_in_store)
      return;
    if (pack.read_on_device && caller_stream)
      be.make_stream_wait(*caller_stream);
    else if (pack.read_on_device)
      be.synchronize();
  });
  // Some buckets of this micro-batch may be with the reducer, others not: the step is broken.
  return d.stop(device ? device : failed, engine_lifecycle::in_step(step));
}

error engine::impl::check_ahead_stream(void* cuda_stream) {
  for (int i = 0; i < job->local; ++i)
    if (hand_over->ahead[i])
      if (auto err = job->ranks[i].backend->check_caller_stream(cuda_stream))
        return {err.code(),
                "step(): rank " + std::to_string(job->first_rank + i) + ": " + err.message()};
  return {};
}

error engine::impl::begin_ahead_reads(std::optional<void*> cuda_stream) {
  for (int i = 0; i < job->local; ++i) {
    if (!hand_over->ahead[i])
      continue;
    compute_backend& be = *job->ranks[i].backend;
    if (cuda_stream)
      if (auto err =
              on_backend("step", job->first_rank + i, [&] { be.wait_for_stream(*cuda_stream); }))
        return err;
    if (hand_over->begun[i])
      continue;
    // Once every bucket is with the store (answered long since, as a backward pass ended), so
    // that no accumulate comes after the reads.
    if (auto err = hand_over->windows[i].wait_until(0))
      return err;
    caf::anon_send(job->ranks[i].store, begin_reads{job->step + 1});
    hand_over->begun[i] = 1;
  }
  return {};
}

error engine::impl::withdraw_ahead(int local) {
  const int first = local < 0 ? 0 : local;
  const int end = local < 0 ? job->local : local + 1;
  for (int i = first; i < end; ++i) {
    if (!hand_over->ahead[i])
      continue;
    const uint64_t step = job->step + 1;
    if (auto err = hand_over->windows[i].wait_until(0))  // every bucket of it with the store
      return err;
    if (auto done = job->ask<ack>(job->ranks[i].reducer, discard_grads{step}); !done)
      return done.err();
    if (auto done = job->ask<ack>(job->ranks[i].store, discard_grads{step}); !done)
      return done.err();
    hand_over->micros[i] = 0;
    hand_over->kept[i] = 0;
    hand_over->only_kept[i] = 1;
    hand_over->ahead[i] = 0;
    hand_over->begun[i] = 0;
    std::fill(hand_over->touched[i].begin(), hand_over->touched[i].end(), 0);
  }
  return {};
}

error engine::begin_step(void* cuda_stream) {
  auto& d = *impl_;
  if (auto err = d.start())
    return err;
  if (auto err = d.check_ahead_stream(cuda_stream))
    return err;
  if (auto err = d.begin_ahead_reads(cuda_stream))
    return d.stop(err, engine_lifecycle::in_step(d.job->step + 1));
  return {};
}

error engine::report_qk_logits(int rank, const std::string& query,
                               const std::vector<float>& max_logits) {
  auto& d = *impl_;
  if (auto err = d.start_for(rank))
    return err;
  const plan& pl = *d.registry->pl;
  const int i = pl.find(query);
  const int pair = i < 0 ? -1 : pl.find_qk_pair(i);
  if (pair < 0)
    return {i < 0 ? errc::unknown_parameter : errc::invalid_argument,
            "report_qk_logits: '" + query + "' is not the query of a MuonClip pair (add_qk_clip)"};
  const auto& p = pl.qk_pairs[pair];
  if (static_cast<int64_t>(max_logits.size()) != p.query_heads)
    return {errc::shape_mismatch, "report_qk_logits: '" + query + "' has "
                                      + std::to_string(p.query_heads) + " heads, got "
                                      + std::to_string(max_logits.size()) + " values"};
  // -inf: no logit of that head here (a process of tensor parallelism computes some heads).
  for (size_t h = 0; h < max_logits.size(); ++h)
    if (std::isnan(max_logits[h]) || max_logits[h] == std::numeric_limits<float>::infinity())
      return {errc::invalid_argument, "report_qk_logits: '" + query + "' head " + std::to_string(h)
                                          + " has a logit of " + std::to_string(max_logits[h])
                                          + " (finite, or -inf for a head not computed here)"};
  auto& mine = d.hand_over->qk_logits[rank - d.job->first_rank];
  if (mine.empty())
    mine.assign(static_cast<size_t>(pl.qk_values), -std::numeric_limits<float>::max());
  for (int64_t h = 0; h < p.query_heads; ++h) {
    float& at = mine[static_cast<size_t>(p.value_offset + h)];
    at = std::max(at, max_logits[static_cast<size_t>(h)]);
  }
  return {};
}

}  // namespace zmuon
