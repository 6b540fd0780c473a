// Runs a command, or the zmuon-launch binary (its path comes in as ZMUON_LAUNCH), and captures
// its output (stdout and stderr).
#pragma once

#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <string>

namespace zmuon::test {

/// Runs `cmd` through the shell; `*status` gets pclose's status (0: exit code 0).
inline std::string run_command(const std::string& cmd, int* status) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  BOOST_REQUIRE(pipe);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe))
    out.append(buf, n);
  *status = pclose(pipe);
  return out;
}

#ifdef ZMUON_LAUNCH
inline std::string run_launch(const std::string& args, int* status) {
  return run_command(std::string(ZMUON_LAUNCH) + " " + args, status);
}
#endif

}  // namespace zmuon::test
