// The rendezvous actor alone, under CAF's testing scheduler: ranks in node-rank order whatever
// the join order, no answer before every node is in, the first difference between nodes named to
// all of them, bad joins refused one by one, a node dying while others join, the hello phase's
// doors, the NCCL id hook
// and comm "auto"'s decision from the GPUs the nodes bring.
// Plus the small pure helpers of the launch (describe_node, parse_host_port).
#define BOOST_TEST_MODULE rendezvous
#include <boost/test/unit_test.hpp>

#include "support/actor_fixture.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "node/node.hpp"
#include "node/node_supervisor.hpp"
#include "node/rendezvous.hpp"

namespace {

using zmuon::join_reply;
using zmuon::join_request;
using zmuon::test::actor_fixture;

const std::vector<std::string> table{"a [4, 4] automatic, heads 0", "b [4] automatic, heads 0"};
const std::string job = R"({"optimizer": {"params": {"momentum": 0.95}}, "launch": {"seed": 1}})";

struct fixture : actor_fixture {
  /// An actor that does nothing: a stand-in for a supervisor or a comm actor.
  caf::actor idle() {
    // One spawn argument: CAF 0.17 dereferences a null argument tuple when there is none (UBSan).
    return keep(
        sys.spawn([](caf::event_based_actor*, int) -> caf::behavior { return {[](int) {}}; }, 0));
  }

  join_request request(int node, int ranks) {
    join_request req{node, ranks, table, job, idle(), {}, {}};
    for (int i = 0; i < ranks; ++i)
      req.comms.push_back(idle());
    return req;
  }
};

}  // namespace

BOOST_FIXTURE_TEST_CASE(ranks_follow_node_ranks_whatever_the_join_order, fixture) {
  auto rdv = keep(zmuon::spawn_rendezvous(sys, 3));
  auto r2 = request(2, 3), r0 = request(0, 2), r1 = request(1, 1);
  auto a2 = ask<join_reply>(rdv, r2);
  auto a0 = ask<join_reply>(rdv, r0);
  run();
  BOOST_TEST(!a2->done);  // no answer before every node is in
  BOOST_TEST(!a0->done);
  auto a1 = ask<join_reply>(rdv, r1);
  run();
  std::vector<caf::actor> comms;
  for (auto* r : {&r0, &r1, &r2})
    comms.insert(comms.end(), r->comms.begin(), r->comms.end());
  int node = 0;
  for (auto* a : {&a0, &a1, &a2}) {
    const auto& reply = zmuon::test::value_of(*a);
    BOOST_TEST(reply.world == 6);
    BOOST_TEST(reply.node_first_ranks == (std::vector<int32_t>{0, 2, 3}));
    BOOST_TEST(reply.first_rank == reply.node_first_ranks[node]);
    BOOST_TEST((reply.comms == comms));
    BOOST_TEST((reply.supervisors
                == std::vector<caf::actor>{r0.supervisor, r1.supervisor, r2.supervisor}));
    BOOST_TEST(reply.nccl_unique_id.empty());
    ++node;
  }
}

BOOST_FIXTURE_TEST_CASE(every_node_hears_the_first_difference, fixture) {
  struct case_t {
    std::function<void(join_request&)> change;  // applied to node 1's request
    std::string expected;
  };
  const std::vector<case_t> cases = {
      {[](join_request& r) { r.table[1] = "b [5] automatic, heads 0"; },
       "the parameter table of node 1 differs from node 0's at entry 1: node 0 has 'b [4] "
       "automatic, heads 0', node 1 has 'b [5] automatic, heads 0'"},
      {[](join_request& r) { r.table.pop_back(); },
       "the parameter table of node 1 differs from node 0's: node 0 has 2 parameters, node 1 has "
       "1"},
      {[](join_request& r) {
         r.job = R"({"optimizer": {"params": {"momentum": 0.9}}, "launch": {"seed": 1}})";
       },
       "the config of node 1 differs from node 0's at 'optimizer.params.momentum': node 0 has "
       "0.95, node 1 has 0.9"},
      {[](join_request& r) { r.job = R"({"optimizer": {"params": {"momentum": 0.95}}})"; },
       "the config of node 1 differs from node 0's at 'launch.seed': node 0 has 1, node 1 has "
       "nothing"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.expected) {
      auto rdv = keep(zmuon::spawn_rendezvous(sys, 2));
      auto r1 = request(1, 1);
      c.change(r1);
      auto a0 = ask<join_reply>(rdv, request(0, 1));
      auto a1 = ask<join_reply>(rdv, r1);
      run();
      zmuon::test::check_error(a0, zmuon::errc::invalid_argument, c.expected);
      // Node 1 hears only its own side: node 0's settings are not told to another process.
      const auto node1_side = zmuon::first_difference(request(0, 1), r1, false);
      BOOST_TEST(node1_side.find("node 0 has") == std::string::npos);
      BOOST_TEST(c.expected.find(node1_side.substr(0, node1_side.find(':'))) == 0);
      zmuon::test::check_error(a1, zmuon::errc::invalid_argument, node1_side);
      BOOST_TEST(zmuon::first_difference(r1, r1).empty());
    }
  }
}

