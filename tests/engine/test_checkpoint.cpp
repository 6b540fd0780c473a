// Checkpoints through the engine (real actors, caf comm, host backend, real files): a save/load
// round trip restores every rank's state bit for bit, loading onto another world size reshards,
// every corruption is named, a failed load changes nothing, and non-finite gradients injected at
// random positions are skipped on all ranks without touching parameters or optimizer state.
#define BOOST_TEST_MODULE checkpoint
#include "support/engine_fixture.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>

#include <zlib.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "engine/faults.hpp"
#include "plan/ownership.hpp"
#include "plan/plan.hpp"
#include "support/scratch_dir.hpp"

using namespace zmuon;
using namespace zmuon::test;
namespace fs = std::filesystem;

namespace {

// Muon matrices (one per-head), AdamW vectors and an embedding; sizes that do not divide by 3
// or 4, so shards carry padding.
const std::vector<param_spec> table = {
    {"layer.q.weight", {12, 10}, param_group::automatic, 3},
    {"layer.fc.weight", {10, 7}},
    {"layer.fc.bias", {10}},
    {"embed.weight", {9, 5}},
};

std::unique_ptr<engine> fresh_engine(int world, const fault_options& faults = {}) {
  auto o = options(world);
  o.adamw.lr = 3e-3f;
  auto eng = make_engine(o);
  register_table(*eng, table, 3);
  BOOST_REQUIRE(!arm_faults(*eng, faults));
  return eng;
}

/// One step of the global batch of `step`: world*gas micro-gradients, split over the ranks so that
/// every world size sees the same samples (rank r, micro k gets sample (r*gas + k) of gas*4/world).
void run_step(engine& eng, int step, int gas = 1) {
  int world = eng.world();
  int per_rank = 4 / world;  // the global batch is 4 samples per micro-batch slot
  for (int k = 0; k < gas; ++k)
    for (int r = 0; r < world; ++r) {
      tensor_map sum;
      for (int j = 0; j < per_rank; ++j) {
        auto g = random_grads(table, 11, step, r * per_rank + j, k, 0.5f);
        for (auto& [name, v] : g) {
          auto& s = sum[name];
          s.resize(v.size(), 0.0f);
          for (size_t i = 0; i < v.size(); ++i)
            s[i] += v[i] / per_rank;
        }
      }
      reduce_ok(eng, r, sum);
    }
  step_ok(eng);
}

void train_steps(engine& eng, int first, int last) {
  for (int s = first; s <= last; ++s)
    run_step(eng, s);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The message of the failed load of `dir`, or "" when it loaded.
std::string load_error(engine& eng, const std::string& dir) {
  auto info = eng.load_checkpoint(dir);
  return info ? std::string() : info.err().message();
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x))
      return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_restores_every_rank_bit_for_bit) {
  scratch_dir dir;
  auto a = fresh_engine(4);
  train_steps(*a, 1, 3);
  BOOST_REQUIRE(!a->save_checkpoint(dir.path().string(), R"({"note": "test"})"));

  auto b = fresh_engine(4);
  auto info = b->load_checkpoint(dir.path().string());
  BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
  BOOST_TEST(info->step == 3u);
  BOOST_TEST(info->world == 4);
  BOOST_TEST(info->config == R"({"note":"test"})");
  BOOST_TEST(b->last_step() == 3u);
  for (int r = 0; r < 4; ++r) {
    auto sa = snapshot_of(*a, r), sb = snapshot_of(*b, r);
    BOOST_TEST(same_bits(sa.params, sb.params), "params of rank " << r);
    BOOST_TEST(same_bits(sa.momentum, sb.momentum), "momentum of rank " << r);
    BOOST_TEST(same_bits(sa.exp_avg, sb.exp_avg), "exp_avg of rank " << r);
    BOOST_TEST(same_bits(sa.exp_avg_sq, sb.exp_avg_sq), "exp_avg_sq of rank " << r);
    BOOST_TEST(sa.adam_steps == sb.adam_steps);
  }
  // The state is complete: both continue identically.
  train_steps(*a, 4, 6);
  train_steps(*b, 4, 6);
  auto pa = params_of(*a), pb = params_of(*b);
  for (const auto& [name, v] : pa)
    BOOST_TEST(same_bits(v, pb.at(name)), name);
}

