#include "node/node.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <thread>

#include <netdb.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "caf/all.hpp"
#include "caf/io/all.hpp"

#include "base/log.hpp"
#include "base/private_files.hpp"
#include "comm/caf_comm.hpp"
#include "kernels/compute.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"
#include "node/node_supervisor.hpp"
#include "node/rendezvous.hpp"
#include "node/tls_gate.hpp"
#include "node/transport.hpp"
#ifdef ZMUON_HAVE_NCCL
#include "comm/nccl_comm.hpp"
#endif

namespace zmuon {

void register_node_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<hello>("zmuon::hello");
  cfg.add_message_type<hello_reply>("zmuon::hello_reply");
  cfg.add_message_type<join_request>("zmuon::join_request");
  cfg.add_message_type<join_reply>("zmuon::join_reply");
  cfg.add_message_type<heartbeat>("zmuon::heartbeat");
  cfg.add_message_type<node_lost>("zmuon::node_lost");
  cfg.add_message_type<node_done>("zmuon::node_done");
}

namespace {

struct node_config : caf::actor_system_config {
  node_config() {
    configure_actor_system(*this);
    register_node_messages(*this);
    load<caf::io::middleman>();
    // No automatic connections: with them on, the switch from the route through node 0 to a
    // direct connection sometimes killed the proxies of a live node ("lost in step 1:
    // remote_link_unreachable", 1 run in ~50 of test_multinode with 3 nodes). The nodes connect
    // to each other before they hold each other's handles instead (connect_peers_directly).
    set("middleman.enable-automatic-connections", false);
  }
};

node_door_actor::behavior_type door_impl(int32_t node) {
  return {[node](door_atom) { return node; }};
}

/// How long a node waits for another's door to take a connection before it goes through node 0.
constexpr std::chrono::milliseconds kDoorProbe{3000};

// node_options::host's default.
std::string advertised_host(const node_options& opts) {
  if (!opts.host.empty())
    return opts.host;
  if (const char* env = std::getenv("ZMUON_NODE_HOST"); env != nullptr && *env != '\0')
    return env;
  if (is_loopback_host(opts.master_host))
    return opts.master_host;
  char name[256] = "";
  if (::gethostname(name, sizeof name - 1) == 0 && name[0] != '\0')
    return name;
  return opts.master_host;
}

}  // namespace

size_t node_scheduler_threads(int ranks) {
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  return std::max(cores, static_cast<size_t>(2 * std::max(ranks, 1))) + 2;
}

struct node::impl {
  node_options opts;
  std::unique_ptr<tls_credentials> tls;  // until the TLS context has read them
  node_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::vector<caf_comm_actor> comms;
  rendezvous_actor rendezvous;  // node 0 only
  node_supervisor_actor supervisor;
  node_door_actor door;
  caf::io::middleman_actor tls_middleman;  // TLS: zmuon's gate in front of CAF's broker
  join_reply reply;
  uint16_t rendezvous_port = 0;  // node 0: where the rendezvous listens until the job starts
  uint16_t door_port = 0;

  bool use_tls() const { return tls_middleman != nullptr; }
  std::shared_ptr<job_end> end = std::make_shared<job_end>();

  std::chrono::milliseconds join_timeout() const {
    return std::chrono::milliseconds(opts.join_timeout_ms);
  }

  expected<rendezvous_actor> find_rendezvous();
  /// The rendezvous' answer as an error: its own, or, when it did not come in time, which wait
  /// ran out.
  error join_failure(const caf::error& err) const {
    error failed = from_caf_error(err);
    if (failed.code() != errc::timeout)
      return failed;
    return {errc::timeout, "not every node joined within " + std::to_string(opts.join_timeout_ms)
                               + " ms (zmuon.timeout_ms)"};
  }
  /// Says hello to the rendezvous with this node's door (published here when the job has three
  /// or more nodes), then connects to the doors of the nodes 1..node_rank-1 (each pair once: the
  /// higher rank connects), so that once join_reply hands out the actor handles, CAF routes
  /// every message between two nodes over their own connection.
  error connect_peers_directly(const rendezvous_actor& rdv);

