// tests/ckpt_engine/pickle_bytes.hpp: a tiny pickle writer for tests: it emits opcodes one by
// one so hostile and edge-case pickles can be written without Python.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::ckpt_engine::testing {

class PickleBytes {
 public:
  explicit PickleBytes(int protocol = 4) {
    op(0x80);
    op(static_cast<std::uint8_t>(protocol));
  }
  PickleBytes& op(std::uint8_t code) {
    bytes_.push_back(code);
    return *this;
  }
  PickleBytes& raw(std::string_view s) {
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  PickleBytes& le(std::uint64_t v, int width) {
    for (int i = 0; i < width; ++i) bytes_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
    return *this;
  }
  PickleBytes& str(std::string_view s) {
    if (s.size() < 256) {
      op(0x8c).le(s.size(), 1);
    } else {
      op('X').le(s.size(), 4);
    }
    return raw(s);
  }
  PickleBytes& bin(std::string_view s) {
    if (s.size() < 256) {
      op('C').le(s.size(), 1);
    } else {
      op('B').le(s.size(), 4);
    }
    return raw(s);
  }
  PickleBytes& integer(std::int64_t v) {
    if (v >= 0 && v < 256) return op('K').le(static_cast<std::uint64_t>(v), 1);
    if (v >= INT32_MIN && v <= INT32_MAX) return op('J').le(static_cast<std::uint32_t>(v), 4);
    return op(0x8a).le(8, 1).le(static_cast<std::uint64_t>(v), 8);
  }
  PickleBytes& global(std::string_view module, std::string_view name) {
    return str(module).str(name).op(0x93);
  }
  PickleBytes& text_global(std::string_view module, std::string_view name) {
    return op('c').raw(module).raw("\n").raw(name).raw("\n");
  }
  PickleBytes& mark() { return op('('); }
  PickleBytes& tuple() { return op('t'); }
  PickleBytes& reduce() { return op('R'); }
  PickleBytes& none() { return op('N'); }
  PickleBytes& stop() { return op('.'); }
  // torch.Size((d0, d1, ...)) as Python pickles it.
  PickleBytes& size(const std::vector<std::int64_t>& dims) {
    global("torch", "Size").mark();
    for (const auto d : dims) integer(d);
    return tuple().op(0x85).reduce();
  }
  // {"name": name, "dtype": torch.<dtype>, "shape": torch.Size(shape), "offset": offset}
  PickleBytes& tensor_meta(std::string_view name, std::string_view dtype,
                           const std::vector<std::int64_t>& shape, std::int64_t offset) {
    op('}').mark();
    str("name").str(name).str("dtype").global("torch", dtype).str("shape").size(shape);
    str("offset").integer(offset);
    return op('u');
  }
  const std::vector<std::uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
};

}  // namespace ferry::ckpt_engine::testing
