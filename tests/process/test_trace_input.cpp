// zmuon-trace on bad input (docs/DESIGN.md §9; the rule that bad input gets a clear error): input
// errors exit 2 naming the file and line (a missing rank file, a directory in its place, a line
// that is not JSON or nests too deeply, a field of the wrong type, meta numbers out of range);
// the trace of a killed process is still read (a torn last line ignored, the cut steps left out
// of the check); bad arguments exit 2 with the nearest subcommand or flag.
#define BOOST_TEST_MODULE trace_input
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/trace_files.hpp"
#include "zmuon-trace/reader.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace zmuon;
using test::read_jsonl;
using test::trace_file;

#define TRACE_RUN_PREFIX "test_trace_input_"
#include "support/trace_run.hpp"

BOOST_AUTO_TEST_CASE(bad_trace_input_is_an_error) {
  int status = 0;
  auto out = tool("check test_trace_no_such_dir", &status);
  BOOST_TEST(WEXITSTATUS(status) == 2);
  BOOST_TEST(out.find("'test_trace_no_such_dir' is not a directory") != std::string::npos, out);
  auto dir = copy_of("corrupt");
  std::ofstream(trace_file(dir, 1), std::ios::app) << "{\"seq\": 5, not json\n";
  out = tool("check " + dir, &status);
  BOOST_TEST(WEXITSTATUS(status) == 2);
  BOOST_TEST(out.find("trace-node0-rank1.jsonl:") != std::string::npos, out);
  BOOST_TEST(out.find("not JSON") != std::string::npos, out);
  auto deep = copy_of("deep");  // nested past any record: refused before it is built
  std::ofstream(trace_file(deep, 1), std::ios::app)
      << "{\"ev\": " << std::string(100000, '[') << std::string(100000, ']') << "}\n";
  out = tool("check " + deep, &status);
  BOOST_TEST(WEXITSTATUS(status) == 2);
  BOOST_TEST(out.find("nests deeper than 100 levels") != std::string::npos, out);
}

// A rank of the world without its file is an input error naming the file (not protocol
// violations from the records it would have had), as is a directory in its place.
BOOST_AUTO_TEST_CASE(a_missing_rank_file_is_an_input_error) {
  auto dir = copy_of("missing_rank");
  fs::remove(trace_file(dir, 2));
  const std::string want = "rank 2 of world 3 has no trace file (expected trace-node0-rank2.jsonl";
  for (const std::string sub : {"check ", "summary ", "perfetto -o test_trace_missing.json "}) {
    int status = 0;
    auto out = tool(sub + dir, &status);
    BOOST_TEST(WEXITSTATUS(status) == 2, sub << out);
    BOOST_TEST(out.find(want) != std::string::npos, sub << out);
  }
  fs::remove(trace_file(dir, 1));
  int status = 0;
  auto out = tool("check " + dir, &status);
  BOOST_TEST(WEXITSTATUS(status) == 2, out);
  BOOST_TEST(out.find("ranks 1, 2 of world 3 have no trace file (expected "
                      "trace-node0-rank1.jsonl, trace-node0-rank2.jsonl")
                 != std::string::npos,
             out);
  // A caller that means to read a subset says so.
  auto ts = trace_tool::read_traces(dir, {nullptr, false});
  BOOST_REQUIRE_MESSAGE(ts, (ts ? "" : ts.err().message()));
  BOOST_TEST(ts->ranks.size() == 1u);

  dir = copy_of("rank_dir");
  fs::remove(trace_file(dir, 2));
  fs::create_directory(trace_file(dir, 2));
  out = tool("summary " + dir, &status);
  BOOST_TEST(WEXITSTATUS(status) == 2, out);
  BOOST_TEST(out.find("'" + trace_file(dir, 2) + "' is a directory, not a rank's trace file")
                 != std::string::npos,
             out);
}

namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

// The first `n` lines of `path`, then the first half of line n + 1 without its newline: what a
// process killed while its buffered writes reach the file leaves.
void tear(const std::string& path, size_t n) {
  auto lines = lines_of(path);
  BOOST_REQUIRE(n < lines.size());
  std::ofstream out(path, std::ios::trunc | std::ios::binary);
  for (size_t i = 0; i < n; ++i)
    out << lines[i] << "\n";
  out << lines[n].substr(0, lines[n].size() / 2);
}

// The 0-based index of the first line of `path` whose record is of `step`, plus `plus`.
// Moves the `reply` record that ends `step` in `path` (the coordinator's, to finish_step) to
// line `to` (0-based, after the move), as when the host's next step wrote `to` lines first;
// where the run already wrote it there or later, the file stays as it is.
void move_step_end(const std::string& path, uint64_t step, size_t to) {
  auto recs = read_jsonl(path);
  std::string id;
  for (const auto& r : recs)
    if (is(r, "send") && r["type"] == "finish_step" && r["step"] == step)
      id = r["id"].get<std::string>();
  BOOST_REQUIRE_MESSAGE(!id.empty(), "no finish_step of step " << step << " in " << path);
  auto lines = lines_of(path);
  size_t from = 0;
  while (from < recs.size() && !(is(recs[from], "reply") && recs[from]["id"] == id))
    ++from;
  BOOST_REQUIRE(from < lines.size() && to < lines.size());
  if (from >= to)  // the reply already comes at or after line `to`: nothing to move
    return;
  auto reply = lines[from];
  lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(from));
  lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(to), reply);
  std::ofstream out(path, std::ios::trunc | std::ios::binary);
  for (const auto& l : lines)
    out << l << "\n";
}