// A config nested 10^5 deep crashed node 0 (the walk of its leaves recursed without a limit); a
// huge one cost seconds. Both are refused by name, and node 0 lives on.
BOOST_FIXTURE_TEST_CASE(a_hostile_job_description_is_refused_not_walked, fixture) {
  const size_t depth = 100000;
  for (const std::string& hostile :
       {std::string(depth, '[') + std::string(depth, ']'), std::string(size_t(5) << 20, ' ')}) {
    auto rdv = keep(zmuon::spawn_rendezvous(sys, 2));
    auto r1 = request(1, 1);
    r1.job = hostile;
    auto a0 = ask<join_reply>(rdv, request(0, 1));
    auto a1 = ask<join_reply>(rdv, r1);
    run();
    if (hostile.size() > (size_t(4) << 20)) {
      zmuon::test::check_error(a1, zmuon::errc::invalid_argument,
                               "more than the 4194304 a job may");
      BOOST_TEST(!a0->done);  // node 0 still waits for a node 1
    } else {
      zmuon::test::check_error(a1, zmuon::errc::invalid_argument,
                               "the config of node 1 differs from node 0's at '(config)'");
      zmuon::test::check_error(a0, zmuon::errc::invalid_argument, "unreadable JSON");
    }
  }
}

BOOST_FIXTURE_TEST_CASE(bad_joins_are_refused_one_by_one, fixture) {
  auto rdv = keep(zmuon::spawn_rendezvous(sys, 2));
  auto a0 = ask<join_reply>(rdv, request(0, 1));
  auto out_of_range = ask<join_reply>(rdv, request(2, 1));
  auto again = ask<join_reply>(rdv, request(0, 1));
  auto no_comms = request(1, 2);
  no_comms.comms.pop_back();
  auto short_of_comms = ask<join_reply>(rdv, no_comms);
  run();
  zmuon::test::check_error(out_of_range, zmuon::errc::invalid_argument,
                           "node rank 2 is outside [0, 2)");
  zmuon::test::check_error(again, zmuon::errc::invalid_argument, "node rank 0 joined twice");
  zmuon::test::check_error(short_of_comms, zmuon::errc::invalid_argument,
                           "node 1 brings 1 comm actors for 2 ranks");
  BOOST_TEST(!a0->done);  // the good join still waits, and completes with node 1
  auto a1 = ask<join_reply>(rdv, request(1, 1));
  run();
  BOOST_TEST(zmuon::test::value_of(a0).world == 2);
  BOOST_TEST(zmuon::test::value_of(a1).first_rank == 1);
}

BOOST_FIXTURE_TEST_CASE(a_node_lost_while_joining_fails_the_others_at_once, fixture) {
  auto rdv = keep(zmuon::spawn_rendezvous(sys, 3));
  auto r1 = request(1, 1);
  auto a0 = ask<join_reply>(rdv, request(0, 1));
  auto a1 = ask<join_reply>(rdv, r1);
  run();
  caf::anon_send_exit(r1.supervisor, caf::exit_reason::kill);
  run();
  zmuon::test::check_error(a0, zmuon::errc::comm_failure,
                           "node 1 was lost while the nodes were joining");
  auto a2 = ask<join_reply>(rdv, request(2, 1));  // a late node hears it too
  run();
  zmuon::test::check_error(a2, zmuon::errc::comm_failure, "node 1 was lost");
}

