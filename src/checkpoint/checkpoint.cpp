// Checkpoint files: per-rank safetensors shards, a manifest with a CRC-32 per file, resharding.
#include "checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "checkpoint/detail.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/shards.hpp"
#include "plan/ownership.hpp"

namespace zmuon {

namespace {

/// Parameter p's shard length in the saved files (the saving world's, cut by its layout).
int64_t saved_shard_len(const checkpoint_manifest& m, const param_layout& p) {
  return shard_length(p.numel, p.shape[0], m.world, m.layout);
}

namespace fs = std::filesystem;
using detail::bad;
using detail::in_quotes;
using detail::shape_text;

const char* const manifest_name = "manifest.json";
const char* const latest_name = "latest";
/// What `latest` may hold: a name.
constexpr uint64_t kMaxLatestBytes = 4096;
/// The job's config a checkpoint keeps (the launcher's is a few KiB).
constexpr uint64_t kMaxManifestConfigBytes = uint64_t(4) << 20;

/// The most bytes manifest_text can write for the table `params` and `shard_files` ranks: a
/// reader refuses a larger manifest before it reads a byte, and a save that would write one
/// fails. Each term is a generous bound on what manifest_text writes per item: a parameter's
/// entry (its name escaped, 6 bytes a character at most, and a line per dimension) and AdamW
/// step count, a shard file's entry, and the fixed keys with the config.
uint64_t manifest_size_bound(const std::vector<param_layout>& params, uint64_t shard_files) {
  uint64_t bound = (uint64_t{64} << 10) + kMaxManifestConfigBytes + 256 * shard_files;
  for (const auto& p : params)
    bound += 256 + 6 * p.name.size() + 32 * p.shape.size();
  return bound;
}

/// The files in the checkpoint directory `dir` (its shard files among them), at most `most`.
uint64_t files_in(const std::string& dir, uint64_t most) {
  std::error_code ec;
  uint64_t n = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end && n < most; it.increment(ec))
    ++n;
  return n;
}

std::string step_dir_name(uint64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step_%08llu", static_cast<unsigned long long>(step));
  return buf;
}

/// step_NNNNNNNN or step_NNNNNNNN_K: the only names `latest` may hold (no paths).
bool is_step_dir_name(const std::string& s) {
  if (s.size() < 13 || s.compare(0, 5, "step_") != 0)
    return false;
  for (size_t i = 5; i < s.size(); ++i)
    if (!(std::isdigit(static_cast<unsigned char>(s[i])) || (s[i] == '_' && i == 13)))
      return false;
  return s.size() == 13 || (s.size() > 14 && s[13] == '_');
}

/// The step of a step_NNNNNNNN[_K] name (is_step_dir_name).
uint64_t step_of_dir_name(const std::string& s) {
  return std::strtoull(s.c_str() + 5, nullptr, 10);
}

/// Whether directory `d` holds only what a save writes there (the manifest, shard files, and
/// their temporary files): anything else is not ours to remove.
bool holds_only_checkpoint_files(const fs::path& d) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(d, ec)) {
    const std::string n = e.path().filename().string();
    const bool shard = n.rfind("rank_", 0) == 0 && n.find(".safetensors") == 10;
    if (!(n.rfind(manifest_name, 0) == 0 || shard) || !e.is_regular_file(ec))
      return false;
  }
  return !ec;
}

error fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return {errc::io_error,
            "cannot open directory " + in_quotes(dir) + ": " + std::strerror(errno)};
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0)
    return {errc::io_error,
            "cannot fsync directory " + in_quotes(dir) + ": " + std::strerror(errno)};
  return {};
}

/// `crc` (zlib's CRC-32 of what came before) extended over `size` more bytes.
uLong crc32_over(uLong crc, const void* data, size_t size) {
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {
    uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = ::crc32(crc, p, n);
    p += n;
    size -= n;
  }
  return crc;
}

/// `bytes` bytes at offset `at` of a file, and where they go.
struct file_range {
  uint64_t at = 0;
  uint64_t bytes = 0;
  char* into = nullptr;
  std::string tensor;  // the tensor's name, and where the range starts in it
  int64_t first_element = 0;
};

