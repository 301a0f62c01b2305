// tests/session/receiver_link_test.cpp: a sharded rank's reading of its receiver's needs
// (session/sender/receiver_link.hpp, Link::read_needs and sent_views): a Welcome's pieces turn a
// rank's blocks into views of the rows it sends and contiguous copies of the columns; needs that
// do not fit the blocks (a wrong count, a piece outside its block, a block narrowed on a dim the
// protocol does not narrow) are refused as corrupt, naming the tensor.
#include <gtest/gtest.h>

#include <capnp/message.h>
#include <ferry/sdk/error.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "session.capnp.h"
#include "session/sender/receiver_link.hpp"

namespace ferry::session {
namespace {

struct Need {
  std::vector<std::uint64_t> offsets, extents;
  bool none = false;
};

// Link::read_needs of `needs` (as a Welcome carries them) for the blocks `declared`.
void read(Link& link, const std::vector<Need>& needs, const std::vector<TensorView>& declared) {
  capnp::MallocMessageBuilder m;
  auto list = m.initRoot<wire::Welcome>().initNeeds(static_cast<unsigned>(needs.size()));
  for (unsigned i = 0; i < needs.size(); ++i) {
    auto o = list[i].initOffsets(static_cast<unsigned>(needs[i].offsets.size()));
    auto e = list[i].initExtents(static_cast<unsigned>(needs[i].extents.size()));
    for (unsigned d = 0; d < needs[i].offsets.size(); ++d) o.set(d, needs[i].offsets[d]);
    for (unsigned d = 0; d < needs[i].extents.size(); ++d) e.set(d, needs[i].extents[d]);
    list[i].setNone(needs[i].none);
  }
  link.read_needs(m.getRoot<wire::Welcome>().asReader().getNeeds(), declared, "receiver r");
}

// A host block of `shape` at `offsets` of a global tensor of `global`, its elements 0, 1, 2 ...
struct Block {
  std::vector<float> values;
  TensorView view;
  Block(std::string name, std::vector<std::uint64_t> shape, std::vector<std::uint64_t> global,
        std::vector<std::uint64_t> offsets) {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    values.resize(n);
    for (std::uint64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i);
    view = TensorView{std::move(name), FERRY_DTYPE_F32, shape, values.data(), FERRY_MEMORY_HOST, 0};
    view.global_shape = std::move(global);
    view.offsets = std::move(offsets);
  }
};

TEST(LinkNeeds, RowsAreViewsColumnsAreCopiesAndUnneededBlocksAreLeftOut) {
  Block rows("rows", {4, 3}, {8, 3}, {4, 0});    // rows 4..7 of an [8, 3] tensor
  Block cols("cols", {2, 6}, {2, 6}, {0, 0});    // a whole [2, 6] tensor
  Block unneeded("expert", {2, 2}, {2, 2}, {0, 0});
  const std::vector<TensorView> declared = {rows.view, cols.view, unneeded.view};
  Link link;
  read(link, {{{5, 0}, {2, 3}}, {{0, 2}, {2, 3}}, {{0, 0}, {2, 2}, true}}, declared);
  ASSERT_TRUE(link.trims);
  EXPECT_EQ(link.sent_count(declared), 2u);
  const auto views = link.sent_views(declared);
  ASSERT_EQ(views.size(), 2u);
  // Rows 5..6: the block's rows 1..2, in place.
  EXPECT_EQ(views[0].data, rows.values.data() + 3);
  EXPECT_EQ(views[0].shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(views[0].offsets, (std::vector<std::uint64_t>{5, 0}));
  // Columns 2..4 of both rows, copied out contiguously.
  EXPECT_EQ(views[1].shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(views[1].offsets, (std::vector<std::uint64_t>{0, 2}));
  std::vector<float> got(6);
  std::memcpy(got.data(), views[1].data, sizeof(float) * 6);
  EXPECT_EQ(got, (std::vector<float>{2, 3, 4, 8, 9, 10}));
}

TEST(LinkNeeds, WholeBlocksDoNotTrim) {
  Block rows("rows", {4, 3}, {8, 3}, {4, 0});
  const std::vector<TensorView> declared = {rows.view};
  Link link;
  read(link, {{{4, 0}, {4, 3}}}, declared);
  EXPECT_FALSE(link.trims);
  read(link, {}, declared);  // a receiver that sent none
  EXPECT_FALSE(link.trims);
  EXPECT_TRUE(link.needs.empty());
}

void expect_refused(const std::vector<Need>& needs, const std::vector<TensorView>& declared,
                    const std::string& words) {
  Link link;
  try {
    read(link, needs, declared);
    ADD_FAILURE() << "accepted: " << words;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_CORRUPT_DATA) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(LinkNeeds, NeedsThatDoNotFitTheBlocksAreRefusedNamingTheTensor) {
  Block rows("rows", {4, 3}, {8, 3}, {4, 0});
  Block cube("cube", {2, 3, 4}, {2, 3, 4}, {0, 0, 0});
  const std::vector<TensorView> declared = {rows.view, cube.view};
  const Need cube_whole{{0, 0, 0}, {2, 3, 4}};
  expect_refused({{{4, 0}, {4, 3}}}, declared, "1 needs for 2 blocks");
  expect_refused({{{2, 0}, {4, 3}}, cube_whole}, declared, "tensor 'rows'");   // before the block
  expect_refused({{{6, 0}, {4, 3}}, cube_whole}, declared, "tensor 'rows'");   // past its end
  expect_refused({{{4, 0}, {0, 3}}, cube_whole}, declared, "tensor 'rows'");   // empty, not none
  expect_refused({{{4}, {4}}, cube_whole}, declared, "tensor 'rows'");         // dims
  expect_refused({{{4, 0}, {4, 3}}, {{0, 0, 1}, {2, 3, 2}}}, declared,
                 "tensor 'cube': a need that does not fit its block (narrowed on dim 2 of 3)");
}

}  // namespace
}  // namespace ferry::session