// Node 0 says which nodes are in as they arrive (first contact: hello or join), and which it
// still waits for; a refused request says nothing.
BOOST_FIXTURE_TEST_CASE(each_arriving_node_is_named_with_those_still_awaited, fixture) {
  std::vector<std::string> lines;
  auto rdv = keep(zmuon::spawn_rendezvous(sys, 3, {}, false,
                                          [&](const std::string& l) { lines.push_back(l); }));
  auto h2 = ask<zmuon::hello_reply>(rdv, zmuon::hello{2, idle(), "host-c", 7002});
  auto bad = ask<join_reply>(rdv, request(3, 1));
  auto a0 = ask<join_reply>(rdv, request(0, 1));
  run();
  zmuon::test::check_error(bad, zmuon::errc::invalid_argument, "node rank 3 is outside");
  BOOST_TEST(lines
                 == (std::vector<std::string>{"node 2 is in (1 of 3 nodes; waiting for nodes "
                                              "0, 1)",
                                              "node 0 is in (2 of 3 nodes; waiting for node 1)"}),
             boost::test_tools::per_element());
  auto a1 = ask<join_reply>(rdv, request(1, 1));
  auto a2 = ask<join_reply>(rdv, request(2, 1));  // node 2's join after its hello: no new line
  run();
  BOOST_REQUIRE_EQUAL(lines.size(), 3u);
  BOOST_TEST(lines[2] == "node 1 is in (3 of 3 nodes)");
  BOOST_TEST(zmuon::test::value_of(a2).world == 3);
}

// hello: every node's door, answered to all once all said it (no handles in it), refused for a
// bad or repeated node rank; a node lost after its hello fails the others' hello and join.
BOOST_FIXTURE_TEST_CASE(hello_hands_every_node_the_doors_once_all_said_it, fixture) {
  auto rdv = keep(zmuon::spawn_rendezvous(sys, 3));
  auto h2 = ask<zmuon::hello_reply>(rdv, zmuon::hello{2, idle(), "host-c", 7002});
  auto h0 = ask<zmuon::hello_reply>(rdv, zmuon::hello{0, idle(), "host-a", 0});
  auto bad = ask<zmuon::hello_reply>(rdv, zmuon::hello{3, idle(), "x", 1});
  auto twice = ask<zmuon::hello_reply>(rdv, zmuon::hello{2, idle(), "x", 1});
  run();
  zmuon::test::check_error(bad, zmuon::errc::invalid_argument, "node rank 3 is outside [0, 3)");
  zmuon::test::check_error(twice, zmuon::errc::invalid_argument, "node rank 2 said hello twice");
  BOOST_TEST(!h2->done);
  BOOST_TEST(!h0->done);
  auto h1 = ask<zmuon::hello_reply>(rdv, zmuon::hello{1, idle(), "host-b", 7001});
  run();
  for (auto* h : {&h0, &h1, &h2}) {
    const auto& doors = zmuon::test::value_of(*h);
    BOOST_TEST(doors.hosts == (std::vector<std::string>{"host-a", "host-b", "host-c"}));
    BOOST_TEST(doors.ports == (std::vector<uint16_t>{0, 7001, 7002}));
  }

  auto rdv2 = keep(zmuon::spawn_rendezvous(sys, 3));
  auto lost = idle();
  auto g0 = ask<zmuon::hello_reply>(rdv2, zmuon::hello{0, idle(), "a", 0});
  auto g1 = ask<zmuon::hello_reply>(rdv2, zmuon::hello{1, lost, "b", 1});
  run();
  caf::anon_send_exit(lost, caf::exit_reason::kill);
  run();
  zmuon::test::check_error(g0, zmuon::errc::comm_failure,
                           "node 1 was lost while the nodes were joining");
  auto j2 = ask<join_reply>(rdv2, request(2, 1));
  run();
  zmuon::test::check_error(j2, zmuon::errc::comm_failure, "node 1 was lost");
}

BOOST_FIXTURE_TEST_CASE(the_nccl_unique_id_goes_to_every_node, fixture) {
  int made = 0;
  auto rdv = keep(zmuon::spawn_rendezvous(sys, 2, [&made] {
    ++made;
    return std::string("\x01\x00\x02", 3);
  }));
  auto a0 = ask<join_reply>(rdv, request(0, 1));
  auto a1 = ask<join_reply>(rdv, request(1, 1));
  run();
  BOOST_TEST(made == 1);
  BOOST_TEST(zmuon::test::value_of(a0).nccl_unique_id == std::string("\x01\x00\x02", 3));
  BOOST_TEST(zmuon::test::value_of(a1).nccl_unique_id == std::string("\x01\x00\x02", 3));
}

