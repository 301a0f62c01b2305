// control/tensor_update.cpp: /update_weights_from_tensor: the staged tensors and the route
// (see tensor_update.hpp and docs/http-api.md, "Tensors from the trainer's process").
#include "control/tensor_update.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <string_view>

#include "common/log.hpp"
#include "config/config.hpp"
#include "control/handlers.hpp"
#include "receiver/torch_tensor_import.hpp"

namespace ferry::control {

std::size_t PendingTensorUpdate::stage(const TensorUpdateRequest& request,
                                       const std::vector<ferry_tensor_desc_t>& catalog,
                                       receiver::Receiver& receiver,
                                       std::chrono::milliseconds idle_timeout) {
  // Every received CUDA tensor's reference goes back to the trainer once, applied or not.
  struct Release {
    const TensorUpdateRequest& r;
    ~Release() {
      for (const auto& s : r.sources) receiver::release_shared_tensor(s);
    }
  } release{request};
  if (update_ && update_->over()) discard();  // it ended on its own (no call for idle_timeout)
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
  std::vector<std::vector<std::size_t>> of_source(request.sources.size());
  for (std::size_t i = 0; i < request.tensors.size(); ++i) {
    const auto& t = request.tensors[i];
    // Every piece fits its storage (as the pickle describes it) before anything is written.
    receiver::check_shared_range(request.sources[t.source], t.byte_offset, t.bytes);
    of_source[t.source].push_back(i);
  }
  if (!update_) {
    catalog_ = catalog;
    update_ = std::make_unique<receiver::FedUpdate>(receiver, catalog_, idle_timeout);
  }
  const int weights_device = receiver.weights_cuda_device();
  // Where a call's time goes (debug log): opening the storages (cudaIpcOpenMemHandle and the
  // producer's event, or shm_open + mmap), applying them (the update loop's write), closing.
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  double open_ms = 0;
  double apply_ms = 0;
  double close_ms = 0;
  std::uint64_t call_bytes = 0;
  // One bucket per storage, read where it is: the span of its tensors' bytes.
  for (std::size_t s = 0; s < request.sources.size(); ++s) {
    if (of_source[s].empty()) continue;
    auto opened_at = Clock::now();
    auto mapping = std::make_unique<receiver::SharedTensorMapping>(request.sources[s]);
    open_ms += ms_since(opened_at);
    std::uint64_t lo = UINT64_MAX;
    std::uint64_t hi = 0;
    for (std::size_t i : of_source[s]) {
      const auto& t = request.tensors[i];  // checked against the storage above
      lo = std::min(lo, t.byte_offset);
      hi = std::max(hi, t.byte_offset + t.bytes);
    }
    manifest::Manifest m;
    m.bucket_index = buckets_;
    m.bucket_count = buckets_ + 1;  // the last so far: the total is known at the commit
    m.bucket_bytes = hi - lo;
    for (std::size_t i : of_source[s]) {
      const auto& t = request.tensors[i];
      manifest::Entry e;
      e.name = t.name;
      e.dtype = t.dtype;
      e.shape = t.shape;
      e.offset = t.byte_offset - lo;
      e.size = t.bytes;
      m.tensors.push_back(std::move(e));
    }
    update::Bucket b;
    b.manifest_bytes = manifest::encode(m);
    b.index = buckets_;
    std::vector<std::byte> copy;
    const auto applied_at = Clock::now();
    const bool readable_here = mapping->kind() == FERRY_MEMORY_HOST ||
                               (weights_device >= 0 && mapping->device() == weights_device);
    if (readable_here) {
      b.data = std::span<const std::byte>(mapping->data() + lo, hi - lo);
      b.kind = mapping->kind();
    } else {
      copy.resize(hi - lo);
      mapping->copy_to_host(copy.data(), lo, hi - lo);
      b.data = copy;
    }
    update_->apply(std::move(b));
    apply_ms += ms_since(applied_at);
    const auto closed_at = Clock::now();
    mapping.reset();
    close_ms += ms_since(closed_at);
    ++buckets_;
    bytes_ += hi - lo;
    call_bytes += hi - lo;
    for (std::size_t i : of_source[s]) names_.insert(request.tensors[i].name);
  }
  logger("control")->debug(
      "update_weights_from_tensor: bucket {} of this update: {} tensors, {} bytes from {} "
      "storages; open {:.3f} ms, apply {:.3f} ms, close {:.3f} ms",
      buckets_, request.tensors.size(), call_bytes, request.sources.size(), open_ms, apply_ms,
      close_ms);
  if (request.weight_version) label_ = request.weight_version;
  last_staged_ = std::chrono::steady_clock::now();
  return request.tensors.size();
}

bool PendingTensorUpdate::discard_if_idle(std::chrono::steady_clock::time_point now,
                                          std::chrono::milliseconds timeout) {
  if (empty() || now - last_staged_ < timeout) return false;
  discard(fmt::format("its client sent nothing for {} ms (update.staged_tensors_timeout_ms) and "
                      "never completed the update",
                      timeout.count()));
  return true;
}

bool PendingTensorUpdate::covers(const std::vector<ferry_tensor_desc_t>& catalog) const {
  return std::all_of(catalog.begin(), catalog.end(),
                     [&](const ferry_tensor_desc_t& t) { return names_.contains(t.name); });
}

receiver::UpdateReport PendingTensorUpdate::commit() {
  if (!update_) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "update_weights_from_tensor: no update in progress");
  }
  auto update = std::move(update_);
  const auto label = label_;
  discard();
  return update->finish(label);
}