size_t first_of_step(const std::string& path, uint64_t step, size_t plus = 0) {
  auto recs = read_jsonl(path);
  for (size_t i = 0; i < recs.size(); ++i)
    if (recs[i].value("step", uint64_t{0}) == step)
      return i + plus;
  BOOST_FAIL("no record of step " << step << " in " << path);
  return 0;
}

}  // namespace

// The trace of a killed process ends in the middle of a line: that line is ignored with a
// warning, and the steps from the one the file ends in on are left out of the check (their
// records may be incomplete), while earlier steps are still checked. The reply that ends step 1
// can be written after step 2's first records (the coordinator writes it once it has answered
// the host): here it is, and the tear loses it, which is no violation. A bad line anywhere else
// is still an error.
BOOST_AUTO_TEST_CASE(an_incomplete_last_line_is_ignored_and_the_cut_steps_are_not_checked) {
  auto dir = copy_of("torn");
  const auto file = trace_file(dir, 1);
  const size_t n = first_of_step(file, 2, 20);  // in the middle of step 2 (an applied step)
  move_step_end(file, 1, n);
  tear(file, n);
  int status = 0;
  auto out = tool("check " + dir, &status);
  BOOST_TEST_MESSAGE(out);
  BOOST_TEST(WEXITSTATUS(status) == 0, out);
  for (const std::string& want :
       {"warning: " + file + ":" + std::to_string(n + 1)
            + ": ignoring an incomplete last line (the process ended while writing it)",
        std::string("the run was cut short (rank 1's file ends in step 2 with an incomplete "
                    "line, another's in step 4): the records of step 2 and later may be "
                    "incomplete, and check leaves them out"),
        std::string("check: OK (3 rank files")})
    BOOST_TEST(out.find(want) != std::string::npos, "missing '" << want << "' in:\n" << out);
  auto ts = trace_tool::read_traces(dir, {nullptr});
  BOOST_REQUIRE_MESSAGE(ts, (ts ? "" : ts.err().message()));
  BOOST_TEST((ts->cut && *ts->cut == 2u));
  BOOST_TEST(ts->warnings.size() == 2u);
  BOOST_TEST(ts->ranks[1].torn_line == n + 1);
  out = tool("summary " + dir, &status);
  BOOST_TEST(WEXITSTATUS(status) == 0, out);
  BOOST_TEST(out.find("step 2 (applied) (the run was cut short: records may be missing)")
                 != std::string::npos,
             out);
  BOOST_TEST(out.find("step 1 (applied)  slowest") != std::string::npos, out);

  // A violation before the cut is still found.
  auto recs = read_jsonl(trace_file(dir, 0));
  for (const auto& rec : recs)
    if (is(rec, "span") && rec["phase"] == "ns" && rec["step"] == 1) {
      auto copy = rec;
      copy["t"] = rec["t"].get<int64_t>() + 1000;
      recs.push_back(copy);
      break;
    }
  write_jsonl(trace_file(dir, 0), recs);
  fails_with(dir, {"[ns_once] rank 0, step 1: NS of Muon parameter ", "ran 2 times"});

  // The same half line followed by more lines: not the end of a write, an error.
  dir = copy_of("torn_middle");
  auto lines = lines_of(trace_file(dir, 1));
  lines[n] = lines[n].substr(0, lines[n].size() / 2);
  {
    std::ofstream o(trace_file(dir, 1), std::ios::trunc);
    for (const auto& l : lines)
      o << l << "\n";
  }
  out = tool("check " + dir, &status);
  BOOST_TEST(WEXITSTATUS(status) == 2, out);
  BOOST_TEST(out.find(trace_file(dir, 1) + ":" + std::to_string(n + 1) + ": not JSON")
                 != std::string::npos,
             out);
  BOOST_TEST(out.find("ignoring") == std::string::npos, out);
}

