// The CUDA backend's calls over several parameters (compute_backend's *_slices calls,
// copy_pieces and copy_spans): each names the span of every buffer its slices touch
// (stream_set.hpp) and runs elementwise.cu's slice kernels, up to 64 slices a launch.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cuda/cautious_normuon.cuh"
#include "kernels/cuda/cuda_compute.hpp"
#include "kernels/cuda/elementwise.cuh"

namespace zmuon::gpu {

namespace {

/// The elements [first, last) that the slices cover in the buffers laid out like the shards
/// (`state` false) or like the optimizer state, from `origin` on.
std::pair<int64_t, int64_t> span_of(const std::vector<param_slice>& slices, bool state,
                                    int64_t origin = 0) {
  int64_t first = 0;
  int64_t last = 0;
  bool any = false;
  for (const param_slice& s : slices) {
    if (s.n <= 0)
      continue;
    const int64_t at = (state ? s.state_offset : s.shard_offset) - origin;
    first = any ? std::min(first, at) : at;
    last = any ? std::max(last, at + s.n) : at + s.n;
    any = true;
  }
  return {first, last};
}

/// The memory of a slice call's buffer: floats, or bf16 halves, over its span.
touched spanned(const void* base, std::pair<int64_t, int64_t> span, bool half) {
  const size_t bytes = half ? sizeof(uint16_t) : sizeof(float);
  return touched{static_cast<const char*>(base) + span.first * static_cast<int64_t>(bytes),
                 static_cast<size_t>(span.second - span.first) * bytes};
}

touched spanned(fp32_or_bf16 x, std::pair<int64_t, int64_t> span) {
  return x.f32 != nullptr ? spanned(x.f32, span, false) : spanned(x.bf16, span, true);
}

}  // namespace

void cuda_compute::momentum_slices(const float* m, float* m_out, const float* g, fp32_or_bf16 u,
                                   int64_t origin, const std::vector<param_slice>& slices,
                                   float beta, bool nesterov, scan_into scan) {
  double* sums = nullptr;  // the scan's part, where there is one (no lane touches it)
  int* flags = nullptr;
  if (scan.scans != nullptr) {
    auto& kept = device_scans_of(*scan.scans, scan.part, "momentum_slices");
    sums = kept.sums.data() + int64_t{scan.part} * kMaxReduceBlocks;
    flags = kept.flags.data() + int64_t{scan.part} * kMaxReduceBlocks;
  }
  const auto state = span_of(slices, true);
  const launch_guard guard = activate({spanned(m, state, false), spanned(m_out, state, false),
                                       spanned(g, span_of(slices, false), false),
                                       spanned(u, span_of(slices, true, origin))});
  const call_timer timer(*this, m_out == m ? "momentum" : "momentum_spare", ctx_.stream);
  if (scan.scans != nullptr && scan.first) {  // the kernel adds to the partials
    ZMUON_CUDA_CHECK(cudaMemsetAsync(sums, 0, kMaxReduceBlocks * sizeof(double), ctx_.stream));
    ZMUON_CUDA_CHECK(cudaMemsetAsync(flags, 0, kMaxReduceBlocks * sizeof(int), ctx_.stream));
  }
  launch_momentum_slices(guard, m, m_out, g, u, origin, slices, beta, nesterov, sums, flags);
}

// The one place where this backend applies a chunk's Muon update (kernels/muon_rule.hpp).
void cuda_compute::muon_update_slices(float* p, fp32_or_bf16 o, int64_t origin,
                                      const std::vector<param_slice>& slices,
                                      const muon_rule& rule) {
  if (rule.decay == decay_mask::cautious)  // a launch a slice: cautious decay has no slice kernel
    return compute_backend::muon_update_slices(p, o, origin, slices, rule);
  // In parts by the Newton-Schulz call that wrote each slice's update, the part whose call is
  // expected to end first first, each waiting for its own call only: the updates of the calls
  // that end early run beside the later ones instead of all after the last (one part where no
  // NS call is pending, as after a scatter). A part is a run of adjacent slices, so that its
  // span holds no other call's memory.
  std::vector<touched> memory;
  for (const param_slice& s : slices)
    memory.push_back(spanned(o, span_of({s}, true, origin)));
  const std::vector<double> ends = streams_->expected_ends(memory);
  std::vector<size_t> order(slices.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ends[a] != ends[b] ? ends[a] < ends[b] : slices[a].state_offset < slices[b].state_offset;
  });
  for (size_t first = 0; first < order.size();) {
    std::vector<param_slice> part{slices[order[first]]};
    size_t last = first + 1;
    for (; last < order.size(); ++last) {
      const param_slice& prev = part.back();
      const param_slice& next = slices[order[last]];
      if (ends[order[last]] != ends[order[first]]
          || next.state_offset != prev.state_offset + prev.n)
        break;
      part.push_back(next);
    }
    const launch_guard guard = activate(
        {spanned(p, span_of(part, false), false), spanned(o, span_of(part, true, origin))});
    const call_timer timer(*this, "apply_update", ctx_.stream);
    launch_apply_update_slices(guard, p, o, origin, part, rule.lr, rule.weight_decay);
    first = last;
  }
}

