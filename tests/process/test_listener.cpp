// The listener of a job against strangers (docs/SECURITY.md), with real zmuon-launch processes on
// loopback: node 0 out of file descriptors refuses connections and finishes its job; a thousand
// idle connections opened during the join are all closed once the job runs; floods of
// connect-and-hang-ups during the join never fail it, and the log names their address, not a
// node; plain TCP stays on loopback addresses and never takes a secret; no signal leaves a node's
// key on disk.
#define BOOST_TEST_MODULE listener
#include <boost/test/unit_test.hpp>

#include "support/run_launch.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

using namespace std::chrono_literals;
using zmuon::test::launch_process;
using clock_type = std::chrono::steady_clock;

bool exited_with(int status, int code) {
  return WIFEXITED(status) && WEXITSTATUS(status) == code;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// A secret file only its owner may read.
std::string secret_file(const std::string& name) {
  std::ofstream(name) << "f3a9c1d07b6e42a8915d2c4e8b0a7f635e1c9d2b7a04f86e3c15b9d0a2e7f418\n";
  ::chmod(name.c_str(), 0600);
  return fs::absolute(name).string();
}

/// The test's own descriptor limit up to its hard limit: it holds a thousand sockets.
void raise_own_file_limit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
}

/// A TCP connection from `from` (a loopback address) to 127.0.0.1:port; -1 when none opens.
int connect_from(const char* from, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &local.sin_addr);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0
      || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Whether the other end closed `fd` (end of file or a reset), waiting up to `timeout`.
bool closed_by_peer(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1)
    return false;
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

const std::string kJob = "--ranks-per-node 1 --seed 3 --set zmuon.timeout_ms=30000";

/// Node 0 of two, listening on a free port; `master` gets HOST:PORT. `shell_prefix` runs first
/// in node 0's shell (a ulimit).
struct node0 {
  pid_t pid = -1;
  int status = 0;
  bool exited = false;
  std::string log, master;

  node0(const std::string& args, const std::string& shell_prefix = "") {
    log = fs::absolute("test_listener_node0.log").string();
    const std::string file = fs::absolute("test_listener_rendezvous").string();
    std::remove(file.c_str());
    std::remove(log.c_str());
    const std::string cmd = shell_prefix + " exec " + std::string(ZMUON_LAUNCH)
                            + " --nodes 2 --node-rank 0 --master 127.0.0.1:0 --rendezvous-file "
                            + file + " " + args + " > " + log + " 2>&1";
    pid = ::fork();
    BOOST_REQUIRE(pid >= 0);
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    for (auto until = clock_type::now() + 20s; master.empty() && clock_type::now() < until;) {
      std::getline(std::ifstream(file) >> std::ws, master);
      std::this_thread::sleep_for(10ms);
    }
    BOOST_REQUIRE_MESSAGE(!master.empty(), output());
  }
  ~node0() {
    if (!exited) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
  uint16_t port() const {
    return static_cast<uint16_t>(std::stoi(master.substr(master.rfind(':') + 1)));
  }
  std::string output() const { return read_text(log); }
  bool wait(std::chrono::milliseconds timeout) {
    for (auto until = clock_type::now() + timeout; !exited; std::this_thread::sleep_for(5ms)) {
      if (::waitpid(pid, &status, WNOHANG) == pid)
        exited = true;
      else if (clock_type::now() >= until)
        return false;
    }
    return true;
  }
};

std::string first(const std::vector<std::string>& v) {
  return v.empty() ? std::string("none") : v.front();
}

/// The median of the step times ("time 5.95 ms") in a launcher's output.
double median_step_ms(const std::string& out) {
  std::regex step(R"(step +\d+ .* time ([0-9.]+) ms)");
  std::vector<double> ms;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), step); it != std::sregex_iterator();
       ++it)
    ms.push_back(std::stod((*it)[1]));
  if (ms.empty())
    return -1;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

// Node 0 at 256 descriptors (hard limit) with 300 idle connections: it used to abort ("cannot
// load certificate") when the TLS layer opened its files per connection. Now node 1 still joins
// and the job finishes. At 24 descriptors (about 12 in use while node 0 waits) the gate runs out
// of descriptors before it runs out of handshake slots: it drops stalled handshakes to take new
// connections, says so, and the job finishes too.
//
// Not under the sanitizers: their runtimes need descriptors of their own (UBSan tests whether a
// vptr is readable through a pipe, and reports a false "invalid vptr" when no pipe can be made),
// so there this case would test them. The normal suite runs it.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

boost::test_tools::assertion_result not_sanitized(boost::unit_test::test_unit_id) {
  return !kSanitized;
}