BOOST_AUTO_TEST_CASE(loading_onto_another_world_size_reshards) {
  scratch_dir dir;
  auto a = fresh_engine(4);
  train_steps(*a, 1, 3);
  BOOST_REQUIRE(!a->save_checkpoint(dir.path().string()));
  auto before = params_of(*a);
  train_steps(*a, 4, 6);
  auto reference = params_of(*a);
  for (int world : {1, 2, 3}) {
    auto b = fresh_engine(world);
    auto info = b->load_checkpoint(dir.path().string());
    BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
    BOOST_TEST(info->world == 4);
    // Resharding copies: the loaded parameters are the saved ones exactly.
    auto loaded = params_of(*b);
    for (const auto& [name, v] : before)
      BOOST_TEST(same_bits(v, loaded.at(name)), name << " at world " << world);
    if (world == 3)
      continue;  // the batch of run_step splits over 1, 2 or 4 ranks
    train_steps(*b, 4, 6);
    double diff = rel_diff(params_of(*b), reference);
    BOOST_TEST_MESSAGE("world 4 -> " << world
                                     << ": relative weight difference after 3 more "
                                        "steps "
                                     << diff);
    BOOST_TEST(diff <= 1e-6);
  }
}

// A process of a multi-process job loads only its own ranks: their states equal those of a load
// of every rank, the other ranks' stay empty, and shard files they do not need are not read.
BOOST_AUTO_TEST_CASE(a_range_of_ranks_reads_only_the_files_it_needs) {
  scratch_dir dir;
  auto a = fresh_engine(4);
  train_steps(*a, 1, 2);
  BOOST_REQUIRE(!a->save_checkpoint(dir.path().string()));
  auto target = make_plan(table, 3, 64);
  BOOST_REQUIRE(target);
  auto all = read_checkpoint(dir.path().string(), *target);
  BOOST_REQUIRE_MESSAGE(all, (all ? "" : all.err().to_string()));
  for (const auto& [first, count] : std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 1}}) {
    auto part = read_checkpoint(dir.path().string(), *target, first, count);
    BOOST_REQUIRE_MESSAGE(part, (part ? "" : part.err().to_string()));
    for (int r = 0; r < 3; ++r) {
      const auto& got = part->states[r];
      if (r < first || r >= first + count) {
        BOOST_TEST((got.params.empty() && got.momentum.empty() && got.exp_avg.empty()),
                   "rank " << r << " of [" << first << ", " << first + count << ")");
        continue;
      }
      const auto& want = all->states[r];
      BOOST_TEST(same_bits(got.params, want.params), "params of rank " << r);
      BOOST_TEST(same_bits(got.momentum, want.momentum), "momentum of rank " << r);
      BOOST_TEST(same_bits(got.exp_avg, want.exp_avg), "exp_avg of rank " << r);
      BOOST_TEST(same_bits(got.exp_avg_sq, want.exp_avg_sq), "exp_avg_sq of rank " << r);
      BOOST_TEST(got.adam_steps == want.adam_steps);
    }
  }
  // Target rank 0 of 3 holds the first third of each tensor: saved ranks 0 and 1 of 4, never 3.
  const auto step_dir = fs::path(all->path);
  fs::remove(step_dir / "rank_00003.safetensors");
  auto first_third = read_checkpoint(dir.path().string(), *target, 0, 1);
  BOOST_TEST(static_cast<bool>(first_third), (first_third ? "" : first_third.err().to_string()));
  auto last_third = read_checkpoint(dir.path().string(), *target, 2, 1);
  BOOST_REQUIRE(!last_third);
  BOOST_TEST(last_third.err().message().find("missing shard file") != std::string::npos,
             last_third.err().message());
  BOOST_TEST(
      !static_cast<bool>(read_checkpoint(dir.path().string(), *target, 2, 2)));  // past the world
}

