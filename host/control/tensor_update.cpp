// control/tensor_update.cpp: /update_weights_from_tensor: the staged tensors and the route
// (see tensor_update.hpp and docs/http-api.md, "Tensors from the trainer's process").
#include "control/tensor_update.hpp"

#include <ferry/sdk/bucket_packing.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "config/config.hpp"
#include "control/handlers.hpp"
#include "receiver/torch_tensor_import.hpp"

namespace ferry::control {

std::size_t PendingTensorUpdate::stage(const TensorUpdateRequest& request,
                                       const std::vector<ferry_tensor_desc_t>& catalog,
                                       std::uint64_t capacity) {
  std::map<std::string_view, const ferry_tensor_desc_t*> by_name;
  for (const auto& t : catalog) by_name[t.name] = &t;
  for (const auto& t : request.tensors) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "update_weights_from_tensor: tensor '{}' is not one of this receiver's checkpoint "
           "tensors",
           t.name);
    }
    const auto& want = *it->second;
    const std::vector<std::uint64_t> shape(want.shape, want.shape + want.ndim);
    if (want.dtype != t.dtype || shape != t.shape) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "update_weights_from_tensor: tensor '{}' is {} {}, the receiver expects {} {}", t.name,
           dtype_name(t.dtype), shape_string(t.shape), dtype_name(want.dtype), shape_string(shape));
    }
    if (names_.contains(t.name)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "update_weights_from_tensor: tensor '{}' was sent already in this update", t.name);
    }
  }
  // Every received CUDA tensor's reference goes back to the trainer once, copied or not.
  struct Release {
    const TensorUpdateRequest& r;
    ~Release() {
      for (const auto& s : r.sources) receiver::release_shared_tensor(s);
    }
  } release{request};
  // Places first (buckets grow), then one open per source copying all of its pieces.
  std::vector<std::pair<std::size_t, std::uint64_t>> places;  // bucket, offset
  for (const auto& t : request.tensors) {
    std::uint64_t offset = 0;
    if (!buckets_.empty()) offset = sdk::bucket_align_up(buckets_.back().data.size());
    if (buckets_.empty() || (offset + t.bytes > capacity && !buckets_.back().entries.empty())) {
      buckets_.emplace_back();
      offset = 0;
    }
    auto& b = buckets_.back();
    b.data.resize(offset + t.bytes);
    manifest::Entry e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.shape = t.shape;
    e.offset = offset;
    e.size = t.bytes;
    b.entries.push_back(std::move(e));
    names_.insert(t.name);
    places.emplace_back(buckets_.size() - 1, offset);
  }
  std::vector<std::vector<receiver::SharedTensorRange>> ranges(request.sources.size());
  for (std::size_t i = 0; i < request.tensors.size(); ++i) {
    const auto& t = request.tensors[i];
    ranges[t.source].push_back(
        {t.byte_offset, t.bytes, buckets_[places[i].first].data.data() + places[i].second});
  }
  for (std::size_t s = 0; s < request.sources.size(); ++s) {
    receiver::copy_shared_tensor(request.sources[s], ranges[s]);
  }
  if (request.weight_version) label_ = request.weight_version;
  last_staged_ = std::chrono::steady_clock::now();
  return request.tensors.size();
}

std::uint64_t PendingTensorUpdate::bytes() const {
  std::uint64_t n = 0;
  for (const auto& b : buckets_) n += b.data.size();
  return n;
}

bool PendingTensorUpdate::discard_if_idle(std::chrono::steady_clock::time_point now,
                                          std::chrono::milliseconds timeout) {
  if (empty() || now - last_staged_ < timeout) return false;
  discard();
  return true;
}

bool PendingTensorUpdate::covers(const std::vector<ferry_tensor_desc_t>& catalog) const {
  return std::all_of(catalog.begin(), catalog.end(),
                     [&](const ferry_tensor_desc_t& t) { return names_.contains(t.name); });
}

