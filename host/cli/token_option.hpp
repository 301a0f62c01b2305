// cli/token_option.hpp: where the `ferry` commands take the bearer token of the control API from,
// so that it need not be on the command line (visible to every user in `ps`): --token TEXT,
// --token-file PATH (a file only its owner can read), or the environment variable FERRY_TOKEN,
// in that order; none of them: the config's receiver.token.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

namespace ferry::cli {

inline constexpr const char* kTokenEnvironment = "FERRY_TOKEN";

struct TokenOptions {
  std::optional<std::string> token;
  std::optional<std::string> token_file;
};

// Adds --token and --token-file (one or the other) to `cmd`; `what` says what the token is for.
std::shared_ptr<TokenOptions> add_token_options(CLI::App& cmd, const std::string& what);

// The token from the options, else FERRY_TOKEN (when set and not empty), else nullopt.
// INVALID_ARGUMENT naming the file when the token file is not a regular file, can be read or
// written by every user, is empty, or holds more than one line; a warning when its group may
// read it.
std::optional<std::string> resolve_token(const TokenOptions& options);

// The token in `path` (one line; the final line break and surrounding blanks are not part of
// it), with the checks of resolve_token.
std::string read_token_file(const std::string& path);

}  // namespace ferry::cli