// NorMuon's row moments lie in the file of each NS block's owner at the save. A checkpoint
// written when every block went longest-processing-time first (before a block whole in one
// rank's shard stayed with that rank) has them in other files than today's owners: loading
// each rank alone still finds every block's rows, as written. The control: the earlier owners
// differ from today's for some block.
BOOST_AUTO_TEST_CASE(row_moments_saved_under_the_earlier_owner_rule_are_found) {
  const std::vector<param_spec> experts = {
      {"fc", {64, 32}}, {"up", {4, 64, 32}}, {"down", {4, 32, 64}}};
  const int world = 4;
  auto now = make_plan(experts, world, 1 << 20);
  BOOST_REQUIRE(now);
  plan earlier = *now;  // the earlier writer's plan
  const auto lpt = owners_at_world(*now, world, now->layout, nullptr, false);
  int moved = 0;
  for (size_t j = 0; j < earlier.params.size(); ++j)
    for (size_t k = 0; k < lpt[j].size(); ++k) {
      moved += lpt[j][k] != now->params[j].blocks[k].owner;
      earlier.params[j].blocks[k].owner = lpt[j][k];
    }
  BOOST_REQUIRE(moved > 0);
  // Row i of parameter j holds 1000 * (j + 1) + i, wherever it lies.
  const auto row_value = [](size_t j, int64_t i) { return 1000.0f * (j + 1) + i; };
  scratch_dir dir;
  const auto suffix = create_checkpoint_dir(dir.path().string(), 5);
  BOOST_REQUIRE(suffix);
  const std::string name = checkpoint_dir_name(5, *suffix);
  const std::string out = (dir.path() / name).string();
  const auto offsets = row_moment_offsets(earlier);
  checkpoint_manifest meta;
  meta.step = 5;
  for (int r = 0; r < world; ++r) {
    rank_state st;
    st.params.assign(earlier.shard_total, 0.5f);
    st.momentum.assign(earlier.muon_state_total, 0.25f);
    st.exp_avg.assign(earlier.adam_state_total, 0.0f);
    st.exp_avg_sq.assign(earlier.adam_state_total, 0.0f);
    st.row_moments.assign(row_moment_total(earlier, r), -1.0f);
    for (size_t j = 0; j < earlier.params.size(); ++j)
      for (size_t k = 0; k < offsets[j].size(); ++k) {
        const muon_block& blk = earlier.params[j].blocks[k];
        if (blk.owner == r)
          for (int64_t i = 0; i < blk.rows; ++i)
            st.row_moments[offsets[j][k] + i] = row_value(j, blk.row0 + i);
      }
    auto file = write_shard_file(out, earlier, r, st, 5);
    BOOST_REQUIRE_MESSAGE(file, (file ? "" : file.err().to_string()));
    meta.files.push_back(*file);
  }
  BOOST_REQUIRE(!commit_checkpoint(dir.path().string(), name, earlier, meta));
  const auto now_offsets = row_moment_offsets(*now);
  for (int r = 0; r < world; ++r) {
    auto loaded = read_checkpoint(dir.path().string(), *now, r, 1);
    BOOST_REQUIRE_MESSAGE(loaded, (loaded ? "" : loaded.err().to_string()));
    const auto& rows = loaded->states[r].row_moments;
    BOOST_REQUIRE_EQUAL(static_cast<int64_t>(rows.size()), row_moment_total(*now, r));
    for (size_t j = 0; j < now->params.size(); ++j)
      for (size_t k = 0; k < now_offsets[j].size(); ++k) {
        const muon_block& blk = now->params[j].blocks[k];
        if (blk.owner != r)
          continue;
        int64_t wrong = 0;
        for (int64_t i = 0; i < blk.rows; ++i)
          wrong += rows[now_offsets[j][k] + i] != row_value(j, blk.row0 + i);
        BOOST_TEST(wrong == 0, experts[j].name << " block " << k << " on rank " << r << ": "
                                               << wrong << " rows not as written");
      }
  }
}

