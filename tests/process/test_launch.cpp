// zmuon-launch as a user runs it: the loss goes down, --save-params writes a safetensors file
// whose header a reader accepts, and a terminal gets a progress line.
#define BOOST_TEST_MODULE launch
#include <boost/test/unit_test.hpp>

#include "support/run_launch.hpp"

#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.hpp"
#include "zmuon-launch/local_nodes.hpp"
#include "zmuon-launch/model.hpp"

namespace {

std::vector<double> losses(const std::string& out) {
  std::vector<double> v;
  std::regex line(R"(step\s+\d+\s+loss\s+([0-9.eE+-]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
    v.push_back(std::stod((*it)[1]));
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(default_job_trains_and_saves_params) {
  std::string path = "test_launch_params.safetensors";
  std::remove(path.c_str());
  int status = 0;
  auto out = zmuon::test::run_launch("--steps 30 --save-params " + path, &status);
  BOOST_TEST_MESSAGE(out);
  BOOST_REQUIRE_EQUAL(status, 0);
  auto l = losses(out);
  BOOST_REQUIRE_EQUAL(l.size(), 30u);
  BOOST_TEST_MESSAGE("loss: first " << l.front() << ", last " << l.back());
  BOOST_TEST(l.back() < 0.5 * l.front());

  // Parse the header independently: 8-byte little-endian length, JSON, offsets in order.
  std::ifstream in(path, std::ios::binary);
  BOOST_REQUIRE(in);
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i)
    len = len << 8 | len_bytes[i];
  std::string header(len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(len));
  auto j = nlohmann::json::parse(header);
  in.seekg(0, std::ios::end);
  auto data_bytes = static_cast<uint64_t>(in.tellg()) - 8 - len;
  auto table = zmuon::example::param_table({});
  uint64_t covered = 0;
  for (const auto& spec : table) {
    BOOST_REQUIRE(j.contains(spec.name));
    auto& t = j[spec.name];
    BOOST_TEST(t["dtype"] == "F32");
    BOOST_TEST(t["shape"].get<std::vector<int64_t>>() == spec.shape);
    auto off = t["data_offsets"].get<std::vector<uint64_t>>();
    uint64_t n = 1;
    for (auto d : spec.shape)
      n *= d;
    BOOST_TEST(off[1] - off[0] == n * 4);
    covered += off[1] - off[0];
  }
  BOOST_TEST(covered == data_bytes);
  auto back = zmuon::read_safetensors(path);
  BOOST_REQUIRE(back);
  BOOST_TEST(back->size() == table.size());
}

BOOST_AUTO_TEST_CASE(bad_flags_are_errors) {
  int status = 0;
  auto out = zmuon::test::run_launch("--ranks 0", &status);
  BOOST_TEST(status != 0);
  BOOST_TEST(out.find("--ranks") != std::string::npos);
  out = zmuon::test::run_launch("--stpes 3", &status);
  BOOST_TEST(status != 0);
  BOOST_TEST(out.find("unknown flag '--stpes' (did you mean '--steps'?)") != std::string::npos,
             out);
  out = zmuon::test::run_launch("--adam_lr=0.1 --seed 2", &status);  // '_' for '-', with a value
  BOOST_TEST(status != 0);
  BOOST_TEST(out.find("unknown flag '--adam_lr' (did you mean '--adam-lr'?)") != std::string::npos,
             out);
  // Range errors say the range, not DBL_MAX's 300 digits; a seed is a uint64_t, not wrapped.
  for (const auto& [flags, says] :
       {std::pair{"--bucket-size 0", "must be > 0, got 0"}, std::pair{"--steps -1", ">= 0, got -1"},
        std::pair{"--seed -1", "whole number from 0 to 18446744073709551615, got -1"},
        std::pair{"--seed 18446744073709551616", "got 18446744073709551616"}}) {
    out = zmuon::test::run_launch(flags, &status);
    BOOST_TEST(WEXITSTATUS(status) == 2, flags);
    BOOST_TEST(out.find(says) != std::string::npos, out);
    BOOST_TEST(out.find("17976931348623157") == std::string::npos, out);
  }
  out = zmuon::test::run_launch("--zzzzzzzz", &status);  // nothing near: no suggestion
  BOOST_TEST(status != 0);
  BOOST_TEST(out.find("zzzzzzzz") != std::string::npos, out);
  BOOST_TEST(out.find("did you mean") == std::string::npos, out);
}

// On a terminal the steps are one updating line (carriage return, erase line) with the step
// count, loss, step time and ETA, not one line per step.
BOOST_AUTO_TEST_CASE(progress_on_a_terminal_is_one_updating_line) {
  int master = -1;
  pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::execl(ZMUON_LAUNCH, ZMUON_LAUNCH, "--steps", "5", static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;)  // EIO once the child is gone
    out.append(buf, static_cast<size_t>(n));
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(master);
  BOOST_TEST_MESSAGE(out);
  BOOST_REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int s = 1; s <= 5; ++s)
    BOOST_TEST(out.find("\r\033[Kstep " + std::to_string(s) + "/5  loss ") != std::string::npos);
  BOOST_TEST(out.find("ms/step  ETA ") != std::string::npos);
  BOOST_TEST(out.find("grad_norm") == std::string::npos);  // no plain lines
  BOOST_TEST(losses(out).empty());
}

// --local-nodes on GPUs: each node gets its own run of the visible GPUs, from the launcher's
// CUDA_VISIBLE_DEVICES (indices or UUIDs) or, unset, from the device count; none when there are
// fewer GPUs than ranks (the nodes then share them).
BOOST_AUTO_TEST_CASE(local_nodes_get_their_own_gpus) {
  using zmuon::example::node_visible_devices;
  BOOST_TEST(node_visible_devices(nullptr, 8, 2, 4, 0) == "0,1,2,3");
  BOOST_TEST(node_visible_devices(nullptr, 8, 2, 4, 1) == "4,5,6,7");
  BOOST_TEST(node_visible_devices(nullptr, 8, 2, 3, 1) == "3,4,5");  // two left over
  BOOST_TEST(node_visible_devices("4,5,6,7", 4, 2, 2, 0) == "4,5");
  BOOST_TEST(node_visible_devices("4,5,6,7", 4, 2, 2, 1) == "6,7");
  BOOST_TEST(node_visible_devices("4,,5", 2, 2, 1, 1) == "5");  // empty entries skipped
  BOOST_TEST(node_visible_devices("GPU-a1,GPU-b2", 2, 2, 1, 1) == "GPU-b2");
  BOOST_TEST(node_visible_devices(nullptr, 1, 2, 1, 0).empty());  // one GPU, two nodes
  BOOST_TEST(node_visible_devices("0,1", 8, 2, 2, 0).empty());    // the list, not the count
  BOOST_TEST(node_visible_devices(nullptr, 0, 2, 1, 0).empty());  // no GPU
  BOOST_TEST(node_visible_devices(nullptr, 8, 2, 4, 2).empty());  // no such node
}
