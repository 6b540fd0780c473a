// Runs a command, or the zmuon-launch binary (its path comes in as ZMUON_LAUNCH): to completion,
// capturing its output (run_launch), or in the background (launch_process), for the
// multi-process tests.
#pragma once

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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

/// zmuon-launch started in the background, stdout and stderr going to `log`, in the directory
/// `cwd` (empty: the test's). Killed (SIGKILL) when destroyed if it still runs.
class launch_process {
public:
  using clock = std::chrono::steady_clock;

  launch_process(const std::string& args, const std::string& log, const std::string& cwd = "")
      : log_(std::filesystem::absolute(log).string()) {
    std::remove(log_.c_str());
    std::string cmd = "exec " + std::string(ZMUON_LAUNCH) + " " + args + " > " + log_ + " 2>&1";
    pid_ = ::fork();
    BOOST_REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test killed midway leaves no job behind
      if (!cwd.empty() && ::chdir(cwd.c_str()) != 0)
        std::_Exit(126);
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      std::_Exit(127);
    }
  }
  ~launch_process() {
    if (running()) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
    }
  }
  launch_process(const launch_process&) = delete;
  launch_process& operator=(const launch_process&) = delete;

  bool running() const { return !exited_; }

  /// Waits up to `timeout` for the process to exit; true if it did (status()).
  bool wait(std::chrono::milliseconds timeout) {
    auto until = clock::now() + timeout;
    while (!exited_) {
      if (::waitpid(pid_, &status_, WNOHANG) == pid_) {
        exited_ = true;
        break;
      }
      if (clock::now() >= until)
        return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  int status() const { return status_; }

  void signal(int sig) { ::kill(pid_, sig); }

  /// SIGKILL, and wait for it.
  void kill() {
    if (running()) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
      exited_ = true;
    }
  }

  /// Everything written so far.
  std::string output() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  /// Waits up to `timeout` until the output contains `text`; false if it did not (or the
  /// process exited first).
  bool wait_for_output(const std::string& text, std::chrono::milliseconds timeout) {
    auto until = clock::now() + timeout;
    while (output().find(text) == std::string::npos) {
      if (clock::now() >= until || wait(std::chrono::milliseconds(0)))
        return output().find(text) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

private:
  std::string log_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
};

#endif  // ZMUON_LAUNCH

}  // namespace zmuon::test
