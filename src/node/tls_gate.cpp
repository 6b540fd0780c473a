#include "node/tls_gate.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "caf/all.hpp"
#include "caf/io/basp_broker.hpp"
#include "caf/io/doorman.hpp"
#include "caf/io/middleman.hpp"
#include "caf/io/middleman_actor_impl.hpp"
#include "caf/io/network/default_multiplexer.hpp"
#include "caf/io/network/native_socket.hpp"
#include "caf/io/network/stream_impl.hpp"
#include "caf/io/scribe.hpp"

#include "base/log.hpp"
#include "messages/errors.hpp"

namespace zmuon {

namespace {

using caf::io::network::default_multiplexer;
using caf::io::network::rw_state;
using clock_type = std::chrono::steady_clock;
using ctx_ptr = std::shared_ptr<SSL_CTX>;
using ssl_ptr = std::shared_ptr<SSL>;

std::atomic<uint64_t> refused{0};
std::atomic<int64_t> connect_deadline_ms{5000};

const caf::atom_value kRegistryKey = caf::atom("zmuonTLS");

// OpenSSL writes to the socket with write(): a peer gone would raise SIGPIPE, which ends a
// process by default. Blocked on this thread around the call; one raised meanwhile is consumed.
class sigpipe_guard {
public:
  sigpipe_guard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &saved_);
  }
  ~sigpipe_guard() {
    timespec none{};
    while (sigtimedwait(&pipe_, nullptr, &none) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  sigpipe_guard(const sigpipe_guard&) = delete;
  sigpipe_guard& operator=(const sigpipe_guard&) = delete;

private:
  sigset_t pipe_{}, saved_{};
};

// "ADDR:PORT" of `addr`.
std::string address_text(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

std::string host_part(const std::string& peer) {
  return peer.substr(0, peer.rfind(':'));
}

// At most 20 lines a minute: a flood of strangers cannot flood the log.
bool may_log_refusal() {
  static std::mutex mutex;
  static clock_type::time_point window;
  static int lines = 0;
  std::lock_guard<std::mutex> lock(mutex);
  const auto now = clock_type::now();
  if (now - window > std::chrono::minutes(1)) {
    window = now;
    lines = 0;
  }
  return ++lines <= 20;
}

// Why the handshake on `ssl` failed: the certificate check's verdict, else OpenSSL's reason.
std::string handshake_failure(SSL* ssl) {
  const long verdict = SSL_get_verify_result(ssl);
  if (verdict != X509_V_OK)
    return std::string("certificate refused: ") + X509_verify_cert_error_string(verdict);
  if (unsigned long e = ERR_peek_last_error(); e != 0 && ERR_reason_error_string(e) != nullptr)
    return ERR_reason_error_string(e);
  return "connection closed during the handshake";
}

ssl_ptr new_ssl(SSL_CTX* ctx, int fd, bool accept) {
  ssl_ptr ssl(SSL_new(ctx), SSL_free);
  if (!ssl || SSL_set_fd(ssl.get(), fd) != 1)
    return nullptr;
  if (accept)
    SSL_set_accept_state(ssl.get());
  else
    SSL_set_connect_state(ssl.get());
  return ssl;
}

// One step of a non-blocking handshake: 1 done, 0 wants `events`, -1 failed.
int handshake_step(SSL* ssl, short& events) {
  sigpipe_guard guard;
  ERR_clear_error();
  const int ret = SSL_do_handshake(ssl);
  if (ret == 1)
    return 1;
  switch (SSL_get_error(ssl, ret)) {
    case SSL_ERROR_WANT_READ:
      events = POLLIN;
      return 0;
    case SSL_ERROR_WANT_WRITE:
      events = POLLOUT;
      return 0;
    default:
      return -1;
  }
}

// The TLS context of the node, made once: TLS 1.3 only, this node's certificate and key, and
// only the job's CA trusted, on both ends of every connection.
expected<ctx_ptr> make_context(const tls_credentials& creds) {
  auto fail = [](const std::string& what) {
    return error{errc::internal, "cannot set up TLS: " + what};
  };
  ctx_ptr ctx(SSL_CTX_new(TLS_method()), SSL_CTX_free);
  if (!ctx)
    return fail("no TLS context");
  auto read_pem = [](const std::string& pem, auto reader) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(
        BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
    return bio ? reader(bio.get(), nullptr, nullptr, nullptr) : nullptr;
  };
  std::unique_ptr<X509, decltype(&X509_free)> ca(read_pem(creds.ca_pem(), PEM_read_bio_X509),
                                                 X509_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(read_pem(creds.cert_pem(), PEM_read_bio_X509),
                                                   X509_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      read_pem(creds.key_pem(), PEM_read_bio_PrivateKey), EVP_PKEY_free);
  if (!ca || !cert || !key)
    return fail("the credentials do not parse");
  if (SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION) != 1
      || SSL_CTX_use_certificate(ctx.get(), cert.get()) != 1
      || SSL_CTX_use_PrivateKey(ctx.get(), key.get()) != 1
      || SSL_CTX_check_private_key(ctx.get()) != 1
      || X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx.get()), ca.get()) != 1)
    return fail("the credentials do not load");
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  // CAF's stream may hand a write back with another address or in parts.
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return ctx;
}

// CAF's stream over an established TLS session.
struct tls_policy {
  explicit tls_policy(ssl_ptr s) : ssl(std::move(s)) {}