// A process killed after a flush leaves whole lines, but its file ends steps before the others':
// the check leaves out the steps from the earliest end on instead of reporting what is missing.
BOOST_AUTO_TEST_CASE(files_that_end_in_different_steps_are_checked_up_to_the_earliest) {
  auto dir = copy_of("short");
  auto recs = read_jsonl(trace_file(dir, 2));
  recs.resize(first_of_step(trace_file(dir, 2), 3, 15));  // rank 2 stops inside step 3
  write_jsonl(trace_file(dir, 2), recs);
  int status = 0;
  auto out = tool("check " + dir, &status);
  BOOST_TEST(WEXITSTATUS(status) == 0, out);
  BOOST_TEST(out.find("the run was cut short (rank 2's file ends in step 3, another's in step 4): "
                      "the records of step 3 and later may be incomplete")
                 != std::string::npos,
             out);
  BOOST_TEST(out.find("check: OK (3 rank files") != std::string::npos, out);
  // A complete run says nothing of the kind.
  out = tool("check " + run().dir, &status);
  BOOST_TEST(status == 0, out);
  BOOST_TEST(out.find("warning") == std::string::npos, out);
}

// A field of the wrong type is named, with the value; the meta record's world, rank and node
// must be in range and agree with the file name and the other files.
BOOST_AUTO_TEST_CASE(bad_fields_are_named_and_meta_numbers_checked) {
  auto expect = [](const std::string& dir, const std::string& want) {
    int status = 0;
    auto out = tool("check " + dir, &status);
    BOOST_TEST(WEXITSTATUS(status) == 2, out);
    BOOST_TEST(out.find(want) != std::string::npos, "missing '" << want << "' in:\n" << out);
  };
  {
    auto dir = copy_of("bad_dur");
    auto recs = read_jsonl(trace_file(dir, 1));
    size_t i = 1;
    while (i < recs.size() && !recs[i].contains("dur"))
      ++i;
    BOOST_REQUIRE(i < recs.size());
    recs[i]["dur"] = "x";
    write_jsonl(trace_file(dir, 1), recs);
    expect(dir, trace_file(dir, 1) + ":" + std::to_string(i + 1)
                    + ": field 'dur' must be a number, got \"x\"");
    recs[i]["dur"] = 12;
    recs[i]["step"] = -1;
    write_jsonl(trace_file(dir, 1), recs);
    expect(dir, trace_file(dir, 1) + ":" + std::to_string(i + 1)
                    + ": field 'step' must be a whole number from 0 to 18446744073709551615, "
                      "got -1");
  }
  const std::vector<std::pair<json, std::string>> metas{
      {{{"world", 0}}, "meta field 'world' must be from 1 to 1048576, got 0"},
      {{{"world", 1e9}}, "meta field 'world' must be from 1 to 1048576, got 1000000000.0"},
      {{{"rank", 2e9}}, "meta field 'rank' must be from 0 to 2 (world 3), got 2000000000.0"},
      {{{"rank", -1}}, "meta field 'rank' must be from 0 to 2 (world 3), got -1"},
      {{{"rank", "1"}}, "meta field 'rank' must be a number, got \"1\""},
      {{{"node", 7}}, "meta field 'node' must be from 0 to 2"},
      {{{"rank", 2}}, "the meta record says node 0, rank 2, the file name node 0, rank 1"},
      {{{"world", nullptr}}, "the meta record has no field 'world'"},
  };
  for (const auto& [change, want] : metas) {
    auto dir = copy_of("bad_meta");
    auto recs = read_jsonl(trace_file(dir, 1));
    BOOST_REQUIRE(is(recs.at(0), "meta"));
    recs[0].update(change);
    write_jsonl(trace_file(dir, 1), recs);
    expect(dir, trace_file(dir, 1) + ":1: " + want);
  }
  auto dir = copy_of("bad_world");
  auto recs = read_jsonl(trace_file(dir, 1));
  recs[0]["world"] = 4;
  write_jsonl(trace_file(dir, 1), recs);
  expect(dir, trace_file(dir, 1) + ": world 4, but " + trace_file(dir, 0) + " says world 3");
}

// Bad arguments exit 2 (as the header of tools/zmuon-trace/main.cpp says), not CLI11's own codes,
// and a misspelled subcommand or flag is followed by the nearest one.
BOOST_AUTO_TEST_CASE(bad_arguments_exit_2_and_name_the_nearest_subcommand) {
  int status = 0;
  auto out = tool("chek some_dir", &status);
  BOOST_TEST(WEXITSTATUS(status) == 2);
  BOOST_TEST(out.find("zmuon-trace: unknown subcommand 'chek' (did you mean 'check'?)")
                 != std::string::npos,
             out);
  out = tool("perfetto some_dir --ouptut x.json", &status);
  BOOST_TEST(WEXITSTATUS(status) == 2);
  BOOST_TEST(out.find("zmuon-trace: unknown flag '--ouptut' (did you mean '--output'?)")
                 != std::string::npos,
             out);
  out = tool("", &status);  // no subcommand at all: CLI11's message, no guess
  BOOST_TEST(WEXITSTATUS(status) == 2);
  BOOST_TEST(out.find("A subcommand is required") != std::string::npos, out);
  BOOST_TEST(out.find("did you mean") == std::string::npos, out);
  out = tool("--help", &status);
  BOOST_TEST(WEXITSTATUS(status) == 0);
  BOOST_TEST(out.find("check") != std::string::npos, out);
}