/// Where the first value of `ranges` (as loaded) that is not finite is, or "": a checkpoint holds
/// only finite state (a NaN there would make every later step a skipped one).
std::string first_nonfinite(const std::vector<file_range>& ranges) {
  for (const auto& r : ranges) {
    const auto* v = reinterpret_cast<const float*>(r.into);
    const auto n = static_cast<int64_t>(r.bytes / sizeof(float));
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(v[i]))
        return "tensor " + in_quotes(r.tensor) + " holds " + std::to_string(v[i]) + " at element "
               + std::to_string(r.first_element + i);
  }
  return {};
}

/// Reads the file at `path` (`size` bytes) once, in pieces of at most 16 MB (never all of it in
/// memory): copies each of `ranges` (sorted by offset, disjoint) into its place and returns
/// zlib's CRC-32 of the whole file.
expected<uint32_t> read_once(const std::string& path, uint64_t size,
                             const std::vector<file_range>& ranges) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return error{errc::io_error, "cannot open " + in_quotes(path)};
  std::vector<char> piece(
      static_cast<size_t>(std::min<uint64_t>(std::max<uint64_t>(size, 1), 16u << 20)));
  uLong crc = ::crc32(0L, Z_NULL, 0);
  uint64_t offset = 0;
  size_t next = 0;  // the first range not wholly before `offset`
  while (in) {
    in.read(piece.data(), static_cast<std::streamsize>(piece.size()));
    const auto n = static_cast<uint64_t>(in.gcount());
    crc = crc32_over(crc, piece.data(), n);
    while (next < ranges.size() && ranges[next].at + ranges[next].bytes <= offset)
      ++next;
    for (size_t k = next; k < ranges.size() && ranges[k].at < offset + n; ++k) {
      const uint64_t lo = std::max(ranges[k].at, offset);
      const uint64_t hi = std::min(ranges[k].at + ranges[k].bytes, offset + n);
      std::memcpy(ranges[k].into + (lo - ranges[k].at), piece.data() + (lo - offset), hi - lo);
    }
    offset += n;
  }
  if (in.bad())
    return error{errc::io_error, "cannot read " + in_quotes(path)};
  return static_cast<uint32_t>(crc);
}

