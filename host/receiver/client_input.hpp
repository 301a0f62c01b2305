// receiver/client_input.hpp: checks of what a client names (paths, addresses, text files beside
// a checkpoint) before the receiver acts on it, so that a mistake or an attack is refused with a
// message instead of loading something else or blocking: no NUL bytes (a C string ends there and
// would name another file), and checkpoint paths that are regular files or folders, found
// without opening them (a FIFO blocks an open; a device never ends a read).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace ferry::receiver {

// INVALID_ARGUMENT naming `field` and the offset of the first NUL byte in `value`, if any.
void refuse_nul(std::string_view value, std::string_view field);

// `path` (the client's `field`) is a regular file or a folder, symbolic links followed, or it
// does not exist (the open that follows names that). Otherwise INVALID_ARGUMENT naming what it
// is (a FIFO, a character device, a socket, ...). A stat only: nothing is opened. Refuses NUL
// bytes first.
void check_checkpoint_path(const std::filesystem::path& path, std::string_view field);

// The text of a small file that may be absent ("" then), opened without blocking and read only
// when it is a regular file of at most `limit` bytes (INVALID_ARGUMENT otherwise, naming it).
std::string read_optional_text_file(const std::filesystem::path& file, std::uint64_t limit);

}  // namespace ferry::receiver
