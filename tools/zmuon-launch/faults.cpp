#include "zmuon-launch/faults.hpp"

#include <cerrno>
#include <cstdlib>

namespace zmuon::example {

namespace {

bool parse_uint(const std::string& text, uint64_t max, uint64_t& out) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    return false;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno != 0 || v > max)
    return false;
  out = v;
  return true;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts(1);
  for (char c : text)
    if (c == sep)
      parts.emplace_back();
    else
      parts.back() += c;
  return parts;
}

}  // namespace

void add_fault_flags(CLI::App& app, fault_flags& flags) {
  const char* group = "Fault injection (tests)";
  app.add_option("--inject-nonfinite", flags.nonfinite,
                 "write a non-finite value (default nan; inf, -inf) into element 0 of PARAM's "
                 "gradient that RANK hands over in micro-batch MICRO (0-based) of STEP; "
                 "repeatable")
      ->type_name("STEP:RANK:PARAM:MICRO[:VALUE]")
      ->group(group);
  app.add_option("--kill-at-step", flags.kill_at_step,
                 "the process kills itself (SIGKILL) as this step begins")
      ->group(group);
  app.add_option("--kill-in-save", flags.kill_in_save,
                 "the process kills itself (SIGKILL) in the checkpoint save of STEP, after FILES "
                 "(default 1) shard files are written")
      ->type_name("STEP[:FILES]")
      ->group(group);
}

error apply_fault_flags(const fault_flags& flags, uint64_t steps, int gas, int every,
                        fault_options& out) {
  auto never = [&](const std::string& flag, const std::string& text, uint64_t step) {
    return error{errc::invalid_argument, flag + " " + text + ": step " + std::to_string(step)
                                             + " never comes in a run of " + std::to_string(steps)
                                             + " steps"};
  };
  for (const auto& text : flags.nonfinite) {
    auto bad = [&] {
      return error{errc::invalid_argument,
                   "--inject-nonfinite " + text
                       + ": expected STEP:RANK:PARAM:MICRO[:VALUE] with VALUE nan, inf or -inf"};
    };
    auto parts = split(text, ':');
    if (parts.size() != 4 && parts.size() != 5)
      return bad();
    nonfinite_fault f;
    uint64_t rank = 0, micro = 0;
    if (!parse_uint(parts[0], UINT64_MAX, f.step) || f.step == 0
        || !parse_uint(parts[1], 1 << 20, rank) || parts[2].empty()
        || !parse_uint(parts[3], 1 << 20, micro))
      return bad();
    if (f.step > steps)
      return never("--inject-nonfinite", text, f.step);
    if (micro >= static_cast<uint64_t>(gas))
      return {errc::invalid_argument, "--inject-nonfinite " + text + ": micro-batch " + parts[3]
                                          + " never comes with gas " + std::to_string(gas)
                                          + " (MICRO is 0-based)"};
    f.rank = static_cast<int>(rank);
    f.param = parts[2];
    f.micro = static_cast<int>(micro);
    if (parts.size() == 5) {
      if (parts[4] == "inf")
        f.value = __builtin_inff();
      else if (parts[4] == "-inf")
        f.value = -__builtin_inff();
      else if (parts[4] != "nan")
        return bad();
    }
    out.nonfinite.push_back(std::move(f));
  }
  if (flags.kill_at_step > steps)
    return never("--kill-at-step", std::to_string(flags.kill_at_step), flags.kill_at_step);
  out.kill_at_step = flags.kill_at_step;
  if (!flags.kill_in_save.empty()) {
    auto parts = split(flags.kill_in_save, ':');
    uint64_t files = 1;
    if (parts.size() > 2 || !parse_uint(parts[0], UINT64_MAX, out.kill_in_save_at_step)
        || out.kill_in_save_at_step == 0
        || (parts.size() == 2 && (!parse_uint(parts[1], 1 << 20, files) || files == 0)))
      return {errc::invalid_argument,
              "--kill-in-save " + flags.kill_in_save + ": expected STEP[:FILES], both >= 1"};
    if (out.kill_in_save_at_step > steps)
      return never("--kill-in-save", flags.kill_in_save, out.kill_in_save_at_step);
    if (every <= 0)
      return {errc::invalid_argument, "--kill-in-save " + flags.kill_in_save
                                          + ": the run saves no checkpoint (--save-checkpoint "
                                            "DIR --every N saves one)"};
    if (out.kill_in_save_at_step % static_cast<uint64_t>(every) != 0)
      return {errc::invalid_argument, "--kill-in-save " + flags.kill_in_save + ": step "
                                          + std::to_string(out.kill_in_save_at_step)
                                          + " saves no checkpoint (--every " + std::to_string(every)
                                          + " saves at its multiples)"};
    out.kill_in_save_after_files = static_cast<int>(files);
  }
  return {};
}

error check_faults_after_resume(const fault_options& faults, uint64_t resumed_step) {
  auto past = [&](const std::string& flag, uint64_t step) {
    return error{errc::invalid_argument, flag + ": step " + std::to_string(step)
                                             + " never comes: the run resumes after step "
                                             + std::to_string(resumed_step)};
  };
  for (const auto& f : faults.nonfinite)
    if (f.step <= resumed_step)
      return past("--inject-nonfinite " + std::to_string(f.step) + ":" + std::to_string(f.rank)
                      + ":" + f.param + ":" + std::to_string(f.micro),
                  f.step);
  if (faults.kill_at_step != 0 && faults.kill_at_step <= resumed_step)
    return past("--kill-at-step " + std::to_string(faults.kill_at_step), faults.kill_at_step);
  if (faults.kill_in_save_at_step != 0 && faults.kill_in_save_at_step <= resumed_step)
    return past("--kill-in-save " + std::to_string(faults.kill_in_save_at_step),
                faults.kill_in_save_at_step);
  return {};
}

}  // namespace zmuon::example
