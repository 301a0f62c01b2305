// conformance/elf_symbols.cpp: reads .dynsym of an ELF64 little-endian file. Every offset and
// size from the file is checked against the file's length before it is used.
#include "conformance/elf_symbols.hpp"

#include <ferry/sdk/error.hpp>

#include <elf.h>

#include <cstring>
#include <fstream>
#include <iterator>

namespace ferry::conformance {
namespace {

class ElfImage {
 public:
  ElfImage(std::filesystem::path path, std::vector<char> bytes)
      : path_(std::move(path)), bytes_(std::move(bytes)) {}

  // Copies a T from `offset` after checking [offset, offset + sizeof(T)) lies in the file.
  template <typename T>
  T read(std::uint64_t offset, const char* what) const {
    check_range(offset, sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + offset, sizeof(T));
    return value;
  }

  void check_range(std::uint64_t offset, std::uint64_t size, const char* what) const {
    if (offset > bytes_.size() || size > bytes_.size() - offset) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: {} at offset {} (+{} bytes) lies past the end ({} bytes)", path_.string(), what,
           offset, size, bytes_.size());
    }
  }

  // The NUL-terminated string at `offset` inside the string table [table, table + size).
  std::string string_at(std::uint64_t table, std::uint64_t size, std::uint64_t offset) const {
    check_range(table, size, "string table");
    if (offset >= size) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: symbol name offset {} outside the {}-byte string table",
           path_.string(), offset, size);
    }
    const char* start = bytes_.data() + table + offset;
    const void* nul = std::memchr(start, '\0', size - offset);
    if (nul == nullptr) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: symbol name at offset {} is not NUL-terminated",
           path_.string(), offset);
    }
    return std::string(start, static_cast<const char*>(nul));
  }

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::vector<char> bytes_;
};

}  // namespace

bool DynamicSymbol::exported() const {
  const bool visible_binding =
      binding == STB_GLOBAL || binding == STB_WEAK || binding == STB_GNU_UNIQUE;
  const bool visible = visibility == STV_DEFAULT || visibility == STV_PROTECTED;
  return section != SHN_UNDEF && visible_binding && visible;
}

std::vector<DynamicSymbol> read_dynamic_symbols(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(FERRY_STATUS_IO, "{}: cannot open for reading", path.string());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const ElfImage elf(path, std::move(bytes));

  const auto header = elf.read<Elf64_Ehdr>(0, "ELF header");
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: not an ELF file (bad magic)", path.string());
  }
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: not a little-endian ELF64 file", path.string());
  }
  if (header.e_shentsize != sizeof(Elf64_Shdr)) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: section header size {} (expected {})", path.string(),
         header.e_shentsize, sizeof(Elf64_Shdr));
  }
  auto section = [&](std::uint64_t index) {
    if (index >= header.e_shnum) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: section index {} out of {}", path.string(), index,
           header.e_shnum);
    }
    return elf.read<Elf64_Shdr>(header.e_shoff + index * sizeof(Elf64_Shdr), "section header");
  };

  for (std::uint64_t i = 0; i < header.e_shnum; ++i) {
    const auto dynsym = section(i);
    if (dynsym.sh_type != SHT_DYNSYM) continue;
    if (dynsym.sh_entsize != sizeof(Elf64_Sym)) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: .dynsym entry size {} (expected {})", path.string(),
           dynsym.sh_entsize, sizeof(Elf64_Sym));
    }
    const auto strtab = section(dynsym.sh_link);
    elf.check_range(dynsym.sh_offset, dynsym.sh_size, ".dynsym");
    std::vector<DynamicSymbol> symbols;
    const std::uint64_t count = dynsym.sh_size / sizeof(Elf64_Sym);
    for (std::uint64_t k = 1; k < count; ++k) {
      const auto sym = elf.read<Elf64_Sym>(dynsym.sh_offset + k * sizeof(Elf64_Sym), "symbol");
      DynamicSymbol out;
      out.name = elf.string_at(strtab.sh_offset, strtab.sh_size, sym.st_name);
      out.type = ELF64_ST_TYPE(sym.st_info);
      out.binding = ELF64_ST_BIND(sym.st_info);
      out.visibility = ELF64_ST_VISIBILITY(sym.st_other);
      out.section = sym.st_shndx;
      symbols.push_back(std::move(out));
    }
    return symbols;
  }
  fail(FERRY_STATUS_CORRUPT_DATA, "{}: has no .dynsym section (not a shared object?)",
       path.string());
}

}  // namespace ferry::conformance