/// A row-moment tensor's name after kRowMomentsPrefix: "<name>" (all rows: b = -1) or
/// "<name>@a:b" (rows [a, b)); the parameter's index in `pl` (-1: none) and the rows.
std::tuple<int, int64_t, int64_t> row_moment_tensor(const plan& pl, const std::string& rest) {
  if (const int j = pl.find(rest); j >= 0)
    return {j, 0, -1};
  const size_t at = rest.rfind('@');
  const size_t colon = rest.rfind(':');
  if (at == std::string::npos || colon == std::string::npos || colon < at)
    return {-1, 0, 0};
  const std::string a = rest.substr(at + 1, colon - at - 1);
  const std::string b = rest.substr(colon + 1);
  auto digits = [](const std::string& t) {
    return !t.empty() && t.size() < 18
           && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const int j = pl.find(rest.substr(0, at));
  if (j < 0 || !digits(a) || !digits(b) || std::stoll(b) <= std::stoll(a))
    return {-1, 0, 0};
  return {j, std::stoll(a), std::stoll(b)};
}

/// Checks the header of shard file `path` (saved rank f.rank of `m`) against the manifest and
/// the target's table, and lists where the values target ranks [first, last) hold lie in it,
/// sorted by offset, each with its place in `states`.
error shard_ranges(const std::string& path, const checkpoint_file& f, const checkpoint_manifest& m,
                   const plan& target, int first, int last, std::vector<rank_state>& states,
                   std::vector<file_range>& ranges) {
  auto index = read_safetensors_index(path);
  if (!index)
    return index.err();
  std::map<std::string, std::string> meta = index->metadata;
  const std::string step = std::to_string(m.step);
  if (!meta.count("format") || !meta.count("rank") || !meta.count("world") || !meta.count("step"))
    return bad(path,
               "shard file lacks the zmuon metadata (format, rank, world, step) in its "
               "header's __metadata__");
  if (meta["format"] != "zmuon-shard" || meta["rank"] != std::to_string(f.rank)
      || meta["world"] != std::to_string(m.world) || meta["step"] != step)
    return bad(path, "shard file was written for rank " + meta["rank"] + " of world "
                         + meta["world"] + " at step " + meta["step"] + ", the manifest says rank "
                         + std::to_string(f.rank) + " of world " + std::to_string(m.world)
                         + " at step " + step);
  std::map<std::string, const safetensors_entry*> by_name;
  for (const auto& t : index->tensors)
    by_name[t.name] = &t;
  size_t used = 0;
  for (const auto& p : target.params) {
    auto [sb, se] = rank_slice(p.numel, saved_shard_len(m, p), f.rank);
    for (const auto& kind : state_kinds) {
      if (!has_kind(kind, p.muon))
        continue;
      const std::string name = kind.prefix + p.name;
      auto it = by_name.find(name);
      if (it == by_name.end())
        return bad(path, "shard file lacks tensor " + in_quotes(name));
      const safetensors_entry& t = *it->second;
      if (static_cast<int64_t>(t.count) != se - sb)
        return bad(path, "tensor " + in_quotes(name) + " has " + std::to_string(t.count)
                             + " values, rank " + std::to_string(f.rank) + " of world "
                             + std::to_string(m.world) + " holds " + std::to_string(se - sb));
      ++used;
      for (int r = first; r < last; ++r) {  // the part of it each target rank holds
        auto [rb, re] = rank_slice(p.numel, p.shard_len, r);
        const int64_t lo = std::max(sb, rb);
        const int64_t hi = std::min(se, re);
        if (lo < hi)
          ranges.push_back({t.offset + static_cast<uint64_t>(lo - sb) * sizeof(float),
                            static_cast<uint64_t>(hi - lo) * sizeof(float),
                            reinterpret_cast<char*>((states[r].*kind.buffer).data()
                                                    + offset_in(kind, p) + (lo - rb)),
                            t.name, lo - sb});
      }
    }
  }
  // NorMuon's row moments: in the file of the rank that owned each NS block when it was saved
  // (a file without them: zeros), as tensors of rows [a, b) of a parameter's matrix view; each
  // row goes to the target rank that owns its block now.
  const std::vector<std::vector<int64_t>> row_offsets = row_moment_offsets(target);
  for (const auto& [name, entry] : by_name) {
    if (name.rfind(kRowMomentsPrefix, 0) != 0)
      continue;
    auto [j, a, b] = row_moment_tensor(target, name.substr(std::string(kRowMomentsPrefix).size()));
    if (j < 0)
      continue;  // counted as unused below
    const auto& p = target.params[j];
    const int64_t b_end = b < 0 ? static_cast<int64_t>(entry->count) : b;
    if (!p.muon || a < 0 || b_end > p.rows || b_end - a != static_cast<int64_t>(entry->count))
      return bad(path, "tensor " + in_quotes(name) + " has " + std::to_string(entry->count)
                           + " values, not rows of the matrix of " + std::to_string(p.rows)
                           + " rows it names");
    ++used;
    for (size_t k = 0; k < p.blocks.size(); ++k) {
      const muon_block& blk = p.blocks[k];
      const int64_t lo = std::max(a, blk.row0);
      const int64_t hi = std::min(b_end, blk.row0 + blk.rows);
      if (lo < hi && blk.owner >= first && blk.owner < last && row_offsets[j][k] >= 0)
        ranges.push_back({entry->offset + static_cast<uint64_t>(lo - a) * sizeof(float),
                          static_cast<uint64_t>(hi - lo) * sizeof(float),
                          reinterpret_cast<char*>(states[blk.owner].row_moments.data()
                                                  + row_offsets[j][k] + (lo - blk.row0)),
                          name, lo - a});
    }
  }
  if (used != index->tensors.size())
    return bad(path, "shard file holds " + std::to_string(index->tensors.size() - used)
                         + " tensors that belong to no parameter of the table");
  std::sort(ranges.begin(), ranges.end(),
            [](const file_range& a, const file_range& b) { return a.at < b.at; });
  return {};
}

}  // namespace

std::string shard_file_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
  return buf;
}

std::string checkpoint_dir_name(uint64_t step, int suffix) {
  return suffix == 0 ? step_dir_name(step) : step_dir_name(step) + "_" + std::to_string(suffix);
}

expected<int> create_checkpoint_dir(const std::string& dir, uint64_t step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return error{errc::io_error,
                 "cannot create checkpoint directory " + in_quotes(dir) + ": " + ec.message()};
  int k = 0;
  while (fs::exists(fs::path(dir) / checkpoint_dir_name(step, k), ec))
    ++k;
  const std::string out = (fs::path(dir) / checkpoint_dir_name(step, k)).string();
  fs::create_directory(out, ec);
  if (ec)
    return error{errc::io_error, "cannot create " + in_quotes(out) + ": " + ec.message()};
  return k;
}

