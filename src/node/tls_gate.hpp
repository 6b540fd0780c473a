// zmuon's own TLS in front of CAF's BASP broker (docs/DECISIONS.md, docs/SECURITY.md): a
// middleman actor whose listening ports are served by a gate thread and whose connections are
// made with a deadline. The gate accepts, runs the TLS handshake (OpenSSL, one context made once
// from the job's credentials) with a few handshakes at a time and a deadline for each, and hands
// CAF only connections whose peer showed a certificate of the job's CA. A stranger never becomes
// one of CAF's connections: it cannot stall, crash or confuse the broker, and it is closed and
// logged with its address. Running out of descriptors refuses connections and ends nothing.
//
// Interface: CAF's io::middleman_actor (publish, connect, unpublish...), as the middleman's own.
#pragma once

#include <chrono>
#include <cstdint>

#include "caf/actor_system.hpp"
#include "caf/io/middleman_actor.hpp"

#include "node/tls_credentials.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

struct tls_gate_limits {
  /// A connection that has not finished its TLS handshake by then is closed.
  std::chrono::milliseconds handshake_deadline{5000};
  /// Handshakes in flight at once on one listening port; beyond, the oldest is dropped (a node
  /// of the job finishes its handshake in milliseconds, an idle stranger never does).
  int max_pending = 16;
};

/// Starts the TLS middleman actor of `sys` with `creds` (read once, into one TLS context).
/// Errors: the credentials cannot be loaded.
expected<caf::io::middleman_actor> start_tls_middleman(caf::actor_system& sys,
                                                       const tls_credentials& creds,
                                                       tls_gate_limits limits = {});

/// The actor start_tls_middleman started for `sys`; invalid when none.
caf::io::middleman_actor tls_middleman(caf::actor_system& sys);

/// The deadline of the next connections this process makes under TLS (TCP connect and TLS
/// handshake together); at most handshake_deadline.
void set_tls_connect_deadline(std::chrono::milliseconds deadline);

/// Connections refused by the gates of this process so far (failed or late handshakes,
/// descriptors or room exhausted), for tests and the log.
uint64_t refused_tls_connections();

}  // namespace zmuon
