// formats/pickle_reader.cpp: the restricted pickle reader (see pickle_reader.hpp): an
// iterative opcode loop over a bounds-checked cursor, an allow-list of globals, inert call nodes.
#include <ferry/formats/pickle_reader.hpp>

#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <unordered_set>
#include <utility>

namespace ferry::ckpt_engine {
namespace {

// Opcode bytes, named as in CPython's pickletools.
enum Op : std::uint8_t {
  kMark = '(',
  kStop = '.',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kNone = 'N',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kEmptyDict = '}',
  kAppends = 'e',
  kBinGet = 'h',
  kLongBinGet = 'j',
  kEmptyList = ']',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  kReduce = 'R',
  kShortBinBytes = 'C',
  kBinBytes = 'B',
  kProto = 0x80,
  kNewObj = 0x81,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
};

// Every opcode CPython knows, so that a refusal names what it refused.
const char* opcode_name(std::uint8_t op) noexcept {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return "unknown opcode";
  }
}

struct AllowedEntry {
  std::string_view module;
  std::string_view name;
  GlobalUse use;
};

// The names checkpoint-engine's messages contain (PROTOCOL.md lists where each comes from).
// "__builtin__" is how protocol 2 spells "builtins".
constexpr std::array kAllowed = {
    AllowedEntry{"torch.multiprocessing.reductions", "rebuild_cuda_tensor", GlobalUse::callable},
    AllowedEntry{"torch", "Size", GlobalUse::callable},
    AllowedEntry{"torch", "Tensor", GlobalUse::marker},
    AllowedEntry{"torch.nn.parameter", "Parameter", GlobalUse::marker},
    AllowedEntry{"torch.storage", "TypedStorage", GlobalUse::marker},
    AllowedEntry{"torch.storage", "UntypedStorage", GlobalUse::marker},
    AllowedEntry{"torch", "TypedStorage", GlobalUse::marker},
    AllowedEntry{"torch", "UntypedStorage", GlobalUse::marker},
    AllowedEntry{"torch", "float64", GlobalUse::marker},
    AllowedEntry{"torch", "float32", GlobalUse::marker},
    AllowedEntry{"torch", "float16", GlobalUse::marker},
    AllowedEntry{"torch", "bfloat16", GlobalUse::marker},
    AllowedEntry{"torch", "int64", GlobalUse::marker},
    AllowedEntry{"torch", "int32", GlobalUse::marker},
    AllowedEntry{"torch", "int16", GlobalUse::marker},
    AllowedEntry{"torch", "int8", GlobalUse::marker},
    AllowedEntry{"torch", "uint8", GlobalUse::marker},
    AllowedEntry{"torch", "bool", GlobalUse::marker},
    AllowedEntry{"torch", "float8_e4m3fn", GlobalUse::marker},
    AllowedEntry{"torch", "float8_e5m2", GlobalUse::marker},
    // Dtypes torch has and ferry does not convert: decoded so the refusal can name the tensor.
    AllowedEntry{"torch", "uint16", GlobalUse::marker},
    AllowedEntry{"torch", "uint32", GlobalUse::marker},
    AllowedEntry{"torch", "uint64", GlobalUse::marker},
    AllowedEntry{"torch", "complex64", GlobalUse::marker},
    AllowedEntry{"torch", "complex128", GlobalUse::marker},
    AllowedEntry{"torch", "float8_e4m3fnuz", GlobalUse::marker},
    AllowedEntry{"torch", "float8_e5m2fnuz", GlobalUse::marker},
    AllowedEntry{"torch", "float8_e8m0fnu", GlobalUse::marker},
    // SGLang's MultiprocessingSerializer (update_weights_from_tensor): its patched CUDA rebuild
    // (the device as a UUID), CPU tensors (rebuild_tensor over a typed storage; the storage in a
    // shared-memory file, or by file descriptor, which the decoder refuses naming why), and the
    // metadata of a flattened bucket (a dataclass: NEWOBJ, then BUILD with its fields).
    AllowedEntry{"sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified", GlobalUse::callable},
    AllowedEntry{"torch.multiprocessing.reductions", "rebuild_tensor", GlobalUse::callable},
    AllowedEntry{"torch.multiprocessing.reductions", "rebuild_typed_storage", GlobalUse::callable},
    AllowedEntry{"torch.multiprocessing.reductions", "rebuild_storage_filename", GlobalUse::callable},
    AllowedEntry{"torch.multiprocessing.reductions", "rebuild_storage_fd", GlobalUse::callable},
    AllowedEntry{"multiprocessing.resource_sharer", "DupFd", GlobalUse::callable_state},
    AllowedEntry{"sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata",
                 GlobalUse::callable_state},
    // The ParameterServer's abort message is a pickled RuntimeError.
    AllowedEntry{"builtins", "RuntimeError", GlobalUse::callable_state},
    AllowedEntry{"builtins", "Exception", GlobalUse::callable_state},
    AllowedEntry{"__builtin__", "RuntimeError", GlobalUse::callable_state},
    AllowedEntry{"__builtin__", "Exception", GlobalUse::callable_state},
};

// Longest module or attribute name accepted (the longest allowed one is 36 characters).
constexpr std::size_t kMaxGlobalName = 128;

bool valid_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  const std::size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms and values past U+10FFFF. Surrogates are allowed: Python writes lone
    // surrogates with "surrogatepass".
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF) {
      return false;
    }
    i += len;
  }
  return true;
}

