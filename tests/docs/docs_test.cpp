// tests/docs/docs_test.cpp: the docs are claims, and this holds them to the code. It reads every
// Markdown file of the source tree (README.md, docs/**, the plugin READMEs, new ones included
// without listing them) and checks:
// - every ```toml block is accepted by the config loader, plugin sections included (checked
//   against the in-tree plugins), unless its info string says `toml fragment` (not a whole file:
//   skipped) or `toml refused` (a negative example: it must be refused);
// - every command line of a ```sh / bash / shell / console block that runs `ferry` (or a path
//   ending in /ferry) parses with the real executable (`--parse-only`: an option or command that
//   does not exist fails), and the ones that need no peer, file or GPU (plugins, version,
//   conformance --list, --help, --version) also run and succeed;
// - docs/config.md's key tables list exactly the keys the config knows, each choice of a key
//   with fixed spellings, and its table of plugin options what each in-tree plugin declares;
// - the demo's model is "synthetic" wherever the docs describe it, as `ferry demo --help` says.
#include <ferry/sdk/error.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/plugin_sections.hpp"
#include "registry/registry.hpp"
#include "tests/common/run_command.hpp"

namespace fs = std::filesystem;
namespace fc = ferry::config;
using ::testing::HasSubstr;

namespace {

fs::path source_root() { return std::getenv("FERRY_SOURCE_ROOT"); }
std::string ferry_exe() { return std::getenv("FERRY_EXE"); }

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every Markdown file under the source root, outside build folders and hidden ones.
std::vector<fs::path> markdown_files() {
  std::vector<fs::path> files;
  const fs::path root = source_root();
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() &&
        (name.starts_with(".") || name.starts_with("build") || name == "subprojects" ||
         name == "node_modules" || fs::exists(it->path() / "meson-private"))) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && it->path().extension() == ".md") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string source_relative(const fs::path& path) { return fs::relative(path, source_root()).string(); }

struct Block {
  fs::path file;
  int line = 0;  // of the first line inside the fence
  std::string language;
  std::set<std::string> flags;  // words after the language in the info string
  std::string text;
};

std::vector<Block> fenced_blocks(const fs::path& file) {
  std::vector<Block> blocks;
  std::istringstream in(read_text(file));
  std::string line;
  int number = 0;
  std::optional<Block> open;
  std::string fence_indent;
  while (std::getline(in, line)) {
    ++number;
    const auto start = line.find_first_not_of(' ');
    const bool fence = start != std::string::npos && line.compare(start, 3, "```") == 0;
    if (!open) {
      if (!fence) continue;
      Block block;
      block.file = file;
      block.line = number + 1;
      std::istringstream info(line.substr(start + 3));
      info >> block.language;
      for (std::string word; info >> word;) block.flags.insert(word);
      open = block;
      fence_indent = line.substr(0, start);
    } else if (fence && line.find_first_not_of("` ", start) == std::string::npos) {
      blocks.push_back(*open);
      open.reset();
    } else {
      open->text += (line.starts_with(fence_indent) ? line.substr(fence_indent.size()) : line) +
                    "\n";
    }
  }
  return blocks;
}

std::vector<Block> all_blocks() {
  std::vector<Block> blocks;
  for (const auto& file : markdown_files()) {
    for (auto& block : fenced_blocks(file)) blocks.push_back(std::move(block));
  }
  return blocks;
}

const ferry::registry::Registry& in_tree_registry() {
  static const ferry::registry::Registry registry = [] {
    std::vector<fs::path> dirs;
    std::string rest = std::getenv("FERRY_IN_TREE_PLUGIN_DIRS");
    while (!rest.empty()) {
      const auto colon = rest.find(':');
      dirs.emplace_back(rest.substr(0, colon));
      rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
    }
    return ferry::registry::Registry(dirs);
  }();
  return registry;
}

// ---- TOML blocks --------------------------------------------------------------------------