  /// Asks the rendezvous, within the join timeout; node 0 lost meanwhile (its connection gone)
  /// fails the wait at once, naming node 0.
  template <class Reply, class Request>
  expected<Reply> ask_rendezvous(const rendezvous_actor& rdv, Request req);

  /// Once the job has started: no more connections are taken at the rendezvous or the door.
  void close_doors();
};

template <class Reply, class Request>
expected<Reply> node::impl::ask_rendezvous(const rendezvous_actor& rdv, Request req) {
  auto answer = std::make_shared<std::promise<expected<Reply>>>();
  auto result = answer->get_future();
  const bool remote = opts.node_rank != 0;
  const auto timeout = join_timeout();
  auto failure = [this](const caf::error& err) { return join_failure(err); };
  // The request goes in as a spawn argument: CAF 0.17 spawning a function with no argument
  // besides `self` dereferences a null tuple (UBSan's finding, harmless but undefined).
  sys->spawn(
      [=](caf::event_based_actor* self, Request req) mutable {
        auto done = std::make_shared<bool>(false);
        auto finish = [=](expected<Reply> value) {
          if (!*done) {
            *done = true;
            answer->set_value(std::move(value));
          }
          self->quit();
        };
        if (remote) {
          self->monitor(rdv);
          self->set_down_handler([=](caf::down_msg& dm) {
            finish(error{errc::comm_failure, "node 0 was lost while the nodes were joining ("
                                                 + to_string(dm.reason) + ")"});
          });
        }
        self->request(rdv, timeout, std::move(req))
            .then([=](Reply& reply) { finish(std::move(reply)); },
                  [=](caf::error& err) { finish(failure(err)); });
      },
      std::move(req));
  return result.get();
}

void node::impl::close_doors() {
  if (rendezvous && rendezvous_port != 0)
    sys->middleman().unpublish(rendezvous, rendezvous_port);
  if (door && door_port != 0)
    sys->middleman().unpublish(door, door_port);
}

error node::impl::connect_peers_directly(const rendezvous_actor& rdv) {
  hello h{opts.node_rank, caf::actor_cast<caf::actor>(supervisor), advertised_host(opts), 0};
  if (opts.nodes > 2 && opts.node_rank > 0) {
    door = sys->spawn(door_impl, opts.node_rank);
    auto port = publish_actor(use_tls(), door, 0, h.host);
    if (port)
      h.port = door_port = *port;
    else
      ZMUON_LOG_WARN("cannot listen for the other nodes on " + h.host + " (" + port.err().message()
                     + "); their messages to this node go through node 0");
  }
  auto answer = ask_rendezvous<hello_reply>(rdv, std::move(h));
  if (!answer)
    return answer.err();
  hello_reply doors = std::move(*answer);
  caf::scoped_actor self{*sys};
  // Nodes 1..node_rank-1, all at once, each with a short deadline (connect_actor's probe): a
  // door a firewall hides costs kDoorProbe, not the system's SYN retries (about two minutes).
  const int lower = std::min<int>(opts.node_rank, static_cast<int>(doors.ports.size()));
  std::vector<expected<node_door_actor>> found_doors(static_cast<size_t>(std::max(lower, 0)),
                                                     error{errc::comm_failure, "not tried"});
  {
    std::vector<std::thread> connects;
    for (int j = 1; j < lower; ++j)
      if (doors.ports[j] != 0)
        connects.emplace_back([&, j] {
          found_doors[j] = connect_actor<node_door_actor>(*sys, use_tls(), doors.hosts[j],
                                                          doors.ports[j], kDoorProbe);
        });
    for (auto& t : connects)
      t.join();
  }
  for (int j = 1; j < lower; ++j) {
    if (doors.ports[j] == 0)
      continue;  // it said why on its own stderr
    const std::string where = doors.hosts[j] + ":" + std::to_string(doors.ports[j]);
    std::string problem;
    if (auto& found = found_doors[j]; !found) {
      problem = found.err().message();
    } else {
      // The answer comes back over the new connection: node j knows it before any handle of
      // this node's actors reaches it.
      self->request(*found, join_timeout(), door_atom::value)
          .receive(
              [&](int32_t rank) {
                if (rank != j)
                  problem = "the door there is node " + std::to_string(rank) + "'s";
              },
              [&](caf::error& err) { problem = sys->render(err); });
    }
    if (!problem.empty())
      ZMUON_LOG_WARN("no direct connection to node " + std::to_string(j) + " at " + where + " ("
                     + problem + "); messages between them go through node 0");
  }
  return {};
}