void PendingTensorUpdate::discard(const std::string& reason) {
  if (update_) update_->abort(reason);
  update_.reset();
  catalog_.clear();
  buckets_ = 0;
  bytes_ = 0;
  names_.clear();
  label_.reset();
}

HttpResponse update_from_tensor(Context& c, const HttpRequest& req) {
  const auto& rc = c.receiver.receiver_config();
  const auto parsed_at = std::chrono::steady_clock::now();
  const auto request =
      parse_tensor_update(parse_body(req), rc.receiver.tp_rank, rc.receiver.tp_size);
  logger("control")->debug(
      "update_weights_from_tensor: {} body bytes parsed (JSON, base64, pickles) in {:.3f} ms",
      req.body.size(),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - parsed_at)
          .count());
  const std::lock_guard lock(c.state.tensor_mutex);
  auto& pending = c.state.tensors;
  const auto catalog =
      pending.catalog() != nullptr ? *pending.catalog() : c.receiver.checkpoint_catalog();
  if (catalog.empty()) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "update_weights_from_tensor: the receiver has no model loaded (load the checkpoint "
         "first, or register the engine's parameters)");
  }
  const bool in_session = c.receiver.engine_control().state().session_open;
  // Whether this call completes the update: then the engine's effects (abort_all_requests before
  // the first write of the call, the cache flush after) wrap its writes and the commit.
  std::set<std::string_view> sent;
  for (const auto& t : request.tensors) sent.insert(t.name);
  const bool completes =
      !in_session && std::all_of(catalog.begin(), catalog.end(), [&](const ferry_tensor_desc_t& t) {
        return pending.contains(t.name) || sent.contains(t.name);
      });
  const auto stage = [&] {
    try {
      pending.stage(request, catalog, c.receiver,
                    std::chrono::milliseconds(rc.update.staged_tensors_timeout_ms));
    } catch (const Error& e) {
      const std::size_t dropped = pending.size();
      pending.discard(e.what());
      throw Error(e.code(),
                  dropped == 0
                      ? fmt::format("{} (nothing was written; the published version stays)",
                                    e.what())
                      : fmt::format("{} (the update in progress, {} tensors written, was "
                                    "aborted; the published version stays: see /health)",
                                    e.what(), dropped));
    }
  };
  if (!completes) {
    stage();
    return reply(
        200,
        json{{"success", true},
             {"message", fmt::format("wrote {} tensors ({} of {} in this update; it commits {})",
                                     request.tensors.size(), pending.size(), catalog.size(),
                                     in_session ? "at end_weight_update" : "with the last tensor")},
             {"committed", false},
             {"num_staged", request.tensors.size()},
             {"num_pending", pending.size()}});
  }
  receiver::UpdateReport report;
  c.receiver.engine_control().run_update(request.effects, [&] {
    stage();
    try {
      report = pending.commit();
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
  // An update must cover every parameter: one that does not is aborted, never published.
  const auto catalog = c.state.tensors.catalog() != nullptr ? *c.state.tensors.catalog()
                                                             : c.receiver.checkpoint_catalog();
  if (!c.state.tensors.covers(catalog)) {
    std::vector<std::string> missing;
    for (const auto& t : catalog) {
      if (!c.state.tensors.contains(t.name)) missing.emplace_back(t.name);
    }
    const std::size_t shown = std::min<std::size_t>(missing.size(), 8);
    const std::string why = fmt::format(
        "{} of {} checkpoint tensors were never sent ({}{})", missing.size(), catalog.size(),
        fmt::join(missing.begin(), missing.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
        missing.size() > shown ? ", ..." : "");
    c.state.tensors.discard(why);
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "{}: the update was aborted (what its calls wrote is restored from the host mirror, or "
         "the receiver is fenced: see /health)",
         why);
  }
  try {
    return c.state.tensors.commit();
  } catch (...) {
    c.state.tensors.discard();
    throw;
  }
}

}  // namespace ferry::control