  // WANT_READ/WANT_WRITE: nothing now, the multiplexer calls again.
  rw_state result_of(int ret, size_t& result) {
    result = 0;
    const int code = SSL_get_error(ssl.get(), ret);
    return code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE ? rw_state::success
                                                                       : rw_state::failure;
  }

  rw_state read_some(size_t& result, caf::io::network::native_socket, void* buf, size_t len) {
    result = 0;
    if (len == 0)
      return rw_state::indeterminate;
    sigpipe_guard guard;
    ERR_clear_error();
    const int n = SSL_read(ssl.get(), buf, static_cast<int>(std::min<size_t>(len, INT_MAX)));
    if (n > 0) {
      result = static_cast<size_t>(n);
      return rw_state::success;
    }
    return result_of(n, result);
  }

  rw_state write_some(size_t& result, caf::io::network::native_socket, const void* buf,
                      size_t len) {
    result = 0;
    if (len == 0)
      return rw_state::indeterminate;
    sigpipe_guard guard;
    ERR_clear_error();
    const int n = SSL_write(ssl.get(), buf, static_cast<int>(std::min<size_t>(len, INT_MAX)));
    if (n > 0) {
      result = static_cast<size_t>(n);
      return rw_state::success;
    }
    return result_of(n, result);
  }

  bool must_read_more(caf::io::network::native_socket, size_t threshold) {
    return static_cast<size_t>(SSL_pending(ssl.get())) >= threshold;
  }

  ssl_ptr ssl;
};

// A connection of CAF's broker whose TLS handshake is done.
class tls_scribe : public caf::io::scribe {
public:
  tls_scribe(default_multiplexer& mpx, int fd, ssl_ptr ssl)
      : scribe(caf::io::network::conn_hdl_from_socket(fd)), stream_(mpx, fd, std::move(ssl)) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_)
      launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

private:
  void launch() {
    launched_ = true;
    stream_.start(this);
  }

  bool launched_ = false;
  caf::io::network::stream_impl<tls_policy> stream_;
};

class gate_doorman;

// The listening socket of one published port and its thread: accepts, runs the handshakes, and
// posts each authenticated connection to the multiplexer, where the doorman hands it to CAF.
class gate : public std::enable_shared_from_this<gate> {
public:
  gate(default_multiplexer& mpx, int listen_fd, ctx_ptr ctx, tls_gate_limits limits)
      : mpx_(mpx), listen_fd_(listen_fd), ctx_(std::move(ctx)), limits_(limits) {
    auto port = caf::io::network::local_port_of_fd(listen_fd);
    port_ = port ? *port : 0;
    auto addr = caf::io::network::local_addr_of_fd(listen_fd);
    addr_ = addr ? *addr : std::string();
  }

  ~gate() { stop(); }

  int fd() const { return listen_fd_; }
  uint16_t port() const { return port_; }
  const std::string& addr() const { return addr_; }

  void start(gate_doorman* owner) {
    {
      std::lock_guard<std::recursive_mutex> lock(owner_mutex_);
      owner_ = owner;
    }
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
      ZMUON_LOG_WARN("cannot start a TLS gate: " + std::string(std::strerror(errno)));
      return;
    }
    spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    thread_ = std::thread([self = shared_from_this()] { self->run(); });
  }

  // Stops accepting: the listening socket and every pending handshake close (the thread joins).
  void stop() {
    {
      std::lock_guard<std::recursive_mutex> lock(owner_mutex_);
      owner_ = nullptr;
    }
    if (thread_.joinable()) {
      stopping_ = true;
      (void)!::write(wake_[1], "x", 1);
      if (thread_.get_id() == std::this_thread::get_id())
        thread_.detach();
      else
        thread_.join();
    }
    // Closed now, not when the last reference goes: no connection waits in its backlog.
    if (listen_fd_ >= 0 && !closed_.exchange(true))
      ::close(listen_fd_);
  }

  void admit(int fd, ssl_ptr ssl);

