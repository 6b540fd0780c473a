// Runs the zmuon-launch binary (its path comes in as ZMUON_LAUNCH) and captures its output.
#pragma once

#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <string>

namespace zmuon::test {

inline std::string run_launch(const std::string& args, int* status) {
  std::string cmd = std::string(ZMUON_LAUNCH) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  BOOST_REQUIRE(pipe);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe))
    out.append(buf, n);
  *status = pclose(pipe);
  return out;
}

}  // namespace zmuon::test