expected<rendezvous_actor> node::impl::find_rendezvous() {
  auto where = opts.master_host + ":" + std::to_string(opts.master_port);
  // The job's progress: info for the launcher, debug where a host embeds the node.
  const log_level progress_level = opts.quiet ? log_level::debug : log_level::info;
  if (opts.node_rank == 0) {
    std::function<void(const std::string&)> progress = [progress_level](const std::string& line) {
      ZMUON_LOG(progress_level, line);
    };
    rendezvous = spawn_rendezvous(*sys, opts.nodes, opts.nccl_unique_id, opts.nccl_only_on_own_gpus,
                                  std::move(progress));
    auto port = opts.nodes == 1
                    ? expected<uint16_t>(uint16_t{0})
                    : publish_actor(use_tls(), rendezvous, opts.master_port, opts.master_host);
    if (!port)
      return error{errc::comm_failure,
                   "node 0 cannot listen on " + where + ": " + port.err().message()};
    rendezvous_port = *port;
    std::string actual = opts.master_host + ":" + std::to_string(*port);
    ZMUON_LOG(progress_level, "rendezvous listening on " + actual);
    if (!opts.rendezvous_file.empty())
      if (auto err = replace_file(opts.rendezvous_file, actual + "\n", 0600))
        return err;
    return rendezvous;
  }
  // Node 0 may not listen yet: retry until the join timeout. Each try has the time left: a
  // listener that accepts and never answers costs the timeout, not forever.
  const auto deadline = std::chrono::steady_clock::now() + join_timeout();
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    bool nobody_listens = false;
    auto found = connect_actor<rendezvous_actor>(
        *sys, use_tls(), opts.master_host, opts.master_port,
        std::max(left, std::chrono::milliseconds(1)), &nobody_listens);
    if (found)
      return *found;
    // A listener not of this job: this node's credentials do not fit (no node of the job was
    // lost, so not comm_failure).
    if (!nobody_listens && found.err().code() != errc::timeout)
      return error{errc::invalid_argument,
                   "node " + std::to_string(opts.node_rank) + ": the handshake with " + where
                       + " failed (" + found.err().message() + ")"
                       + (use_tls() ? ": the node there is not of this job, or the nodes have "
                                      "different secrets or certificates"
                                    : "")};
    if (std::chrono::steady_clock::now() >= deadline)
      return error{errc::timeout,
                   "node " + std::to_string(opts.node_rank) + " found no rendezvous at " + where
                       + " within " + std::to_string(opts.join_timeout_ms)
                       + " ms (zmuon.timeout_ms): " + found.err().message()
                       + (use_tls() ? " (under TLS: does every node have the job's secret?)" : "")};
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

node::node() : impl_(std::make_unique<impl>()) {}

node::~node() {
  auto& d = *impl_;
  if (!d.sys)
    return;
  caf::anon_send_exit(d.supervisor, caf::exit_reason::user_shutdown);
  if (d.door)
    caf::anon_send_exit(d.door, caf::exit_reason::user_shutdown);
  if (d.rendezvous)
    caf::anon_send_exit(d.rendezvous, caf::exit_reason::user_shutdown);
  for (auto& c : d.comms)
    caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
  if (d.tls_middleman)
    caf::anon_send_exit(d.tls_middleman, caf::exit_reason::kill);
}

expected<std::unique_ptr<node>> node::join(const node_options& opts,
                                           const std::vector<std::string>& table,
                                           const std::string& job) {
  if (opts.nodes < 1 || opts.node_rank < 0 || opts.node_rank >= opts.nodes)
    return error{errc::invalid_argument, "--node-rank " + std::to_string(opts.node_rank)
                                             + " is outside [0, " + std::to_string(opts.nodes)
                                             + ")"};
  if (opts.ranks < 1)
    return error{errc::invalid_argument, "a node needs at least one rank"};
  // Idle connections of strangers used to exhaust a 256-descriptor soft limit and spin node 0 on
  // accept(): the soft limit goes up to the hard one.
  if (rlimit files{}; ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  std::unique_ptr<node> n(new node());
  auto& d = *n->impl_;
  d.opts = opts;
  d.cfg.set("scheduler.max-threads", node_scheduler_threads(opts.ranks));
  // A job of one node takes no connections: it needs no secret and opens no port.
  auto secret = opts.nodes == 1
                    ? expected<std::string>(std::string())
                    : resolve_transport(d.opts.transport, opts.secret, opts.master_host);
  if (!secret)
    return secret.err();
  // Plain TCP on loopback: this node's own door (three nodes or more) too.
  if (opts.nodes > 2 && opts.node_rank > 0 && d.opts.transport == node_transport::insecure_loopback)
    if (const auto door_host = advertised_host(d.opts); !is_loopback_host(door_host))
      return error{errc::invalid_argument,
                   "plain TCP (--insecure) is for loopback addresses only, and this node's "
                   "address '"
                       + door_host
                       + "' (--host or $ZMUON_NODE_HOST) does not resolve to loopback addresses "
                         "only"};
  if (opts.nodes > 1 && d.opts.transport == node_transport::tls) {
    // Every way to a node's secret passes here: the launcher's, the C ABI's and Python's.
    const char* weak_env = std::getenv("ZMUON_WEAK_SECRET_OK");
    const bool weak_ok =
        opts.weak_secret_ok || (weak_env != nullptr && std::string(weak_env) == "1");
    const std::string from = opts.secret.empty() ? job_secret_source() : opts.secret_from;
    if (auto err = check_job_secret(*secret, from.empty() ? "the node's options" : from, weak_ok))
      return err;
    auto creds = tls_credentials::make(*secret, job_salt(opts.nodes, opts.master_host),
                                       opts.join_timeout_ms, opts.certificate);
    if (!creds)
      return creds.err();
    d.tls = std::move(*creds);
  }
  d.sys = std::make_unique<caf::actor_system>(d.cfg);
  if (d.tls) {
    auto mm = start_tls_middleman(*d.sys, *d.tls);
    if (!mm)
      return mm.err();
    d.tls_middleman = *mm;
    d.tls.reset();  // the TLS context holds what it needs; the key's text is wiped now
  }
  join_request req{opts.node_rank, opts.ranks, table, job, {}, {}, opts.gpus};
  for (int i = 0; i < opts.ranks; ++i) {
    d.comms.push_back(spawn_caf_comm(*d.sys, 0, 1));  // rank and world come with connect_peers
    req.comms.push_back(caf::actor_cast<caf::actor>(d.comms.back()));
  }
  supervisor_options sopts;
  sopts.node = opts.node_rank;
  sopts.heartbeat_timeout = std::chrono::milliseconds(opts.heartbeat_timeout_ms);
  sopts.comms = d.comms;
  sopts.end = d.end;
  d.supervisor = spawn_node_supervisor(*d.sys, sopts);
  req.supervisor = caf::actor_cast<caf::actor>(d.supervisor);

  auto rdv = d.find_rendezvous();
  if (!rdv)
    return rdv.err();
  if (auto err = d.connect_peers_directly(*rdv))
    return err;
  auto joined = d.ask_rendezvous<join_reply>(*rdv, std::move(req));
  if (!joined)
    return joined.err();
  d.reply = std::move(*joined);
  d.close_doors();
  for (int i = 0; i < opts.ranks; ++i)
    caf::anon_send(d.comms[i], connect_peers{d.reply.first_rank + i, d.reply.comms});
  caf::anon_send(d.supervisor,
                 watch_nodes{d.reply.supervisors, d.reply.node_first_ranks, d.reply.world});
  return n;
}

node_setup node::setup() const {
  node_setup s;
  s.system = impl_->sys.get();
  s.world = impl_->reply.world;
  s.first_rank = impl_->reply.first_rank;
  for (auto& c : impl_->comms)
    s.comms.push_back(c);
  s.node_first_ranks.assign(impl_->reply.node_first_ranks.begin(),
                            impl_->reply.node_first_ranks.end());
  s.nccl_unique_id = impl_->reply.nccl_unique_id;
  s.end = impl_->end;
  return s;
}

// The table's Muon block layout and MuonClip pairing, which every process must agree on too.
static std::string muon_blocks_line(const param_spec& spec) {
  std::string line;
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i)
      s += (i ? "," : "") + std::to_string(v[i]);
    return s;
  };
  if (!spec.split_sizes.empty())
    line += ", split " + list(spec.split_sizes) + " heads " + list(spec.split_heads);
  if (spec.view != matrix_view::automatic)
    line += spec.view == matrix_view::expert_stack ? ", expert stack" : ", flatten";
  if (!spec.qk_clip_key.empty())
    line += ", qk clip " + spec.qk_clip_key + " " + std::to_string(spec.qk_clip_heads) + "/"
            + std::to_string(spec.qk_clip_key_heads);
  return line;
}