class Reader {
 public:
  Reader(std::span<const std::uint8_t> in, const PickleLimits& limits)
      : in_(in), limits_(limits) {}

  ValuePtr run();

 private:
  using Node = std::shared_ptr<Value>;

  template <typename... Args>
  [[noreturn]] void refuse(fmt::format_string<Args...> format, Args&&... args) const {
    fail(FERRY_STATUS_CORRUPT_DATA, "pickle refused at byte {} ({}): {}", op_pos_,
         opcode_name(op_), fmt::format(format, std::forward<Args>(args)...));
  }

  std::size_t left() const noexcept { return in_.size() - pos_; }

  std::span<const std::uint8_t> take(std::uint64_t n, const char* what) {
    if (n > left()) refuse("{} of {} bytes runs past the end of the input ({} bytes left)", what, n, left());
    auto out = in_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return out;
  }

  std::uint64_t read_le(std::size_t width, const char* what) {
    const auto b = take(width, what);
    std::uint64_t v = 0;
    for (std::size_t i = width; i-- > 0;) v = (v << 8) | b[i];
    return v;
  }

  Node make(ValueKind kind) {
    auto node = std::make_shared<Value>();
    node->kind = kind;
    return node;
  }

  void push(Node node) {
    if (stack_.size() >= limits_.max_stack) {
      refuse("more than {} values on the stack (nesting or width limit)", limits_.max_stack);
    }
    stack_.push_back(std::move(node));
  }

  Node pop(const char* what) {
    if (stack_.size() <= floor()) refuse("{} needs a value but the stack is empty", what);
    Node n = std::move(stack_.back());
    stack_.pop_back();
    return n;
  }

  Node& top(const char* what) {
    if (stack_.size() <= floor()) refuse("{} needs a value but the stack is empty", what);
    return stack_.back();
  }

  // Values below the innermost MARK are not visible to ordinary opcodes (as in CPython).
  std::size_t floor() const noexcept { return marks_.empty() ? 0 : marks_.back(); }