private:
  struct pending {
    int fd;
    ssl_ptr ssl;
    clock_type::time_point deadline;
    std::string peer;
    short events = POLLIN;
  };

  void refuse(const std::string& peer, const std::string& why, bool log = true) {
    refused.fetch_add(1, std::memory_order_relaxed);
    ++tally_[host_part(peer)];
    if (log && may_log_refusal())
      ZMUON_LOG_WARN("refused a connection from " + peer + " (" + why
                     + "); the job goes on without it");
  }

  void close_pending(size_t i, const std::string& why, bool log = true) {
    refuse(pending_[i].peer, why, log);
    ::close(pending_[i].fd);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void accept_some() {
    for (int round = 0; round < 64 && !stopping_; ++round) {
      // The address from accept itself: a peer that has already hung up has none later.
      sockaddr_storage from{};
      socklen_t from_len = sizeof from;
      const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &from_len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if ((errno == EMFILE || errno == ENFILE) && !pending_.empty()) {
          // Out of descriptors: a stalled handshake makes room, as when all slots are taken.
          close_pending(victim(),
                        "this process is out of file descriptors: a stalled handshake is "
                        "dropped");
          continue;
        }
        if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors: the spare one makes room to take the connection and close it.
          if (spare_ >= 0)
            ::close(spare_);
          const int taken = ::accept(listen_fd_, reinterpret_cast<sockaddr*>(&from), &from_len);
          if (taken >= 0)
            ::close(taken);
          spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
          if (taken < 0)
            return;
          const std::string peer = address_text(from);
          refuse(peer, "this process is out of file descriptors");
          continue;
        }
        return;  // EAGAIN, or an error of that connection alone
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      pending p{fd, new_ssl(ctx_.get(), fd, true), clock_type::now() + limits_.handshake_deadline,
                address_text(from)};
      if (!p.ssl) {
        refuse(p.peer, "no TLS session");
        ::close(fd);
        continue;
      }
      // A first step at once: a peer that already hung up takes no room, a node whose hello is
      // there gets on.
      if (!progress(p))
        continue;
      if (static_cast<int>(pending_.size()) >= limits_.max_pending)
        close_pending(victim(),
                      std::to_string(limits_.max_pending)
                          + " TLS handshakes at once: one from the busiest address is dropped");
      pending_.push_back(std::move(p));
    }
  }

  static uint64_t bytes_read(const pending& p) {
    return SSL_get_rbio(p.ssl.get()) != nullptr ? BIO_number_read(SSL_get_rbio(p.ssl.get())) : 0;
  }

  // The pending handshake to drop for a new one: of the address with the most in flight (a
  // stranger's flood does not push out a node from elsewhere), the oldest that has sent nothing,
  // else its oldest.
  size_t victim() const {
    std::map<std::string, int> per_host;
    std::string crowded;
    for (const auto& p : pending_) {
      const int n = ++per_host[host_part(p.peer)];
      if (n > per_host[crowded] || crowded.empty())
        crowded = host_part(p.peer);
    }
    size_t first = pending_.size();
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (host_part(pending_[i].peer) != crowded)
        continue;
      if (bytes_read(pending_[i]) == 0)
        return i;
      first = std::min(first, i);
    }
    return first < pending_.size() ? first : 0;
  }

  // A step of `p`'s handshake; false when it is over (handed to CAF, or refused and closed).
  bool progress(pending& p) {
    const int step = handshake_step(p.ssl.get(), p.events);
    if (step == 0)
      return true;
    if (step == 1) {
      hand_over(std::move(p));
      return false;
    }
    // A connection closed before it sent a byte (a port probe, a TCP check) is counted, not
    // logged line by line; the door's summary names its address.
    refuse(p.peer, "TLS handshake failed: " + handshake_failure(p.ssl.get()), bytes_read(p) != 0);
    ::close(p.fd);
    return false;
  }

  void run() {
    std::vector<pollfd> fds;
    while (!stopping_) {
      fds.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      auto next = clock_type::now() + std::chrono::seconds(1);
      for (const auto& p : pending_) {
        fds.push_back({p.fd, p.events, 0});
        next = std::min(next, p.deadline);
      }
      const auto wait =
          std::chrono::duration_cast<std::chrono::milliseconds>(next - clock_type::now());
      const int ready =
          ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait.count(), 0)) + 1);
      if (ready < 0 && errno != EINTR) {
        ZMUON_LOG_WARN("the TLS gate at port " + std::to_string(port_)
                       + " stops: " + std::strerror(errno));
        break;
      }
      if (stopping_)
        break;
      // Handshakes first (their indices match fds[2..] until pending_ changes).
      for (size_t i = pending_.size(); i-- > 0;) {
        if (fds[i + 2].revents == 0)
          continue;
        if (!progress(pending_[i]))
          pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      }
      const auto now = clock_type::now();
      for (size_t i = pending_.size(); i-- > 0;)
        if (pending_[i].deadline <= now)
          close_pending(i, "no TLS handshake within "
                               + std::to_string(limits_.handshake_deadline.count()) + " ms");
      if (fds[1].revents != 0)
        accept_some();
    }
    for (size_t i = pending_.size(); i-- > 0;)
      close_pending(i, "the door closed before its TLS handshake ended", false);
    summarize();
    ::close(wake_[0]);
    ::close(wake_[1]);
    if (spare_ >= 0)
      ::close(spare_);
  }

  // The addresses refused at this door, most first: the log names who misbehaved.
  void summarize() {
    if (tally_.empty())
      return;
    std::vector<std::pair<uint64_t, std::string>> by_count;
    uint64_t total = 0;
    for (const auto& [host, n] : tally_) {
      by_count.emplace_back(n, host);
      total += n;
    }
    std::sort(by_count.rbegin(), by_count.rend());
    std::string line = "refused " + std::to_string(total) + " connection" + (total == 1 ? "" : "s")
                       + " at port " + std::to_string(port_) + " from: ";
    for (size_t i = 0; i < by_count.size() && i < 8; ++i)
      line += (i ? ", " : "") + by_count[i].second + " (" + std::to_string(by_count[i].first) + ")";
    if (by_count.size() > 8)
      line += " and " + std::to_string(by_count.size() - 8) + " more addresses";
    ZMUON_LOG_WARN(line);
  }

  void hand_over(pending&& p) {
    auto self = shared_from_this();
    const int fd = p.fd;
    ssl_ptr ssl = std::move(p.ssl);
    mpx_.post([self, fd, ssl] { self->admit(fd, ssl); });
  }

  default_multiplexer& mpx_;
  int listen_fd_;
  std::atomic<bool> closed_{false};
  uint16_t port_ = 0;
  std::string addr_;
  ctx_ptr ctx_;
  tls_gate_limits limits_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  int wake_[2] = {-1, -1};
  int spare_ = -1;
  std::vector<pending> pending_;
  std::map<std::string, uint64_t> tally_;  // refusals by address
  std::recursive_mutex owner_mutex_;
  gate_doorman* owner_ = nullptr;  // null once the port is closed
};

