// session/holdings.cpp: the tiling check of a sharded update's holdings (see
// session/holdings.hpp).
#include "session/holdings.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <algorithm>
#include <map>
#include <optional>

namespace ferry::session {
namespace {

struct Placed {
  std::uint32_t rank = 0;
  const Holding* holding = nullptr;
};

std::string where(const Placed& p) {
  return fmt::format("rank {} {}", p.rank, block_text(p.holding->offsets, p.holding->extents));
}

bool overlaps(const Holding& a, const Holding& b) {
  for (std::size_t d = 0; d < a.offsets.size(); ++d) {
    const std::uint64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const std::uint64_t hi =
        std::min(a.offsets[d] + a.extents[d], b.offsets[d] + b.extents[d]);
    if (lo >= hi) return false;
  }
  return true;
}

bool same_block(const Holding& a, const Holding& b) {
  return a.offsets == b.offsets && a.extents == b.extents;
}

bool contains(const Holding& h, std::span<const std::uint64_t> point) {
  for (std::size_t d = 0; d < point.size(); ++d) {
    if (point[d] < h.offsets[d] || point[d] >= h.offsets[d] + h.extents[d]) return false;
  }
  return true;
}

// An element no sent block covers: searched among the corners the blocks define (0 and every
// block end per dimension), which include one where there is a gap. Nullopt when that grid is
// too large to search.
std::optional<std::vector<std::uint64_t>> uncovered_point(const GlobalTensor& t,
                                                          const std::vector<Placed>& sent) {
  const std::size_t ndim = t.shape.size();
  std::vector<std::vector<std::uint64_t>> candidates(ndim);
  std::uint64_t grid = 1;
  for (std::size_t d = 0; d < ndim; ++d) {
    auto& c = candidates[d];
    c.push_back(0);
    for (const auto& p : sent) {
      const std::uint64_t end = p.holding->offsets[d] + p.holding->extents[d];
      if (end < t.shape[d]) c.push_back(end);
    }
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    grid *= c.size();
    if (grid > 1'000'000) return std::nullopt;
  }
  std::vector<std::size_t> at(ndim, 0);
  std::vector<std::uint64_t> point(ndim, 0);
  for (std::uint64_t n = 0; n < grid; ++n) {
    for (std::size_t d = 0; d < ndim; ++d) point[d] = candidates[d][at[d]];
    bool covered = false;
    for (const auto& p : sent) covered = covered || contains(*p.holding, point);
    if (!covered) return point;
    for (std::size_t d = ndim; d-- > 0;) {
      if (++at[d] < candidates[d].size()) break;
      at[d] = 0;
    }
  }
  return std::nullopt;
}

}  // namespace

std::string block_text(std::span<const std::uint64_t> offsets,
                       std::span<const std::uint64_t> extents) {
  std::string out = "[";
  for (std::size_t d = 0; d < offsets.size() && d < extents.size(); ++d) {
    out += fmt::format("{}{}:{}", d ? ", " : "", offsets[d], offsets[d] + extents[d]);
  }
  return out + "]";
}

ShardLayout check_holdings(std::span<const RankHoldings> ranks, std::uint32_t world) {
  if (ranks.size() != world) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "a sharded update of {} senders has {} ranks", world,
         ranks.size());
  }
  std::vector<const RankHoldings*> by_rank(world, nullptr);
  for (const auto& r : ranks) {
    if (r.rank >= world || by_rank[r.rank] != nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "rank {} of {} senders is given twice or out of range",
           r.rank, world);
    }
    by_rank[r.rank] = &r;
  }
  ShardLayout layout;
  std::map<std::string, std::size_t> index;  // name -> layout.tensors
  std::map<std::string, std::uint32_t> first_rank;
  std::vector<std::vector<Placed>> blocks;  // per tensor, every holding
  for (const RankHoldings* r : by_rank) {
    for (const Holding& h : r->holdings) {
      const std::size_t ndim = h.global_shape.size();
      if (h.offsets.size() != ndim || h.extents.size() != ndim) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "rank {}: tensor '{}': a block of {} offsets and {} extents in {} dims", r->rank,
             h.tensor, h.offsets.size(), h.extents.size(), ndim);
      }
      std::uint64_t elements = 1;
      for (std::size_t d = 0; d < ndim; ++d) {
        if (h.offsets[d] + h.extents[d] > h.global_shape[d] || h.offsets[d] + h.extents[d] < h.offsets[d]) {
          fail(FERRY_STATUS_INVALID_ARGUMENT,
               "rank {}: tensor '{}': block {} lies outside its global shape {}", r->rank,
               h.tensor, block_text(h.offsets, h.extents), shape_string(h.global_shape));
        }
        elements *= h.extents[d];
      }
      if (elements == 0) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "rank {}: tensor '{}': block {} is empty (declare only blocks that hold elements)",
             r->rank, h.tensor, block_text(h.offsets, h.extents));
      }
      auto [it, inserted] = index.emplace(h.tensor, layout.tensors.size());
      if (inserted) {
        GlobalTensor t;
        t.name = h.tensor;
        t.dtype = h.dtype;
        t.shape = h.global_shape;
        const auto bytes = byte_size(h.dtype, h.global_shape);
        if (!bytes) {
          fail(FERRY_STATUS_INVALID_ARGUMENT, "rank {}: tensor '{}': global shape {} is too large",
               r->rank, h.tensor, shape_string(h.global_shape));
        }
        t.bytes = *bytes;
        layout.tensors.push_back(std::move(t));
        blocks.emplace_back();
        first_rank[h.tensor] = r->rank;
      } else {
        const GlobalTensor& t = layout.tensors[it->second];
        if (t.dtype != h.dtype || t.shape != h.global_shape) {
          fail(FERRY_STATUS_INVALID_ARGUMENT,
               "ranks {} and {} disagree on tensor '{}': {} {} against {} {}",
               first_rank[h.tensor], r->rank, h.tensor, dtype_name(t.dtype),
               shape_string(t.shape), dtype_name(h.dtype), shape_string(h.global_shape));
        }
      }
      blocks[it->second].push_back({r->rank, &h});
    }
  }
  for (std::size_t i = 0; i < layout.tensors.size(); ++i) {
    const GlobalTensor& t = layout.tensors[i];
    std::vector<Placed> sent;
    for (const Placed& p : blocks[i]) {
      if (p.holding->sent) sent.push_back(p);
    }
    std::uint64_t covered = 0;
    for (std::size_t a = 0; a < sent.size(); ++a) {
      std::uint64_t elements = 1;
      for (auto e : sent[a].holding->extents) elements *= e;
      covered += elements;
      for (std::size_t b = a + 1; b < sent.size(); ++b) {
        if (overlaps(*sent[a].holding, *sent[b].holding)) {
          fail(FERRY_STATUS_INVALID_ARGUMENT,
               "tensor '{}': the blocks of {} and {} overlap (each element is sent by one "
               "rank; a replicated block by its lowest holder only)",
               t.name, where(sent[a]), where(sent[b]));
        }
      }
    }
    // Replicas: the same block, sent by the lowest rank that holds it.
    for (const Placed& p : blocks[i]) {
      const Placed* sender = nullptr;
      for (const Placed& s : sent) {
        if (sender == nullptr && same_block(*s.holding, *p.holding)) sender = &s;
      }
      if (!p.holding->sent && sender == nullptr) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "tensor '{}': {} is declared a replica, but no rank sends that block", t.name,
             where(p));
      }
      if (sender != nullptr && p.rank < sender->rank) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "tensor '{}': block {} is sent by rank {}, but rank {} holds it too: the lowest "
             "rank holding a replicated block sends it",
             t.name, block_text(p.holding->offsets, p.holding->extents), sender->rank, p.rank);
      }
    }
    std::uint64_t elements = 1;
    for (auto d : t.shape) elements *= d;
    if (covered != elements) {
      const auto point = uncovered_point(t, sent);
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "tensor '{}' {}: the senders' blocks cover {} of its {} elements{}", t.name,
           shape_string(t.shape), covered, elements,
           point ? fmt::format("; no rank sends element {}", shape_string(*point)) : std::string());
    }
    layout.needed_bytes += t.bytes;
  }
  return layout;
}

