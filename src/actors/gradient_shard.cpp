#include "actors/gradient_shard.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "messages/errors.hpp"

namespace zmuon {

namespace {

/// An address aligned as an allocation's (256 bytes, as a device pool's), plus `offset` floats:
/// where scan_pieces groups elements as into a buffer, with nothing read or written there.
const float* stand_in_at(int64_t offset) {
  return reinterpret_cast<const float*>(uintptr_t{256}
                                        + static_cast<uintptr_t>(offset) * sizeof(float));
}

/// `n` floats from `src` to `dst_offset` appended to `pieces`: the last piece grows where both
/// its source and its destination run on into this one.
void add_piece(std::vector<copy_piece>& pieces, const float* src, int64_t dst_offset, int64_t n) {
  if (!pieces.empty() && pieces.back().src + pieces.back().n == src
      && pieces.back().dst_offset + pieces.back().n == dst_offset)
    pieces.back().n += n;
  else
    pieces.push_back(copy_piece{src, dst_offset, n});
}

/// Whether `pieces` land inside a bucket of `n` elements, in increasing order, not overlapping.
bool pieces_fit(const std::vector<copy_piece>& pieces, int64_t n) {
  int64_t end = 0;
  for (const copy_piece& p : pieces) {
    if (p.n < 0 || p.dst_offset < end || p.dst_offset + p.n > n || (p.n > 0 && !p.src))
      return false;
    end = p.dst_offset + p.n;
  }
  return true;
}

}  // namespace

gradient_shard::gradient_shard(std::shared_ptr<const plan> pl, std::shared_ptr<compute_backend> be,
                               bool muon_in_momentum)
    : pl_(std::move(pl)),
      be_(std::move(be)),
      written_(pl_->buckets.size(), false),
      // A part per bucket, then one per chunk for the momentum calls' scans.
      scans_(be_->make_part_scans(
          static_cast<int>(pl_->buckets.size() + (muon_in_momentum ? pl_->chunks.size() : 0)))),
      scanned_(pl_->buckets.size(), false),
      muon_in_momentum_(muon_in_momentum),
      muon_left_out_(pl_->buckets.size(), false),
      muon_scanned_(pl_->chunks.size(), false),
      holds_muon_(pl_->buckets.size(), false),
      in_place_(pl_->buckets.size(), nullptr),
      due_scan_(pl_->buckets.size()),
      grad_at_(pl_->params.size(), nullptr) {
  for (size_t b = 0; b < pl_->buckets.size(); ++b)
    for (int i = pl_->buckets[b].first_param; i < pl_->buckets[b].end_param; ++i)
      holds_muon_[b] = holds_muon_[b] || (pl_->params[i].muon && pl_->params[i].shard_len > 0);
}

caf::error gradient_shard::accumulate(const zmuon::accumulate& msg) {
  const plan& pl = *pl_;
  const bool bucket_known = msg.bucket >= 0 && msg.bucket < static_cast<int32_t>(pl.buckets.size());
  const int64_t n = bucket_known ? pl.buckets[msg.bucket].shard_len : 0;
  if (!bucket_known
      || (msg.pieces ? !pieces_fit(*msg.pieces, n)
                     : msg.slice.data == nullptr || msg.slice.size != n))
    return make_caf_error(errc::shape_mismatch, "accumulate: bucket " + std::to_string(msg.bucket)
                                                    + " slice has the wrong size");
  const auto& b = pl.buckets[msg.bucket];
  const bool first = !written_[msg.bucket];
  if (first && msg.pieces && read_in_place(msg.bucket, msg.pieces, msg.at_step)) {
    written_[msg.bucket] = true;
    scanned_[msg.bucket] = true;
    return {};
  }
  if (in_place_[msg.bucket])  // a later micro-batch adds to it: into the buffer first
    copy_in(msg.bucket);
  float* dst = buffer_at(b.shard_offset);
  if (msg.pieces) {  // read where the caller keeps them, in the accumulate's own pass
    be_->accumulate_pieces_scanned(dst, n, *msg.pieces,
                                   first ? accumulate_mode::copy : accumulate_mode::add, *scans_,
                                   msg.bucket);
    written_[msg.bucket] = true;
    scanned_[msg.bucket] = true;
    return {};
  }
  // The scan in the same pass where the slice is in the backend's own memory.
  const bool own_memory = !msg.from_host || !be_->device_memory();
  if (own_memory)
    be_->accumulate_scanned(dst, msg.slice.data, b.shard_len,
                            first ? accumulate_mode::copy : accumulate_mode::add, *scans_,
                            msg.bucket);
  else if (first)  // pageable: copied out before it returns
    be_->copy_from_host_async(dst, msg.slice.data, b.shard_len);
  else
    be_->add_from_host(dst, msg.slice.data, b.shard_len);
  written_[msg.bucket] = true;
  scanned_[msg.bucket] = own_memory;
  return {};
}

/// A bucket's first pieces of the step read where they lie: the scan taken without a copy
/// (compute_backend::scan_pieces; where the momentum may go ahead of the vote, of its non-Muon
/// parameters alone), each parameter's gradient read from its piece by the momentum and the
/// non-Muon rule, a parameter no piece reaches zeroed in the buffer. `at_step`: the scan waits
/// for the step's first reader (materialize). False, and nothing done, where a parameter's
/// shard lies across pieces or partly outside them.
bool gradient_shard::read_in_place(int bucket, const gradient_pieces& pieces, bool at_step) {
  const plan& pl = *pl_;
  const auto& b = pl.buckets[bucket];
  const std::vector<copy_piece>& ps = *pieces;
  std::vector<std::pair<int, const float*>> at;
  std::vector<int> gaps;
  size_t k = 0;
  for (int i = b.first_param; i < b.end_param; ++i) {
    const auto& p = pl.params[i];
    const int64_t begin = p.shard_offset - b.shard_offset;
    const int64_t end = begin + p.shard_len;
    while (k < ps.size() && (ps[k].n <= 0 || ps[k].dst_offset + ps[k].n <= begin))
      ++k;  // pieces that end before this parameter's shard
    if (p.shard_len == 0)
      continue;
    if (k == ps.size() || ps[k].dst_offset >= end)
      gaps.push_back(i);
    else if (ps[k].dst_offset <= begin && end <= ps[k].dst_offset + ps[k].n)
      at.emplace_back(i, ps[k].src + (begin - ps[k].dst_offset));
    else
      return false;
  }
  for (int i : gaps)
    be_->fill_zero(buffer_at(pl.params[i].shard_offset), pl.params[i].shard_len);
  const bool left_out = muon_in_momentum_ && holds_muon_[bucket];
  std::vector<copy_piece> rest;  // then: the non-Muon parameters' pieces, runs of them merged
  for (const auto& [i, src] : at) {
    const auto& p = pl.params[i];
    if (left_out && !p.muon)
      add_piece(rest, src, p.shard_offset - b.shard_offset, p.shard_len);
  }
  const std::vector<copy_piece>& scanned = left_out ? rest : ps;
  if (at_step)
    due_scan_[bucket] = scanned;
  else
    be_->scan_pieces(grouping_at(b.shard_offset), b.shard_len, scanned, *scans_, bucket);
  muon_left_out_[bucket] = left_out;
  for (const auto& [i, src] : at)
    grad_at_[i] = src;
  in_place_[bucket] = pieces;
  return true;
}

/// The scan that read_in_place left to the step's first reader, if any.
void gradient_shard::scan_due(int bucket) {
  if (!due_scan_[bucket])
    return;
  const auto& b = pl_->buckets[bucket];
  be_->scan_pieces(grouping_at(b.shard_offset), b.shard_len, *due_scan_[bucket], *scans_, bucket);
  due_scan_[bucket].reset();
}

/// A bucket read in place copied into the buffer, as its accumulate would have done.
void gradient_shard::copy_in(int bucket) {
  const auto& b = pl_->buckets[bucket];
  be_->accumulate_pieces_scanned(buffer_at(b.shard_offset), b.shard_len, *in_place_[bucket],
                                 accumulate_mode::copy, *scans_, bucket);
  for (int i = b.first_param; i < b.end_param; ++i)
    grad_at_[i] = nullptr;
  in_place_[bucket] = nullptr;
  due_scan_[bucket].reset();       // the copy scanned it
  muon_left_out_[bucket] = false;  // the copy's scan is of every element
}

void gradient_shard::materialize(reader by) {
  const auto& buckets = pl_->buckets;
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (written_[b]) {
      if (by == reader::buffer && in_place_[b])
        copy_in(static_cast<int>(b));
      else
        scan_due(static_cast<int>(b));
      continue;
    }
    be_->accumulate_scanned(buffer_at(buckets[b].shard_offset), nullptr, buckets[b].shard_len,
                            accumulate_mode::zero, *scans_, static_cast<int>(b));
    written_[b] = true;
    scanned_[b] = true;
  }
}