// comm "auto" across processes: the id (and so nccl) only when every rank of the job has a GPU
// of its own. Nodes on one host may see the same GPU; a node without GPUs lists none.
BOOST_FIXTURE_TEST_CASE(auto_comm_is_nccl_only_on_gpus_of_their_own, fixture) {
  using gpus = std::vector<std::string>;
  struct job_case {
    gpus node0, node1;  // node 0 runs 2 ranks, node 1 one
    bool nccl;
  };
  const job_case cases[] = {
      {{"GPU-a", "GPU-b"}, {"GPU-c"}, true},
      {{"GPU-a", "GPU-b"}, {"GPU-a"}, false},  // node 1 shares node 0's first GPU
      {{"GPU-a", "GPU-a"}, {"GPU-c"}, false},  // two ranks on one GPU
      {{"GPU-a", "GPU-b"}, {}, false},         // node 1 cannot run nccl (host backend, no GPU)
      {{"GPU-a"}, {"GPU-c"}, false},           // fewer GPUs than ranks on node 0
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT("node 0 " << c.node0.size() << " GPUs, node 1 " << c.node1.size()) {
      int made = 0;
      auto rdv = keep(zmuon::spawn_rendezvous(
          sys, 2,
          [&made] {
            ++made;
            return std::string("id");
          },
          /*only_on_own_gpus=*/true));
      auto r0 = request(0, 2), r1 = request(1, 1);
      r0.gpus = c.node0;
      r1.gpus = c.node1;
      auto a0 = ask<join_reply>(rdv, r0);
      auto a1 = ask<join_reply>(rdv, r1);
      run();
      BOOST_TEST(made == (c.nccl ? 1 : 0));
      for (auto* a : {&a0, &a1})
        BOOST_TEST(zmuon::test::value_of(*a).nccl_unique_id == (c.nccl ? "id" : ""));
    }
  }
  // comm "nccl": the id whatever the GPUs (the engines then refuse what NCCL cannot run).
  auto rdv = keep(zmuon::spawn_rendezvous(sys, 1, [] { return std::string("id"); }));
  auto a = ask<join_reply>(rdv, request(0, 2));
  run();
  BOOST_TEST(zmuon::test::value_of(a).nccl_unique_id == "id");
}

BOOST_AUTO_TEST_CASE(helpers) {
  BOOST_TEST(zmuon::describe_node(1, {0, 2, 3}, 6) == "node 1 (rank 2)");
  BOOST_TEST(zmuon::describe_node(2, {0, 2, 3}, 6) == "node 2 (ranks 3-5)");
  BOOST_TEST(zmuon::describe_node(0, {0, 2, 3}, 6) == "node 0 (ranks 0-1)");
  auto hp = zmuon::parse_host_port("node0.cluster:29500");
  BOOST_REQUIRE(hp);
  BOOST_TEST(hp->first == "node0.cluster");
  BOOST_TEST(hp->second == 29500);
  for (const char* bad : {"host", "host:", ":80", "host:65536", "host:8o"})
    BOOST_TEST(!zmuon::parse_host_port(bad), bad);
}

// The door probe: a listening port opens, a closed one does not, and a port that drops the
// handshake (a listener whose queue of unaccepted connections is full: the kernel drops new
// SYNs, as a firewall would) answers no after the timeout, not the system's minutes.
BOOST_AUTO_TEST_CASE(tcp_probe) {
  using namespace std::chrono;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  BOOST_REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  BOOST_REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  BOOST_REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const uint16_t port = ntohs(addr.sin_port);
  BOOST_TEST(!zmuon::tcp_reachable("127.0.0.1", port, 1000ms));  // bound, not listening
  BOOST_REQUIRE(::listen(fd, 4) == 0);
  BOOST_TEST(zmuon::tcp_reachable("127.0.0.1", port, 1000ms));
  ::close(fd);
  BOOST_TEST(!zmuon::tcp_reachable("no such host name", 80, 1000ms));

  const int full = ::socket(AF_INET, SOCK_STREAM, 0);
  addr.sin_port = 0;
  BOOST_REQUIRE(::bind(full, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  BOOST_REQUIRE(::getsockname(full, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  BOOST_REQUIRE(::listen(full, 0) == 0);
  std::vector<int> queued;  // connections nobody accepts
  for (int i = 0; i < 3; ++i) {
    queued.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
    (void)::connect(queued.back(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  }
  std::this_thread::sleep_for(100ms);
  const auto start = steady_clock::now();
  BOOST_TEST(!zmuon::tcp_reachable("127.0.0.1", ntohs(addr.sin_port), 300ms));
  const auto waited = duration_cast<milliseconds>(steady_clock::now() - start).count();
  BOOST_TEST_MESSAGE("probe of a full listener: no after " << waited << " ms");
  BOOST_TEST(waited >= 250);
  BOOST_TEST(waited < 1000);
  for (int q : queued)
    ::close(q);
  ::close(full);
}