// The broker's view of a published port: no socket in the multiplexer's loop; connections come
// from the gate, authenticated.
class gate_doorman : public caf::io::doorman {
public:
  gate_doorman(default_multiplexer& mpx, std::shared_ptr<gate> g)
      : doorman(caf::io::network::accept_hdl_from_socket(g->fd())),
        mpx_(mpx),
        gate_(std::move(g)) {}

  ~gate_doorman() override { gate_->stop(); }

  bool new_connection() override { return false; }  // the gate's thread accepts
  void launch() override { gate_->start(this); }
  void graceful_shutdown() override {
    gate_->stop();
    detach(&mpx_, false);
  }
  std::string addr() const override { return gate_->addr(); }
  uint16_t port() const override { return gate_->port(); }
  void add_to_loop() override {}
  void remove_from_loop() override {}

  // On the multiplexer's thread.
  void admit(int fd, ssl_ptr ssl) {
    if (detached()) {
      ::close(fd);
      return;
    }
    auto scribe = caf::make_counted<tls_scribe>(mpx_, fd, std::move(ssl));
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    doorman::new_connection(&mpx_, hdl);
  }

private:
  default_multiplexer& mpx_;
  std::shared_ptr<gate> gate_;
};

void gate::admit(int fd, ssl_ptr ssl) {
  std::lock_guard<std::recursive_mutex> lock(owner_mutex_);
  if (owner_ == nullptr)
    ::close(fd);
  else
    owner_->admit(fd, std::move(ssl));
}

