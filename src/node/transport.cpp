#include "node/transport.hpp"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "caf/io/middleman.hpp"
#include "caf/openssl/manager.hpp"
#include "caf/scoped_actor.hpp"

#include "base/log.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"

namespace zmuon {

namespace {

std::atomic<uint64_t> failed_handshakes{0};

// "ADDR:PORT" of the peer on `fd`, or "an unknown peer".
std::string peer_of(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return "an unknown peer";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

// At most 20 lines a minute: a flood of strangers cannot flood the log.
bool may_log_refusal() {
  static std::mutex mutex;
  static std::chrono::steady_clock::time_point window;
  static int lines = 0;
  std::lock_guard<std::mutex> lock(mutex);
  const auto now = std::chrono::steady_clock::now();
  if (now - window > std::chrono::minutes(1)) {
    window = now;
    lines = 0;
  }
  return ++lines <= 20;
}

// The peer's address, noted at the first handshake call (once the peer has gone, the socket no
// longer knows it).
struct peer_note {
  std::string peer;
  bool reported = false;  // a failed handshake is logged once
};

int peer_index() {
  static const int index = SSL_get_ex_new_index(
      0, nullptr, nullptr, nullptr,
      [](void*, void* p, CRYPTO_EX_DATA*, int, long, void*) { delete static_cast<peer_note*>(p); });
  return index;
}

void note_peer(SSL* ssl) {
  if (SSL_get_ex_data(ssl, peer_index()) == nullptr)
    SSL_set_ex_data(ssl, peer_index(), new peer_note{peer_of(SSL_get_fd(ssl))});
}

// Logs a handshake of CAF's openssl session that failed: who, and why (the certificate check's
// verdict when there was one). The OpenSSL error queue is read, not consumed.
void report_failed_handshake(SSL* ssl, int ret, bool accepted) {
  const int code = SSL_get_error(ssl, ret);
  if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE)
    return;
  auto* note = static_cast<peer_note*>(SSL_get_ex_data(ssl, peer_index()));
  if (note != nullptr && note->reported)
    return;
  if (note != nullptr)
    note->reported = true;
  failed_handshakes.fetch_add(1, std::memory_order_relaxed);
  // A connection closed before it sent a byte (a port probe, a TCP check) is no handshake.
  if (SSL_get_rbio(ssl) != nullptr && BIO_number_read(SSL_get_rbio(ssl)) == 0)
    return;
  std::string why;
  const long verdict = SSL_get_verify_result(ssl);
  if (verdict != X509_V_OK)
    why = std::string("certificate refused: ") + X509_verify_cert_error_string(verdict);
  else if (unsigned long e = ERR_peek_last_error(); e != 0)
    why = ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "TLS error";
  else
    why = "connection closed during the handshake";
  const std::string peer = note != nullptr ? note->peer : peer_of(SSL_get_fd(ssl));
  if (!may_log_refusal())
    return;
  if (accepted)
    ZMUON_LOG_WARN("refused a connection from " + peer + " (TLS handshake failed: " + why
                   + "); the job goes on without it");
  else
    ZMUON_LOG_WARN("the TLS handshake with " + peer + " failed (" + why + ")");
}

template <class Fn>
Fn real_function(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}

}  // namespace

}  // namespace zmuon

// CAF's openssl module calls these for every connection; the ones here (ELF symbol interposition:
// an executable's definition comes before libssl's) call OpenSSL's and log a failed handshake,
// which CAF would only drop. Where they are not interposed (a host loaded libssl globally
// first), the job is as safe, only the log line is missing.
extern "C" int SSL_accept(SSL* ssl) {
  using fn = int (*)(SSL*);
  static const fn real = zmuon::real_function<fn>("SSL_accept");
  zmuon::note_peer(ssl);
  const int ret = real(ssl);
  if (ret != 1)
    zmuon::report_failed_handshake(ssl, ret, /*accepted=*/true);
  return ret;
}

extern "C" int SSL_connect(SSL* ssl) {
  using fn = int (*)(SSL*);
  static const fn real = zmuon::real_function<fn>("SSL_connect");
  zmuon::note_peer(ssl);
  const int ret = real(ssl);
  if (ret != 1)
    zmuon::report_failed_handshake(ssl, ret, /*accepted=*/false);
  return ret;
}

