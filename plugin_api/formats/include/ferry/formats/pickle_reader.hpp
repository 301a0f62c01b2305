// ferry/formats/pickle_reader.hpp: a restricted reader for the Python pickles (protocols 2-5) that
// a checkpoint-engine ParameterServer sends; it builds an inert value tree and never executes
// anything.
//
// Contract: read_pickle() accepts exactly one pickle that uses only the opcodes Python's pickler
// emits for plain containers and scalars, plus GLOBAL/STACK_GLOBAL for an allow-list of names
// (see allowed_global()). A call (REDUCE/NEWOBJ) of an allow-listed callable becomes a Call node
// that records the callee's name and its arguments; nothing is looked up or run. Everything else
// is refused with ferry::Error(FERRY_STATUS_CORRUPT_DATA) whose message names the byte offset,
// the opcode and the rule that was broken. Work and memory are linear in the input size; the
// reader never recurses, so hostile nesting cannot overflow the stack.
//
// Threading: read_pickle() is reentrant; a returned tree is immutable and may be read from any
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::ckpt_engine {

// Bounds on what one pickle may use. The defaults are far above what checkpoint-engine sends
// (a bucket of a few thousand tensors is ~250 KiB and nests 4 deep).
struct PickleLimits {
  std::size_t max_input_bytes = std::size_t{64} << 20;
  std::size_t max_depth = 32;             // containers/calls inside each other
  std::size_t max_stack = std::size_t{1} << 16;  // values on the unpickler stack at once
  std::size_t max_marks = 32;             // MARKs open at once
  std::size_t max_memo = std::size_t{1} << 22;   // memo entries
};

enum class ValueKind : std::uint8_t {
  none,
  boolean,
  integer,  // fits int64; wider integers are refused
  real,     // Python float
  str,      // UTF-8 text (validated)
  bytes,
  list,
  tuple,
  dict,
  global,  // an allow-listed name, e.g. "torch.bfloat16"; never resolved
  call,    // an allow-listed callable applied to arguments; never called
};

const char* value_kind_name(ValueKind kind) noexcept;

// One node of the value tree. Nodes may be shared (the pickle memo), never cyclic: a container
// fetched from the memo can no longer be mutated, so no container can come to contain itself.
struct Value {
  ValueKind kind = ValueKind::none;
  bool boolean = false;
  std::int64_t integer = 0;
  double real = 0.0;
  // str: the text; bytes: the raw bytes; global: "module.name"; call: the callee "module.name".
  std::string text;
  // list/tuple: the elements; dict: key0, value0, key1, value1, ... in pickle order (duplicate
  // keys are kept; consumers that look keys up refuse duplicates); call: the arguments.
  std::vector<std::shared_ptr<const Value>> items;
  // call: the BUILD state (exception attributes), or null.
  std::shared_ptr<const Value> state;
  // 1 for a scalar; 1 + the deepest child for containers and calls.
  std::uint32_t depth = 1;

  bool is(ValueKind k) const noexcept { return kind == k; }
  std::size_t dict_size() const noexcept { return items.size() / 2; }
  // The value stored under a str key of a dict, or null when absent.
  const Value* dict_get(std::string_view key) const noexcept;
};

using ValuePtr = std::shared_ptr<const Value>;

// How an allow-listed global may be used.
enum class GlobalUse : std::uint8_t {
  marker,        // only as a value (a dtype, a class passed as an argument)
  callable,      // REDUCE/NEWOBJ target; no BUILD on the result
  callable_state // REDUCE/NEWOBJ target whose result may get a BUILD state (exceptions)
};

// The use of "module" + "name" if it is on the allow-list, or nullptr when it is refused.
const GlobalUse* allowed_global(std::string_view module, std::string_view name) noexcept;

// Reads one complete pickle. Throws ferry::Error(FERRY_STATUS_CORRUPT_DATA) on anything outside
// the restricted subset, on truncation, oversize lengths, memo misuse, trailing bytes after STOP
// or when a limit is exceeded.
ValuePtr read_pickle(std::span<const std::uint8_t> bytes, const PickleLimits& limits = {});

// A short, bounded description of a value for error messages ("dict of 4", "call
// torch.Size(...)", "str 'abc…'"); it looks at one level only.
std::string describe(const Value& value);

}  // namespace ferry::ckpt_engine