BOOST_AUTO_TEST_CASE(out_of_descriptors_node0_refuses_connections_and_finishes,
                     *boost::unit_test::precondition(not_sanitized)) {
  raise_own_file_limit();
  const std::string secret = secret_file("test_listener_secret");
  const std::string job = kJob + " --steps 4 --secret-file " + secret;
  for (int limit : {256, 24}) {
    BOOST_TEST_CONTEXT("ulimit -n " << limit) {
      node0 n0(job, "ulimit -n " + std::to_string(limit) + " &&");
      std::vector<int> idle;
      for (int i = 0; i < 300; ++i)
        if (int fd = connect_from("127.0.0.1", n0.port()); fd >= 0)
          idle.push_back(fd);
      BOOST_TEST(idle.size() == 300u);
      std::this_thread::sleep_for(500ms);  // node 0 accepts what it can
      launch_process n1("--nodes 2 --node-rank 1 --master " + n0.master + " " + job,
                        "test_listener_node1.log");
      BOOST_REQUIRE_MESSAGE(n0.wait(60s), n0.output());
      BOOST_REQUIRE(n1.wait(60s));
      BOOST_TEST(exited_with(n0.status, 0), n0.output());
      BOOST_TEST(exited_with(n1.status(), 0), n1.output());
      BOOST_TEST(
          std::regex_search(
              n0.output(), std::regex(R"(refused \d+ connections at port \d+ from: 127\.0\.0\.1)")),
          n0.output());
      if (limit == 24)
        BOOST_TEST(n0.output().find("out of file descriptors") != std::string::npos, n0.output());
      for (int fd : idle)
        ::close(fd);
    }
  }
}

// A thousand idle connections (from 127.0.0.2) opened while node 0 waits for node 1: once the
// job runs, node 0 has closed every one of them (each sees its end of file or a reset), and the
// log names their address. The median step time with them and of a clean run go to the test's
// output (docs/PERFORMANCE.md has a pair), not into an assertion.
BOOST_AUTO_TEST_CASE(idle_strangers_do_not_outlive_the_join) {
  raise_own_file_limit();
  const std::string secret = secret_file("test_listener_secret");
  const std::string job = kJob + " --steps 100 --secret-file " + secret;
  node0 n0(job);
  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i)
    if (int fd = connect_from("127.0.0.2", n0.port()); fd >= 0)
      idle.push_back(fd);
  BOOST_TEST(idle.size() == 1000u);
  launch_process n1("--nodes 2 --node-rank 1 --master " + n0.master + " " + job,
                    "test_listener_node1.log");
  BOOST_REQUIRE_MESSAGE(n1.wait_for_output("joined", 30s), n1.output());
  // The kernel's view, while node 0 trains: no connection of node 0's port with 127.0.0.2 left
  // (node 0 closes its door right after the join; a moment is allowed for that).
  std::string table;
  for (auto until = clock_type::now() + 2s; clock_type::now() < until;
       std::this_thread::sleep_for(50ms)) {
    int status = 0;
    table = zmuon::test::run_command(
        "ss -tnH state established '( sport = :" + std::to_string(n0.port()) + " )' dst 127.0.0.2",
        &status);
    BOOST_REQUIRE_MESSAGE(exited_with(status, 0), "ss (iproute2) failed: " << table);
    if (table.empty())
      break;
  }
  BOOST_TEST(n0.wait(0ms) == false, "node 0 ended before the check: " << n0.output());
  BOOST_TEST(table.empty(), "connections left in the kernel's table:\n" << table);
  // The strangers' view: each sees its end of file or a reset.
  size_t open = 0;
  for (int fd : idle)
    open += closed_by_peer(fd, 2s) ? 0 : 1;
  BOOST_TEST(open == 0u, open << " of 1000 stranger connections still open after the join");
  BOOST_REQUIRE_MESSAGE(n0.wait(60s), n0.output());
  BOOST_REQUIRE(n1.wait(60s));
  BOOST_TEST(exited_with(n0.status, 0), n0.output());
  BOOST_TEST(exited_with(n1.status(), 0), n1.output());
  BOOST_TEST(
      std::regex_search(n0.output(),
                        std::regex(R"(refused \d+ connections at port \d+ from: 127\.0\.0\.2)")),
      n0.output());
  const double attacked = median_step_ms(n0.output());
  for (int fd : idle)
    ::close(fd);

  node0 clean(job);
  launch_process c1("--nodes 2 --node-rank 1 --master " + clean.master + " " + job,
                    "test_listener_node1.log");
  BOOST_REQUIRE(clean.wait(60s));
  BOOST_REQUIRE(c1.wait(60s));
  BOOST_TEST_MESSAGE("median step, node 0, 100 steps: " << attacked
                                                        << " ms after 1000 idle "
                                                           "strangers during the join, "
                                                        << median_step_ms(clean.output())
                                                        << " ms in a clean run");
}