namespace zmuon {

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

expected<std::string> resolve_transport(node_transport& mode, const std::string& secret,
                                        const std::string& host) {
  std::string key = secret;
  if (mode == node_transport::tls && key.empty()) {
    auto from_env = read_job_secret();
    if (!from_env)
      return from_env.err();
    key = *from_env;
  }
  if (mode == node_transport::tls && key.empty()) {
    if (const char* env = std::getenv("ZMUON_INSECURE"); env != nullptr) {
      const std::string v = env;
      if (v == "1")
        mode = node_transport::insecure_loopback;
      else if (v == "any-host")
        mode = node_transport::insecure_any_host;
    }
  }
  if (mode == node_transport::tls) {
    if (key.empty())
      return error{errc::invalid_argument,
                   "the job has no secret: give every node the same one (--secret-file FILE, "
                   "$ZMUON_JOB_SECRET or $ZMUON_JOB_SECRET_FILE; at least "
                   + std::to_string(kMinSecretBytes)
                   + " bytes), or ask for plain TCP on loopback with --insecure "
                     "($ZMUON_INSECURE=1)"};
    if (key.size() < kMinSecretBytes)
      return error{errc::invalid_argument, "the job's secret is shorter than "
                                               + std::to_string(kMinSecretBytes) + " bytes"};
    return key;
  }
  if (mode == node_transport::insecure_loopback && !is_loopback_host(host))
    return error{errc::invalid_argument,
                 "plain TCP (--insecure) is for loopback addresses only, and '" + host
                     + "' is not one: give the job a secret, or ask for plain TCP across hosts "
                       "with --insecure-any-host ($ZMUON_INSECURE=any-host)"};
  return std::string();
}

void configure_transport(caf::actor_system_config& cfg, const tls_credentials* creds) {
  if (creds == nullptr)
    return;
  cfg.load<caf::openssl::manager>();
  cfg.openssl_cafile = creds->ca_file();
  cfg.openssl_certificate = creds->cert_file();
  cfg.openssl_key = creds->key_file();
}

expected<uint16_t> publish_actor(caf::actor_system& sys, bool tls,
                                 const caf::strong_actor_ptr& whom, std::set<std::string> interface,
                                 uint16_t port, const std::string& host) {
  // The middleman actor's own message: it keeps the typed interface (which the peers check)
  // under plain TCP too.
  auto mm = tls ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
  expected<uint16_t> out{error{errc::comm_failure, "no answer"}};
  caf::scoped_actor self{sys};
  self->request(mm, std::chrono::seconds(30), caf::publish_atom::value, port, whom,
                std::move(interface), host, true)
      .receive([&](uint16_t bound) { out = bound; },
               [&](caf::error& err) {
                 out = error{errc::comm_failure, sys.render(err)};
               });
  return out;
}

namespace {

// Ends this process's connections to host:port: CAF 0.17 cannot cancel a connect whose handshake
// stalls (a peer that accepts and never answers); its session would spin and block the actor
// system's shutdown. shutdown(), not close(): CAF still owns the socket and closes it itself.
void abort_connections_to(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0)
    return;
  std::vector<std::string> targets;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = "";
    if (a->ai_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text,
                  sizeof text);
    else if (a->ai_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                  sizeof text);
    targets.push_back(std::string(text) + ":" + std::to_string(port));
  }
  ::freeaddrinfo(found);
  if (DIR* fds = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(fds)) {
      const int fd = std::atoi(e->d_name);
      if (fd <= 2 || fd == ::dirfd(fds))
        continue;
      const std::string peer = peer_of(fd);
      for (const auto& t : targets)
        if (peer == t)
          ::shutdown(fd, SHUT_RDWR);
    }
    ::closedir(fds);
  }
}

}  // namespace

expected<caf::strong_actor_ptr> connect_actor(caf::actor_system& sys, const tls_credentials* creds,
                                              const std::string& host, uint16_t port,
                                              const std::set<std::string>& interface,
                                              std::chrono::milliseconds timeout,
                                              bool* nobody_listens) {
  bool refused = false;
  if (nobody_listens == nullptr)
    nobody_listens = &refused;
  *nobody_listens = false;
  // No probe connection of our own first: CAF 0.17 cleans a closed connection up later, under
  // its socket's number, which the next connection may have taken by then (the join's links
  // died of it). CAF's connect itself runs under the deadline instead.
  const auto left = timeout;
  const bool tls = creds != nullptr;
  auto mm = tls ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
  expected<caf::strong_actor_ptr> out{error{errc::comm_failure, "no answer"}};
  caf::scoped_actor self{sys};
  self->request(mm, left, caf::connect_atom::value, host, port)
      .receive(
          [&](const caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>& found) {
            if (!ptr)
              out = error{errc::comm_failure, "no actor is published there"};
            else if (!sys.assignable(found, interface))
              out = error{errc::comm_failure, "the actor there is not the one expected"};
            else
              out = std::move(ptr);
          },
          [&](caf::error& err) {
            *nobody_listens = err == caf::sec::cannot_connect_to_node;
            if (err == caf::sec::request_timeout) {
              out = error{errc::timeout,
                          "no answer within " + std::to_string(timeout.count()) + " ms"};
              abort_connections_to(host, port);
            } else
              out = error{errc::comm_failure, sys.render(err)};
          });
  return out;
}

uint64_t failed_tls_handshakes() {
  return failed_handshakes.load(std::memory_order_relaxed);
}

}  // namespace zmuon