void cuda_compute::scalar_update_slices(float* p, const float* g, float* m, float* v,
                                        const std::vector<param_slice>& slices,
                                        const scalar_args& args) {
  const auto shards = span_of(slices, false);
  const auto state = span_of(slices, true);
  const launch_guard guard = activate({spanned(p, shards, false), spanned(g, shards, false),
                                       spanned(m, state, false), spanned(v, state, false)});
  const call_timer timer(*this, "adamw", ctx_.stream);
  if (args.algorithm != scalar_algorithm::adamw) {  // a launch a slice: scalar_rules.hpp's rule
    for (const param_slice& s : slices)
      launch_scalar_rule(guard, p + s.shard_offset, grad_of(s, g), m + s.state_offset,
                         v + s.state_offset, s.n, args);
    return;
  }
  if (args.cautious) {  // a launch a slice: cautious weight decay has no slice kernel
    for (const param_slice& s : slices)
      launch_adamw_cautious(guard, p + s.shard_offset, grad_of(s, g), m + s.state_offset,
                            v + s.state_offset, s.n, args);
    return;
  }
  launch_adamw_slices(guard, p, g, m, v, slices, args);
}

void cuda_compute::copy_pieces(float* dst, const std::vector<copy_piece>& pieces) {
  int64_t end = 0;
  for (const copy_piece& p : pieces)
    end = std::max(end, p.dst_offset + p.n);
  if (end == 0)
    return;
  // The sources are the caller's gradients, which no Newton-Schulz lane touches.
  const launch_guard guard = activate({touched{dst, static_cast<size_t>(end) * sizeof(float)}});
  const call_timer timer(*this, "copy", ctx_.stream);
  launch_copy_pieces(guard, dst, pieces);
}

void cuda_compute::copy_spans(const std::vector<copy_span>& spans) {
  // The bounds of the sources and of the destinations (addresses: the destinations are separate
  // allocations), for the lanes' order: a bound wider than the memory can only make a lane's
  // later work wait longer, never less.
  uintptr_t src_lo = UINTPTR_MAX, src_hi = 0, dst_lo = UINTPTR_MAX, dst_hi = 0;
  const auto at = [](const float* p) { return reinterpret_cast<uintptr_t>(p); };
  std::vector<unit_piece> pieces;
  for (const copy_span& s : spans) {
    if (s.n <= 0 || s.src == s.dst)
      continue;
    const size_t bytes = static_cast<size_t>(s.n) * sizeof(float);
    src_lo = std::min(src_lo, at(s.src));
    src_hi = std::max(src_hi, at(s.src) + bytes);
    dst_lo = std::min(dst_lo, at(s.dst));
    dst_hi = std::max(dst_hi, at(s.dst) + bytes);
    pieces.push_back(unit_piece{reinterpret_cast<const uint16_t*>(s.src),
                                reinterpret_cast<uint16_t*>(s.dst), 2 * s.n});
  }
  if (pieces.empty())
    return;
  const launch_guard guard =
      activate({touched{reinterpret_cast<const void*>(dst_lo), dst_hi - dst_lo},
                touched{reinterpret_cast<const void*>(src_lo), src_hi - src_lo}});
  const call_timer timer(*this, "copy", ctx_.stream);
  launch_copy_units(guard, pieces);
}

}  // namespace zmuon::gpu