TEST(DocsToml, EveryConfigExampleIsAcceptedOrMarked) {
  int checked = 0;
  for (const Block& block : all_blocks()) {
    if (block.language != "toml" || block.flags.contains("fragment")) continue;
    ++checked;
    const std::string where = source_relative(block.file) + ":" + std::to_string(block.line);
    std::string error;
    try {
      const fc::Config config = fc::parse(block.text, where);
      fc::check_plugin_sections(config, in_tree_registry());
    } catch (const ferry::Error& e) {
      error = e.what();
    }
    if (block.flags.contains("refused")) {
      EXPECT_NE(error, "") << where << ": a `toml refused` example is accepted:\n" << block.text;
    } else {
      EXPECT_EQ(error, "") << where << ": the config loader refuses this example:\n"
                           << block.text;
    }
  }
  EXPECT_GE(checked, 1) << "no ```toml block found: is FERRY_SOURCE_ROOT right?";
  std::printf("checked %d toml blocks\n", checked);
}

// ---- command lines ------------------------------------------------------------------------

// A shell line cut to its first simple command: no comment, no pipe or list after it, no
// trailing '&'. Quotes are kept as they are (the shell reads them).
std::string first_command(const std::string& line) {
  std::string out;
  char quote = 0;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
      out += c;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
      break;
    } else if (c == '|' || c == ';' || (c == '&' && i + 1 < line.size() && line[i + 1] == '&')) {
      break;
    }
    out += c;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == '&' || out.back() == '\t')) {
    out.pop_back();
  }
  return out;
}

// The words of a command (split at blanks outside quotes; quotes kept).
std::vector<std::string> words_of(const std::string& command) {
  std::vector<std::string> words;
  std::string word;
  char quote = 0;
  for (const char c : command) {
    if (quote == 0 && (c == ' ' || c == '\t' || c == '\n')) {
      if (!word.empty()) words.push_back(word);
      word.clear();
      continue;
    }
    if (quote == 0 && (c == '\'' || c == '"')) quote = c;
    else if (c == quote) quote = 0;
    word += c;
  }
  if (!word.empty()) words.push_back(word);
  return words;
}

struct FerryLine {
  std::string where;   // "docs/x.md:12"
  std::string text;    // as written
  std::string env;     // leading VAR=value words
  std::string args;    // after the executable, optional brackets dropped
};

// `[--token T]` is an option the reader may leave out: the check takes it in.
std::string drop_optional_brackets(const std::vector<std::string>& words, std::size_t from) {
  std::string args;
  for (std::size_t i = from; i < words.size(); ++i) {
    std::string w = words[i];
    if (w.starts_with("[-")) w.erase(0, 1);
    if (w.ends_with("]") && w.find('[') == std::string::npos) w.pop_back();
    if (w.empty()) continue;
    args += (args.empty() ? "" : " ") + w;
  }
  return args;
}

std::vector<FerryLine> ferry_lines() {
  static const std::set<std::string> kShells = {"sh", "bash", "shell", "console"};
  std::vector<FerryLine> lines;
  for (const Block& block : all_blocks()) {
    if (!kShells.contains(block.language)) continue;
    std::istringstream in(block.text);
    std::string line;
    std::string joined;
    int number = block.line - 1;
    int first = 0;
    while (std::getline(in, line)) {
      ++number;
      if (joined.empty()) first = number;
      if (!line.empty() && line.back() == '\\') {
        joined += line.substr(0, line.size() - 1) + " ";
        continue;
      }
      joined += line;
      std::string command = first_command(joined);
      joined.clear();
      if (command.starts_with("$ ")) command.erase(0, 2);
      const auto words = words_of(command);
      std::size_t i = 0;
      std::string env;
      while (i < words.size() && words[i].find('=') != std::string::npos &&
             words[i].find('=') > 0 && words[i][0] != '-') {
        env += words[i++] + " ";
      }
      if (i == words.size()) continue;
      const std::string& exe = words[i];
      if (exe != "ferry" && !exe.ends_with("/ferry")) continue;
      lines.push_back({source_relative(block.file) + ":" + std::to_string(first), command, env,
                       drop_optional_brackets(words, i + 1)});
    }
  }
  return lines;
}

