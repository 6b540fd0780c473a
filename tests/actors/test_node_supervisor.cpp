// The node supervisor on a real scheduler: its heartbeats must not wait for the ranks' compute.
// On the host backend a rank's Newton-Schulz runs inside an actor's handler for as long as it
// takes (seconds for a large table on few cores); if such handlers held every scheduler thread,
// the supervisor (a scheduled actor) would send no heartbeat and its peers would call the node
// lost. node_scheduler_threads keeps two threads beyond two computing handlers per rank. And a
// lost node ends the job, never the process.
#define BOOST_TEST_MODULE node_supervisor
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "caf/all.hpp"

#include "messages/registry.hpp"
#include "node/job_end.hpp"
#include "node/node.hpp"
#include "node/node_supervisor.hpp"

namespace {

using namespace std::chrono_literals;

struct node_like_config : caf::actor_system_config {
  explicit node_like_config(size_t threads) {
    zmuon::register_messages(*this);
    set("scheduler.max-threads", threads);
    set("logger.verbosity", caf::atom("quiet"));
  }
};

}  // namespace

// Two nodes' supervisors in one process whose scheduler is a node's of as many ranks as the
// machine has cores; every rank's coordinator and store then compute for five heartbeat
// timeouts at once. Neither supervisor may call the other lost. (With the former cores + 2
// threads, the computing handlers held them all and both nodes called each other lost.)
BOOST_AUTO_TEST_CASE(heartbeats_flow_while_every_rank_computes) {
  const int ranks = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  node_like_config cfg(zmuon::node_scheduler_threads(ranks));
  caf::actor_system sys{cfg};
  zmuon::supervisor_options opts;
  opts.heartbeat_timeout = 200ms;
  opts.failure_wait = 50ms;
  std::vector<zmuon::node_supervisor_actor> sups;
  for (int node = 0; node < 2; ++node) {
    opts.node = node;
    sups.push_back(zmuon::spawn_node_supervisor(sys, opts));
  }
  const zmuon::watch_nodes nodes{
      {caf::actor_cast<caf::actor>(sups[0]), caf::actor_cast<caf::actor>(sups[1])}, {0, 1}, 2};
  for (auto& s : sups)
    caf::anon_send(s, nodes);
  std::this_thread::sleep_for(300ms);
  std::vector<caf::actor> computing;
  for (int i = 0; i < 2 * ranks; ++i) {
    computing.push_back(sys.spawn(
        [](caf::event_based_actor*, int) -> caf::behavior {
          return {[](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }};
        },
        0));
    caf::anon_send(computing.back(), 1000);
  }
  std::this_thread::sleep_for(1300ms);  // the compute is over; any loss has been noticed
  caf::scoped_actor self{sys};
  for (int node = 0; node < 2; ++node) {
    std::string failure = "no answer";
    self->request(sups[static_cast<size_t>(node)], 5s, zmuon::failure_atom::value)
        .receive([&](const std::string& what) { failure = what; },
                 [&](const caf::error& e) { failure = sys.render(e); });
    BOOST_TEST(failure.empty(), "node " << node << ": " << failure);
  }
  for (auto& s : sups)
    caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  for (auto& c : computing)
    caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
}

// Node 1's supervisor stops (its process gone): node 0's supervisor writes the loss into its
// job_end and answers failure_atom with it, and this process still runs well past the time a
// supervisor that ended the process would have taken.
BOOST_AUTO_TEST_CASE(a_lost_node_ends_the_job_not_the_process) {
  node_like_config cfg(zmuon::node_scheduler_threads(1));
  caf::actor_system sys{cfg};
  auto end = std::make_shared<zmuon::job_end>();
  zmuon::supervisor_options opts;
  opts.heartbeat_timeout = 200ms;
  opts.failure_wait = 50ms;
  std::vector<zmuon::node_supervisor_actor> sups;
  for (int node = 0; node < 2; ++node) {
    opts.node = node;
    opts.end = node == 0 ? end : nullptr;
    sups.push_back(zmuon::spawn_node_supervisor(sys, opts));
  }
  const zmuon::watch_nodes nodes{
      {caf::actor_cast<caf::actor>(sups[0]), caf::actor_cast<caf::actor>(sups[1])}, {0, 2}, 3};
  for (auto& s : sups)
    caf::anon_send(s, nodes);
  caf::anon_send(sups[0], zmuon::step_atom::value, uint64_t{7});
  caf::anon_send(sups[1], zmuon::step_atom::value, uint64_t{7});
  std::this_thread::sleep_for(300ms);  // heartbeats have carried node 1's step to node 0
  BOOST_TEST(end->what().empty());
  caf::anon_send_exit(sups[1], caf::exit_reason::kill);
  const std::string lost = end->wait(5s);
  BOOST_TEST(
      lost.rfind("node 1 (rank 2) lost in step 7: its process or connection is gone", 0) == 0,
      lost);
  caf::scoped_actor self{sys};
  std::string failure;
  self->request(sups[0], 5s, zmuon::failure_atom::value)
      .receive([&](const std::string& what) { failure = what; },
               [&](const caf::error& e) { failure = sys.render(e); });
  BOOST_TEST(failure == lost);
  // The former supervisor ended its process 5 s after a loss.
  std::this_thread::sleep_for(6s);
  BOOST_TEST(end->what() == lost);
  caf::anon_send_exit(sups[0], caf::exit_reason::user_shutdown);
}
