// cli/main.cpp: the `ferry` command: parses global options and dispatches to a subcommand.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "cli/command_suggestion.hpp"
#include "cli/global_options.hpp"

int main(int argc, char** argv) {
  using namespace ferry::cli;
  CLI::App app{"ferry: moves model weights from RL trainers into rollout engines"};
  app.require_subcommand(1);
  GlobalOptions globals;
  const CLI::Option* log_level = add_global_options(app, globals);

  std::map<CLI::App*, Action> actions;
  auto add = [&](Action (*adder)(CLI::App&, const GlobalOptions&)) {
    const auto before = app.get_subcommands({});
    Action action = adder(app, globals);
    for (CLI::App* sub : app.get_subcommands({})) {
      bool seen = false;
      for (CLI::App* old : before) seen = seen || old == sub;
      if (!seen) actions[sub] = action;
    }
  };
  add(add_plugins_command);
  add(add_version_command);
  add(add_conformance_command);
  add(add_inspect_command);
  add(add_serve_command);
  add(add_push_command);
  add(add_demo_command);
  add(add_bench_command);

  // A mistyped command gets the nearest one named, not only "A subcommand is required".
  if (const auto word = command_word(argc, argv)) {
    std::vector<std::string> known;
    for (CLI::App* sub : app.get_subcommands({})) known.push_back(sub->get_name());
    if (std::find(known.begin(), known.end(), *word) == known.end()) {
      const auto near = nearest_command(*word, known);
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "ferry: error: '%s' is not a ferry command%s (commands: %s)\n",
                   word->c_str(),
                   near ? (std::string("; did you mean '") + *near + "'?").c_str() : "",
                   list.c_str());
      return 2;
    }
  }
  CLI11_PARSE(app, argc, argv);
  CLI::App* chosen = app.get_subcommands().front();
  // A command that hands its arguments to another program (`ferry bench`: ferry-bench) has them
  // checked there.
  if (globals.parse_only && !chosen->get_prefix_command()) {
    print_parsed(app);
    return 0;
  }
  return run_command(globals, *log_level, [&] { return actions.at(chosen)(); });
}