std::string in_scratch(const std::string& env, const std::string& args) {
  static const fs::path scratch = [] {
    const fs::path dir = fs::temp_directory_path() / ("ferry-docs-test-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    return dir;
  }();
  return "cd '" + scratch.string() + "' && env -u FERRY_PLUGIN_PATH " + env + "timeout 60 '" +
         ferry_exe() + "' " + args + " 2>&1";
}

TEST(DocsCommands, EveryFerryCommandLineParses) {
  const auto lines = ferry_lines();
  EXPECT_GE(lines.size(), 5u);
  for (const FerryLine& line : lines) {
    const bool self_answering = line.args == "--version" || line.args == "--help" ||
                                line.args.ends_with(" --help");
    if (self_answering) continue;  // run below
    const auto result = ferry::test::run_command(in_scratch(line.env, "--parse-only " + line.args));
    EXPECT_EQ(result.status, 0) << line.where << ": `" << line.text
                                << "` does not parse:\n" << result.out;
    EXPECT_THAT(result.out, HasSubstr("ferry: parsed '")) << line.where << ": " << line.text;
  }
  std::printf("parsed %zu ferry command lines\n", lines.size());
}

TEST(DocsCommands, TheOnesThatNeedNothingRun) {
  int ran = 0;
  for (const FerryLine& line : ferry_lines()) {
    const auto words = words_of(line.args);
    if (words.empty()) continue;
    const bool runnable = words[0] == "plugins" || words[0] == "version" ||
                          line.args == "--version" || line.args.ends_with("--help") ||
                          line.args == "conformance --list";
    if (!runnable) continue;
    ++ran;
    const auto result = ferry::test::run_command(in_scratch(line.env, line.args));
    EXPECT_EQ(result.status, 0) << line.where << ": `" << line.text << "` fails:\n"
                                << result.out;
  }
  EXPECT_GE(ran, 1);
  std::printf("ran %d ferry command lines\n", ran);
}

// `ferry ...` in running text names a command or an option, often without its values: the
// command and every option named must exist (a missing value or required option is not checked).
TEST(DocsCommands, EveryCommandNamedInTheTextExists) {
  const std::regex span(R"(`((?:build/host/cli/)?ferry(?: [^`]*)?)`)");
  int checked = 0;
  for (const auto& file : markdown_files()) {
    const std::string text = read_text(file);
    for (std::sregex_iterator it(text.begin(), text.end(), span), end; it != end; ++it) {
      const std::string written = (*it)[1].str();
      const auto words = words_of(written);
      if (words.size() < 2) continue;
      // "--config/--set" lists options in prose; "<name>" stands for a value.
      if (written.find("/--") != std::string::npos) continue;
      ++checked;
      std::string args;  // each word quoted: running text is not shell ("<name>")
      for (const auto& word : words_of(drop_optional_brackets(words, 1))) {
        args += (word.find('\'') == std::string::npos ? "'" + word + "'" : word) + " ";
      }
      const auto result = ferry::test::run_command(in_scratch("", "--parse-only " + args));
      const bool unknown = result.out.find("was not expected") != std::string::npos ||
                           result.out.find("is not a ferry command") != std::string::npos;
      EXPECT_FALSE(unknown) << source_relative(file) << ": `" << written
                            << "` names a command or option ferry does not have:\n" << result.out;
    }
  }
  std::printf("checked %d ferry commands named in the text\n", checked);
}

// The checker itself: a made-up option or command must fail it.
TEST(DocsCommands, AnOptionThatDoesNotExistFailsTheCheck) {
  EXPECT_NE(ferry::test::run_command(in_scratch("", "--parse-only serve --no-such-option")).status,
            0);
  EXPECT_NE(ferry::test::run_command(in_scratch("", "--parse-only servve")).status, 0);
  EXPECT_EQ(first_command("ferry plugins   # what was found | x"), "ferry plugins");
  EXPECT_EQ(first_command("ferry serve --port 0 --ready-file F &"),
            "ferry serve --port 0 --ready-file F");
  EXPECT_EQ(drop_optional_brackets(words_of("ferry serve --port 1 [--token T]"), 1),
            "serve --port 1 --token T");
}

// ---- docs/config.md's tables --------------------------------------------------------------

// "| `key` | ..." rows of docs/config.md under "### Top level" and "### `[section]`...", as
// full key paths -> the row's text.
std::map<std::string, std::string> documented_keys() {
  std::map<std::string, std::string> keys;
  std::istringstream in(read_text(source_root() / "docs" / "config.md"));
  std::string line;
  std::optional<std::string> section;  // "" = top level
  const std::regex heading(R"(^###\s+`\[(\w+)\]`)");
  const std::regex row(R"(^\|\s*`([a-z_]+)`\s*\|)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (line.starts_with("#")) {
      if (line.starts_with("### Top level")) {
        section = "";
      } else if (std::regex_search(line, m, heading)) {
        section = m[1].str();
      } else if (line.starts_with("## ") || line.starts_with("### ")) {
        section.reset();
      }
      continue;
    }
    if (section && std::regex_search(line, m, row)) {
      keys[section->empty() ? m[1].str() : *section + "." + m[1].str()] = line;
    }
  }
  return keys;
}