BOOST_AUTO_TEST_CASE(loss_scaler_state_is_restored) {
  scratch_dir dir;
  auto o = options(2);
  o.fp16.enabled = true;
  o.fp16.loss_scale_window = 4;
  auto a = make_engine(o);
  register_table(*a, table, 3);
  // An overflow (hysteresis 2: consumed, scale kept), then two clean steps.
  for (int s = 1; s <= 3; ++s) {
    for (int r = 0; r < 2; ++r) {
      auto g = random_grads(table, 5, s, r, 0);
      if (s == 1)
        g["layer.fc.bias"][0] = INFINITY;
      reduce_ok(*a, r, g);
    }
    step_ok(*a);
  }
  BOOST_REQUIRE(!a->save_checkpoint(dir.path().string()));
  auto b = make_engine(o);
  register_table(*b, table, 3);
  BOOST_REQUIRE(b->load_checkpoint(dir.path().string()));
  // From here both see the same steps: a second overflow now halves the scale (hysteresis is
  // used up in both), and the window's growth comes at the same step.
  float lowest = 65536.0f;
  for (int s = 4; s <= 9; ++s) {
    std::vector<float> scales;
    for (auto* eng : {a.get(), b.get()}) {
      for (int r = 0; r < 2; ++r) {
        auto g = random_grads(table, 5, s, r, 0);
        if (s == 4)
          g["layer.fc.bias"][0] = NAN;
        reduce_ok(*eng, r, g);
      }
      auto info = step_ok(*eng);
      scales.push_back(info.next_loss_scale);
    }
    BOOST_TEST(scales[0] == scales[1], "step " << s);
    lowest = std::min(lowest, scales[0]);
  }
  auto sa = a->loss_scale(), sb = b->loss_scale();
  BOOST_REQUIRE(sa && sb);
  BOOST_TEST(*sa == *sb);
  BOOST_TEST(lowest == 32768.0f);  // the scale did change on the way, so the test could fail
}

BOOST_AUTO_TEST_CASE(each_corruption_is_named_and_a_failed_load_changes_nothing) {
  scratch_dir root;
  const std::string good = root.file("good");
  {
    auto a = fresh_engine(4);
    train_steps(*a, 1, 2);
    BOOST_REQUIRE(!a->save_checkpoint(good));
  }
  const std::string ckpt = good + "/step_00000002";
  BOOST_REQUIRE(fs::exists(ckpt + "/manifest.json"));
  auto copy = [&](const std::string& name) {
    std::string to = root.file(name);
    fs::copy(ckpt, to, fs::copy_options::recursive);
    return to;
  };

  std::string truncated = copy("truncated");
  {
    std::string f = truncated + "/rank_00001.safetensors";
    std::string bytes = read_all(f);
    write_all(f, bytes.substr(0, bytes.size() - 100));
  }
  std::string flipped = copy("flipped");
  {
    std::string f = flipped + "/rank_00002.safetensors";
    std::string bytes = read_all(f);
    bytes[bytes.size() - 7] ^= 0x10;
    write_all(f, bytes);
  }
  // A header byte changed so that the header still parses but names another step: the loader
  // reads the header first, yet the cause it names is the checksum.
  std::string header_changed = copy("header_changed");
  {
    std::string f = header_changed + "/rank_00000.safetensors";
    std::string bytes = read_all(f);
    const size_t at = bytes.find("\"step\":\"2\"");
    BOOST_REQUIRE(at != std::string::npos);
    bytes[at + 8] = '3';
    write_all(f, bytes);
  }
  std::string deleted = copy("deleted");
  fs::remove(deleted + "/rank_00003.safetensors");
  std::string wrong_world = copy("wrong_world");
  {
    auto j = nlohmann::json::parse(read_all(wrong_world + "/manifest.json"));
    j["world"] = 3;
    write_all(wrong_world + "/manifest.json", j.dump(1));
  }
  // A NaN in a shard whose checksum was made to match: refused by name, not loaded (every later
  // step would be skipped).
  std::string nonfinite = copy("nonfinite");
  {
    std::string f = nonfinite + "/rank_00001.safetensors";
    std::string bytes = read_all(f);
    const char nan_bits[4] = {0, 0, '\xc0', '\x7f'};  // the last value of the last tensor
    bytes.replace(bytes.size() - 4, 4, nan_bits, 4);
    write_all(f, bytes);
    auto j = nlohmann::json::parse(read_all(nonfinite + "/manifest.json"));
    j["files"][1]["crc32"] =
        ::crc32(::crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()),
                static_cast<uInt>(bytes.size()));
    write_all(nonfinite + "/manifest.json", j.dump(1));
  }
  // A manifest nested past any real one: refused while parsing, before anything walks it
  // recursively (its config was copied and dumped: a stack overflow before).
  std::string deep = copy("deep");
  write_all(deep + "/manifest.json", "{\"config\": " + std::string(100000, '[')
                                         + std::string(100000, ']') + ", "
                                         + read_all(deep + "/manifest.json").substr(1));

  struct corruption_case {
    std::string dir;
    std::string says;
  };
  std::vector<corruption_case> cases = {
      {truncated, "rank_00001.safetensors': file is"},
      {flipped, "rank_00002.safetensors': checksum mismatch"},
      {header_changed, "rank_00000.safetensors': checksum mismatch"},
      {deleted, "missing shard file"},
      {wrong_world, "manifest says world 3 but lists 4 shard files"},
      {deep, "manifest is not valid JSON: nesting deeper than 100 levels at line"},
      {nonfinite, "rank_00001.safetensors': tensor "},
  };
  auto b = fresh_engine(4);
  auto before = params_of(*b);
  std::set<std::string> messages;
  for (const auto& c : cases) {
    std::string msg = load_error(*b, c.dir);
    BOOST_TEST_MESSAGE(c.dir << ": " << msg);
    BOOST_TEST(msg.find(c.says) != std::string::npos, "'" << msg << "' does not say " << c.says);
    messages.insert(msg);
    for (const auto& other : cases)
      if (other.says != c.says)
        BOOST_TEST(msg.find(other.says) == std::string::npos);
  }
  BOOST_TEST(messages.size() == cases.size());
  auto after = params_of(*b);
  for (const auto& [name, v] : before)
    BOOST_TEST(same_bits(v, after.at(name)), name << " changed by a failed load");
  BOOST_TEST(b->last_step() == 0u);
  // The intact one still loads.
  BOOST_TEST(load_error(*b, good).empty());
}