std::vector<std::string> table_lines(const std::vector<param_spec>& table) {
  std::vector<std::string> lines;
  for (const auto& spec : table) {
    std::string line = spec.name + " [";
    for (size_t i = 0; i < spec.shape.size(); ++i)
      line += (i ? ", " : "") + std::to_string(spec.shape[i]);
    const char* groups[] = {"automatic", "muon", "adamw"};
    line += "] " + std::string(groups[static_cast<int>(spec.group)]) + ", heads "
            + std::to_string(spec.heads);
    line += muon_blocks_line(spec);
    lines.push_back(line);
  }
  return lines;
}

void choose_comm(node_options& opts, const std::string& compute, const std::string& comm,
                 int first_device) {
#ifdef ZMUON_HAVE_NCCL
  if (compute != "cuda" || comm == "caf")
    return;
  opts.nccl_unique_id = [] {
    auto id = make_nccl_unique_id();
    return id ? *id : std::string();
  };
  opts.nccl_only_on_own_gpus = comm == "auto";
  auto gpus = compute_device_ids("cuda");
  if (first_device >= 0 && static_cast<int>(gpus.size()) >= first_device + opts.ranks)
    opts.gpus.assign(gpus.begin() + first_device, gpus.begin() + first_device + opts.ranks);
#else
  (void)first_device;
  (void)opts;
  (void)compute;
  (void)comm;
#endif
}

