#include "zmuon-launch/local_nodes.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <thread>

#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/private_files.hpp"

#include "base/log.hpp"

namespace zmuon::example {

namespace {

using clock = std::chrono::steady_clock;

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

/// `args` without the option `name` (and its value, given as the next word or after '=').
std::vector<std::string> without(const std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name) {
      ++i;  // its value
      continue;
    }
    if (starts_with(args[i], name + "="))
      continue;
    out.push_back(args[i]);
  }
  return out;
}

constexpr const char* kVisibleDevices = "CUDA_VISIBLE_DEVICES";

constexpr const char* kJobSecret = "ZMUON_JOB_SECRET";

/// This process's environment with CUDA_VISIBLE_DEVICES set to `devices` (unchanged if empty)
/// and ZMUON_JOB_SECRET to `secret` (unchanged if empty).
std::vector<std::string> environment_with(const std::string& devices, const std::string& secret) {
  std::vector<std::string> env;
  const std::string key = std::string(kVisibleDevices) + "=";
  const std::string secret_key = std::string(kJobSecret) + "=";
  for (char** e = environ; *e != nullptr; ++e)
    if ((devices.empty() || !starts_with(*e, key))
        && (secret.empty() || !starts_with(*e, secret_key)))
      env.emplace_back(*e);
  if (!devices.empty())
    env.push_back(key + devices);
  if (!secret.empty())
    env.push_back(secret_key + secret);
  return env;
}

bool has_flag(const std::vector<std::string>& args, const std::string& name) {
  for (const auto& a : args)
    if (a == name || starts_with(a, name + "="))
      return true;
  return false;
}

/// The job's own secret: 32 random bytes as hex ("" if the system has no randomness to give).
std::string fresh_secret() {
  unsigned char bytes[32];
  if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes))
    return {};
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

// vfork, not fork: fork runs OpenBLAS's pthread_atfork handler (it shuts the BLAS thread pool
// down first), the suspected cause of one test run in which the launcher printed nothing for
// 30 s. The child only sets its death signal and execs (everything it needs is built before).
pid_t spawn(const std::vector<std::string>& args, const std::string& devices,
            const std::string& secret) {
  static const char* self = "/proc/self/exe";
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(self));
  for (auto& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env = environment_with(devices, secret);
  std::vector<char*> envp;
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = ::vfork();
  if (pid != 0)
    return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the launcher dies: so do its nodes
  ::execve(self, argv.data(), envp.data());
  ::_exit(127);
}

int exit_code(int status) {
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return 1;
}

std::string describe(int status) {
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "exited with " + std::to_string(exit_code(status));
}

}  // namespace

std::string node_visible_devices(const char* visible, int device_count, int nodes,
                                 int ranks_per_node, int node) {
  std::vector<std::string> gpus;
  if (visible != nullptr) {
    std::string list = visible;
    for (size_t at = 0; at <= list.size();) {
      const size_t comma = std::min(list.find(',', at), list.size());
      if (comma > at)
        gpus.push_back(list.substr(at, comma - at));
      at = comma + 1;
    }
  } else {
    for (int i = 0; i < device_count; ++i)
      gpus.push_back(std::to_string(i));
  }
  if (nodes < 1 || ranks_per_node < 1 || node < 0 || node >= nodes
      || static_cast<int64_t>(nodes) * ranks_per_node > static_cast<int64_t>(gpus.size()))
    return {};
  std::string out;
  for (int i = node * ranks_per_node; i < (node + 1) * ranks_per_node; ++i)
    out += (out.empty() ? "" : ",") + gpus[static_cast<size_t>(i)];
  return out;
}

std::vector<std::string> args_without_local_nodes(int argc, char** argv) {
  return without(std::vector<std::string>(argv + 1, argv + argc), "--local-nodes");
}