BOOST_AUTO_TEST_CASE(other_problems_are_named) {
  scratch_dir root;
  const std::string good = root.file("good");
  {
    auto a = fresh_engine(2);
    train_steps(*a, 1, 1);
    BOOST_REQUIRE(!a->save_checkpoint(good));
  }
  auto b = fresh_engine(2);
  BOOST_TEST(load_error(*b, root.file("nothing")).find("no checkpoint in") != std::string::npos);
  // A file where the directory should be; a `latest` that is a symbolic link to itself.
  write_all(root.file("a_file"), "x\n");
  std::string said = load_error(*b, root.file("a_file"));
  BOOST_TEST(said.find("a_file': it is not a directory") != std::string::npos, said);
  fs::create_directory(root.file("looped"));
  fs::create_symlink("latest", root.file("looped/latest"));
  said = load_error(*b, root.file("looped"));
  BOOST_TEST(said.find("looped/latest") != std::string::npos, said);
  BOOST_TEST(said.find("symbolic links") != std::string::npos, said);
  // A different parameter table.
  auto o = options(2);
  auto c = make_engine(o);
  auto other = table;
  other[1].shape = {10, 8};
  register_table(*c, other, 3);
  std::string msg = load_error(*c, good);
  BOOST_TEST(msg.find("parameter table mismatch at entry 1") != std::string::npos, msg);
  // `latest` naming something else than a checkpoint directory.
  write_all(good + "/latest", "../../etc\n");
  msg = load_error(*b, good);
  BOOST_TEST(msg.find("does not name a checkpoint") != std::string::npos, msg);
  // A save whose manifest never got written.
  write_all(good + "/latest", "step_00000001\n");
  fs::remove(good + "/step_00000001/manifest.json");
  msg = load_error(*b, good);
  BOOST_TEST(msg.find("the save did not complete") != std::string::npos, msg);
  // Save and load are refused with a step open.
  reduce_ok(*b, 0, random_grads(table, 1, 1, 0, 0));
  auto err = b->save_checkpoint(root.file("open"));
  BOOST_TEST((err.code() == errc::bad_state), err.to_string());
}

