// Reading the trace files a traced engine writes (trace/recorder.hpp), record by record, for
// the tests that check what the trace says.
#pragma once

#include <boost/test/unit_test.hpp>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zmuon::test {

/// The trace file of `rank` of a one-node job under `dir`.
inline std::string trace_file(const std::string& dir, int rank) {
  return dir + "/trace-node0-rank" + std::to_string(rank) + ".jsonl";
}

/// Every record of a JSON Lines file.
inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  BOOST_REQUIRE_MESSAGE(in, "cannot read " << path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty())
      out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace zmuon::test