expected<checkpoint_file> write_shard_file(const std::string& out, const plan& pl, int rank,
                                           const rank_state& st, uint64_t step) {
  if (static_cast<int64_t>(st.params.size()) != pl.shard_total
      || static_cast<int64_t>(st.momentum.size()) != pl.muon_state_total
      || static_cast<int64_t>(st.exp_avg.size()) != pl.adam_state_total
      || static_cast<int64_t>(st.exp_avg_sq.size()) != pl.adam_state_total)
    return error{errc::internal, "write_shard_file: rank " + std::to_string(rank)
                                     + "'s state does not fit the plan"};
  // Written straight from the state (no copy of it), the CRC-32 taken on the way.
  std::vector<safetensors_view> tensors;
  for (const auto& p : pl.params) {
    auto [begin, end] = rank_slice(p.numel, p.shard_len, rank);
    const int64_t n = end - begin;
    for (const auto& k : state_kinds) {
      if (has_kind(k, p.muon))
        tensors.push_back({k.prefix + p.name,
                           {n},
                           (st.*k.buffer).data() + offset_in(k, p),
                           static_cast<size_t>(n)});
    }
  }
  // NorMuon's row moments of the NS blocks this rank owns: a parameter of one block whole
  // ("row_moments/<name>"), another's blocks as rows [a, b) ("row_moments/<name>@a:b").
  if (!st.row_moments.empty()) {
    if (static_cast<int64_t>(st.row_moments.size()) != row_moment_total(pl, rank))
      return error{errc::internal, "write_shard_file: rank " + std::to_string(rank)
                                       + "'s row moments do not fit the plan"};
    const std::vector<std::vector<int64_t>> offsets = row_moment_offsets(pl);
    for (size_t j = 0; j < pl.params.size(); ++j) {
      const auto& p = pl.params[j];
      for (size_t k = 0; p.muon && k < p.blocks.size(); ++k) {
        const muon_block& b = p.blocks[k];
        if (b.owner != rank)
          continue;
        std::string name = kRowMomentsPrefix + p.name;
        if (p.blocks.size() > 1)
          name += "@" + std::to_string(b.row0) + ":" + std::to_string(b.row0 + b.rows);
        tensors.push_back(
            {name, {b.rows}, st.row_moments.data() + offsets[j][k], static_cast<size_t>(b.rows)});
      }
    }
  }
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const std::string file = shard_file_name(rank);
  auto bytes = write_safetensors_views(
      (fs::path(out) / file).string(), tensors,
      {{"format", "zmuon-shard"},
       {"rank", std::to_string(rank)},
       {"world", std::to_string(pl.world)},
       {"step", std::to_string(step)}},
      [&](const void* data, size_t size) { crc = crc32_over(crc, data, size); });
  if (!bytes)
    return bytes.err();
  return checkpoint_file{file, rank, *bytes, static_cast<uint32_t>(crc)};
}

error commit_checkpoint(const std::string& dir, const std::string& name, const plan& pl,
                        checkpoint_manifest meta) {
  const std::string out = (fs::path(dir) / name).string();
  if (static_cast<int>(meta.files.size()) != pl.world)
    return {errc::internal, "commit_checkpoint: " + std::to_string(meta.files.size())
                                + " shard files for world " + std::to_string(pl.world)};
  std::error_code ec;
  for (int r = 0; r < pl.world; ++r) {
    const checkpoint_file& f = meta.files[r];
    const std::string path = (fs::path(out) / shard_file_name(r)).string();
    if (f.rank != r || f.name != shard_file_name(r))
      return {errc::internal, "commit_checkpoint: file entry " + std::to_string(r) + " is "
                                  + in_quotes(f.name) + " of rank " + std::to_string(f.rank)};
    auto size = fs::file_size(path, ec);
    if (ec || size != f.bytes)
      return {errc::io_error,
              "rank " + std::to_string(r) + "'s shard file " + in_quotes(path)
                  + (ec ? " is not there" : " has " + std::to_string(size) + " bytes, not "
                                                + std::to_string(f.bytes))
                  + " after it was written: the checkpoint directory must be one every process "
                    "of the job sees"};
  }
  meta.world = pl.world;
  meta.layout = pl.layout;
  meta.params.clear();
  for (const auto& p : pl.params)
    meta.params.push_back({p.name, p.shape, p.muon});
  const std::string text = manifest_text(meta);
  if (text.size() > manifest_size_bound(pl.params, static_cast<uint64_t>(pl.world)))
    return {errc::invalid_argument,
            "the checkpoint's manifest would hold " + std::to_string(text.size())
                + " bytes, more than a load takes for this table: the config given to "
                  "save_checkpoint is over "
                + std::to_string(kMaxManifestConfigBytes >> 20) + " MiB"};
  if (auto err = write_file_atomically((fs::path(out) / manifest_name).string(), text))
    return err;
  if (auto err = fsync_directory(dir))
    return err;

  // Point `latest` at the new checkpoint, then keep it and the one before.
  const std::string latest = (fs::path(dir) / latest_name).string();
  std::string previous;
  if (auto old = read_file(latest, kMaxLatestBytes)) {
    previous = *old;
    while (!previous.empty() && (previous.back() == '\n' || previous.back() == ' '))
      previous.pop_back();
  }
  if (auto err = write_file_atomically(latest, name + "\n"))
    return err;
  // Removed: checkpoints of steps up to this one (a later step's belongs to another run that
  // saved here: kept) holding nothing but a checkpoint's files, and `latest`'s temporary files.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string entry_name = entry.path().filename().string();
    std::error_code ignored;
    bool stale_step = is_step_dir_name(entry_name) && entry_name != name && entry_name != previous
                      && step_of_dir_name(entry_name) <= step_of_dir_name(name)
                      && entry.is_directory(ignored) && holds_only_checkpoint_files(entry.path());
    bool stale_tmp = entry_name.rfind(std::string(latest_name) + ".tmp.", 0) == 0;
    if (stale_step || stale_tmp)
      fs::remove_all(entry.path(), ignored);
  }
  return {};
}

