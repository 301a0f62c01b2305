// update/update_loop.hpp: the one loop every update runs through. It begins the update on the
// engine, takes the buckets of a BucketSource (update/bucket_source.hpp) and applies each (the
// next one arriving while one is applied when the source is double buffered), commits with the
// sender's fingerprints, and makes the report. Where a bucket is applied: here, through
// UpdateEngine::apply.
//
// Errors and rollback. Any failure (a source's, the engine's, the commit's) aborts the update:
// the engine rolls back from the host mirror or fences (update_engine.hpp, "Transactions"), the
// published version stays, and the error is rethrown. When fetching a bucket fails while one is
// applied, the loop waits for that apply first; if it failed too and the fetch failed after it,
// or with ABORTED / PEER_FAILED (a source stopped because of it), the apply's error is the one
// rethrown: it is the cause.
//
// Threading: run_update blocks its caller; a double-buffered source's buckets are applied on a
// second thread, one at a time (the engine serializes them anyway).
#pragma once

#include "update/bucket_source.hpp"
#include "update/update_engine.hpp"

#include <chrono>
#include <cstdint>
#include <string>

namespace ferry::update {

struct UpdateRun {
  std::uint64_t version = 0;
  std::string label;
  // Where the report's seconds count from (the request's arrival; default: run_update's call).
  std::optional<std::chrono::steady_clock::time_point> started;
  // When set, kept at the phase under way ("receive bucket K", "apply bucket K", "commit"), for
  // the caller's error messages; a source may refine it. Phases before the first bucket (the
  // source's begun()) are the source's to set.
  std::string* phase = nullptr;
};

struct UpdateReport {
  WeightVersion version;  // published by the commit
  std::uint64_t bytes = 0;    // bytes of the staged buckets applied
  std::uint64_t tensors = 0;  // manifest entries applied or recorded
  std::uint64_t buckets = 0;
  double seconds = 0;
};

// Runs one update `run.version` from `source` into `engine`: begin, buckets, commit. Throws what
// failed after aborting the update (see above); begin's own refusals leave nothing to abort.
UpdateReport run_update(UpdateEngine& engine, BucketSource& source, const UpdateRun& run);

}  // namespace ferry::update
