#include "node/node.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "caf/all.hpp"
#include "caf/io/all.hpp"

#include "comm/caf_comm.hpp"
#include "kernels/compute.hpp"
#include "node/node_supervisor.hpp"
#include "node/rendezvous.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"
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
    register_messages(*this);
    register_node_messages(*this);
    load<caf::io::middleman>();
    set("logger.verbosity", caf::atom("quiet"));
    // No automatic connections: with them on, the switch from the route through node 0 to a
    // direct connection sometimes killed the proxies of a live node ("lost in step 1:
    // remote_link_unreachable", 1 run in ~50 of test_multinode with 3 nodes). The nodes connect
    // to each other before they hold each other's handles instead (connect_peers_directly).
    set("middleman.enable-automatic-connections", false);
  }
};

// Writes `text` to `path` atomically (a reader never sees half of it).
error write_file_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << text;
    if (!out)
      return {errc::io_error, "cannot write '" + tmp + "': " + std::strerror(errno)};
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return {errc::io_error,
            "cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno)};
  return {};
}

node_door_actor::behavior_type door_impl(int32_t node) {
  return {[node](door_atom) { return node; }};
}

/// How long a node waits for another's door to take a connection before it goes through node 0.
constexpr std::chrono::milliseconds kDoorProbe{3000};

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// node_options::host's default.
std::string advertised_host(const node_options& opts) {
  if (!opts.host.empty())
    return opts.host;
  if (const char* env = std::getenv("ZMUON_NODE_HOST"); env != nullptr && *env != '\0')
    return env;
  if (is_loopback(opts.master_host))
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
  node_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::vector<caf_comm_actor> comms;
  rendezvous_actor rendezvous;  // node 0 only
  node_supervisor_actor supervisor;
  node_door_actor door;
  join_reply reply;

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
};