/// What scan_pieces takes of the buffer at `offset`: its alignment, by which the scan groups the
/// elements as the copy into it would (bit for bit). Where no buffer is allocated, stand_in_at.
const float* gradient_shard::grouping_at(int64_t offset) const {
  if (grads_.data() != nullptr)
    return grads_.data() + offset;
  return stand_in_at(offset);
}

float* gradient_shard::buffer_at(int64_t offset) {
  if (grads_.data() == nullptr && pl_->shard_total > 0)
    grads_ = be_->allocate(pl_->shard_total);
  return grads_.data() + offset;
}

void gradient_shard::forget() {
  written_.assign(pl_->buckets.size(), false);
  in_place_.assign(pl_->buckets.size(), nullptr);
  due_scan_.assign(pl_->buckets.size(), std::nullopt);
  grad_at_.assign(pl_->params.size(), nullptr);
  muon_left_out_.assign(pl_->buckets.size(), false);
  muon_scanned_.assign(pl_->chunks.size(), false);
}

void gradient_shard::scale(float factor) {
  materialize();
  be_->scale(grads_.data(), grads_.size(), factor);
  scanned_.assign(scanned_.size(), false);  // every bucket changed outside its accumulate
}

void gradient_shard::scan_async(scan_result* out, std::function<void()> landed) {
  materialize(reader::in_place);
  if (std::find(scanned_.begin(), scanned_.end(), false) != scanned_.end()) {
    materialize();  // a scan of the whole buffer, which then holds every bucket
    be_->scan_async(grads_.data(), grads_.size(), out, std::move(landed));
    return;
  }
  size_t parts = pl_->buckets.size();
  if (muon_all_left_out()) {  // each chunk's part holds its Muon gradients' scan
    for (size_t c = 0; c < pl_->chunks.size(); ++c)
      if (!muon_scanned_[c])
        scan_chunk(static_cast<int>(c));
    parts += pl_->chunks.size();
  } else {  // some bucket was copied in: those left out are scanned again whole
    for (size_t b = 0; b < muon_left_out_.size(); ++b) {
      if (!muon_left_out_[b])
        continue;
      const auto& bucket = pl_->buckets[b];
      be_->scan_pieces(grouping_at(bucket.shard_offset), bucket.shard_len, *in_place_[b], *scans_,
                       static_cast<int>(b));
      muon_left_out_[b] = false;
    }
  }
  be_->scan_parts_async(*scans_, static_cast<int>(parts), out, std::move(landed));
}

