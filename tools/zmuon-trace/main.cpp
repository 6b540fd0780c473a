// zmuon-trace: reads the message traces of a run (one JSON Lines file per rank, written with
// `zmuon-launch --trace DIR`, the config key zmuon.trace, or ZMUON_TRACE=DIR) and
//   summary DIR                 per step: phase times per rank, the slowest rank; message counts
//   perfetto DIR -o trace.json  Chrome Trace Event JSON for ui.perfetto.dev / chrome://tracing
//   check DIR                   the protocol checks; exit status 1 on a violation
// Exit status: 0 fine, 1 a protocol violation, 2 unreadable input or bad arguments.
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>

#include "base/log.hpp"
#include "config/cli_hints.hpp"
#include "zmuon-trace/check.hpp"
#include "zmuon-trace/perfetto.hpp"
#include "zmuon-trace/summary.hpp"
#include "zmuon/version.hpp"

namespace {

using namespace zmuon::trace_tool;

int with_traces(const std::string& dir, const std::function<int(const trace_set&)>& f) {
  auto ts = read_traces(dir, {nullptr});  // its warnings go to the log, here
  if (!ts) {
    ZMUON_LOG_ERROR(ts.err().message());
    return 2;
  }
  for (const auto& w : ts->warnings)
    ZMUON_LOG_WARN("warning: " + w);
  return f(*ts);
}

}  // namespace

int main(int argc, char** argv) {
  zmuon::set_log_prefix("zmuon-trace: ");
  CLI::App app{"zmuon-trace: summarize, convert and check zmuon message traces"};
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "the least severe messages on stderr: error | warn | info | debug | trace "
                 "(default: $ZMUON_LOG_LEVEL, else info)")
      ->check(CLI::IsMember({"error", "warn", "info", "debug", "trace"}));
  app.set_version_flag("--version", std::string("zmuon-trace ") + zmuon::version(),
                       "print the version and exit");
  std::string dir, out;
  auto* sum = app.add_subcommand("summary",
                                 "per step: phase times per rank, slowest rank, "
                                 "message counts and bytes by type and by actor");
  sum->add_option("DIR", dir, "trace directory")->required();
  auto* pf = app.add_subcommand("perfetto", "write Chrome Trace Event JSON (Perfetto)");
  pf->add_option("DIR", dir, "trace directory")->required();
  pf->add_option("-o,--output", out, "output file")->required();
  auto* chk = app.add_subcommand(
      "check",
      "check the protocol: NS once per matrix per applied step, nothing of Muon before "
      "the overflow report, no momentum or NorMuon row-moment write or state-changing "
      "compute call on a "
      "skipped step, the same collectives "
      "on every rank, every request answered");
  chk->add_option("DIR", dir, "trace directory")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return zmuon::parse_failure(app, e);
  }
  if (!log_level.empty())
    zmuon::set_log_level(*zmuon::parse_log_level(log_level));

  if (*sum)
    return with_traces(dir, [](const trace_set& ts) {
      std::cout << summary(ts);
      return 0;
    });
  if (*pf)
    return with_traces(dir, [&](const trace_set& ts) {
      std::ofstream f(out);
      if (!f) {
        ZMUON_LOG_ERROR("cannot write '" + out + "'");
        return 2;
      }
      auto j = to_perfetto(ts);
      f << j.dump() << "\n";
      if (!f.flush()) {
        ZMUON_LOG_ERROR("cannot write '" + out + "'");
        return 2;
      }
      std::cout << "wrote " << j["traceEvents"].size() << " events to " << out << "\n";
      return 0;
    });
  return with_traces(dir, [](const trace_set& ts) {
    auto vs = check(ts);
    size_t n = 0;
    for (const auto& rt : ts.ranks)
      n += rt.records.size();
    for (const auto& v : vs)
      std::cout << format(ts, v);
    if (!vs.empty()) {
      std::cout << "check: " << vs.size() << " violation(s) in " << ts.ranks.size()
                << " rank file(s)\n";
      return 1;
    }
    std::cout << "check: OK (" << ts.ranks.size() << " rank files, " << n << " records)\n";
    return 0;
  });
}