receiver::UpdateReport PendingTensorUpdate::commit(receiver::Receiver& receiver) {
  const std::uint64_t version = receiver.version().number + 1;
  std::vector<receiver::Receiver::Bucket> buckets;
  buckets.reserve(buckets_.size());
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    manifest::Manifest m;
    m.version = version;
    m.bucket_index = static_cast<std::uint32_t>(i);
    m.bucket_count = static_cast<std::uint32_t>(buckets_.size());
    m.bucket_bytes = buckets_[i].data.size();
    m.tensors = std::move(buckets_[i].entries);
    receiver::Receiver::Bucket b;
    b.manifest = manifest::encode(m);
    b.data = std::move(buckets_[i].data);
    buckets.push_back(std::move(b));
  }
  const auto label = label_;
  discard();
  return receiver.apply_update(buckets, version, label);
}

void PendingTensorUpdate::discard() {
  buckets_.clear();
  names_.clear();
  label_.reset();
}

HttpResponse update_from_tensor(Context& c, const HttpRequest& req) {
  const auto& rc = c.receiver.receiver_config();
  const auto request =
      parse_tensor_update(parse_body(req), rc.receiver.tp_rank, rc.receiver.tp_size);
  const auto catalog = c.receiver.checkpoint_catalog();
  if (catalog.empty()) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "update_weights_from_tensor: the receiver has no model loaded (load the checkpoint "
         "first, or register the engine's parameters)");
  }
  const std::lock_guard lock(c.state.tensor_mutex);
  auto& pending = c.state.tensors;
  try {
    pending.stage(request, catalog, rc.update.bucket_bytes);
  } catch (const Error& e) {
    const std::size_t dropped = pending.size();
    pending.discard();
    throw Error(e.code(), dropped == 0 ? std::string(e.what())
                                       : fmt::format("{} (the {} tensors staged before were "
                                                     "discarded; the published version stays)",
                                                     e.what(), dropped));
  }
  const bool in_session = c.receiver.engine_control().state().session_open;
  if (in_session || !pending.covers(catalog)) {
    return reply(
        200,
        json{{"success", true},
             {"message", fmt::format("staged {} tensors ({} of {} pending; the "
                                     "update commits {})",
                                     request.tensors.size(), pending.size(), catalog.size(),
                                     in_session ? "at end_weight_update" : "with the last tensor")},
             {"committed", false},
             {"num_staged", request.tensors.size()},
             {"num_pending", pending.size()}});
  }
  receiver::UpdateReport report;
  c.receiver.engine_control().run_update(request.effects, [&] {
    try {
      report = pending.commit(c.receiver);
    } catch (...) {
      pending.discard();
      throw;
    }
  });
  json out = report_json(report);
  out["success"] = true;
  out["message"] = "updated from tensors";
  out["committed"] = true;
  out["num_staged"] = request.tensors.size();
  out["num_pending"] = 0;
  return reply(200, out);
}

std::optional<receiver::UpdateReport> commit_pending_tensors(Context& c) {
  const std::lock_guard lock(c.state.tensor_mutex);
  if (c.state.tensors.empty()) return std::nullopt;
  // An update must cover every parameter: refused before any byte is written when it does not.
  const auto catalog = c.receiver.checkpoint_catalog();
  if (!c.state.tensors.covers(catalog)) {
    std::vector<std::string> missing;
    for (const auto& t : catalog) {
      if (!c.state.tensors.contains(t.name)) missing.emplace_back(t.name);
    }
    c.state.tensors.discard();
    const std::size_t shown = std::min<std::size_t>(missing.size(), 8);
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "{} of {} checkpoint tensors were never sent ({}{}); nothing was written", missing.size(),
         catalog.size(),
         fmt::join(missing.begin(), missing.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
         missing.size() > shown ? ", ..." : "");
  }
  try {
    return c.state.tensors.commit(c.receiver);
  } catch (...) {
    c.state.tensors.discard();
    throw;
  }
}

}  // namespace ferry::control
