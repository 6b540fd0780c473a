// Resuming zmuon-launch from a checkpoint in a new process: bit for bit on the same world size,
// within 1e-6 from 4 ranks to 2, and after the process was killed mid-save or mid-run.
#define BOOST_TEST_MODULE resume
#include <boost/test/unit_test.hpp>

#include "support/run_launch.hpp"

#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "checkpoint/safetensors.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path work = fs::path("test_resume_work");

std::string path_of(const std::string& name) {
  return (work / name).string();
}

/// Runs zmuon-launch, which must succeed.
std::string launch_ok(const std::string& args) {
  int status = 0;
  auto out = zmuon::test::run_launch(args, &status);
  BOOST_TEST_MESSAGE("zmuon-launch " << args << "\n" << out);
  BOOST_REQUIRE_MESSAGE(status == 0, "zmuon-launch " << args << " failed:\n" << out);
  return out;
}

/// Runs zmuon-launch, which must die of SIGKILL (directly, or as the shell's child: 128 + 9).
std::string launch_killed(const std::string& args) {
  int status = 0;
  auto out = zmuon::test::run_launch(args, &status);
  BOOST_TEST_MESSAGE("zmuon-launch " << args << "\n" << out);
  bool killed = (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
                || (WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGKILL);
  BOOST_REQUIRE_MESSAGE(killed, "expected SIGKILL, status " << status << ":\n" << out);
  return out;
}

std::vector<zmuon::named_tensor> params_in(const std::string& file) {
  auto t = zmuon::read_safetensors(file);
  BOOST_REQUIRE_MESSAGE(t, (t ? "" : t.err().to_string()));
  return *t;
}

void require_bit_identical(const std::string& a, const std::string& b) {
  auto ta = params_in(a), tb = params_in(b);
  BOOST_REQUIRE_EQUAL(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    BOOST_TEST(ta[i].name == tb[i].name);
    BOOST_TEST(
        (ta[i].data.size() == tb[i].data.size()
         && std::memcmp(ta[i].data.data(), tb[i].data.data(), ta[i].data.size() * sizeof(float))
                == 0),
        ta[i].name << " differs between " << a << " and " << b);
  }
}

/// The "step N  loss ..." lines of steps >= first.
/// The step lines from step `first` on, without their wall time (which differs between runs).
std::vector<std::string> step_lines(const std::string& out, int first) {
  std::vector<std::string> lines;
  std::regex line(R"(step\s+(\d+)\s+loss[^\n]*?skipped \d)");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
    if (std::stoi((*it)[1]) >= first)
      lines.push_back((*it)[0]);
  return lines;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The uninterrupted 10-step run every case compares with (4 ranks, the launcher's defaults).
struct reference_run {
  std::string params = path_of("uninterrupted.safetensors");
  std::string output;
  reference_run() {
    std::error_code ec;
    fs::remove_all(work, ec);
    fs::create_directories(work);
    output = launch_ok("--steps 10 --save-params " + params);
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(resume, reference_run)

BOOST_AUTO_TEST_CASE(resume_in_a_new_process_is_bit_identical) {
  const std::string dir = path_of("ckpt_same_world");
  auto first = launch_ok("--steps 5 --save-checkpoint " + dir + " --every 5");
  BOOST_TEST(read_text(dir + "/latest") == "step_00000005\n");
  const std::string resumed = path_of("resumed.safetensors");
  auto second = launch_ok("--steps 10 --resume " + dir + " --save-params " + resumed);
  BOOST_TEST(second.find("at step 5 (saved by 4 ranks)") != std::string::npos);
  BOOST_TEST(second.find("a setting the saved run did not have") == std::string::npos);
  BOOST_TEST(step_lines(second, 1) == step_lines(output, 6), "steps 6-10 print the same lines");
  require_bit_identical(resumed, params);
}

// A resume with other settings than the saved run's runs, and names each one that differs.
BOOST_AUTO_TEST_CASE(resume_with_other_settings_names_them) {
  const std::string dir = path_of("ckpt_other_settings");
  launch_ok("--steps 2 --save-checkpoint " + dir + " --every 2 --seed 3");
  auto out = launch_ok("--steps 3 --resume " + dir + " --seed 4 --set optimizer.params.lr=0.01");
  BOOST_TEST(out.find("did not have: seed 3 -> 4") != std::string::npos, out);
  BOOST_TEST(
      out.find("did not have: config.optimizer.params.muon_lr 0.02 -> 0.01") != std::string::npos,
      out);
  BOOST_TEST(out.find("no step is left") == std::string::npos, out);
  // --steps not past the checkpoint's step: nothing to train, and it says so.
  out = launch_ok("--steps 2 --resume " + dir + " --seed 3");
  BOOST_TEST(out.find("the checkpoint is at step 2 and --steps is 2: no step is left to train")
                 != std::string::npos,
             out);
  BOOST_TEST(step_lines(out, 1).empty(), out);
}

BOOST_AUTO_TEST_CASE(resume_from_4_ranks_on_2_is_within_1e_6) {
  const std::string dir = path_of("ckpt_4_ranks");
  launch_ok("--ranks 4 --steps 5 --save-checkpoint " + dir + " --every 5");
  // Two ranks with twice the micro-batch see the same 32 samples per step.
  const std::string resumed = path_of("resumed_on_2.safetensors");
  auto out = launch_ok("--ranks 2 --micro-batch 16 --steps 10 --resume " + dir + " --save-params "
                       + resumed);
  BOOST_TEST(out.find("saved by 4 ranks") != std::string::npos);
  auto ta = params_in(resumed), tb = params_in(params);
  BOOST_REQUIRE_EQUAL(ta.size(), tb.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ta.size(); ++i)
    for (size_t j = 0; j < tb[i].data.size(); ++j) {
      double d = static_cast<double>(ta[i].data[j]) - tb[i].data[j];
      num += d * d;
      den += static_cast<double>(tb[i].data[j]) * tb[i].data[j];
    }
  double rel = std::sqrt(num / den);
  BOOST_TEST_MESSAGE("4 -> 2 ranks: relative weight difference at step 10: " << rel);
  BOOST_TEST(rel <= 1e-6);
}

BOOST_AUTO_TEST_CASE(a_save_killed_halfway_leaves_the_previous_checkpoint_loadable) {
  const std::string dir = path_of("ckpt_killed_save");
  // Saves at 5 and 10; the save at 10 dies after 2 of its 4 shard files.
  launch_killed("--steps 10 --save-checkpoint " + dir + " --every 5 --kill-in-save 10:2");
  BOOST_TEST(read_text(dir + "/latest") == "step_00000005\n");
  BOOST_TEST(fs::exists(dir + "/step_00000010/rank_00001.safetensors"));
  BOOST_TEST(!fs::exists(dir + "/step_00000010/rank_00002.safetensors"));
  BOOST_TEST(!fs::exists(dir + "/step_00000010/manifest.json"));
  const std::string resumed = path_of("resumed_after_killed_save.safetensors");
  auto out = launch_ok("--steps 10 --resume " + dir + " --save-params " + resumed);
  BOOST_TEST(out.find("at step 5") != std::string::npos);
  require_bit_identical(resumed, params);
}

BOOST_AUTO_TEST_CASE(a_run_killed_at_a_step_resumes_from_its_last_checkpoint) {
  const std::string dir = path_of("ckpt_killed_run");
  auto out = launch_killed("--steps 10 --save-checkpoint " + dir + " --every 3 --kill-at-step 8");
  BOOST_TEST(step_lines(out, 8).empty(), "step 8 must not have run");
  BOOST_TEST(read_text(dir + "/latest") == "step_00000006\n");
  const std::string resumed = path_of("resumed_after_kill.safetensors");
  out = launch_ok("--steps 10 --resume " + dir + " --save-params " + resumed);
  BOOST_TEST(out.find("at step 6") != std::string::npos);
  require_bit_identical(resumed, params);
}

BOOST_AUTO_TEST_CASE(injected_nonfinite_gradients_skip_exactly_their_steps) {
  auto out = launch_ok(
      "--steps 5 --gas 2 --inject-nonfinite 2:1:mlp.fc1.weight:1 "
      "--inject-nonfinite 4:3:head.bias:0:-inf");
  std::regex line(R"(step\s+(\d+)\s+loss[^\n]*skipped (\d))");
  std::vector<int> skipped;
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
    if ((*it)[2] == "1")
      skipped.push_back(std::stoi((*it)[1]));
  BOOST_TEST(skipped == (std::vector<int>{2, 4}), out);
}

BOOST_AUTO_TEST_CASE(bad_fault_and_checkpoint_flags_are_errors) {
  int status = 0;
  auto out = zmuon::test::run_launch("--inject-nonfinite 3:0:fc1.weight", &status);
  BOOST_TEST(status != 0);
  BOOST_TEST(out.find("STEP:RANK:PARAM:MICRO") != std::string::npos, out);
  // Faults the run never reaches: refused before it starts, naming the flag.
  const std::pair<const char*, const char*> never[] = {
      {"--steps 5 --kill-at-step 6", "--kill-at-step 6: step 6 never comes in a run of 5 steps"},
      {"--steps 5 --kill-in-save 9:2 --save-checkpoint x --every 1",
       "--kill-in-save 9:2: step 9 never comes in a run of 5 steps"},
      {"--steps 5 --kill-in-save 4:1 --save-checkpoint x --every 3",
       "--kill-in-save 4:1: step 4 saves no checkpoint (--every 3 saves at its multiples)"},
      {"--steps 5 --kill-in-save 4", "--kill-in-save 4: the run saves no checkpoint"},
      {"--steps 5 --inject-nonfinite 7:0:fc1.weight:0",
       "--inject-nonfinite 7:0:fc1.weight:0: step 7 never comes in a run of 5 steps"},
      {"--steps 5 --gas 2 --inject-nonfinite 1:0:fc1.weight:2",
       "--inject-nonfinite 1:0:fc1.weight:2: micro-batch 2 never comes with gas 2 (MICRO is "
       "0-based)"},
  };
  for (auto [args, says] : never) {
    out = zmuon::test::run_launch(args, &status);
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 2), args << ": " << out);
    BOOST_TEST(out.find(says) != std::string::npos, out);
  }
  // After a resume, a fault at the checkpoint's step or before never comes either.
  const std::string dir = path_of("ckpt_faults");
  launch_ok("--steps 4 --save-checkpoint " + dir + " --every 2");
  const std::pair<std::string, const char*> passed[] = {
      {"--kill-at-step 3", "--kill-at-step 3: step 3 never comes: the run resumes after step 4"},
      {"--kill-in-save 4 --save-checkpoint " + dir + " --every 2",
       "--kill-in-save 4: step 4 never comes: the run resumes after step 4"},
      {"--inject-nonfinite 2:1:mlp.fc1.weight:0",
       "--inject-nonfinite 2:1:mlp.fc1.weight:0: step 2 never comes: the run resumes after step 4"},
  };
  for (const auto& [args, says] : passed) {
    out = zmuon::test::run_launch("--steps 8 --resume " + dir + " " + args, &status);
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 2), args << ": " << out);
    BOOST_TEST(out.find(says) != std::string::npos, out);
  }
  launch_killed("--steps 8 --resume " + dir + " --kill-at-step 5");  // the next step still fires
  out = zmuon::test::run_launch("--every 5", &status);
  BOOST_TEST(status != 0);
  BOOST_TEST(out.find("--save-checkpoint") != std::string::npos, out);
  out = zmuon::test::run_launch("--save-checkpoint " + path_of("x"), &status);
  BOOST_TEST(status != 0);
  BOOST_TEST(out.find("--every") != std::string::npos, out);
  out = zmuon::test::run_launch("--resume " + path_of("no_such_dir"), &status);
  BOOST_TEST(status != 0);
  BOOST_TEST(out.find("no checkpoint in") != std::string::npos, out);
}

BOOST_AUTO_TEST_SUITE_END()
