// update/update_loop.cpp: begin, the buckets of a source (double buffered when it can), commit,
// the report, and abort on any failure (see update/update_loop.hpp).
#include "update/update_loop.hpp"

#include <fmt/format.h>

#include <atomic>
#include <exception>
#include <future>
#include <memory>

namespace ferry::update {
namespace {

// Applies one bucket on whichever thread calls it; remembers that an apply failed.
struct Applier {
  UpdateEngine& engine;
  BucketSource& source;
  UpdateReport& report;
  std::atomic<bool> failed{false};

  void apply(Bucket& bucket) {
    try {
      source.verify(bucket);
      engine.apply(bucket);
      report.bytes += bucket_payload_bytes(bucket);
      report.tensors += bucket.manifest ? bucket.manifest->tensors.size() : 0;
      report.buckets += 1;
      source.applied(bucket);
    } catch (const Error& e) {
      failed.store(true);
      source.apply_failed(e);
      throw;
    } catch (const std::exception& e) {
      failed.store(true);
      source.apply_failed(Error(FERRY_STATUS_INTERNAL, e.what()));
      throw;
    }
  }
};

bool stopped_by_peer(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.code() == FERRY_STATUS_ABORTED || e.code() == FERRY_STATUS_PEER_FAILED;
  } catch (...) {
    return false;
  }
}

void set_phase(const UpdateRun& run, std::string text) {
  if (run.phase != nullptr) *run.phase = std::move(text);
}

}  // namespace

UpdateReport run_update(UpdateEngine& engine, BucketSource& source, const UpdateRun& run) {
  const auto started = run.started.value_or(std::chrono::steady_clock::now());
  engine.begin(run.version, run.label);
  UpdateReport report;
  Applier applier{engine, source, report};
  // The bucket applied on the second thread (double buffering) and its index.
  std::future<void> inflight;
  std::unique_ptr<Bucket> inflight_bucket;
  std::uint32_t inflight_index = 0;
  const auto finish_inflight = [&] {
    if (!inflight.valid()) return;
    set_phase(run, fmt::format("apply bucket {}", inflight_index));
    auto done = std::move(inflight);
    done.get();
    inflight_bucket.reset();
  };
  try {
    const Delivery delivery = source.delivery();
    // Before begun(): from then on a peer writing in place writes live parameters.
    if (delivery != Delivery::staged) {
      engine.begin_direct_writes(delivery == Delivery::in_place_writer_prints);
    }
    source.begun();
    const bool overlap = source.double_buffered();
    for (std::uint32_t k = 0;; ++k) {
      set_phase(run, fmt::format("receive bucket {}", k));
      auto bucket = std::make_unique<Bucket>();
      bool more = false;
      try {
        more = source.next(overlap ? k % 2 : 0, *bucket);
      } catch (...) {
        // The bucket being applied ends first. Its failure is the cause when it came first or
        // when the source stopped because its peer did (the fetch's error is then a consequence).
        const std::exception_ptr fetch_error = std::current_exception();
        if (inflight.valid()) {
          const bool apply_failed_first = applier.failed.load();
          try {
            finish_inflight();
          } catch (const Error&) {
            if (apply_failed_first || stopped_by_peer(fetch_error)) throw;
          } catch (...) {
          }
        }
        std::rethrow_exception(fetch_error);
      }
      finish_inflight();
      if (!more) break;
      if (!overlap || bucket->in_place) {
        // A bucket written in place is bookkeeping only: no second thread for it.
        set_phase(run, fmt::format("apply bucket {}", k));
        applier.apply(*bucket);
        continue;
      }
      inflight_index = k;
      inflight_bucket = std::move(bucket);
      inflight = std::async(std::launch::async,
                            [&applier, b = inflight_bucket.get()] { applier.apply(*b); });
    }
    finish_inflight();
    set_phase(run, "commit");
    UpdateEnd end = source.end();
    if (end.writer_fingerprints) {
      engine.attach_direct_fingerprints(*end.writer_fingerprints, end.writer_chunk_hashes);
    }
    if (!end.expected.empty()) engine.set_expected_fingerprints(std::move(end.expected));
    if (end.label) engine.set_label(std::move(*end.label));
    engine.commit();
  } catch (const std::exception& e) {
    if (inflight.valid()) inflight.wait();
    engine.abort(e.what());  // a no-op when the engine ended the update itself
    throw;
  } catch (...) {
    if (inflight.valid()) inflight.wait();
    engine.abort("unknown exception");
    throw;
  }
  report.version = engine.version();
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

}  // namespace ferry::update