/// A fresh engine's steps 1-4, each saved into `dir`: what `dir` then holds.
std::set<std::string> names_after_four_saves(const scratch_dir& dir) {
  auto a = fresh_engine(2);
  for (int s = 1; s <= 4; ++s) {
    run_step(*a, s);
    BOOST_REQUIRE(!a->save_checkpoint(dir.path().string()));
  }
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path()))
    names.insert(e.path().filename().string());
  return names;
}

BOOST_AUTO_TEST_CASE(saves_keep_the_two_newest_and_latest_names_the_newest) {
  scratch_dir dir;
  const auto names = names_after_four_saves(dir);
  BOOST_TEST((names == std::set<std::string>{"latest", "step_00000003", "step_00000004"}));
  BOOST_TEST(read_all(dir.file("latest")) == "step_00000004\n");
}

// The rotation removes only what saves wrote, and only up to the step it saves: a file the user
// named like a checkpoint, a step directory holding anything else, and a later step's checkpoint
// (another run's, saved into the same directory) are all left alone.
BOOST_AUTO_TEST_CASE(saves_remove_only_their_own_older_checkpoints) {
  scratch_dir dir;
  write_all(dir.file("step_00000001"), "precious\n");  // a file, not a checkpoint
  fs::create_directory(dir.file("step_00000002"));
  write_all(dir.file("step_00000002/notes.txt"), "mine\n");
  fs::create_directory(dir.file("step_00000009"));  // a later run's checkpoint
  write_all(dir.file("step_00000009/manifest.json"), "{}\n");
  const auto names = names_after_four_saves(dir);
  BOOST_TEST((names
              == std::set<std::string>{"latest", "step_00000001", "step_00000002", "step_00000003",
                                       "step_00000004", "step_00000009"}));
  BOOST_TEST(read_all(dir.file("step_00000001")) == "precious\n");
  BOOST_TEST(read_all(dir.file("step_00000002/notes.txt")) == "mine\n");
  BOOST_TEST(read_all(dir.file("latest")) == "step_00000004\n");
}

// 1000 steps, 50 random (step, rank, parameter, micro-batch) positions poisoned with NaN or
// +-inf: each such step is skipped on every rank (state bit-identical across it), nothing
// non-finite ever reaches parameters or optimizer state, and the result equals a run in which
// those steps' gradients were never handed over.
BOOST_AUTO_TEST_CASE(injected_nonfinite_steps_are_skipped_everywhere) {
  const int steps = 1000, world = 4, gas = 2;
  std::mt19937_64 gen(2026);
  fault_options faults;
  std::set<uint64_t> poisoned;
  const float values[] = {NAN, INFINITY, -INFINITY};
  for (int i = 0; i < 50; ++i) {
    nonfinite_fault f;
    f.step = 1 + gen() % steps;
    f.rank = static_cast<int>(gen() % world);
    f.param = table[gen() % table.size()].name;
    f.micro = static_cast<int>(gen() % gas);
    f.value = values[i % 3];
    poisoned.insert(f.step);
    faults.nonfinite.push_back(f);
  }
  BOOST_TEST_MESSAGE(poisoned.size() << " distinct poisoned steps");
  auto faulty = fresh_engine(world, faults);
  auto clean = fresh_engine(world);
  int skipped = 0;
  for (int s = 1; s <= steps; ++s) {
    bool bad = poisoned.count(s) > 0;
    std::vector<rank_state> before;
    if (bad)
      for (int r = 0; r < world; ++r)
        before.push_back(snapshot_of(*faulty, r));
    for (int k = 0; k < gas; ++k)
      for (int r = 0; r < world; ++r) {
        auto g = random_grads(table, 17, s, r, k, 0.3f);
        reduce_ok(*faulty, r, g);
        if (!bad)
          reduce_ok(*clean, r, g);
      }
    auto info = step_ok(*faulty);
    if (!bad)
      step_ok(*clean);
    BOOST_TEST(info.skipped == bad, "step " << s);
    skipped += info.skipped;
    for (int r = 0; r < world; ++r) {
      auto now = snapshot_of(*faulty, r);
      bool finite = all_finite(now.params) && all_finite(now.momentum) && all_finite(now.exp_avg)
                    && all_finite(now.exp_avg_sq) && all_finite(now.grads);
      BOOST_TEST(finite, "non-finite state on rank " << r << " after step " << s);
      if (bad) {
        const auto& was = before[r];
        BOOST_TEST(
            (same_bits(was.params, now.params) && same_bits(was.momentum, now.momentum)
             && same_bits(was.exp_avg, now.exp_avg) && same_bits(was.exp_avg_sq, now.exp_avg_sq)
             && was.adam_steps == now.adam_steps),
            "rank " << r << " changed in skipped step " << s);
      }
    }
  }
  BOOST_TEST(skipped == static_cast<int>(poisoned.size()));
  auto pf = params_of(*faulty), pc = params_of(*clean);
  for (const auto& [name, v] : pc)
    BOOST_TEST(same_bits(v, pf.at(name)), name << " differs from the run without those steps");
  for (int r = 0; r < world; ++r) {
    auto sf = snapshot_of(*faulty, r), sc = snapshot_of(*clean, r);
    BOOST_TEST(same_bits(sf.momentum, sc.momentum), "momentum of rank " << r);
    BOOST_TEST(same_bits(sf.exp_avg_sq, sc.exp_avg_sq), "exp_avg_sq of rank " << r);
  }
}

