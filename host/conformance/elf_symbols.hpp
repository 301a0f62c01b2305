// conformance/elf_symbols.hpp: a small, bounds-checked reader of an ELF64 file's dynamic symbol
// table (.dynsym), used to check that a plugin exports nothing but its entry symbol.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ferry::conformance {

struct DynamicSymbol {
  std::string name;
  unsigned type = 0;          // STT_*
  unsigned binding = 0;       // STB_*
  unsigned visibility = 0;    // STV_*
  std::uint16_t section = 0;  // SHN_UNDEF for an import, SHN_ABS for an absolute symbol

  // Defined in this object and visible to other objects (what `nm -D --defined-only` lists).
  bool exported() const;
};

// Every entry of .dynsym except the null symbol. Throws ferry::Error (IO when the file cannot be
// read, CORRUPT_DATA naming the offending offset when it is not a well-formed little-endian
// ELF64 file or has no .dynsym).
std::vector<DynamicSymbol> read_dynamic_symbols(const std::filesystem::path& path);

}  // namespace ferry::conformance