TEST(DocsConfig, TheKeyTablesListExactlyTheKnownKeys) {
  const auto documented = documented_keys();
  std::set<std::string> known;
  for (const fc::KeyInfo& key : fc::known_keys()) {
    known.insert(key.path);
    const auto it = documented.find(key.path);
    if (it == documented.end()) {
      ADD_FAILURE() << "docs/config.md has no row for '" << key.path << "'";
      continue;
    }
    for (const auto& choice : key.choices) {
      const bool named = it->second.find("`" + choice + "`") != std::string::npos ||
                         it->second.find("`\"" + choice + "\"`") != std::string::npos;
      EXPECT_TRUE(named) << "docs/config.md's row for '" << key.path
                         << "' does not name its choice '" << choice << "': " << it->second;
    }
  }
  for (const auto& [path, row] : documented) {
    EXPECT_TRUE(known.contains(path)) << "docs/config.md documents '" << path
                                      << "', which the config does not know";
  }
}

TEST(DocsConfig, ThePluginOptionsTableIsWhatThePluginsDeclare) {
  std::istringstream in(read_text(source_root() / "docs" / "config.md"));
  std::string line;
  const std::regex row(R"(^\|\s*((?:`(?:transport|model)\.\w+`(?:,\s*)?)+)\s*\|\s*(.*?)\s*\|$)");
  const std::regex name(R"(`(transport|model)\.(\w+)`)");
  const std::regex option(R"(`(\w+)`)");
  std::set<std::string> listed;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    const std::string names = m[1].str();
    const std::string options_text = m[2].str();
    std::vector<std::string> options;
    for (std::sregex_iterator it(options_text.begin(), options_text.end(), option), end;
         it != end; ++it) {
      options.push_back((*it)[1].str());
    }
    std::sort(options.begin(), options.end());
    for (std::sregex_iterator it(names.begin(), names.end(), name), end; it != end; ++it) {
      const std::string kind = (*it)[1].str();
      const std::string plugin = (*it)[2].str();
      listed.insert(kind + "." + plugin);
      std::shared_ptr<ferry::registry::LoadedPlugin> loaded;
      try {
        loaded = kind == "transport" ? in_tree_registry().transport(plugin)
                                     : in_tree_registry().model(plugin);
      } catch (const ferry::Error&) {
        continue;  // not built here (a feature left out)
      }
      ASSERT_TRUE(loaded->info().option_keys.has_value()) << kind << "." << plugin;
      auto declared = *loaded->info().option_keys;
      std::sort(declared.begin(), declared.end());
      EXPECT_EQ(options, declared) << "docs/config.md's options of " << kind << "." << plugin;
    }
  }
  for (const auto& plugin : in_tree_registry().plugins()) {
    const std::string key =
        std::string(ferry::registry::kind_name(plugin->info().kind)) + "." + plugin->info().name;
    EXPECT_TRUE(listed.contains(key)) << "docs/config.md's plugin options table lacks " << key;
  }
}

// ---- one word for the demo's model --------------------------------------------------------

TEST(DocsWords, TheDemoModelIsSyntheticEverywhere) {
  const auto help = ferry::test::run_command("'" + ferry_exe() + "' demo --help 2>&1");
  EXPECT_THAT(help.out, HasSubstr("synthetic"));
  const std::regex other(R"((bundled|built-in|sample|shipped)[^.\n]{0,30}\bmodel)",
                         std::regex::icase);
  for (const auto& file : markdown_files()) {
    std::istringstream in(read_text(file));
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.find("demo") == std::string::npos) continue;
      EXPECT_FALSE(std::regex_search(line, other))
          << source_relative(file) << ":" << number << " calls the demo's model something other than "
          << "synthetic: " << line;
    }
  }
  EXPECT_THAT(read_text(source_root() / "README.md"), HasSubstr("on a synthetic small model"));
}

}  // namespace
