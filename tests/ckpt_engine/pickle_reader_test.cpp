// tests/ckpt_engine/pickle_reader_test.cpp: the restricted pickle reader: the subset it accepts
// decodes to the right values, and a hostile corpus is refused with messages naming the problem.
#include <ferry/formats/pickle_reader.hpp>
#include "pickle_bytes.hpp"

#include <ferry/sdk/error.hpp>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ferry::ckpt_engine {
namespace {

using testing::PickleBytes;

// The message of the CORRUPT_DATA error read_pickle throws, or a failure when it accepts.
std::string refusal(const std::vector<std::uint8_t>& bytes, const PickleLimits& limits = {}) {
  try {
    (void)read_pickle(bytes, limits);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "the pickle was accepted";
  return {};
}

#define EXPECT_REFUSED(bytes, needle)                                      \
  do {                                                                     \
    const std::string message_ = refusal(bytes);                           \
    EXPECT_NE(message_.find(needle), std::string::npos) << message_;       \
  } while (false)

TEST(PickleReader, ReadsScalarsOfEveryWidth) {
  PickleBytes p;
  p.mark().integer(7).integer(-5).integer(70000).op('M').le(65535, 2);
  p.op(0x8a).le(5, 1).le(0x0180000000, 5);   // LONG1, 6 GiB
  p.op(0x8a).le(2, 1).le(0xff7f, 2);         // LONG1, two's complement: -129
  p.op('G').raw(std::string("\x3f\xf8\0\0\0\0\0\0", 8));  // 1.5 big-endian
  p.op(0x88).op(0x89).none();
  p.tuple().stop();
  const ValuePtr v = read_pickle(p.bytes());
  ASSERT_TRUE(v->is(ValueKind::tuple));
  ASSERT_EQ(v->items.size(), 10u);
  EXPECT_EQ(v->items[0]->integer, 7);
  EXPECT_EQ(v->items[1]->integer, -5);
  EXPECT_EQ(v->items[2]->integer, 70000);
  EXPECT_EQ(v->items[3]->integer, 65535);
  EXPECT_EQ(v->items[4]->integer, 6LL << 30);
  EXPECT_EQ(v->items[5]->integer, -129);
  EXPECT_EQ(v->items[6]->real, 1.5);
  EXPECT_TRUE(v->items[7]->boolean);
  EXPECT_FALSE(v->items[8]->boolean);
  EXPECT_TRUE(v->items[9]->is(ValueKind::none));
  EXPECT_EQ(v->depth, 2u);
}

TEST(PickleReader, ReadsStrAndBytesExactly) {
  PickleBytes p;
  p.str("héllo").bin(std::string("\0\1\2", 3)).op(0x86).stop();
  const ValuePtr v = read_pickle(p.bytes());
  EXPECT_EQ(v->items[0]->text, "héllo");
  EXPECT_TRUE(v->items[1]->is(ValueKind::bytes));
  EXPECT_EQ(v->items[1]->text, std::string("\0\1\2", 3));
}

TEST(PickleReader, BuildsContainersAndSharesMemoizedValues) {
  // [{"a": torch.Size((2, 3))}, <the same torch.Size object, from the memo>]
  PickleBytes p;
  p.op(']').op(0x94);       // memo 0: the list
  p.mark().op('}').op(0x94);  // memo 1: the dict
  p.str("a").op(0x94);      // memo 2: the key
  p.size({2, 3}).op(0x94);  // memo 3: the torch.Size call
  p.op('s');
  p.op('h').le(3, 1);       // the call again: shared, not copied
  p.op('e').stop();
  const ValuePtr v = read_pickle(p.bytes());
  ASSERT_TRUE(v->is(ValueKind::list));
  ASSERT_EQ(v->items.size(), 2u);
  const Value* shape = v->items[0]->dict_get("a");
  ASSERT_NE(shape, nullptr);
  ASSERT_TRUE(shape->is(ValueKind::call));
  EXPECT_EQ(shape->text, "torch.Size");
  ASSERT_EQ(shape->items.size(), 1u);
  EXPECT_EQ(shape->items[0]->items[1]->integer, 3);
  EXPECT_EQ(v->items[1].get(), shape);
}

TEST(PickleReader, ProtocolTwoTextGlobalIsResolvedAgainstTheAllowList) {
  PickleBytes p(2);
  p.text_global("torch", "bfloat16").stop();
  EXPECT_EQ(read_pickle(p.bytes())->text, "torch.bfloat16");
}

TEST(PickleReader, ExceptionCallMayCarryBuildState) {
  PickleBytes p;
  p.global("builtins", "RuntimeError").str("boom").op(0x85).reduce();
  p.op('}').str("__notes__").op(']').op('s').op('b').stop();
  const ValuePtr v = read_pickle(p.bytes());
  EXPECT_EQ(v->text, "builtins.RuntimeError");
  ASSERT_NE(v->state, nullptr);
  EXPECT_TRUE(v->state->is(ValueKind::dict));
}

// ---- hostile corpus -----------------------------------------------------------------------

TEST(PickleReaderHostile, OsSystemViaReduceIsRefusedByName) {
  PickleBytes p;
  p.global("os", "system").str("touch /tmp/pwned").op(0x85).reduce().stop();
  EXPECT_REFUSED(p.bytes(), "global 'os.system' is not on the allow-list");
}

TEST(PickleReaderHostile, PosixSystemViaTextGlobalIsRefusedByName) {
  PickleBytes p(2);
  p.text_global("posix", "system").str("id").op(0x85).reduce().stop();
  EXPECT_REFUSED(p.bytes(), "'posix.system'");
}

TEST(PickleReaderHostile, BuiltinsThatRunCodeAreRefusedByName) {
  for (const char* name : {"eval", "exec", "getattr", "__import__", "compile", "open"}) {
    PickleBytes p;
    p.global("builtins", name).str("1").op(0x85).reduce().stop();
    EXPECT_REFUSED(p.bytes(), std::string("'builtins.") + name + "'");
  }
}

TEST(PickleReaderHostile, SubprocessAndOtherModulesAreRefused) {
  const std::vector<std::pair<std::string, std::string>> globals = {
      {"subprocess", "Popen"}, {"subprocess", "check_output"}, {"torch", "load"},
      {"torch._utils", "_rebuild_tensor"}, {"numpy", "frombuffer"}, {"collections", "OrderedDict"},
      {"copyreg", "_reconstructor"}, {"torch.multiprocessing.reductions", "rebuild_storage_empty"},
      {"torch.multiprocessing.reductions", "rebuild_event"}, {"multiprocessing.connection", "Client"}};
  for (const auto& [module, name] : globals) {
    PickleBytes p;
    p.global(module, name).op(')').reduce().stop();
    EXPECT_REFUSED(p.bytes(), "'" + module + "." + name + "'");
  }
}

TEST(PickleReaderHostile, CallingAMarkerGlobalIsRefused) {
  PickleBytes p;
  p.global("torch", "Tensor").op(')').reduce().stop();
  EXPECT_REFUSED(p.bytes(), "REDUCE of 'torch.Tensor' is refused");
  PickleBytes q;
  q.global("torch", "float32").op(')').op(0x81).stop();
  EXPECT_REFUSED(q.bytes(), "NEWOBJ of 'torch.float32' is refused");
}

TEST(PickleReaderHostile, CallingANonGlobalIsRefused) {
  PickleBytes p;
  p.str("os.system").op(')').reduce().stop();
  EXPECT_REFUSED(p.bytes(), "REDUCE of a str");
}

TEST(PickleReaderHostile, BuildOnANonExceptionIsRefused) {
  PickleBytes p;
  p.size({1}).op('}').op('b').stop();
  EXPECT_REFUSED(p.bytes(), "BUILD on the result of 'torch.Size' is refused");
  PickleBytes q;
  q.op('}').op('}').op('b').stop();
  EXPECT_REFUSED(q.bytes(), "BUILD applies to a call but the target is a dict");
}

TEST(PickleReaderHostile, ListNestedAMillionDeepIsRefusedWithoutRecursion) {
  constexpr std::size_t kDepth = 1'000'000;
  PickleBytes p;
  for (std::size_t i = 0; i < kDepth; ++i) p.op(']');
  for (std::size_t i = 1; i < kDepth; ++i) p.op('a');
  p.stop();
  EXPECT_REFUSED(p.bytes(), "values on the stack");
}

TEST(PickleReaderHostile, TupleNestedAMillionDeepIsRefusedAtTheDepthLimit) {
  PickleBytes p;
  p.op(')');
  for (std::size_t i = 0; i < 1'000'000; ++i) p.op(0x85);
  p.stop();
  EXPECT_REFUSED(p.bytes(), "nesting deeper than 32 levels");
}

TEST(PickleReaderHostile, AppendNestingPastTheDepthLimitIsRefused) {
  PickleBytes p;
  for (int i = 0; i < 40; ++i) p.op(']');
  for (int i = 1; i < 40; ++i) p.op('a');
  p.stop();
  EXPECT_REFUSED(p.bytes(), "nesting deeper than 32 levels");
}

TEST(PickleReaderHostile, AMillionOpenMarksAreRefused) {
  PickleBytes p;
  for (int i = 0; i < 1'000'000; ++i) p.mark();
  p.stop();
  EXPECT_REFUSED(p.bytes(), "MARKs open");
}

TEST(PickleReaderHostile, LengthsPastTheEndAreRefused) {
  PickleBytes a;
  a.op('X').le(100, 4).raw("short").stop();
  EXPECT_REFUSED(a.bytes(), "string of 100 bytes runs past the end of the input");
  PickleBytes b;
  b.op('C').le(200, 1).raw("x").stop();
  EXPECT_REFUSED(b.bytes(), "bytes of 200 bytes runs past the end");
  PickleBytes c;
  c.op(0x8a).le(8, 1).raw("\1\2");
  EXPECT_REFUSED(c.bytes(), "integer of 8 bytes runs past the end");
}

TEST(PickleReaderHostile, HugeDeclaredLengthsAreRefusedBeforeAllocating) {
  PickleBytes a;
  a.op(0x8d).le(std::uint64_t{1} << 62, 8).raw("abc").stop();
  EXPECT_REFUSED(a.bytes(), "string of 4611686018427387904 bytes runs past the end");
  PickleBytes b;
  b.op(0x8e).le(~std::uint64_t{0}, 8).stop();
  EXPECT_REFUSED(b.bytes(), "bytes of 18446744073709551615 bytes runs past the end");
  PickleBytes c;
  c.op(0x95).le(std::uint64_t{1} << 40, 8).none().stop();
  EXPECT_REFUSED(c.bytes(), "frame of 1099511627776 bytes runs past the end");
  PickleBytes d;
  d.op(0x8b).le(1u << 30, 4).stop();
  EXPECT_REFUSED(d.bytes(), "integer of 1073741824 bytes is wider than 64 bits");
}

TEST(PickleReaderHostile, OversizeInputIsRefused) {
  PickleBytes p;
  p.str(std::string(1000, 'x')).stop();
  PickleLimits limits;
  limits.max_input_bytes = 512;
  const std::string message = refusal(p.bytes(), limits);
  EXPECT_NE(message.find("more than the limit of 512 bytes"), std::string::npos) << message;
}

TEST(PickleReaderHostile, MemoMisuseIsRefused) {
  PickleBytes get;
  get.op('h').le(5, 1).stop();
  EXPECT_REFUSED(get.bytes(), "memo index 5 is not defined (the memo has 0 entries)");
  PickleBytes long_get;
  long_get.none().op(0x94).op('j').le(0xffffffff, 4).stop();
  EXPECT_REFUSED(long_get.bytes(), "memo index 4294967295 is not defined (the memo has 1 entries)");
  PickleBytes put;
  put.none().op('r').le(1000, 4).stop();
  EXPECT_REFUSED(put.bytes(), "memo index 1000 skips ahead of the memo size 0");
  PickleBytes put_empty;
  put_empty.op(0x94).stop();
  EXPECT_REFUSED(put_empty.bytes(), "memo put needs a value but the stack is empty");
}

TEST(PickleReaderHostile, SelfReferenceThroughTheMemoIsRefused) {
  PickleBytes p;  // l = []; l.append(l)
  p.op(']').op(0x94).op('h').le(0, 1).op('a').stop();
  EXPECT_REFUSED(p.bytes(), "APPEND on a list fetched from the memo");
  PickleBytes d;  // d = {}; d["x"] = d, via SETITEMS
  d.op('}').op(0x94).mark().str("x").op('h').le(0, 1).op('u').stop();
  EXPECT_REFUSED(d.bytes(), "SETITEMS on a dict fetched from the memo");
}

TEST(PickleReaderHostile, TrailingBytesAndSecondPicklesAreRefused) {
  PickleBytes a;
  a.none().stop().raw("garbage");
  EXPECT_REFUSED(a.bytes(), "7 trailing bytes after STOP");
  PickleBytes b;
  b.none().stop().op(0x80).op(4).none().stop();
  EXPECT_REFUSED(b.bytes(), "4 trailing bytes after STOP");
}

TEST(PickleReaderHostile, UnknownAndUnusedOpcodesAreRefusedByName) {
  PickleBytes inst;
  inst.raw("ios\nsystem\n").stop();
  EXPECT_REFUSED(inst.bytes(), "(INST): opcode 0x69 is not accepted");
  PickleBytes persid;
  persid.str("x").op('Q').stop();
  EXPECT_REFUSED(persid.bytes(), "(BINPERSID)");
  PickleBytes ext;
  ext.op(0x82).le(1, 1).stop();
  EXPECT_REFUSED(ext.bytes(), "(EXT1)");
  PickleBytes buffer;
  buffer.op(0x97).stop();
  EXPECT_REFUSED(buffer.bytes(), "(NEXT_BUFFER)");
  PickleBytes junk;
  junk.op(0xff).stop();
  EXPECT_REFUSED(junk.bytes(), "(unknown opcode): opcode 0xff");
}

TEST(PickleReaderHostile, WrongProtocolAndMissingStopAreRefused) {
  EXPECT_REFUSED(std::vector<std::uint8_t>{}, "must start with PROTO");
  EXPECT_REFUSED((std::vector<std::uint8_t>{'N', '.'}), "must start with PROTO");
  PickleBytes six(6);
  six.none().stop();
  EXPECT_REFUSED(six.bytes(), "protocol 6 is not supported");
  PickleBytes again;
  again.op(0x80).op(4).none().stop();
  EXPECT_REFUSED(again.bytes(), "PROTO is only accepted as the first opcode");
  PickleBytes no_stop;
  no_stop.none();
  EXPECT_REFUSED(no_stop.bytes(), "truncated, the input ends before STOP");
}

TEST(PickleReaderHostile, MalformedStructureIsRefused) {
  PickleBytes two;
  two.none().none().stop();
  EXPECT_REFUSED(two.bytes(), "STOP with 2 values on the stack");
  PickleBytes open_mark;
  open_mark.mark().none().stop();
  EXPECT_REFUSED(open_mark.bytes(), "STOP with 1 MARKs still open");
  PickleBytes odd;
  odd.op('}').mark().str("k").op('u').stop();
  EXPECT_REFUSED(odd.bytes(), "SETITEMS with an odd number (1)");
  PickleBytes list_key;
  list_key.op('}').op(']').none().op('s').stop();
  EXPECT_REFUSED(list_key.bytes(), "dict key is a list");
  PickleBytes append_to_tuple;
  append_to_tuple.op(')').none().op('a').stop();
  EXPECT_REFUSED(append_to_tuple.bytes(), "APPEND applies to a list but the target is a tuple");
  PickleBytes below_mark;  // values under a MARK are invisible, as in CPython
  below_mark.op(']').mark().op('a').stop();
  EXPECT_REFUSED(below_mark.bytes(), "APPEND needs a value but the stack is empty");
  PickleBytes stack_global;
  stack_global.integer(1).str("system").op(0x93).stop();
  EXPECT_REFUSED(stack_global.bytes(), "STACK_GLOBAL needs two str values, got int and str");
  PickleBytes bad_utf8;
  bad_utf8.op(0x8c).le(2, 1).raw("\xc0\x80").stop();
  EXPECT_REFUSED(bad_utf8.bytes(), "string is not valid UTF-8");
  PickleBytes long_name;
  long_name.op('c').raw(std::string(300, 'a')).stop();
  EXPECT_REFUSED(long_name.bytes(), "GLOBAL module name longer than 128 characters");
  PickleBytes args_not_tuple;
  args_not_tuple.global("torch", "Size").op(']').reduce().stop();
  EXPECT_REFUSED(args_not_tuple.bytes(), "REDUCE of 'torch.Size' with a list as arguments");
}

}  // namespace
}  // namespace ferry::ckpt_engine
