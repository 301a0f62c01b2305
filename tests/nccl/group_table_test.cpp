// tests/nccl/group_table_test.cpp: the lifecycle rules of named weight-update groups: re-init
// after a failure aborts and frees the stale communicator before the new one exists; a ready
// group is not replaced; a failed group is refused with its reason; destroy frees.
#include <ferry/sdk/error.hpp>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "group/group_table.hpp"

namespace ferry::nccl {
namespace {

// Records what happens to each group, in order, in a shared journal.
struct JournaledGroup {
  std::vector<std::string>& journal;
  std::string id;
  JournaledGroup(std::vector<std::string>& j, std::string i) : journal(j), id(std::move(i)) {
    journal.push_back("create " + id);
  }
  ~JournaledGroup() { journal.push_back("free " + id); }
  void abort(const std::string& reason) noexcept { journal.push_back("abort " + id + ": " + reason); }
};

using Table = GroupTable<JournaledGroup>;

auto maker(std::vector<std::string>& journal, const std::string& id) {
  return [&journal, id] { return std::make_unique<JournaledGroup>(journal, id); };
}

TEST(GroupTable, ReinitAfterFailureDestroysTheStaleCommunicatorFirst) {
  std::vector<std::string> journal;
  Table table;
  table.init("g", maker(journal, "first"));
  table.mark_failed("g", "bucket 3 timed out");
  EXPECT_EQ(table.state("g"), GroupState::failed);
  table.init("g", maker(journal, "second"));
  const std::vector<std::string> expected = {
      "create first", "abort first: bucket 3 timed out",
      "abort first: re-initialising group 'g' after a failure", "free first", "create second"};
  EXPECT_EQ(journal, expected);
  EXPECT_EQ(table.state("g"), GroupState::ready);
  EXPECT_EQ(table.ready("g").id, "second");
}

TEST(GroupTable, RefusesToReplaceAReadyGroup) {
  std::vector<std::string> journal;
  Table table;
  table.init("g", maker(journal, "first"));
  try {
    table.init("g", maker(journal, "second"));
    FAIL() << "replaced a ready group";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
    EXPECT_NE(std::string(e.what()).find("destroy it before init"), std::string::npos);
  }
  EXPECT_EQ(table.ready("g").id, "first");
  EXPECT_EQ(journal, std::vector<std::string>{"create first"});
}

TEST(GroupTable, FailedGroupIsRefusedWithItsReason) {
  std::vector<std::string> journal;
  Table table;
  table.init("g", maker(journal, "first"));
  table.mark_failed("g", "rank 1 left");
  table.mark_failed("g", "again");  // aborted once only
  try {
    table.ready("g");
    FAIL() << "a failed group was used";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_FAILED_PRECONDITION);
    EXPECT_NE(std::string(e.what()).find("rank 1 left"), std::string::npos) << e.what();
  }
  EXPECT_EQ(journal.size(), 2u);
}

TEST(GroupTable, FailedInitLeavesNoGroup) {
  std::vector<std::string> journal;
  Table table;
  EXPECT_THROW(table.init("g",
                          []() -> std::unique_ptr<JournaledGroup> {
                            fail(FERRY_STATUS_TIMEOUT, "rank 1 did not join");
                          }),
               Error);
  EXPECT_FALSE(table.contains("g"));
  table.init("g", maker(journal, "retry"));
  EXPECT_EQ(table.ready("g").id, "retry");
}

TEST(GroupTable, DestroyFreesAndUnknownNamesAreNotFound) {
  std::vector<std::string> journal;
  Table table;
  table.init("a", maker(journal, "a"));
  table.init("b", maker(journal, "b"));
  table.destroy("a");
  EXPECT_EQ(journal.back(), "free a");
  EXPECT_EQ(table.size(), 1u);
  try {
    table.destroy("a");
    FAIL() << "destroyed twice";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_NOT_FOUND);
  }
  EXPECT_THROW(table.ready("nope"), Error);
}

}  // namespace
}  // namespace ferry::nccl