  // Pops the innermost MARK and returns the values above it.
  std::vector<Node> pop_mark(const char* what) {
    if (marks_.empty()) refuse("{} without a matching MARK", what);
    const std::size_t at = marks_.back();
    marks_.pop_back();
    std::vector<Node> out(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(at)),
                          std::make_move_iterator(stack_.end()));
    stack_.resize(at);
    return out;
  }

  void adopt(Value& parent, const Node& child) {
    const std::uint32_t d = child->depth + 1;
    if (d > limits_.max_depth) refuse("nesting deeper than {} levels", limits_.max_depth);
    parent.depth = std::max(parent.depth, d);
    parent.items.push_back(child);
  }

  // A container may only be mutated while nothing else can reach it: once fetched from the
  // memo it is shared, and mutating it could build a cycle.
  Value& mutable_target(Node& node, ValueKind kind, const char* what) {
    if (node->kind != kind) {
      refuse("{} applies to a {} but the target is a {}", what, value_kind_name(kind),
             value_kind_name(node->kind));
    }
    if (shared_.contains(node.get())) {
      refuse("{} on a {} fetched from the memo (shared or recursive structures are refused)",
             what, value_kind_name(kind));
    }
    return *node;
  }

  void check_dict_key(const Node& key) {
    if (!key->is(ValueKind::str) && !key->is(ValueKind::integer)) {
      refuse("dict key is a {}; only str and int keys are accepted", value_kind_name(key->kind));
    }
  }

  void push_global(std::string module, std::string name) {
    if (allowed_global(module, name) == nullptr) {
      refuse("global '{}.{}' is not on the allow-list", module.substr(0, kMaxGlobalName),
             name.substr(0, kMaxGlobalName));
    }
    auto node = make(ValueKind::global);
    node->text = module + "." + name;
    push(std::move(node));
  }

  std::string read_line(const char* what) {
    const std::size_t limit = std::min(left(), kMaxGlobalName + 1);
    for (std::size_t i = 0; i < limit; ++i) {
      if (in_[pos_ + i] == '\n') {
        std::string out(reinterpret_cast<const char*>(in_.data() + pos_), i);
        pos_ += i + 1;
        return out;
      }
    }
    if (limit == left()) refuse("{} runs past the end of the input without a newline", what);
    refuse("{} longer than {} characters", what, kMaxGlobalName);
  }

  void text_value(ValueKind kind, std::uint64_t n, const char* what) {
    const auto b = take(n, what);
    auto node = make(kind);
    node->text.assign(reinterpret_cast<const char*>(b.data()), b.size());
    if (kind == ValueKind::str && !valid_utf8(node->text)) refuse("{} is not valid UTF-8", what);
    push(std::move(node));
  }

  void integer_value(std::int64_t v) {
    auto node = make(ValueKind::integer);
    node->integer = v;
    push(std::move(node));
  }

  void long_value(std::uint64_t n) {
    if (n > 8) refuse("integer of {} bytes is wider than 64 bits", n);
    const auto b = take(n, "integer");
    std::uint64_t v = 0;
    for (std::size_t i = b.size(); i-- > 0;) v = (v << 8) | b[i];
    if (n > 0 && n < 8 && (b[n - 1] & 0x80) != 0) v |= ~std::uint64_t{0} << (8 * n);  // sign
    integer_value(static_cast<std::int64_t>(v));
  }

  void memo_put(std::uint64_t index) {
    Node& value = top("memo put");
    if (index > memo_.size()) {
      refuse("memo index {} skips ahead of the memo size {}", index, memo_.size());
    }
    if (index == memo_.size()) {
      if (memo_.size() >= limits_.max_memo) refuse("more than {} memo entries", limits_.max_memo);
      memo_.push_back(value);
    } else {
      memo_[static_cast<std::size_t>(index)] = value;
    }
  }

  void memo_get(std::uint64_t index) {
    if (index >= memo_.size()) {
      refuse("memo index {} is not defined (the memo has {} entries)", index, memo_.size());
    }
    Node node = memo_[static_cast<std::size_t>(index)];
    shared_.insert(node.get());
    push(std::move(node));
  }

  void make_tuple(std::vector<Node> items) {
    auto node = make(ValueKind::tuple);
    node->items.reserve(items.size());
    for (const auto& item : items) adopt(*node, item);
    push(std::move(node));
  }

  void call(const char* what) {
    Node args = pop(what);
    Node callee = pop(what);
    if (!callee->is(ValueKind::global)) {
      refuse("{} of a {}; only allow-listed callables may be called", what,
             value_kind_name(callee->kind));
    }
    const auto dot = callee->text.rfind('.');
    const GlobalUse* use =
        allowed_global(std::string_view(callee->text).substr(0, dot),
                       std::string_view(callee->text).substr(dot + 1));
    if (use == nullptr || *use == GlobalUse::marker) {
      refuse("{} of '{}' is refused: it is not an allow-listed callable", what, callee->text);
    }
    if (!args->is(ValueKind::tuple)) {
      refuse("{} of '{}' with a {} as arguments; a tuple is required", what, callee->text,
             value_kind_name(args->kind));
    }
    auto node = make(ValueKind::call);
    node->text = callee->text;
    node->items.reserve(args->items.size());
    for (const auto& item : args->items) {
      const std::uint32_t d = item->depth + 1;
      if (d > limits_.max_depth) refuse("nesting deeper than {} levels", limits_.max_depth);
      node->depth = std::max(node->depth, d);
      node->items.push_back(item);
    }
    push(std::move(node));
  }

  void build() {
    Node state = pop("BUILD");
    Node& target = top("BUILD");
    Value& call = mutable_target(target, ValueKind::call, "BUILD");
    const auto dot = call.text.rfind('.');
    const GlobalUse* use = allowed_global(std::string_view(call.text).substr(0, dot),
                                          std::string_view(call.text).substr(dot + 1));
    if (use == nullptr || *use != GlobalUse::callable_state) {
      refuse("BUILD on the result of '{}' is refused", call.text);
    }
    if (call.state) refuse("second BUILD on the result of '{}'", call.text);
    const std::uint32_t d = state->depth + 1;
    if (d > limits_.max_depth) refuse("nesting deeper than {} levels", limits_.max_depth);
    call.depth = std::max(call.depth, d);
    call.state = std::move(state);
  }

  void step();

  std::span<const std::uint8_t> in_;
  const PickleLimits& limits_;
  std::size_t pos_ = 0;
  std::size_t op_pos_ = 0;
  std::uint8_t op_ = 0;
  std::vector<Node> stack_;
  std::vector<std::size_t> marks_;
  std::vector<Node> memo_;
  std::unordered_set<const Value*> shared_;
  ValuePtr result_;
};

