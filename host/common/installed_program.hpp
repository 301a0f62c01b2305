// common/installed_program.hpp: where ferry's own programs are: bin/ferry and the helpers in
// <libexecdir>/ferry (ferry-plugin-vet, ferry-bench). Looked for in the installed tree that holds
// the calling code (an install, a relocated bundle or a staged install), then in the build tree
// (development builds), then at the configured install path.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace ferry {

// The file (executable or shared library) the calling code was loaded from.
std::filesystem::path own_object();

// A program of ferry's: its path below an install prefix and where the build tree puts it.
struct InstalledProgram {
  std::filesystem::path relative;  // below the prefix: <bindir>/ferry, <libexecdir>/ferry/NAME
  std::filesystem::path in_build;  // absolute: <build>/host/cli/ferry, ...
};

// The places looked at, in order: <prefix>/<relative> for every prefix the folder of own_object()
// gives when a trailing <bindir>, <libdir>, bin, lib, <libexecdir>/ferry or libexec/ferry is
// removed; `in_build` when own_object() lies in the build tree; <configured prefix>/<relative>.
std::vector<std::filesystem::path> program_candidates(const InstalledProgram& program);

// The first candidate that is an executable regular file, or nullopt.
std::optional<std::filesystem::path> find_program(const InstalledProgram& program);

// The arguments this process was started with (/proc/self/cmdline), argv[0] first: what a program
// hands on when it runs another one (or itself again) with the same command line.
std::vector<std::string> own_arguments();

// The candidates as one line ("A, B or C"), for an error that says where it looked.
std::string candidates_text(const std::vector<std::filesystem::path>& candidates);

}  // namespace ferry