int node::world() const {
  return impl_->reply.world;
}

std::shared_ptr<const job_end> node::end() const {
  return impl_->end;
}

std::string node::name() const {
  return describe_node(impl_->opts.node_rank, impl_->reply.node_first_ranks, impl_->reply.world);
}

void node::step_started(uint64_t step) {
  caf::anon_send(impl_->supervisor, step_atom::value, step);
}

std::string node::explain_failure(const std::string& own_error) {
  auto& d = *impl_;
  std::string lost;
  caf::scoped_actor self{*d.sys};
  self->request(d.supervisor, std::chrono::seconds(10), failure_atom::value)
      .receive([&](std::string& what) { lost = std::move(what); }, [](caf::error&) {});
  if (lost.empty())
    caf::anon_send(d.supervisor, fail_atom::value, own_error);
  return lost;
}

error node::finish() {
  auto& d = *impl_;
  error failed;
  caf::scoped_actor self{*d.sys};
  self->request(d.supervisor, d.join_timeout(), finish_atom::value)
      .receive([](bool) {}, [&](caf::error& err) { failed = from_caf_error(err); });
  return failed;
}

bool tcp_reachable(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0)
    return false;
  bool open = false;
  for (addrinfo* a = found; a != nullptr && !open; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0)
      continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      open = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      open = ::poll(&p, 1, static_cast<int>(timeout.count())) == 1
             && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return open;
}

expected<std::pair<std::string, uint16_t>> parse_host_port(const std::string& text) {
  auto colon = text.rfind(':');
  auto bad = [&](const std::string& why) {
    return error{errc::invalid_argument, "--master '" + text + "': " + why};
  };
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    return bad("expected HOST:PORT");
  std::string port_text = text.substr(colon + 1);
  if (port_text.find_first_not_of("0123456789") != std::string::npos || port_text.size() > 5)
    return bad("the port must be a number in [0, 65535]");
  long port = std::stol(port_text);
  if (port > 65535)
    return bad("the port must be a number in [0, 65535]");
  return std::make_pair(text.substr(0, colon), static_cast<uint16_t>(port));
}

}  // namespace zmuon