// A TCP connection to host:port and its TLS handshake, both within `deadline`.
expected<std::pair<int, ssl_ptr>> connect_tls(SSL_CTX* ctx, const std::string& host, uint16_t port,
                                              clock_type::time_point deadline) {
  auto left_ms = [&] {
    return static_cast<int>(std::max<int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count(),
        0));
  };
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      rc != 0)
    return error{errc::comm_failure, "cannot resolve '" + host + "': " + gai_strerror(rc)};
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        socklen_t len = sizeof err;
        err =
            ::poll(&p, 1, left_ms()) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0
                ? err
                : ETIMEDOUT;
      }
    }
    if (err != 0) {
      why = std::strerror(err);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0)
    return error{errc::io_error, why};
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ssl_ptr ssl = new_ssl(ctx, fd, false);
  short events = POLLOUT;
  for (int step = ssl ? 0 : -1; step == 0;) {
    step = handshake_step(ssl.get(), events);
    if (step == 1)
      return std::make_pair(fd, std::move(ssl));
    if (step == 0) {
      pollfd p{fd, events, 0};
      if (::poll(&p, 1, left_ms()) != 1) {
        ::close(fd);
        return error{errc::timeout, "no TLS handshake within the deadline"};
      }
    }
  }
  // Closed without a verdict (a listener out of room or descriptors): worth another try.
  // A certificate refused, or an alert, is final.
  const unsigned long last = ERR_peek_last_error();
  const bool closed = ssl && SSL_get_verify_result(ssl.get()) == X509_V_OK
                      && (last == 0 || ERR_GET_REASON(last) == SSL_R_UNEXPECTED_EOF_WHILE_READING);
  const std::string failure = ssl ? handshake_failure(ssl.get()) : "no TLS session";
  ::close(fd);
  if (closed)
    return error{errc::io_error, "the connection closed during the TLS handshake"};
  refused.fetch_add(1, std::memory_order_relaxed);
  return error{errc::comm_failure, "TLS handshake failed: " + failure};
}

class tls_middleman_impl : public caf::io::middleman_actor_impl {
public:
  tls_middleman_impl(caf::actor_config& cfg, caf::actor broker, ctx_ptr ctx, tls_gate_limits limits)
      : caf::io::middleman_actor_impl(cfg, std::move(broker)),
        ctx_(std::move(ctx)),
        limits_(limits) {}

  const char* name() const override { return "zmuon::tls_middleman"; }

protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, uint16_t port) override {
    const auto deadline = clock_type::now()
                          + std::min(std::chrono::milliseconds(connect_deadline_ms.load()),
                                     limits_.handshake_deadline);
    auto conn = connect_tls(ctx_.get(), host, port, deadline);
    if (!conn) {
      const std::string where = host + ":" + std::to_string(port);
      if (conn.err().code() == errc::io_error)  // nobody listens there (yet)
        return caf::make_error(caf::sec::cannot_connect_to_node, where, conn.err().message());
      if (conn.err().code() == errc::comm_failure && may_log_refusal())
        ZMUON_LOG_WARN("the TLS handshake with " + where + " failed ("
                       + conn.err().message().substr(std::strlen("TLS handshake failed: ")) + ")");
      return make_caf_error(conn.err());
    }
    return caf::io::scribe_ptr(
        caf::make_counted<tls_scribe>(mpx(), conn->first, std::move(conn->second)));
  }

  caf::expected<caf::io::doorman_ptr> open(uint16_t port, const char* addr, bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd)
      return std::move(fd.error());
    caf::io::network::nonblocking(*fd, true);
    caf::io::network::child_process_inherit(*fd, false);
    auto g = std::make_shared<gate>(mpx(), *fd, ctx_, limits_);
    return caf::io::doorman_ptr(caf::make_counted<gate_doorman>(mpx(), std::move(g)));
  }

private:
  default_multiplexer& mpx() {
    return static_cast<default_multiplexer&>(system().middleman().backend());
  }

  ctx_ptr ctx_;
  tls_gate_limits limits_;
};

}  // namespace

expected<caf::io::middleman_actor> start_tls_middleman(caf::actor_system& sys,
                                                       const tls_credentials& creds,
                                                       tls_gate_limits limits) {
  auto ctx = make_context(creds);
  if (!ctx)
    return ctx.err();
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  // Scheduled, not detached: a detached actor hangs ~actor_system here as the supervisor did
  // (docs/DECISIONS.md). Its connects block one scheduler thread for their deadline at most.
  auto mm = sys.spawn<tls_middleman_impl, caf::hidden>(std::move(broker), std::move(*ctx), limits);
  auto handle = caf::actor_cast<caf::io::middleman_actor>(mm);
  sys.registry().put(kRegistryKey, handle);
  return handle;
}

caf::io::middleman_actor tls_middleman(caf::actor_system& sys) {
  return sys.registry().get<caf::io::middleman_actor>(kRegistryKey);
}

void set_tls_connect_deadline(std::chrono::milliseconds deadline) {
  connect_deadline_ms.store(std::max<int64_t>(deadline.count(), 1));
}

uint64_t refused_tls_connections() {
  return refused.load(std::memory_order_relaxed);
}

}  // namespace zmuon