/// Chunk `chunk`'s Muon gradients scanned into its part: those read where the caller keeps them
/// (the others are zero, in the buffer).
void gradient_shard::scan_chunk(int chunk) {
  std::vector<copy_piece> pieces;
  int64_t n = 0;
  for (int i : pl_->chunks[chunk].params) {
    const float* src = grad_at_[i];
    const int64_t len = pl_->params[i].shard_len;
    if (src == nullptr || len <= 0)
      continue;
    add_piece(pieces, src, n, len);
    n += len;
  }
  // Nothing is written: the grouping only needs an allocation's alignment (grouping_at).
  be_->scan_pieces(stand_in_at(0), n, pieces, *scans_,
                   static_cast<int>(pl_->buckets.size()) + chunk);
  muon_scanned_[chunk] = true;
}

/// Whether every bucket that holds a Muon parameter left its Muon gradients out of its scan (a
/// chunk's scan is then of gradients no bucket scanned), and some bucket does.
bool gradient_shard::muon_all_left_out() const {
  bool any = false;
  for (size_t b = 0; b < muon_left_out_.size(); ++b) {
    if (holds_muon_[b] && !muon_left_out_[b])
      return false;
    any = any || muon_left_out_[b];
  }
  return any;
}

scan_into gradient_shard::momentum_scan(int chunk) {
  if (!muon_all_left_out() || muon_scanned_.at(static_cast<size_t>(chunk)))
    return {};
  muon_scanned_[chunk] = true;
  return scan_into{scans_.get(), static_cast<int>(pl_->buckets.size()) + chunk, true};
}

bool gradient_shard::momentum_scans_due(int chunks) const {
  if (!muon_all_left_out())
    return false;
  const size_t due = std::min(muon_scanned_.size(), static_cast<size_t>(std::max(chunks, 0)));
  return std::find(muon_scanned_.begin(), muon_scanned_.begin() + due, false)
         != muon_scanned_.begin() + due;
}

}  // namespace zmuon
