#include "messages/registry.hpp"

#include "caf/actor_system_config.hpp"
#include "caf/binary_deserializer.hpp"
#include "caf/sec.hpp"

#include "messages/errors.hpp"
#include "messages/messages.hpp"

namespace zmuon {

const char* kind_name(collective_kind kind) {
  switch (kind) {
    case collective_kind::reduce_scatter:
      return "reduce_scatter";
    case collective_kind::vote:
      return "vote";
    case collective_kind::gather:
      return "gather";
    case collective_kind::scatter:
      return "scatter";
    case collective_kind::params:
      return "params";
    case collective_kind::host:
      return "host";
  }
  return "?";
}

std::string to_string(collective_kind kind) {
  return kind_name(kind);
}

std::string to_string(reduce_op op) {
  return op == reduce_op::sum ? "sum" : "max";
}

std::string to_string(const collective_tag& tag) {
  return to_string(tag.kind) + "(step " + std::to_string(tag.step) + ", micro "
         + std::to_string(tag.micro) + ", index " + std::to_string(tag.index) + ")";
}

const char* wire_name(wire_type type) {
  return type == wire_type::bf16 ? "bf16" : "fp32";
}

namespace {

// A vector of plain numbers as a sequence size and one raw block.
template <class T>
caf::error write_raw(caf::serializer& f, std::vector<T>& v) {
  auto n = v.size();
  if (auto err = f.begin_sequence(n))
    return err;
  if (n > 0)
    if (auto err = f.apply_raw(n * sizeof(T), v.data()))
      return err;
  return f.end_sequence();
}

// CAF's network messages are under 4 GiB (BASP's payload length is 32 bits).
constexpr size_t kMaxWireElements = size_t(1) << 30;

// The count on the wire is checked against the bytes that arrived before anything is
// allocated: a peer's message claiming 2^32 floats in 60 bytes is refused, not filled.
template <class T>
caf::error read_raw(caf::deserializer& f, std::vector<T>& v) {
  size_t n = 0;
  if (auto err = f.begin_sequence(n))
    return err;
  auto* bytes = dynamic_cast<caf::binary_deserializer*>(&f);
  const size_t left = bytes != nullptr ? bytes->remaining() : kMaxWireElements * sizeof(T);
  if (n > kMaxWireElements || n > left / sizeof(T))
    return make_caf_error(
        errc::invalid_argument,
        "a message claims " + std::to_string(n) + " numbers in " + std::to_string(left) + " bytes");
  v.resize(n);
  if (n > 0)
    if (auto err = f.apply_raw(n * sizeof(T), v.data()))
      return err;
  return f.end_sequence();
}

}  // namespace

caf::error inspect(caf::serializer& f, peer_floats& x) {
  if (auto err = f(caf::meta::type_name("peer_floats"), x.tag, x.src))
    return err;
  if (auto err = write_raw(f, x.data))
    return err;
  return write_raw(f, x.bf16);
}

caf::error inspect(caf::deserializer& f, peer_floats& x) {
  if (auto err = f(caf::meta::type_name("peer_floats"), x.tag, x.src))
    return err;
  if (auto err = read_raw(f, x.data))
    return err;
  return read_raw(f, x.bf16);
}

caf::error inspect(caf::serializer& f, peer_doubles& x) {
  if (auto err = f(caf::meta::type_name("peer_doubles"), x.tag, x.src))
    return err;
  return write_raw(f, x.data);
}

caf::error inspect(caf::deserializer& f, peer_doubles& x) {
  if (auto err = f(caf::meta::type_name("peer_doubles"), x.tag, x.src))
    return err;
  return read_raw(f, x.data);
}

caf::error error_from_exception(const std::exception_ptr& eptr) {
  try {
    if (eptr)
      std::rethrow_exception(eptr);
  } catch (const std::exception& e) {
    return make_caf_error(errc::device_failure, e.what());
  } catch (...) {
  }
  return make_caf_error(errc::internal, "an unknown exception escaped an actor's handler");
}

error from_caf_error(const caf::error& err) {
  if (!err)
    return {};
  if (err.category() == error_category()) {
    std::string msg;
    if (err.context().match_elements<std::string>())
      msg = err.context().get_as<std::string>(0);
    return {static_cast<errc>(err.code()), msg};
  }
  if (err.category() == caf::atom("system")) {
    auto code = static_cast<caf::sec>(err.code());
    if (code == caf::sec::request_timeout)
      return {errc::timeout, "a request was not answered in time (" + to_string(err) + ")"};
    return {errc::comm_failure, to_string(err)};
  }
  return {errc::internal, to_string(err)};
}

void configure_actor_system(caf::actor_system_config& cfg) {
  register_messages(cfg);
  cfg.set("logger.verbosity", caf::atom("quiet"));
  cfg.set("work-stealing.moderate-poll-attempts", size_t{0});
}

void register_messages(caf::actor_system_config& cfg) {
  cfg.add_error_category(
      error_category(), [](uint8_t code, caf::atom_value, const caf::message& ctx) -> std::string {
        std::string msg = ctx.match_elements<std::string>() ? ctx.get_as<std::string>(0) : "";
        return std::string("zmuon ") + to_string(static_cast<errc>(code)) + ": " + msg;
      });
  // Types that cross process boundaries (the caf comm backend between processes).
  cfg.add_message_type<collective_tag>("zmuon::collective_tag");
  cfg.add_message_type<peer_floats>("zmuon::peer_floats");
  cfg.add_message_type<peer_doubles>("zmuon::peer_doubles");
  cfg.add_message_type<step_result>("zmuon::step_result");
  cfg.add_message_type<store_snapshot>("zmuon::store_snapshot");
}

}  // namespace zmuon