expected<loaded_checkpoint> read_checkpoint(const std::string& dir, const plan& target, int first,
                                            int count) {
  const int last = count < 0 ? target.world : first + count;
  if (first < 0 || last > target.world || first > last)
    return error{errc::invalid_argument, "read_checkpoint: ranks [" + std::to_string(first) + ", "
                                             + std::to_string(last) + ") of world "
                                             + std::to_string(target.world)};
  loaded_checkpoint out;
  // A checkpoint directory, or a directory whose `latest` names one.
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    return error{errc::io_error, "no checkpoint in " + in_quotes(dir) + ": it is not a directory"};
  if (fs::exists(fs::path(dir) / manifest_name, ec)) {
    out.path = dir;
  } else {
    const std::string latest = (fs::path(dir) / latest_name).string();
    const bool latest_there = fs::symlink_status(latest, ec).type() != fs::file_type::not_found;
    if (!latest_there)
      return error{errc::io_error, "no checkpoint in " + in_quotes(dir) + ": it has neither "
                                       + manifest_name + " nor " + latest_name};
    auto text = read_file(latest, kMaxLatestBytes);
    if (!text)
      return text.err();
    std::string name = *text;
    while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
      name.pop_back();
    if (!is_step_dir_name(name))
      return bad(latest,
                 "does not name a checkpoint (step_NNNNNNNN); what it holds is not "
                 "repeated here (it may be a link to a file not meant to be shown)");
    out.path = (fs::path(dir) / name).string();
  }
  const std::string manifest_path = (fs::path(out.path) / manifest_name).string();
  if (!fs::exists(manifest_path, ec))
    return error{errc::io_error,
                 "missing manifest " + in_quotes(manifest_path) + " (the save did not complete)"};
  // Refused by its size before it is read: no more than this table and the files there can
  // take (parsed, JSON takes many times its size in memory).
  const uint64_t most = manifest_size_bound(target.params, files_in(out.path, uint64_t{1} << 20));
  if (fs::is_regular_file(manifest_path, ec) && fs::file_size(manifest_path, ec) > most && !ec)
    return bad(manifest_path, "manifest holds " + std::to_string(fs::file_size(manifest_path, ec))
                                  + " bytes, more than the " + std::to_string(most)
                                  + " a checkpoint of this table of "
                                  + std::to_string(target.params.size())
                                  + " parameters can take (it is another table's, or no "
                                    "checkpoint's): refused before it is read");
  auto text = read_file(manifest_path, most);
  if (!text)
    return text.err();
  auto parsed = parse_manifest(*text, manifest_path);
  if (!parsed)
    return parsed.err();
  out.manifest = std::move(*parsed);
  const checkpoint_manifest& m = out.manifest;

  // The parameter table must be the one the target registered.
  if (m.params.size() != target.params.size())
    return error{errc::shape_mismatch,
                 "parameter table mismatch: the checkpoint has " + std::to_string(m.params.size())
                     + " parameters, the engine " + std::to_string(target.params.size())};
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& c = m.params[i];
    const auto& t = target.params[i];
    if (c.name != t.name || c.shape != t.shape || c.muon != t.muon)
      return error{errc::shape_mismatch, "parameter table mismatch at entry " + std::to_string(i)
                                             + ": the checkpoint has " + in_quotes(c.name) + " "
                                             + shape_text(c.shape) + (c.muon ? " muon" : " adamw")
                                             + ", the engine " + in_quotes(t.name) + " "
                                             + shape_text(t.shape) + (t.muon ? " muon" : " adamw")};
  }

  // The target ranks' states, filled straight from the shard files that hold a part of them,
  // read one at a time: no full tensors, no file this process does not need.
  out.states.resize(target.world);
  for (int r = first; r < last; ++r) {
    rank_state& st = out.states[r];
    st.params.assign(target.shard_total, 0.0f);
    st.momentum.assign(target.muon_state_total, 0.0f);
    st.exp_avg.assign(target.adam_state_total, 0.0f);
    st.exp_avg_sq.assign(target.adam_state_total, 0.0f);
    st.adam_steps = m.adam_steps;
    st.adam_param_steps = m.adam_param_steps;
    st.row_moments.assign(row_moment_total(target, r), 0.0f);
  }
  // Elements [begin, end) of parameter p that target ranks [first, last) hold.
  auto wanted_range = [&](const param_layout& p) {
    return std::pair<int64_t, int64_t>{std::min(p.numel, first * p.shard_len),
                                       std::min(p.numel, last * p.shard_len)};
  };
  // Row moments lie in the file of the rank that owned the block at the save: under today's
  // rule, or under the earlier one (every block longest-processing-time first).
  const std::vector<std::vector<int>> saved_owner = owners_at_world(target, m.world, m.layout);
  const std::vector<std::vector<int>> earlier_owner =
      owners_at_world(target, m.world, m.layout, nullptr, false);
  for (const auto& f : m.files) {
    bool needed = false;
    for (size_t j = 0; j < target.params.size(); ++j)
      for (size_t b = 0; b < saved_owner[j].size(); ++b) {
        const int now = target.params[j].blocks[b].owner;
        needed = needed
                 || ((saved_owner[j][b] == f.rank || earlier_owner[j][b] == f.rank) && now >= first
                     && now < last);
      }
    for (const auto& p : target.params) {
      auto [sb, se] = rank_slice(p.numel, saved_shard_len(m, p), f.rank);
      auto [wb, we] = wanted_range(p);
      needed = needed || (std::max(sb, wb) < std::min(se, we));
    }
    if (!needed)
      continue;
    const std::string path = (fs::path(out.path) / f.name).string();
    if (!fs::exists(path, ec))
      return error{errc::io_error, "missing shard file " + in_quotes(path) + " (rank "
                                       + std::to_string(f.rank) + " of world "
                                       + std::to_string(m.world) + ")"};
    // Size and CRC-32 first (the file read in pieces), then the header, then each needed range
    // of values straight into the states: the file is never in memory as a whole.
    const uint64_t size = fs::file_size(path, ec);
    if (ec)
      return error{errc::io_error,
                   "cannot read the size of " + in_quotes(path) + ": " + ec.message()};
    if (size != f.bytes)
      return bad(path, "file is " + std::to_string(size) + " bytes, the manifest says "
                           + std::to_string(f.bytes) + " (truncated or overwritten)");
    // The header says where each tensor lies; one pass over the file then copies the ranges the
    // target ranks hold straight into their states and takes the CRC-32 of every byte. A header
    // that is not right in a file whose checksum is wrong is reported as the checksum.
    std::vector<file_range> ranges;
    const error header = shard_ranges(path, f, m, target, first, last, out.states, ranges);
    if (header)
      ranges.clear();
    auto crc = read_once(path, size, ranges);
    if (!crc)
      return crc.err();
    if (*crc != f.crc32)
      return bad(path, "checksum mismatch: CRC-32 " + std::to_string(*crc) + ", the manifest says "
                           + std::to_string(f.crc32) + " (corrupted file)");
    if (header)
      return header;
    if (const std::string where = first_nonfinite(ranges); !where.empty())
      return bad(path, where + ": a checkpoint holds finite values only (the CRC-32 matches, so "
                               "they were saved so or the file was rewritten whole)");
  }
  return out;
}

}  // namespace zmuon
