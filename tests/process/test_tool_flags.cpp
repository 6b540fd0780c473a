// The tools' common flags: --version prints the CMake project's version, and --log-level (or
// $ZMUON_LOG_LEVEL, which the flag overrides) chooses which messages reach stderr; errors always
// do.
#define BOOST_TEST_MODULE tool_flags
#include <boost/test/unit_test.hpp>

#include "support/run_launch.hpp"

#include <filesystem>
#include <string>

namespace {

int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const std::string no_step_left = "no step is left to train";

}  // namespace

BOOST_AUTO_TEST_CASE(version_is_the_projects) {
  int status = 0;
  auto out = zmuon::test::run_launch("--version", &status);
  BOOST_TEST(exit_code(status) == 0, out);
  BOOST_TEST(out == std::string("zmuon-launch ") + ZMUON_PROJECT_VERSION + "\n");
  out = zmuon::test::run_command(std::string(ZMUON_TRACE_TOOL) + " --version", &status);
  BOOST_TEST(exit_code(status) == 0, out);
  BOOST_TEST(out == std::string("zmuon-trace ") + ZMUON_PROJECT_VERSION + "\n");
}

// A resume from a checkpoint at the last step warns that no step is left: shown at warn and
// more, hidden at error, by the flag or the environment.
BOOST_AUTO_TEST_CASE(log_level_chooses_the_messages_shown) {
  const std::string dir = "test_tool_flags_ckpt";
  std::filesystem::remove_all(dir);
  int status = 0;
  auto out = zmuon::test::run_launch("--steps 2 --save-checkpoint " + dir + " --every 2", &status);
  BOOST_REQUIRE_MESSAGE(exit_code(status) == 0, out);
  const std::string resume = " --steps 2 --resume " + dir;
  const std::string launch = ZMUON_LAUNCH;
  struct run {
    std::string env, flag;
    bool warning_shown;
  };
  for (const auto& r :
       {run{"", "", true}, run{"", "--log-level warn", true}, run{"", "--log-level trace", true},
        run{"", "--log-level error", false}, run{"ZMUON_LOG_LEVEL=error", "", false},
        run{"ZMUON_LOG_LEVEL=ERROR", "", false},
        run{"ZMUON_LOG_LEVEL=error", "--log-level info", true},
        run{"ZMUON_LOG_LEVEL=debug", "--log-level error", false}}) {
    BOOST_TEST_CONTEXT("'" << r.env << "' '" << r.flag << "'") {
      out =
          zmuon::test::run_command("env " + r.env + " " + launch + " " + r.flag + resume, &status);
      BOOST_TEST(exit_code(status) == 0, out);
      BOOST_TEST(
          (out.find("zmuon-launch: the checkpoint is at step 2 and --steps is 2: " + no_step_left)
           != std::string::npos)
              == r.warning_shown,
          out);
    }
  }
  // An error shows at every level; a bad level is bad input.
  out = zmuon::test::run_launch("--log-level error --resume test_tool_flags_nowhere", &status);
  BOOST_TEST(exit_code(status) == 1, out);
  BOOST_TEST(out.find("zmuon-launch: cannot resume: ") != std::string::npos, out);
  out = zmuon::test::run_launch("--log-level loud", &status);
  BOOST_TEST(exit_code(status) == 2, out);
  BOOST_TEST(out.find("--log-level") != std::string::npos, out);
  out = zmuon::test::run_command("env ZMUON_LOG_LEVEL=loud " + launch + " --steps 1", &status);
  BOOST_TEST(exit_code(status) == 0, out);
  BOOST_TEST(out.find("zmuon: ZMUON_LOG_LEVEL 'loud' is not a level") != std::string::npos, out);
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(zmuon_trace_takes_the_log_level) {
  int status = 0;
  const std::string trace = ZMUON_TRACE_TOOL;
  auto out = zmuon::test::run_command(trace + " --log-level error summary test_tool_flags_nowhere",
                                      &status);
  BOOST_TEST(exit_code(status) == 2, out);
  BOOST_TEST(out.rfind("zmuon-trace: ", 0) == 0, out);  // the error, with the tool's prefix
  out = zmuon::test::run_command(trace + " --log-level loud summary .", &status);
  BOOST_TEST(exit_code(status) == 2, out);
  BOOST_TEST(out.find("--log-level") != std::string::npos, out);
}
