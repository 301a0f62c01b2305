// session/holdings.hpp: what each sender rank of a sharded update holds, in global coordinates
// (per tensor: its global shape and dtype, the block held), and the receiver's check that the
// blocks the ranks send tile every tensor exactly once (docs/sharded.md).
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ferry::session {

// One block a rank holds.
struct Holding {
  std::string tensor;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> global_shape;
  std::vector<std::uint64_t> offsets;
  std::vector<std::uint64_t> extents;
  // false: a replica. The rank holds the block, but the lowest rank holding it sends it.
  bool sent = true;

  bool operator==(const Holding&) const = default;
};

struct RankHoldings {
  std::uint32_t rank = 0;
  std::vector<Holding> holdings;

  bool operator==(const RankHoldings&) const = default;
};

// A global tensor of the update (the union of the ranks' tensors).
struct GlobalTensor {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  std::uint64_t bytes = 0;
};

struct ShardLayout {
  std::vector<GlobalTensor> tensors;  // in the order the ranks (by rank) first name them
  std::uint64_t needed_bytes = 0;     // of every tensor, each byte once
};

// "[0:4, 0:8]": the block's half-open range per dimension.
std::string block_text(std::span<const std::uint64_t> offsets,
                       std::span<const std::uint64_t> extents);

// Checks the holdings of all `world` ranks (each rank once, ranks 0 .. world-1) and returns the
// update's tensors. INVALID_ARGUMENT, naming the ranks and the tensor, when: a block does not
// fit its global shape or is empty; two ranks disagree on a tensor's dtype or global shape; sent
// blocks overlap (a replicated block sent twice included); the sent blocks leave a gap (an
// uncovered element is named); a replica that no lower rank sends, or a block sent by a rank
// while a lower rank holds it too (the lowest holder sends a replicated block).
ShardLayout check_holdings(std::span<const RankHoldings> ranks, std::uint32_t world);

}  // namespace ferry::session

namespace ferry::manifest {
struct Entry;
}

namespace ferry::session {

// The blocks one rank declared it sends, and which of them arrived (a receiver's session).
// Threading: used by one thread at a time.
class DeclaredBlocks {
 public:
  DeclaredBlocks() = default;
  DeclaredBlocks(std::uint32_t rank, const std::vector<Holding>& holdings);
  // A manifest entry of this rank: it must be a declared, sent block (its name, global shape,
  // offsets and extents), not seen before in this update. CORRUPT_DATA naming the rank and the
  // tensor otherwise.
  void arrived(const manifest::Entry& entry);
  // Every declared block arrived (FAILED_PRECONDITION naming the rank and the first missing
  // tensor otherwise); then forgets them for the next update.
  void check_complete();
  void reset();

 private:
  std::uint32_t rank_ = 0;
  std::vector<const Holding*> sent_;
  std::vector<bool> arrived_;
};

}  // namespace ferry::session
