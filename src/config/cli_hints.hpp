// The command-line tools' answer to a parse error (zmuon-launch, zmuon-trace): CLI11's own
// message, then, for each argument it did not take, the nearest flag or subcommand it lists in
// --help ("zmuon-trace: unknown subcommand 'chek' (did you mean 'check'?)", logged after the
// tool's prefix), with the config keys' nearest-key rule. The exit status is 0 for --help and 2 for
// anything else (bad input), not CLI11's own codes.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/log.hpp"
#include "config/config.hpp"

namespace zmuon {

/// The hints for the arguments `app` (or the subcommand it got to) left over, as errors.
inline void print_parse_hints(CLI::App& app) {
  CLI::App* at = &app;  // the innermost subcommand given: its flags are the candidates
  while (!at->get_subcommands().empty())
    at = at->get_subcommands().front();
  std::vector<std::string> flags, commands;
  for (const CLI::Option* o : at->get_options())
    if (!o->get_group().empty())  // hidden flags (tests' own) are not suggested
      for (const std::string& name : o->get_lnames())
        flags.push_back(name);
  for (const CLI::App* sub : at->get_subcommands([](const CLI::App*) { return true; }))
    commands.push_back(sub->get_name());
  for (const std::string& arg : at->remaining()) {
    const bool flag = arg.rfind("--", 0) == 0 && arg.size() > 2;
    if (!flag && (commands.empty() || arg.empty() || arg[0] == '-'))
      continue;  // a value, or a short option
    const std::string name = flag ? arg.substr(2, arg.find('=') - 2) : arg;
    std::string guess = flag ? "--" + nearest_key(name, flags) : nearest_key(name, commands);
    if (guess == "--")  // `--check` for the subcommand `check`
      guess = nearest_key(name, commands);
    if (!guess.empty())
      ZMUON_LOG_ERROR(std::string("unknown ") + (flag ? "flag" : "subcommand") + " '"
                      + arg.substr(0, arg.find('=')) + "' (did you mean '" + guess + "'?)");
  }
}

/// For `catch (const CLI::ParseError& e)` around app.parse(): prints CLI11's message and the
/// hints; returns the exit status (0 for --help and --version, 2 otherwise).
inline int parse_failure(CLI::App& app, const CLI::ParseError& e) {
  if (app.exit(e) == 0)
    return 0;
  print_parse_hints(app);
  return 2;
}

}  // namespace zmuon