int run_local_nodes(int nodes, const std::vector<std::string>& args, long long join_timeout_ms,
                    long long grace_ms, const std::vector<std::string>& node_devices) {
  auto devices_of = [&](int n) {
    return n < static_cast<int>(node_devices.size()) ? node_devices[n] : std::string();
  };
  auto gpus_of = [&](int n) {  // for the "node N pid P" line
    return devices_of(n).empty() ? std::string() : " (CUDA_VISIBLE_DEVICES=" + devices_of(n) + ")";
  };
  // The hand-over of node 0's port: a file in a directory only this user can enter, so that no
  // one else can plant a file or a link there.
  auto dir = make_private_dir("zmuon-rendezvous-");
  if (!dir) {
    ZMUON_LOG_ERROR(dir.err().message());
    return 1;
  }
  struct dir_guard {
    std::string path;
    ~dir_guard() { remove_private_dir(path); }
  } guard{*dir};
  const std::string file = *dir + "/rendezvous";
  // The job's secret, handed to each node in its environment (readable by this user only):
  // fresh for each job unless the user gave one or asked for plain TCP.
  std::string secret;
  if (!has_flag(args, "--secret-file") && !has_flag(args, "--insecure")
      && !has_flag(args, "--insecure-any-host")) {
    secret = fresh_secret();
    if (secret.empty()) {
      ZMUON_LOG_ERROR("no randomness for the job's secret");
      return 1;
    }
  }
  auto node_args = [&](int n, const std::string& master) {
    auto a = n == 0 ? args : without(args, "--save-params");
    a.insert(a.end(), {"--nodes", std::to_string(nodes), "--node-rank", std::to_string(n),
                       "--master", master});
    if (n == 0)
      a.insert(a.end(), {"--rendezvous-file", file});
    return a;
  };
  std::vector<pid_t> pids(nodes, -1);
  std::vector<int> status(nodes, 0);
  std::vector<bool> running(nodes, false);
  auto kill_all = [&] {
    for (int n = 0; n < nodes; ++n)
      if (running[n])
        ::kill(pids[n], SIGKILL);
  };
  auto reap = [&](bool block) {
    int st = 0;
    pid_t pid = ::waitpid(-1, &st, block ? 0 : WNOHANG);
    for (int n = 0; n < nodes && pid > 0; ++n)
      if (pids[n] == pid && running[n]) {
        running[n] = false;
        status[n] = st;
        return n;
      }
    return -1;
  };

  pids[0] = spawn(node_args(0, "127.0.0.1:0"), devices_of(0), secret);
  running[0] = true;
  std::printf("zmuon-launch: node 0 pid %d%s\n", static_cast<int>(pids[0]), gpus_of(0).c_str());
  std::fflush(stdout);
  // Wait for node 0 to listen (it writes "127.0.0.1:PORT" to the file).
  std::string master;
  auto deadline = clock::now() + std::chrono::milliseconds(join_timeout_ms);
  while (master.empty()) {
    std::ifstream in(file);
    if (in)
      std::getline(in, master);
    if (!master.empty())
      break;
    if (reap(false) == 0) {
      ZMUON_LOG_ERROR("node 0 " + describe(status[0]) + " before it listened");
      return exit_code(status[0]) == 0 ? 1 : exit_code(status[0]);
    }
    if (clock::now() >= deadline) {
      ZMUON_LOG_ERROR("node 0 did not listen within " + std::to_string(join_timeout_ms) + " ms");
      kill_all();
      while (reap(true) >= 0) {
      }
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::remove(file.c_str());
  for (int n = 1; n < nodes; ++n) {
    pids[n] = spawn(node_args(n, master), devices_of(n), secret);
    running[n] = true;
    std::printf("zmuon-launch: node %d pid %d%s\n", n, static_cast<int>(pids[n]),
                gpus_of(n).c_str());
  }
  std::fflush(stdout);

  int first_failure = -1;
  clock::time_point kill_at;
  for (int left = nodes; left > 0;) {
    int n = reap(false);
    if (n < 0) {
      if (first_failure >= 0 && clock::now() >= kill_at) {
        for (int q = 0; q < nodes; ++q)
          if (running[q])
            ZMUON_LOG_ERROR("node " + std::to_string(q) + " still running "
                            + std::to_string(grace_ms) + " ms after node "
                            + std::to_string(first_failure) + " failed; killing it");
        kill_all();
        kill_at = clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    --left;
    if (exit_code(status[n]) != 0) {
      ZMUON_LOG_ERROR("node " + std::to_string(n) + " " + describe(status[n]));
      if (first_failure < 0) {
        first_failure = n;
        kill_at = clock::now() + std::chrono::milliseconds(grace_ms);
      }
    }
  }
  std::fflush(stderr);
  if (first_failure < 0)
    return 0;
  // A node killed by a signal is a node the job lost: the survivors' code for it (3), not 128 +
  // the signal, which reads as if the launcher itself had been killed.
  return WIFSIGNALED(status[first_failure]) ? 3 : exit_code(status[first_failure]);
}

}  // namespace zmuon::example