BOOST_AUTO_TEST_CASE(a_fault_naming_an_unknown_parameter_is_an_error) {
  fault_options faults;
  faults.nonfinite.push_back({1, 0, "no.such.weight", 0});
  auto eng = fresh_engine(2, faults);
  auto err = eng->reduce(0, random_grads(table, 1, 1, 0, 0));
  BOOST_TEST((err.code() == errc::invalid_argument), err.to_string());
  BOOST_TEST(err.message().find("no.such.weight") != std::string::npos, err.message());
}

// A manifest larger than this table and the files there can take is refused by its size before
// a byte of it is read: 200 MiB of valid JSON (the saved manifest with a huge config), which
// would take seconds and gigabytes to parse. A save whose config would make such a manifest fails
// instead.
BOOST_AUTO_TEST_CASE(an_oversized_manifest_is_refused_before_it_is_read) {
  scratch_dir root;
  const std::string dir = root.file("ckpt");
  auto a = fresh_engine(2);
  train_steps(*a, 1, 1);
  BOOST_REQUIRE(!a->save_checkpoint(dir));
  const std::string manifest = dir + "/step_00000001/manifest.json";
  // The saved manifest with its config (null) replaced by a string of 200 MiB, written in pieces.
  const std::string text = read_all(manifest);
  const size_t at = text.find("\"config\": null");
  BOOST_REQUIRE(at != std::string::npos);
  {
    std::ofstream out(manifest, std::ios::binary | std::ios::trunc);
    out << text.substr(0, at) << "\"config\": \"";
    const std::string piece(1 << 20, 'x');
    for (int i = 0; i < 200; ++i)
      out << piece;
    out << "\"" << text.substr(at + std::string("\"config\": null").size());
  }
  const auto huge = fs::file_size(manifest);
  BOOST_REQUIRE(huge > (uint64_t(200) << 20));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string said = load_error(*a, dir);
  BOOST_TEST_MESSAGE(
      "a " << huge << "-byte manifest refused in "
           << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
  BOOST_TEST(said.find("manifest holds " + std::to_string(huge) + " bytes, more than the")
                 != std::string::npos,
             said);
  BOOST_TEST(said.find("refused before it is read") != std::string::npos, said);
  // Nothing changed: the engine steps on.
  train_steps(*a, 2, 2);

  // The save side: a config of 5 MiB is refused, one of 1 MiB saves and loads.
  const std::string big_config = nlohmann::json{{"note", std::string(5 << 20, 'y')}}.dump();
  auto err = a->save_checkpoint(root.file("big"), big_config);
  BOOST_TEST((err.code() == errc::invalid_argument), err.to_string());
  BOOST_TEST(err.message().find("over 4 MiB") != std::string::npos, err.to_string());
  const std::string fine_config = nlohmann::json{{"note", std::string(1 << 20, 'z')}}.dump();
  BOOST_REQUIRE(!a->save_checkpoint(root.file("fine"), fine_config));
  auto info = a->load_checkpoint(root.file("fine"));
  BOOST_REQUIRE(info);
  BOOST_TEST(info->config == fine_config);
}
