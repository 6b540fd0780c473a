// Reading a trace directory: every rank's JSON Lines file (trace/recorder.hpp), merged, with the
// clocks of different processes aligned.
//
// Clock alignment: ranks of one process, and processes of one host, share steady_clock, so their
// times are taken as they are. Files from another host (a different `host` in the meta line) are
// shifted by the offset that matching send/receive pairs of peer messages give (NTP's estimate):
// with d_ab = min(recv on B - send on A) and d_ba = min(recv on A - send on B) over the pairs
// between the reference host (rank 0's) and host B, B's clock is ahead by (d_ab - d_ba) / 2.
//
// Bad input is an error that names the file, line and field: a line that is not JSON, a field
// of the wrong type, a meta record whose world or rank is out of range, ranks of different
// worlds, a rank of the world without a file, two files of one rank, a file whose name and meta
// record disagree, an entry of a rank file's name that is not a regular file.
//
// A run cut short (a process killed, a node lost): a last line without its newline that is not
// JSON is what a process leaves when it ends in the middle of a write (the recorder writes
// through a 1 MiB buffer and flushes after each step); it is ignored with a warning. When some
// rank's file ended that way, or the ranks' files end in different steps, the run was cut short
// and the records of the last steps may be incomplete: trace_set::cut is the earliest step that
// some rank's file ends in, and `check` looks only at the steps before it (a warning says so).
// A run every process of which stopped at the same step boundary cannot be told from a finished
// one: there the last step is checked as if complete.
#pragma once

#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zmuon/status.hpp"

namespace zmuon::trace_tool {

struct record {
  int rank = 0;      // of the file it came from
  size_t line = 0;   // 1-based line in that file
  uint64_t seq = 0;  // write order within the file
  int64_t t = 0;     // ns, aligned to the reference host's clock
  int64_t dur = 0;
  std::string ev;  // send, recv, reply, span
  std::string actor;
  std::string type;
  std::string op;     // collective kind
  std::string phase;  // span records
  std::string id;     // correlation id
  std::string error;  // reply records: the error, if the answer was one
  uint64_t step = 0;
  int micro = -1;
  int index = -1;
  int64_t bytes = 0;
  int peer = -1;
  bool req = false;
  bool wait = false;             // span records: a wait for an answer
  int track = -1;                // compute spans: 0 the main stream, 1 + i Newton-Schulz lane i
  std::optional<bool> overflow;  // overflow_report
  std::optional<bool> skipped;   // step_result
  std::vector<int> params;       // ns spans: the Muon parameters orthogonalized
  std::string text;              // the line as written
  /// A call of the rank's compute backend (actor `compute`), not a phase of the protocol.
  bool is_compute() const { return ev == "span" && actor == "compute"; }
};

struct rank_trace {
  std::string file;  // path
  int node = 0;
  int rank = 0;
  int world = 0;
  std::string host;
  int64_t pid = 0;
  int64_t offset = 0;               // ns subtracted from this file's times
  std::map<int, std::string> muon;  // Muon parameter index -> name (the plan record)
  int chunks = 0;
  std::vector<record> records;  // sorted by (t, seq)
  uint64_t file_bytes = 0;
  size_t torn_line = 0;    // > 0: that last line was incomplete and is ignored
  uint64_t last_step = 0;  // the highest step of any record
};

struct trace_set {
  std::vector<rank_trace> ranks;   // sorted by rank
  int64_t t0 = 0;                  // earliest aligned time
  std::vector<std::string> notes;  // what the alignment did
  /// Set when the run was cut short (see above): the earliest step some rank's file ends in;
  /// that step and later ones may lack records, and `check` leaves them out.
  std::optional<uint64_t> cut;
  std::vector<std::string> warnings;  // an ignored last line, a run cut short
  std::string process_key(int rank_index) const;
  /// The key that matches a send, its receive and its reply across files.
  std::string match_key(int rank_index, const record& r) const;
};

struct read_options {
  /// Where the warnings (trace_set::warnings) go as well, one a line ("zmuon-trace: warning:
  /// ..."); null: nowhere.
  std::ostream* warn = &std::cerr;
  /// Every rank of the world (the meta records') must have its file; false: a subset will do
  /// (a synthetic trace of one rank, one node's files of a multi-host run).
  bool every_rank = true;
};

/// Reads every trace-node*-rank*.jsonl of `dir`. Errors name the file and line.
expected<trace_set> read_traces(const std::string& dir, const read_options& options = {});

/// "file:line" of a record.
std::string where(const trace_set& ts, const record& r);

}  // namespace zmuon::trace_tool
