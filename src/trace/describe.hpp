// What the trace records of each message type: its name, step, micro-batch, bucket or chunk,
// payload bytes (tensor data the message carries, or lends as a view), the collective kind, and
// the phase a request's wait belongs to. One overload per message of messages/messages.hpp.
#pragma once

#include <string>

#include "messages/messages.hpp"
#include "trace/recorder.hpp"

namespace zmuon::trace {

inline fields tagged(const char* type, const collective_tag& t, int64_t bytes) {
  fields f;
  f.type = type;
  f.step = t.step;
  f.op = kind_name(t.kind);
  f.phase = f.op;
  if (t.kind == collective_kind::reduce_scatter)
    f.micro = t.micro;
  if (t.kind != collective_kind::vote)
    f.index = t.index;
  f.bytes = bytes;
  return f;
}

inline fields stepped(const char* type, uint64_t step, int32_t micro = -1, int32_t index = -1,
                      int64_t bytes = 0) {
  fields f;
  f.type = type;
  f.step = step;
  f.micro = micro;
  f.index = index;
  f.bytes = bytes;
  return f;
}

inline int64_t floats(int64_t n) {
  return n * static_cast<int64_t>(sizeof(float));
}

/// The payload of segment lists of `elem` elements (2 bytes each for bf16, 4 for fp32).
inline int64_t segment_bytes(const std::vector<std::vector<segment>>& lists,
                             wire_type elem = wire_type::fp32) {
  int64_t n = 0;
  for (const auto& l : lists)
    for (const auto& s : l)
      n += s.size;
  return n * element_bytes(elem);
}

// -- collectives ---------------------------------------------------------------------------------
inline fields describe(const reduce_scatter_req& m) {
  return tagged("reduce_scatter_req", m.tag, floats(m.count));
}
inline fields describe(const all_reduce_req& m) {
  return tagged("all_reduce_req", m.tag, static_cast<int64_t>(m.values.size() * sizeof(double)));
}
inline fields describe(const all_to_all_req& m) {
  return tagged("all_to_all_req", m.tag, segment_bytes(m.sends, m.elem));
}
inline fields describe(const comm_done& m) {
  auto f = tagged("comm_done", m.tag, 0);
  f.phase = nullptr;
  return f;
}
inline fields describe(const all_reduce_result& m) {
  auto f = tagged("all_reduce_result", m.tag, 0);
  f.phase = nullptr;
  return f;
}
inline fields describe(const peer_floats& m) {
  auto f = tagged("peer_floats", m.tag,
                  floats(static_cast<int64_t>(m.data.size()))
                      + static_cast<int64_t>(m.bf16.size()) * element_bytes(wire_type::bf16));
  f.phase = nullptr;
  return f;
}
inline fields describe(const peer_doubles& m) {
  auto f = tagged("peer_doubles", m.tag, static_cast<int64_t>(m.data.size() * sizeof(double)));
  f.phase = nullptr;
  return f;
}

// -- the rank's actors ---------------------------------------------------------------------------
inline fields describe(const micro_grads& m) {
  return stepped("micro_grads", m.step, m.micro, m.bucket, floats(m.size()));
}
inline fields describe(const flush& m) {
  auto f = stepped("flush", m.step);
  f.phase = "flush";
  return f;
}
inline fields describe(const flush_done& m) {
  return stepped("flush_done", m.step);
}
inline fields describe(const accumulate& m) {
  return stepped("accumulate", m.step, m.micro, m.bucket, floats(m.slice.size));
}
inline fields describe(const ack& m) {
  return stepped("ack", m.step);
}
inline fields describe(const check_overflow& m) {
  auto f = stepped("check_overflow", m.step);
  f.phase = "overflow_check";
  return f;
}
inline fields describe(const scan_grads& m) {
  return stepped("scan_grads", m.step);
}
inline fields describe(const grad_scan& m) {
  return stepped("grad_scan", m.step);
}
inline fields describe(const overflow_report& m) {
  auto f = stepped("overflow_report", m.step);
  f.flag = "overflow";
  f.flag_value = m.overflow;
  return f;
}
inline fields describe(const discard_grads& m) {
  auto f = stepped("discard_grads", m.step);
  f.phase = "discard";
  return f;
}
inline fields describe(const unscale_clip& m) {
  auto f = stepped("unscale_clip", m.step);
  f.phase = "unscale_clip";
  return f;
}
inline fields describe(const muon_momentum& m) {
  auto f = stepped("muon_momentum", m.step, -1, m.chunk, floats(m.out.size));
  f.phase = "momentum";
  if (m.writes == momentum_writes::spare)  // ahead of the vote: the momentum left as it was
    f.op = "spare";
  return f;
}
inline fields describe(const apply_muon& m) {
  auto f = stepped("apply_muon", m.step, -1, m.chunk, floats(m.update.size));
  f.phase = "apply";
  return f;
}
inline fields describe(const normuon_step& m) {
  auto f = stepped("normuon_step", m.step, -1, m.chunk, floats(m.full.size));
  f.phase = "normuon";
  return f;
}
inline fields describe(const adamw_step& m) {
  auto f = stepped("adamw_step", m.step);
  f.phase = "adamw";
  return f;
}
inline fields describe(const finish_step& m) {
  auto f = stepped("finish_step", m.step);
  f.phase = "finish";
  return f;
}
inline fields describe(const qk_clip_scale& m) {
  auto f = stepped("qk_clip_scale", m.step);
  f.phase = "qk_clip";
  return f;
}
inline fields describe(const copy_in_grads& m) {
  return stepped("copy_in_grads", m.step);
}
inline fields describe(const begin_reads& m) {
  return stepped("begin_reads", m.step);
}
inline fields describe(const load_params& m) {
  return stepped("load_params", m.step, -1, -1,
                 m.shard ? floats(static_cast<int64_t>(m.shard->size())) : 0);
}
inline fields describe(const gpu_done& m) {
  return stepped("gpu_done", m.step, -1, m.index);
}
inline fields describe(const step_request& m) {
  auto f = stepped("step_request", m.step);
  f.phase = "step";
  return f;
}
inline fields describe(const step_result& m) {
  auto f = stepped("step_result", m.step);
  f.flag = "skipped";
  f.flag_value = m.skipped;
  return f;
}

// -- correlation ids of one-way messages (no CAF request id): derived from the content, so the
// sender and the receiver compute the same id without it travelling.
inline std::string async_id(const micro_grads& m, int /*dst*/) {
  return "g" + std::to_string(m.step) + "." + std::to_string(m.micro) + "."
         + std::to_string(m.bucket);
}
template <class Piece>
std::string peer_id(const Piece& m, int dst) {
  return std::string("p") + kind_name(m.tag.kind) + "." + std::to_string(m.tag.step) + "."
         + std::to_string(m.tag.micro) + "." + std::to_string(m.tag.index) + "."
         + std::to_string(m.src) + ">" + std::to_string(dst);
}
inline std::string async_id(const peer_floats& m, int dst) {
  return peer_id(m, dst);
}
inline std::string async_id(const peer_doubles& m, int dst) {
  return peer_id(m, dst);
}

}  // namespace zmuon::trace