// Connect-and-hang-ups from 127.0.0.2 at about 100 and 1,000 a second while node 1 joins: once
// failed most such jobs ("node 0/1 was lost", both nodes blaming each other). Then 1,000 a second
// that each send the start of a TLS record and stall (they hold handshake slots until their
// deadline): node 1, from another address, still gets in. Four trials at
// each rate in CI ($ZMUON_FLOOD_TRIALS sets another count); every job finishes, no node is named
// as lost, and node 0's log names 127.0.0.2.
BOOST_AUTO_TEST_CASE(hang_up_floods_during_the_join_never_fail_the_job) {
  const std::string secret = secret_file("test_listener_secret");
  const std::string job = kJob + " --steps 3 --secret-file " + secret;
  raise_own_file_limit();
  struct flood_kind {
    int rate;
    bool stall;
  };
  for (const flood_kind kind : {flood_kind{100, false}, {1000, false}, {1000, true}}) {
    const int rate = kind.rate;
    const char* env = std::getenv("ZMUON_FLOOD_TRIALS");  // 10 for the issue's count
    const int trials = env != nullptr ? std::max(1, std::atoi(env)) : 4;
    for (int trial = 0; trial < trials; ++trial) {
      BOOST_TEST_CONTEXT("rate " << rate << "/s" << (kind.stall ? " stalling" : "") << ", trial "
                                 << trial) {
        node0 n0(job);
        std::atomic<bool> stop{false};
        std::atomic<int> sent{0};
        std::vector<int> stalled;
        std::thread flood([&] {
          const auto gap = std::chrono::microseconds(1'000'000 / rate);
          auto next = clock_type::now();
          while (!stop) {
            if (int fd = connect_from("127.0.0.2", n0.port()); fd >= 0) {
              if (kind.stall) {
                // A TLS record header announcing 255 bytes, then nothing.
                (void)!::write(fd, "\x16\x03\x01\x00\xff", 5);
                stalled.push_back(fd);
              } else {
                if (sent % 4 == 3) {  // every fourth a reset, the rest a plain close
                  linger hard{1, 0};
                  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
                }
                ::close(fd);
              }
              ++sent;
            }
            next += gap;
            std::this_thread::sleep_until(next);
          }
        });
        std::this_thread::sleep_for(300ms);
        launch_process n1("--nodes 2 --node-rank 1 --master " + n0.master + " " + job,
                          "test_listener_node1.log");
        const bool joined = n1.wait_for_output("joined", 30s);
        std::this_thread::sleep_for(200ms);
        stop = true;
        flood.join();
        for (int fd : stalled)
          ::close(fd);
        BOOST_TEST(joined, n1.output());
        BOOST_REQUIRE_MESSAGE(n0.wait(60s), n0.output());
        BOOST_REQUIRE(n1.wait(60s));
        BOOST_TEST(exited_with(n0.status, 0), n0.output());
        BOOST_TEST(exited_with(n1.status(), 0), n1.output());
        BOOST_TEST(n0.output().find("was lost") == std::string::npos, n0.output());
        BOOST_TEST(n1.output().find("was lost") == std::string::npos, n1.output());
        BOOST_TEST(n0.output().find("from: 127.0.0.2") != std::string::npos, n0.output());
        BOOST_TEST_MESSAGE("rate " << rate << "/s" << (kind.stall ? " stalling" : "") << ": "
                                   << sent << " connections during the join");
      }
    }
  }
}

// A node whose secret is not the job's is refused by node 0 and exits 2 (its credentials), not 3
// (a lost node: no node of its job was lost); node 0 logs it and goes on waiting.
BOOST_AUTO_TEST_CASE(a_refused_node_exits_for_its_credentials) {
  const std::string secret = secret_file("test_listener_secret");
  std::ofstream("test_listener_other")
      << "0b7e5f1c9a2d48e6b3f07c5d1e9a2b64d81f3a6c0e5b927d4a1f8c3e60b2d957\n";
  ::chmod("test_listener_other", 0600);
  node0 n0(kJob + " --steps 1 --secret-file " + secret);
  int status = 0;
  auto out = zmuon::test::run_launch("--nodes 2 --node-rank 1 --master " + n0.master + " " + kJob
                                         + " --steps 1 --set zmuon.timeout_ms=5000 --secret-file "
                                         + fs::absolute("test_listener_other").string() + " 2>&1",
                                     &status);
  BOOST_TEST(exited_with(status, 2), out);
  BOOST_TEST(out.find("the handshake with " + n0.master + " failed") != std::string::npos, out);
  BOOST_TEST(out.find("was lost") == std::string::npos, out);
  BOOST_TEST(n0.wait(0ms) == false, "node 0 ended: " << n0.output());
}