ValuePtr Reader::run() {
  if (in_.size() > limits_.max_input_bytes) {
    fail(FERRY_STATUS_CORRUPT_DATA, "pickle refused: {} bytes is more than the limit of {} bytes",
         in_.size(), limits_.max_input_bytes);
  }
  if (in_.size() < 2 || in_[0] != kProto) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "pickle refused at byte 0: not a protocol 2-5 pickle (it must start with PROTO)");
  }
  while (!result_) {
    if (pos_ >= in_.size()) {
      op_pos_ = pos_;
      op_ = 0;
      fail(FERRY_STATUS_CORRUPT_DATA, "pickle refused at byte {}: truncated, the input ends before STOP",
           pos_);
    }
    step();
  }
  if (pos_ != in_.size()) {
    fail(FERRY_STATUS_CORRUPT_DATA,
         "pickle refused at byte {}: {} trailing bytes after STOP (one pickle per message)", pos_,
         in_.size() - pos_);
  }
  return result_;
}

void Reader::step() {
  op_pos_ = pos_;
  op_ = in_[pos_++];
  switch (op_) {
    case kProto: {
      const std::uint64_t v = read_le(1, "protocol number");
      if (op_pos_ != 0) refuse("PROTO is only accepted as the first opcode");
      if (v < 2 || v > 5) refuse("protocol {} is not supported (2-5)", v);
      return;
    }
    case kFrame: {
      // Frames only group opcodes for buffered reading; the declared size must fit.
      const std::uint64_t n = read_le(8, "frame length");
      if (n > left()) refuse("frame of {} bytes runs past the end of the input ({} bytes left)", n, left());
      return;
    }
    case kStop: {
      if (!marks_.empty()) refuse("STOP with {} MARKs still open", marks_.size());
      if (stack_.size() != 1) refuse("STOP with {} values on the stack; exactly one is required", stack_.size());
      result_ = std::move(stack_.back());
      stack_.clear();
      return;
    }
    case kMark:
      if (marks_.size() >= limits_.max_marks) refuse("more than {} MARKs open", limits_.max_marks);
      marks_.push_back(stack_.size());
      return;
    case kNone:
      push(make(ValueKind::none));
      return;
    case kNewTrue:
    case kNewFalse: {
      auto node = make(ValueKind::boolean);
      node->boolean = op_ == kNewTrue;
      push(std::move(node));
      return;
    }
    case kBinInt1:
      integer_value(static_cast<std::int64_t>(read_le(1, "BININT1 operand")));
      return;
    case kBinInt2:
      integer_value(static_cast<std::int64_t>(read_le(2, "BININT2 operand")));
      return;
    case kBinInt:
      integer_value(static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le(4, "BININT operand"))));
      return;
    case kLong1:
      long_value(read_le(1, "LONG1 length"));
      return;
    case kLong4:
      long_value(read_le(4, "LONG4 length"));
      return;
    case kBinFloat: {
      const auto b = take(8, "BINFLOAT operand");
      std::uint64_t bits = 0;
      for (const std::uint8_t byte : b) bits = (bits << 8) | byte;  // big-endian
      auto node = make(ValueKind::real);
      node->real = std::bit_cast<double>(bits);
      push(std::move(node));
      return;
    }
    case kShortBinUnicode:
      text_value(ValueKind::str, read_le(1, "string length"), "string");
      return;
    case kBinUnicode:
      text_value(ValueKind::str, read_le(4, "string length"), "string");
      return;
    case kBinUnicode8:
      text_value(ValueKind::str, read_le(8, "string length"), "string");
      return;
    case kShortBinBytes:
      text_value(ValueKind::bytes, read_le(1, "bytes length"), "bytes");
      return;
    case kBinBytes:
      text_value(ValueKind::bytes, read_le(4, "bytes length"), "bytes");
      return;
    case kBinBytes8:
      text_value(ValueKind::bytes, read_le(8, "bytes length"), "bytes");
      return;
    case kEmptyList:
      push(make(ValueKind::list));
      return;
    case kEmptyDict:
      push(make(ValueKind::dict));
      return;
    case kEmptyTuple:
      push(make(ValueKind::tuple));
      return;
    case kAppend: {
      Node item = pop("APPEND");
      adopt(mutable_target(top("APPEND"), ValueKind::list, "APPEND"), item);
      return;
    }
    case kAppends: {
      auto items = pop_mark("APPENDS");
      Value& list = mutable_target(top("APPENDS"), ValueKind::list, "APPENDS");
      for (const auto& item : items) adopt(list, item);
      return;
    }
    case kSetItem: {
      Node value = pop("SETITEM");
      Node key = pop("SETITEM");
      check_dict_key(key);
      Value& dict = mutable_target(top("SETITEM"), ValueKind::dict, "SETITEM");
      adopt(dict, key);
      adopt(dict, value);
      return;
    }
    case kSetItems: {
      auto items = pop_mark("SETITEMS");
      if (items.size() % 2 != 0) refuse("SETITEMS with an odd number ({}) of keys and values", items.size());
      Value& dict = mutable_target(top("SETITEMS"), ValueKind::dict, "SETITEMS");
      for (std::size_t i = 0; i < items.size(); i += 2) {
        check_dict_key(items[i]);
        adopt(dict, items[i]);
        adopt(dict, items[i + 1]);
      }
      return;
    }
    case kTuple:
      make_tuple(pop_mark("TUPLE"));
      return;
    case kTuple1:
    case kTuple2:
    case kTuple3: {
      const std::size_t n = static_cast<std::size_t>(op_ - kTuple1) + 1;
      std::vector<Node> items(n);
      for (std::size_t i = n; i-- > 0;) items[i] = pop(opcode_name(op_));
      make_tuple(std::move(items));
      return;
    }
    case kMemoize:
      memo_put(memo_.size());
      return;
    case kBinPut:
      memo_put(read_le(1, "memo index"));
      return;
    case kLongBinPut:
      memo_put(read_le(4, "memo index"));
      return;
    case kBinGet:
      memo_get(read_le(1, "memo index"));
      return;
    case kLongBinGet:
      memo_get(read_le(4, "memo index"));
      return;
    case kGlobal: {
      std::string module = read_line("GLOBAL module name");
      std::string name = read_line("GLOBAL attribute name");
      push_global(std::move(module), std::move(name));
      return;
    }
    case kStackGlobal: {
      Node name = pop("STACK_GLOBAL");
      Node module = pop("STACK_GLOBAL");
      if (!module->is(ValueKind::str) || !name->is(ValueKind::str)) {
        refuse("STACK_GLOBAL needs two str values, got {} and {}", value_kind_name(module->kind),
               value_kind_name(name->kind));
      }
      push_global(module->text, name->text);
      return;
    }
    case kReduce:
      call("REDUCE");
      return;
    case kNewObj:
      call("NEWOBJ");
      return;
    case kBuild:
      build();
      return;
    default:
      refuse("opcode 0x{:02x} is not accepted (not used by the checkpoint-engine protocol)", op_);
  }
}

}  // namespace

