// The node supervisor on a real scheduler: its heartbeats must not wait for the node's compute.
// On the host backend a rank's Newton-Schulz runs inside an actor's handler for as long as it
// takes (seconds for a large table on few cores); if such handlers held every scheduler thread,
// a supervisor sharing them would send no heartbeat and its peers would call the node lost.
#define BOOST_TEST_MODULE node_supervisor
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "caf/all.hpp"

#include "launch/node_supervisor.hpp"
#include "messages/registry.hpp"

namespace {

using namespace std::chrono_literals;

struct one_thread_config : caf::actor_system_config {
  one_thread_config() {
    zmuon::register_messages(*this);
    set("scheduler.max-threads", size_t{1});
    set("logger.verbosity", caf::atom("quiet"));
  }
};

}  // namespace

// Two nodes' supervisors in one process whose scheduler has one thread, which an actor then holds
// for five heartbeat timeouts. Neither supervisor may call the other lost.
BOOST_AUTO_TEST_CASE(heartbeats_flow_while_every_scheduler_thread_computes) {
  one_thread_config cfg;
  caf::actor_system sys{cfg};
  zmuon::supervisor_options opts;
  opts.heartbeat_timeout = 200ms;
  opts.failure_wait = 50ms;
  opts.grace = 1h;  // a loss must show in failure_atom, not end the test process
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
  auto compute = sys.spawn(
      [](caf::event_based_actor*, int) -> caf::behavior {
        return {[](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }};
      },
      0);
  caf::anon_send(compute, 1000);
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
  caf::anon_send_exit(compute, caf::exit_reason::user_shutdown);
}
