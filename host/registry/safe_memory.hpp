// registry/safe_memory.hpp: reading memory a plugin pointed at without trusting the pointer.
// A plugin's negotiation answer may hold garbage; the host copies through these instead of
// dereferencing, so a bad answer becomes a refusal rather than a crash.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace ferry::registry {

// Copies `n` bytes from `src` into `dst` when every byte is readable; false otherwise (dst is
// then unspecified). Uses the kernel to touch the memory, so unmapped addresses fail cleanly.
bool copy_readable(const void* src, void* dst, std::size_t n) noexcept;

// The NUL-terminated string at `src`, when it is readable and at most `max_len` bytes long.
std::optional<std::string> read_c_string(const void* src, std::size_t max_len);

// Whether `address` lies inside a loaded ELF object (the plugin, a library, the executable).
bool inside_loaded_object(const void* address) noexcept;

}  // namespace ferry::registry
