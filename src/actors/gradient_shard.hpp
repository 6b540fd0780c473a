// gradient_shard: a rank's gradient for the open step as the partition store keeps it: one flat
// buffer laid out like the parameter shards, in reduce buckets. Per bucket it knows whether the
// buffer holds this step's values, the scan of them kept by the call that wrote them, and
// whether the bucket is read where the caller keeps it (the pieces of a device hand-over kept
// until the step) instead of from the buffer. Where the momentum may go ahead of the vote, such
// a bucket's kept scan is of its non-Muon gradients, and each Muon chunk keeps the scan of its
// gradients in a part of its own (taken by its momentum call, or when the vote asks). Part of
// the partition store's state, driven by its handlers on the store's own thread; not an actor.
// Internal.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "caf/error.hpp"

#include "kernels/compute.hpp"
#include "messages/messages.hpp"
#include "plan/plan.hpp"

namespace zmuon {

class gradient_shard {
public:
  /// Every bucket unwritten (zero). The buffer is allocated when a bucket first needs it: a
  /// rank whose every step reads its buckets in place never holds one. `muon_in_momentum`:
  /// the step's momentum may go ahead of the vote (momentum_may_precede_vote), so a bucket read
  /// in place leaves its Muon parameters out of its scan, for the momentum calls to take
  /// (momentum_scan); the vote's scan scans those of the chunks whose calls do not come first.
  gradient_shard(std::shared_ptr<const plan> pl, std::shared_ptr<compute_backend> be,
                 bool muon_in_momentum = false);

  /// accumulate: the slice (or the caller's pieces) added to its bucket. A bucket's first of the
  /// step is copied in, or, for pieces, only scanned and read where they lie from then on (the
  /// scan at once, or, for pieces read at the step, by the step's first materialize).
  caf::error accumulate(const zmuon::accumulate& msg);

  /// Who reads the gradient next. `in_place`: the momentum, the non-Muon rule or the kept scans,
  /// which take each parameter's gradient where read() says; `buffer`: anything else.
  enum class reader { in_place, buffer };
  /// Before the gradient is read: the buckets nothing reached this step are zeroed, the scans
  /// left to the step taken, and for a reader of the buffer those read in place copied in.
  void materialize(reader by = reader::buffer);
  /// The gradient is zero from here on: every bucket unwritten, none read in place.
  void forget();
  /// The whole gradient times `factor` (the unscale), in the buffer.
  void scale(float factor);
  /// The scan of the whole gradient, without waiting (compute_backend::scan_async's contract):
  /// from the buckets' kept scans where all are current, else a pass over the buffer. Where
  /// the buckets left the Muon gradients out, each chunk's part adds them: its momentum call's
  /// scan (momentum_scan), or else a scan of that chunk's gradients taken here.
  void scan_async(scan_result* out, std::function<void()> landed);
  /// Where chunk `chunk`'s momentum call keeps the scan of the gradients it reads: none
  /// (nothing to scan) unless every bucket that holds Muon gradients left them out of its scan
  /// and the chunk's part is not yet this step's. The first of the chunk's calls writes it
  /// (`first`), the others add to it.
  scan_into momentum_scan(int chunk);
  /// Whether the buckets left the Muon gradients out and one of chunks [0, chunks) has not had
  /// its momentum call this step (the vote's scan waits for those, scan_grads::chunks_ahead).
  bool momentum_scans_due(int chunks) const;

  /// Parameter `param`'s slice `s` as this step reads its gradient (param_slice::grad).
  param_slice read(param_slice s, int param) const {
    s.grad = grad_at_[param];
    return s;
  }
  /// The buffer, the `g` of the backend's slice calls; empty (null) while no bucket has needed
  /// it, and then every slice that read() gives has its own gradient.
  const device_buffer& buffer() const { return grads_; }

private:
  bool read_in_place(int bucket, const gradient_pieces& pieces, bool at_step);
  void scan_due(int bucket);
  bool muon_all_left_out() const;
  void scan_chunk(int chunk);
  void copy_in(int bucket);
  /// The buffer at `offset`, allocated (zero) on first use.
  float* buffer_at(int64_t offset);
  const float* grouping_at(int64_t offset) const;

  std::shared_ptr<const plan> pl_;
  std::shared_ptr<compute_backend> be_;
  device_buffer grads_;  // empty until buffer_at() first needs it
  // Per bucket: whether the buffer holds this step's values. A bucket not written reads as
  // zero: its first slice of a step is copied in rather than added (one read of the gradient
  // fewer), nothing zeroes the whole gradient after a step (one write fewer), and materialize()
  // zeroes the buckets still unwritten before anything reads the gradient.
  std::vector<bool> written_;
  // Per bucket, the scan of its gradient, taken by the call that wrote it, so that the step's
  // scan reads no gradient; `scanned_` says whether the kept scan is that of what the bucket
  // holds (not after a copy from pageable host memory, nor after scale()).
  std::unique_ptr<part_scans> scans_;
  std::vector<bool> scanned_;
  // Where the step's momentum may go ahead of the vote: per bucket, whether its kept scan leaves
  // out its Muon parameters (read in place); per chunk, whether its part of scans_ (after the
  // buckets' parts) holds the scan of its Muon gradients this step.
  bool muon_in_momentum_ = false;
  std::vector<bool> muon_left_out_;
  std::vector<bool> muon_scanned_;
  std::vector<bool> holds_muon_;  // per bucket: a Muon parameter has elements in it
  // Per bucket: the caller's gradients it is read from this step where they lie (its first
  // accumulate's pieces), or null: the buffer holds it. Per parameter, where its gradient is
  // then read (null: the buffer, zeroed there where no piece lands).
  std::vector<gradient_pieces> in_place_;
  std::vector<const float*> grad_at_;
  // Per bucket read in place, the pieces its scan takes while that scan waits for the step's
  // first reader (accumulate's at_step: the caller may write them in place until the step).
  std::vector<std::optional<std::vector<copy_piece>>> due_scan_;
};

}  // namespace zmuon