DeclaredBlocks::DeclaredBlocks(std::uint32_t rank, const std::vector<Holding>& holdings)
    : rank_(rank) {
  for (const auto& h : holdings) {
    if (h.sent) sent_.push_back(&h);
  }
  arrived_.assign(sent_.size(), false);
}

void DeclaredBlocks::arrived(const manifest::Entry& e) {
  std::vector<std::uint64_t> offsets(e.shape.size(), 0);
  const std::vector<std::uint64_t>* global = &e.shape;
  if (e.block) {
    offsets = e.block->offsets;
    global = &e.block->global_shape;
  }
  for (std::size_t i = 0; i < sent_.size(); ++i) {
    const Holding& h = *sent_[i];
    if (h.tensor != e.name) continue;
    if (h.offsets != offsets || h.extents != e.shape || h.global_shape != *global ||
        h.dtype != e.dtype) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "rank {}: tensor '{}': the bucket holds block {} of {} {}, but the rank declared "
           "block {} of {} {}",
           rank_, e.name, block_text(offsets, e.shape), dtype_name(e.dtype),
           shape_string(*global), block_text(h.offsets, h.extents), dtype_name(h.dtype),
           shape_string(h.global_shape));
    }
    if (arrived_[i]) {
      fail(FERRY_STATUS_CORRUPT_DATA, "rank {}: tensor '{}': block {} arrived twice", rank_,
           e.name, block_text(offsets, e.shape));
    }
    arrived_[i] = true;
    return;
  }
  fail(FERRY_STATUS_CORRUPT_DATA,
       "rank {}: tensor '{}': a block the rank did not declare it sends", rank_, e.name);
}

void DeclaredBlocks::check_complete() {
  for (std::size_t i = 0; i < sent_.size(); ++i) {
    if (!arrived_[i]) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "rank {}: committed without tensor '{}' block {} that it declared it sends", rank_,
           sent_[i]->tensor, block_text(sent_[i]->offsets, sent_[i]->extents));
    }
  }
  reset();
}

void DeclaredBlocks::reset() { arrived_.assign(sent_.size(), false); }

}  // namespace ferry::session