const char* value_kind_name(ValueKind kind) noexcept {
  switch (kind) {
    case ValueKind::none: return "None";
    case ValueKind::boolean: return "bool";
    case ValueKind::integer: return "int";
    case ValueKind::real: return "float";
    case ValueKind::str: return "str";
    case ValueKind::bytes: return "bytes";
    case ValueKind::list: return "list";
    case ValueKind::tuple: return "tuple";
    case ValueKind::dict: return "dict";
    case ValueKind::global: return "global";
    case ValueKind::call: return "call";
  }
  return "unknown";
}

const Value* Value::dict_get(std::string_view key) const noexcept {
  if (kind != ValueKind::dict) return nullptr;
  for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
    if (items[i]->kind == ValueKind::str && items[i]->text == key) return items[i + 1].get();
  }
  return nullptr;
}

const GlobalUse* allowed_global(std::string_view module, std::string_view name) noexcept {
  for (const auto& entry : kAllowed) {
    if (entry.module == module && entry.name == name) return &entry.use;
  }
  return nullptr;
}

ValuePtr read_pickle(std::span<const std::uint8_t> bytes, const PickleLimits& limits) {
  Reader reader(bytes, limits);
  return reader.run();
}

std::string describe(const Value& value) {
  constexpr std::size_t kShown = 40;
  switch (value.kind) {
    case ValueKind::none:
      return "None";
    case ValueKind::boolean:
      return value.boolean ? "True" : "False";
    case ValueKind::integer:
      return fmt::format("int {}", value.integer);
    case ValueKind::real:
      return fmt::format("float {}", value.real);
    case ValueKind::str:
      return value.text.size() <= kShown ? fmt::format("str '{}'", value.text)
                                         : fmt::format("str '{}...'", value.text.substr(0, kShown));
    case ValueKind::bytes:
      return fmt::format("bytes of length {}", value.text.size());
    case ValueKind::list:
    case ValueKind::tuple:
      return fmt::format("{} of {}", value_kind_name(value.kind), value.items.size());
    case ValueKind::dict:
      return fmt::format("dict of {}", value.dict_size());
    case ValueKind::global:
      return fmt::format("global {}", value.text);
    case ValueKind::call:
      return fmt::format("call {}(<{} arguments>)", value.text, value.items.size());
  }
  return "unknown value";
}

}  // namespace ferry::ckpt_engine
