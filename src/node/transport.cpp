#include "node/transport.hpp"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "caf/io/middleman.hpp"
#include "caf/scoped_actor.hpp"

#include "base/log.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"
#include "node/tls_gate.hpp"

namespace zmuon {

namespace {

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

// Whether `a` is a loopback address: 127.0.0.0/8, ::1, or 127.x mapped into IPv6.
bool loopback_address(const sockaddr* a) {
  if (a->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family != AF_INET6)
    return false;
  const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
  if (IN6_IS_ADDR_LOOPBACK(&v6))
    return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  if (host.empty())
    return false;  // every interface
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0)
    return false;
  // Every address the name resolves to: a name that also has a network address binds there.
  bool loopback = found != nullptr;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next)
    loopback = loopback && loopback_address(a->ai_addr);
  ::freeaddrinfo(found);
  return loopback;
}

expected<std::string> resolve_transport(node_transport& mode, const std::string& secret,
                                        const std::string& host) {
  std::string key = secret;
  if (mode != node_transport::tls) {
    // Plain TCP with a secret would silently leave the secret unused.
    auto given = secret.empty() ? read_job_secret() : expected<std::string>(secret);
    if (!given || !given->empty())
      return error{errc::invalid_argument,
                   "--insecure (plain TCP) and a job secret (--secret-file, $ZMUON_JOB_SECRET or "
                   "$ZMUON_JOB_SECRET_FILE) exclude each other: drop one of them"};
  }
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
                     + "' does not resolve to loopback addresses only: give the job a secret, or "
                       "ask for plain TCP across hosts with --insecure-any-host "
                       "($ZMUON_INSECURE=any-host)"};
  return std::string();
}

expected<uint16_t> publish_actor(caf::actor_system& sys, bool tls,
                                 const caf::strong_actor_ptr& whom, std::set<std::string> interface,
                                 uint16_t port, const std::string& host) {
  // The middleman actor's own message: it keeps the typed interface (which the peers check)
  // under plain TCP too.
  auto mm = tls ? tls_middleman(sys) : sys.middleman().actor_handle();
  if (!mm)
    return error{errc::internal, "TLS is asked for and the TLS middleman is not running"};
  expected<uint16_t> out{error{errc::comm_failure, "no answer"}};
  caf::scoped_actor self{sys};
  self->request(mm, std::chrono::seconds(30), caf::publish_atom::value, port, whom,
                std::move(interface), host, true)
      .receive([&](uint16_t bound) { out = bound; },
               [&](caf::error& err) {
                 out = error{errc::comm_failure, from_caf_error(err).message()};
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

expected<caf::strong_actor_ptr> connect_actor(caf::actor_system& sys, bool tls,
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
  auto mm = tls ? tls_middleman(sys) : sys.middleman().actor_handle();
  if (!mm)
    return error{errc::internal, "TLS is asked for and the TLS middleman is not running"};
  if (tls)
    set_tls_connect_deadline(timeout);
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
            // The TLS middleman's own deadline may answer first, with a timeout of ours.
            if (err == caf::sec::request_timeout || from_caf_error(err).code() == errc::timeout) {
              out = error{errc::timeout,
                          "no answer within " + std::to_string(timeout.count()) + " ms"};
              if (!tls)  // the TLS middleman's own deadline ends its connect
                abort_connections_to(host, port);
            } else
              out = error{errc::comm_failure, from_caf_error(err).message()};
          });
  return out;
}

}  // namespace zmuon