error node::impl::connect_peers_directly(const rendezvous_actor& rdv) {
  hello h{opts.node_rank, caf::actor_cast<caf::actor>(supervisor), advertised_host(opts), 0};
  const std::string who = "zmuon-launch[node " + std::to_string(opts.node_rank) + "]: ";
  if (opts.nodes > 2 && opts.node_rank > 0) {
    door = sys->spawn(door_impl, opts.node_rank);
    auto port = sys->middleman().publish(door, 0, h.host.c_str(), /*reuse_addr=*/true);
    if (port)
      h.port = *port;
    else
      std::fprintf(stderr,
                   "%scannot listen for the other nodes on %s (%s); their messages to this "
                   "node go through node 0\n",
                   who.c_str(), h.host.c_str(), sys->render(port.error()).c_str());
  }
  hello_reply doors;
  error failed;
  caf::scoped_actor self{*sys};
  self->request(rdv, join_timeout(), std::move(h))
      .receive([&](hello_reply& r) { doors = std::move(r); },
               [&](caf::error& err) { failed = join_failure(err); });
  if (failed)
    return failed;
  // Nodes 1..node_rank-1, each door first probed (all at once) with a short timeout: CAF's
  // connect would wait out the system's SYN retries (about two minutes) at a door a firewall
  // hides, past every other node's join timeout.
  const int lower = std::min<int>(opts.node_rank, static_cast<int>(doors.ports.size()));
  std::vector<char> reachable(static_cast<size_t>(std::max(lower, 0)), 0);
  {
    std::vector<std::thread> probes;
    for (int j = 1; j < lower; ++j)
      if (doors.ports[j] != 0)
        probes.emplace_back([&, j] {
          reachable[j] = tcp_reachable(doors.hosts[j], doors.ports[j], kDoorProbe) ? 1 : 0;
        });
    for (auto& t : probes)
      t.join();
  }
  for (int j = 1; j < lower; ++j) {
    if (doors.ports[j] == 0)
      continue;  // it said why on its own stderr
    const std::string where = doors.hosts[j] + ":" + std::to_string(doors.ports[j]);
    std::string problem;
    if (reachable[j] == 0) {
      problem = "no connection within " + std::to_string(kDoorProbe.count()) + " ms";
    } else if (auto found =
                   sys->middleman().remote_actor<node_door_actor>(doors.hosts[j], doors.ports[j]);
               !found) {
      problem = sys->render(found.error());
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
      std::fprintf(stderr,
                   "%sno direct connection to node %d at %s (%s); messages between "
                   "them go through node 0\n",
                   who.c_str(), j, where.c_str(), problem.c_str());
  }
  return {};
}

expected<rendezvous_actor> node::impl::find_rendezvous() {
  auto where = opts.master_host + ":" + std::to_string(opts.master_port);
  if (opts.node_rank == 0) {
    std::function<void(const std::string&)> progress;
    if (!opts.quiet)
      progress = [](const std::string& line) {
        std::printf("zmuon-launch[node 0]: %s\n", line.c_str());
        std::fflush(stdout);
      };
    rendezvous = spawn_rendezvous(*sys, opts.nodes, opts.nccl_unique_id, opts.nccl_only_on_own_gpus,
                                  std::move(progress));
    auto port = sys->middleman().publish(rendezvous, opts.master_port, opts.master_host.c_str(),
                                         /*reuse_addr=*/true);
    if (!port)
      return error{errc::comm_failure,
                   "node 0 cannot listen on " + where + ": " + sys->render(port.error())};
    std::string actual = opts.master_host + ":" + std::to_string(*port);
    if (!opts.quiet)
      std::printf("zmuon-launch[node 0]: rendezvous listening on %s\n", actual.c_str());
    std::fflush(stdout);
    if (!opts.rendezvous_file.empty())
      if (auto err = write_file_atomically(opts.rendezvous_file, actual + "\n"))
        return err;
    return rendezvous;
  }
  // Node 0 may not listen yet: retry until the join timeout.
  auto deadline = std::chrono::steady_clock::now() + join_timeout();
  for (;;) {
    auto found =
        sys->middleman().remote_actor<rendezvous_actor>(opts.master_host, opts.master_port);
    if (found)
      return *found;
    if (std::chrono::steady_clock::now() >= deadline)
      return error{errc::timeout, "node " + std::to_string(opts.node_rank)
                                      + " found no rendezvous at " + where + " within "
                                      + std::to_string(opts.join_timeout_ms)
                                      + " ms (zmuon.timeout_ms): " + sys->render(found.error())};
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
  std::unique_ptr<node> n(new node());
  auto& d = *n->impl_;
  d.opts = opts;
  d.cfg.set("scheduler.max-threads", node_scheduler_threads(opts.ranks));
  d.sys = std::make_unique<caf::actor_system>(d.cfg);
  join_request req{opts.node_rank, opts.ranks, table, job, {}, {}, opts.gpus};
  for (int i = 0; i < opts.ranks; ++i) {
    d.comms.push_back(spawn_caf_comm(*d.sys, 0, 1));  // rank and world come with connect_peers
    req.comms.push_back(caf::actor_cast<caf::actor>(d.comms.back()));
  }
  supervisor_options sopts;
  sopts.node = opts.node_rank;
  sopts.heartbeat_timeout = std::chrono::milliseconds(opts.heartbeat_timeout_ms);
  sopts.comms = d.comms;
  d.supervisor = spawn_node_supervisor(*d.sys, sopts);
  req.supervisor = caf::actor_cast<caf::actor>(d.supervisor);

  auto rdv = d.find_rendezvous();
  if (!rdv)
    return rdv.err();
  if (auto err = d.connect_peers_directly(*rdv))
    return err;
  error failed;
  caf::scoped_actor self{*d.sys};
  self->request(*rdv, d.join_timeout(), std::move(req))
      .receive([&](join_reply& reply) { d.reply = std::move(reply); },
               [&](caf::error& err) { failed = d.join_failure(err); });
  if (failed)
    return failed;
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
  return s;
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
    lines.push_back(line);
  }
  return lines;
}

void choose_comm(node_options& opts, const std::string& compute, const std::string& comm) {
#ifdef ZMUON_HAVE_NCCL
  if (compute != "cuda" || comm == "caf")
    return;
  opts.nccl_unique_id = [] {
    auto id = make_nccl_unique_id();
    return id ? *id : std::string();
  };
  opts.nccl_only_on_own_gpus = comm == "auto";
  auto gpus = compute_device_ids("cuda");
  if (static_cast<int>(gpus.size()) >= opts.ranks)
    opts.gpus.assign(gpus.begin(), gpus.begin() + opts.ranks);
#else
  (void)opts;
  (void)compute;
  (void)comm;
#endif
}

int node::world() const {
  return impl_->reply.world;
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
