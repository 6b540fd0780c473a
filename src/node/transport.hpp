// The network layer of a node: CAF's middleman, under TLS (caf::openssl) with the job's
// credentials unless the user asked for plain TCP (docs/SECURITY.md). Publishing, connecting with
// a deadline, and a log line for each peer whose TLS handshake fails.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "caf/actor_system.hpp"
#include "caf/actor_system_config.hpp"

#include "node/tls_credentials.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

/// Whether `host` names a loopback address ("localhost", 127.x.y.z, ::1).
bool is_loopback_host(const std::string& host);

/// What `mode` and `secret` come to, given the environment: the secret (empty under plain TCP),
/// or why the job cannot run: no secret and no plain-TCP opt-in ($ZMUON_INSECURE=1 or any-host),
/// or plain TCP on loopback only with `host` not a loopback address.
expected<std::string> resolve_transport(node_transport& mode, const std::string& secret,
                                        const std::string& host);

/// Loads CAF's openssl module into `cfg` with `creds`' files (TLS), or nothing (plain TCP).
void configure_transport(caf::actor_system_config& cfg, const tls_credentials* creds);

/// Publishes `whom` at host:port (TLS when `tls`); the port taken.
expected<uint16_t> publish_actor(caf::actor_system& sys, bool tls,
                                 const caf::strong_actor_ptr& whom, std::set<std::string> interface,
                                 uint16_t port, const std::string& host);

template <class Handle>
expected<uint16_t> publish_actor(bool tls, const Handle& whom, uint16_t port,
                                 const std::string& host) {
  auto& sys = whom.home_system();
  return publish_actor(sys, tls, caf::actor_cast<caf::strong_actor_ptr>(whom),
                       sys.message_types(whom), port, host);
}

/// The actor published at host:port, within `timeout` (TCP connect, TLS handshake and CAF's
/// handshake together), under TLS with `creds` or plain TCP when null. A connection still in its
/// handshake at the deadline is shut down (CAF cannot cancel it). Errors: errc::timeout, or
/// errc::comm_failure with what CAF said; `nobody_listens`, when given, tells a refused
/// connection (worth another try) from a handshake that failed (a peer not of this job).
expected<caf::strong_actor_ptr> connect_actor(caf::actor_system& sys, const tls_credentials* creds,
                                              const std::string& host, uint16_t port,
                                              const std::set<std::string>& interface,
                                              std::chrono::milliseconds timeout,
                                              bool* nobody_listens = nullptr);

template <class Handle>
expected<Handle> connect_actor(caf::actor_system& sys, const tls_credentials* creds,
                               const std::string& host, uint16_t port,
                               std::chrono::milliseconds timeout, bool* nobody_listens = nullptr) {
  auto found =
      connect_actor(sys, creds, host, port, sys.message_types(caf::detail::type_list<Handle>{}),
                    timeout, nobody_listens);
  if (!found)
    return found.err();
  return caf::actor_cast<Handle>(std::move(*found));
}

/// Handshakes that failed so far in this process (accepted and initiated), for tests.
uint64_t failed_tls_handshakes();

}  // namespace zmuon