// Plain TCP binds to loopback addresses only, by what the address resolves to (a name that
// starts with "127." is no loopback address), and never runs with a secret given.
BOOST_AUTO_TEST_CASE(plain_tcp_stays_on_loopback_and_takes_no_secret) {
  const std::string secret = secret_file("test_listener_secret");
  int status = 0;
  for (const std::string master : {"10.0.0.1:1", "127.example.net:1", "0.0.0.0:1"}) {
    auto out = zmuon::test::run_launch(
        "--nodes 2 --node-rank 0 --master " + master + " --insecure --steps 1 2>&1", &status);
    BOOST_TEST(exited_with(status, 2), master << ": " << out);
    BOOST_TEST(out.find("for loopback addresses only") != std::string::npos, out);
  }
  // Node 2 of three would listen at its own address.
  for (const std::string host : {"--host 10.0.0.1", "--host 127.example.net"}) {
    auto out = zmuon::test::run_launch(
        "--nodes 3 --node-rank 2 --master 127.0.0.1:1 --insecure " + host + " --steps 1 2>&1",
        &status);
    BOOST_TEST(exited_with(status, 2), host << ": " << out);
    BOOST_TEST(out.find("for loopback addresses only") != std::string::npos, out);
  }
  auto out = zmuon::test::run_launch(
      "--nodes 2 --node-rank 1 --master 127.0.0.1:1 --insecure --secret-file " + secret
          + " --steps 1 2>&1",
      &status);
  BOOST_TEST(exited_with(status, 2), out);
  BOOST_TEST(out.find("exclude each other") != std::string::npos, out);
  // Loopback itself still runs.
  out = zmuon::test::run_launch("--local-nodes 2 --insecure --steps 1 2>&1", &status);
  BOOST_TEST(exited_with(status, 0), out);
}

// No node key on disk, whatever ends the node: SIGTERM, SIGINT, SIGHUP, SIGKILL and SIGABRT while
// it waits in the join or trains, and SIGTERM to a --local-nodes launcher. $TMPDIR (where keys once
// went) is a directory of the test's own, checked empty of any "zmuon-tls-" entry.
BOOST_AUTO_TEST_CASE(no_node_key_outlives_its_node) {
  const std::string secret = secret_file("test_listener_secret");
  const fs::path tmp = fs::absolute("test_listener_tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  fs::permissions(tmp, fs::perms::owner_all);
  const char* saved = std::getenv("TMPDIR");
  const std::string old_tmp = saved ? saved : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  auto key_files = [&] {
    std::vector<std::string> found;
    for (const auto& e : fs::recursive_directory_iterator(tmp))
      if (e.path().string().find("zmuon-tls-") != std::string::npos
          || e.path().filename() == "node.key")
        found.push_back(e.path().string());
    return found;
  };
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGKILL, SIGABRT}) {
    BOOST_TEST_CONTEXT("signal " << sig) {
      node0 n0(kJob + " --steps 1 --secret-file " + secret);  // waits in the join
      const auto left = key_files();
      ::kill(n0.pid, sig);
      BOOST_REQUIRE(n0.wait(20s));
      const auto after = key_files();
      BOOST_TEST(left.empty(), "a key on disk while node 0 runs: " << first(left));
      BOOST_TEST(after.empty(), "a key left behind: " << first(after));
    }
  }
  {
    launch_process job("--local-nodes 2 --steps 100000 " + kJob, "test_listener_local.log");
    BOOST_REQUIRE_MESSAGE(job.wait_for_output("step    2", 30s), job.output());
    const auto during = key_files();
    job.signal(SIGTERM);
    BOOST_REQUIRE(job.wait(30s));
    std::this_thread::sleep_for(500ms);  // the nodes, its children, end after it
    const auto after = key_files();
    BOOST_TEST(during.empty(), "a key on disk while the job runs: " << first(during));
    BOOST_TEST(after.empty(), "a key left behind: " << first(after));
  }
  if (saved)
    ::setenv("TMPDIR", old_tmp.c_str(), 1);
  else
    ::unsetenv("TMPDIR");
}

// A `latest` planted as a link to a file of someone else's (a secret, /etc/passwd) is refused
// without quoting what the file holds back.
BOOST_AUTO_TEST_CASE(a_planted_latest_is_not_quoted_back) {
  fs::remove_all("test_listener_resume");
  fs::create_directories("test_listener_resume");
  std::ofstream("test_listener_private") << "root:x:0:0:the-private-line\n";
  fs::create_symlink(fs::absolute("test_listener_private"), "test_listener_resume/latest");
  int status = 0;
  auto out = zmuon::test::run_launch("--steps 1 --resume test_listener_resume 2>&1", &status);
  BOOST_TEST(!exited_with(status, 0), out);
  BOOST_TEST(out.find("does not name a checkpoint") != std::string::npos, out);
  BOOST_TEST(out.find("the-private-line") == std::string::npos, out);
  BOOST_TEST(out.find("root:x") == std::string::npos, out);
}
