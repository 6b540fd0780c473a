// A buffer that the compute backend works on and the comm backend moves (docs/DESIGN.md §5).
//
// When both live in the same memory (host compute with caf comm; CUDA compute with nccl comm) it
// is one buffer and the copies are no-ops. When the comm reads host memory but compute runs on a
// GPU (the caf comm with the CUDA backend: several ranks sharing one GPU), it is a device buffer
// plus a host mirror, and `to_comm` / `to_compute` copy between them.
//
// A wire_buffer adds the element type a collective moves: the Muon phase's gather and scatter
// may carry bf16 (docs/DESIGN.md §3), which the kernels then read and write directly.
#pragma once

#include <memory>
#include <string>

#include "kernels/compute.hpp"
#include "messages/messages.hpp"

namespace zmuon {

/// Whether comm backend `comm` sends and receives host memory (caf) or device memory (nccl).
inline bool comm_on_host(const std::string& comm) {
  return comm != "nccl";
}

/// What a new buffer holds: zeros, or unspecified values for a user that writes every element
/// before anything reads it (no zero fill: a pass over device memory fewer).
enum class buffer_init { zeros, overwritten };

class staged_buffer {
public:
  staged_buffer() = default;
  /// n floats, zero or to be overwritten (`init`, the compute side); mirrored in the backend's
  /// host memory (pinned on CUDA) when `comm_on_host` and the backend's memory is not host memory.
  staged_buffer(compute_backend& be, int64_t n, bool comm_on_host, buffer_init init)
      : compute_(init == buffer_init::zeros ? be.allocate(n) : be.allocate_for_overwrite(n)),
        staged_(comm_on_host && be.device_memory()) {
    // The comm side is written whole before it is read exactly where the compute side is
    // (init): it stands in for the compute side's memory on the wire.
    if (staged_)
      host_ = init == buffer_init::zeros ? be.allocate_host(n) : be.allocate_host_for_overwrite(n);
  }

  int64_t size() const { return compute_.size(); }
  /// True when the two sides are different memory (the copies below do something).
  bool staged() const { return staged_; }
  /// Where kernels read and write.
  float* compute() { return compute_.data(); }
  /// What the comm backend sends from and receives into.
  float* comm() { return staged_ ? host_.data() : compute_.data(); }

  /// Enqueues the copy compute -> comm; it has landed once be.when_done() fires.
  void to_comm(compute_backend& be) {
    if (staged_ && size() > 0)
      be.copy_to_host_async(host_.data(), compute_.data(), size());
  }
  /// Enqueues the copy comm -> compute, ahead of the kernels enqueued after it.
  void to_compute(compute_backend& be) {
    if (staged_ && size() > 0)
      be.copy_from_host_async(compute_.data(), host_.data(), size());
  }

private:
  device_buffer compute_;
  device_buffer host_;
  bool staged_ = false;
};

/// n values that kernels work on and the comm backend moves, stored as `type`: fp32, or bf16
/// bits (two per float of storage) under bf16 transport. A bf16 buffer has no fp32 copy: the
/// kernels that produce and consume it round and widen inside (compute_backend's *_bf16 calls),
/// for the rank's own segments as for remote ones, so the result does not depend on the world
/// size.
class wire_buffer {
public:
  wire_buffer() = default;
  /// n values, zero or to be overwritten (`init`); the comm's side in host memory when
  /// `comm_on_host` (staged_buffer).
  wire_buffer(compute_backend& be, int64_t n, wire_type type, bool comm_on_host, buffer_init init)
      : type_(type),
        size_(n),
        storage_(std::make_shared<staged_buffer>(be, type == wire_type::fp32 ? n : (n + 1) / 2,
                                                 comm_on_host, init)) {}

  int64_t size() const { return size_; }
  wire_type type() const { return type_; }
  /// True when the comm's side is a host mirror: to_comm has landed only once be.when_done fires.
  bool staged() const { return storage_ && storage_->staged(); }
  /// The values where kernels read and write them: `data` (fp32) or `bf16` set. The view keeps
  /// the memory (both sides) allocated while it lives, after this buffer is gone too.
  float_view compute() {
    if (!storage_)
      return float_view{};
    if (type_ == wire_type::fp32)
      return float_view{storage_->compute(), size_, nullptr, storage_};
    return float_view{nullptr, size_, bits(storage_->compute()), storage_};
  }
  /// Elements [offset, offset + n) on the comm's side, as a collective's segment of type(),
  /// keeping the memory allocated like compute().
  segment at(int64_t offset, int64_t n) {
    if (type_ == wire_type::fp32)
      return segment{storage_->comm() + offset, n, nullptr, storage_};
    return segment{nullptr, n, bits(storage_->comm()) + offset, storage_};
  }

  /// Enqueues compute -> comm (a copy only when staged).
  void to_comm(compute_backend& be) {
    if (storage_)
      storage_->to_comm(be);
  }
  /// Enqueues comm -> compute (a copy only when staged), ahead of later kernels.
  void to_compute(compute_backend& be) {
    if (storage_)
      storage_->to_compute(be);
  }

private:
  static uint16_t* bits(float* storage) { return reinterpret_cast<uint16_t*>(storage); }

  wire_type type_ = wire_type::fp32;
  int64_t size_ = 0;
  std::shared_ptr<staged_buffer> storage_;  // shared with the views handed out
};

}  // namespace zmuon
