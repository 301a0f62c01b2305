// receiver/receiver.cpp: the receiver's control operations over its model binding, weight store
// and update engine: the start, weight values, versions, health, release and resume, fingerprints,
// metrics and engine-owned parameters (see receiver/receiver.hpp). The layout is made in
// receiver_layout.cpp, every update runs in receiver_updates.cpp.
#include "receiver/receiver.hpp"

#include <fmt/format.h>
#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <algorithm>
#include <cstring>

#include "common/log.hpp"
#include "receiver/receiver_state.hpp"
#include "store/host_mirror.hpp"
#include "store/store_device.hpp"
#include "update/param_fingerprint.hpp"

namespace ferry::receiver {

namespace fs = std::filesystem;

namespace {

std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

Receiver::Receiver(const config::Config& config, const registry::Registry& registry)
    : state_(std::make_unique<State>(config, registry)) {
  // A device this build or machine cannot use is refused now, not at the first load.
  const auto where = store::parse_store_device(config.receiver.device);
  store::check_store_device(where);
  state_->cuda_device.store(where.cuda ? where.ordinal : -1);
}

Receiver::~Receiver() = default;

VersionInfo Receiver::start(const fs::path& model_path) {
  auto& s = *state_;
  if (!s.config.memory.mirror_path.empty()) {
    if (s.config.memory.weights_policy != config::ReleasePolicy::backup) {
      logger("receiver")
          ->warn(
              "memory.mirror_path {} is not used: the host mirror needs memory.weights_policy = "
              "\"backup\"",
              s.config.memory.mirror_path);
    } else if (s.restore_at_start(model_path)) {
      return version();
    }
  }
  if (!model_path.empty()) update_from_disk(model_path, std::nullopt);
  return version();
}

WeightValues Receiver::weights_by_name(const std::string& name, std::size_t truncate_size) const {
  auto& s = *state_;
  std::lock_guard lock(s.update_mutex);
  if (!s.engine) fail(FERRY_STATUS_FAILED_PRECONDITION, "no weights loaded yet");
  auto it = s.catalog.find(name);
  if (it == s.catalog.end()) {
    fail(FERRY_STATUS_NOT_FOUND, "no checkpoint tensor named '{}'", name);
  }
  s.require_weights_resident();
  const auto& desc = it->second;
  auto ops = s.binding->locate(desc);
  WeightValues out;
  out.name = name;
  out.dtype = desc.dtype;
  std::uint64_t elements = 0;
  for (const auto& op : ops) elements += op.rows * op.cols;
  // This rank's shape: the checkpoint shape with the sharded dimension divided.
  std::vector<std::uint64_t> shape(desc.shape, desc.shape + desc.ndim);
  const std::uint64_t full = element_count(shape).value_or(0);
  if (elements != full && elements != 0 && !ops.empty() && full % elements == 0) {
    // A shard on dimension d > 0 is one block per outer row (rows == product of the dims before
    // d); otherwise the shard is on dimension 0.
    const std::uint64_t parts = full / elements;
    std::size_t sharded = 0;
    std::uint64_t outer = shape.empty() ? 1 : shape[0];
    for (std::size_t d = 1; d < shape.size(); ++d) {
      if (ops.front().rows == outer && shape[d] % parts == 0) {
        sharded = d;
        break;
      }
      outer *= shape[d];
    }
    if (!shape.empty()) shape[sharded] /= parts;
  }
  out.shape = shape;
  const auto& layout = s.binding->layout();
  std::size_t remaining = std::min<std::uint64_t>(truncate_size, elements);
  if (remaining > kMaxWeightValues) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "truncate_size {} would return {} of the {} values of '{}', more than the maximum of {} "
         "(get_weights_by_name shows a sample; /get_fingerprints checks whole tensors)",
         truncate_size, remaining, elements, name, kMaxWeightValues);
  }
  out.values.reserve(remaining);
  for (const auto& op : ops) {
    if (remaining == 0) break;
    const auto& lp = layout.at(op.dst_param);
    const auto index = s.store->find(lp.name);
    if (!index) fail(FERRY_STATUS_NOT_FOUND, "layout parameter '{}' is not in the store", lp.name);
    const auto info = s.store->param(*index);
    const std::size_t esize = dtype_size(info.dtype);
    std::vector<std::byte> bytes;  // the row's bytes, copied to the host (device weights too)
    for (std::uint64_t r = 0; r < op.rows && remaining > 0; ++r) {
      const std::uint64_t n = std::min<std::uint64_t>(op.cols, remaining);
      std::vector<double> row(n);
      bytes.resize(n * esize);
      s.store->read(*index, (op.dst_offset + r * op.dst_row_stride) * esize, bytes);
      const std::byte* src = bytes.data();
      if (info.dtype == FERRY_DTYPE_F64 || kernels::cast_supported(info.dtype, FERRY_DTYPE_F64)) {
        kernels::convert_elements(src, info.dtype, row.data(), FERRY_DTYPE_F64, n);
      } else {
        for (std::uint64_t i = 0; i < n; ++i) {
          const std::byte* p = src + i * esize;
          switch (info.dtype) {
            case FERRY_DTYPE_I8:
              row[i] = static_cast<double>(*reinterpret_cast<const std::int8_t*>(p));
              break;
            case FERRY_DTYPE_U8:
              row[i] = static_cast<double>(*reinterpret_cast<const std::uint8_t*>(p));
              break;
            case FERRY_DTYPE_BOOL:
              row[i] = *reinterpret_cast<const std::uint8_t*>(p) ? 1.0 : 0.0;
              break;
            case FERRY_DTYPE_I16: {
              std::int16_t v;
              std::memcpy(&v, p, 2);
              row[i] = v;
              break;
            }
            case FERRY_DTYPE_I32: {
              std::int32_t v;
              std::memcpy(&v, p, 4);
              row[i] = v;
              break;
            }
            case FERRY_DTYPE_I64: {
              std::int64_t v;
              std::memcpy(&v, p, 8);
              row[i] = static_cast<double>(v);
              break;
            }
            default:
              fail(FERRY_STATUS_UNIMPLEMENTED, "cannot show values of dtype {}",
                   dtype_name(info.dtype));
          }
        }
      }
      out.values.insert(out.values.end(), row.begin(), row.end());
      remaining -= n;
    }
  }
  return out;
}

void Receiver::set_version_label(const std::string& label) {
  auto& s = *state_;
  std::lock_guard lock(s.update_mutex);
  if (!s.engine) fail(FERRY_STATUS_FAILED_PRECONDITION, "no weights loaded yet");
  s.engine->set_version_label(label);
}

VersionInfo Receiver::version() const {
  if (!state_->has_layout.load(std::memory_order_acquire)) return {};
  const auto* engine = state_->engine.get();
  auto v = engine->version();
  return VersionInfo{v.number, v.label};
}

Health Receiver::health() const {
  auto& s = *state_;
  if (s.busy.load()) {
    const char* what = s.activity.load();
    return Health{false, what,
                  std::string(what) == "loading" ? "loading the first weights"
                                                 : "an update is being applied"};
  }
  if (!s.has_layout.load(std::memory_order_acquire)) {
    return Health{false, "empty", "no weights loaded yet"};
  }
  const auto h = s.engine->health();
  if (h.ready) return Health{true, "ready", ""};
  // The engine is also not ready while a tag is released or invalid: name the state by its
  // cause, the fence first (resuming does not clear it).
  if (s.engine->metrics().fenced) return Health{false, "fenced", h.reason};
  if (s.store->released(kWeightsTag)) {
    return Health{false, "released", "weights are released (resume_memory_occupation)"};
  }
  if (!s.store->contents_valid(kWeightsTag)) {
    return Health{false, "invalid", s.store->invalid_reason(kWeightsTag)};
  }
  if (!s.engine->version().committed) return Health{false, "empty", h.reason};
  return Health{false, "updating", h.reason};
}

void Receiver::release(const std::vector<std::string>& tags) {
  auto& s = *state_;
  std::lock_guard lock(s.update_mutex);
  if (!s.store) fail(FERRY_STATUS_FAILED_PRECONDITION, "no weights loaded yet");
  std::vector<std::string> chosen = tags.empty() ? s.store->tags() : tags;
  if (tags.empty()) {
    std::erase_if(chosen, [&](const std::string& t) { return s.store->released(t); });
    if (chosen.empty()) fail(FERRY_STATUS_FAILED_PRECONDITION, "every tag is already released");
  }
  ++s.memory_epoch;
  {
    // Called under its mutex: set_release_hook({}) (an endpoint stopping) waits for a running
    // hook, so the hook never outlives what it points into.
    std::lock_guard hook_lock(s.release_hook_mutex);
    if (s.release_hook) s.release_hook("the receiver releases its memory");
  }
  s.store->release(chosen);
}

void Receiver::resume(const std::vector<std::string>& tags) {
  auto& s = *state_;
  std::lock_guard lock(s.update_mutex);
  if (!s.store) fail(FERRY_STATUS_FAILED_PRECONDITION, "no weights loaded yet");
  std::vector<std::string> chosen = tags.empty() ? s.store->tags() : tags;
  if (tags.empty()) {
    std::erase_if(chosen, [&](const std::string& t) { return !s.store->released(t); });
    if (chosen.empty()) fail(FERRY_STATUS_FAILED_PRECONDITION, "no tag is released");
  }
  ++s.memory_epoch;
  s.store->resume(chosen);
  bool weights_back = true;  // (a store without weights has nothing a session shares)
  try {
    weights_back = !s.store->released(kWeightsTag);
  } catch (const Error&) {
  }
  if (!weights_back) return;  // what kept sessions share is not back yet
  std::lock_guard hook_lock(s.release_hook_mutex);
  try {
    if (s.resume_hook) s.resume_hook();
  } catch (...) {
    // The memory is resumed either way; a sender not told rejoins at its next push.
  }
}

std::uint64_t Receiver::memory_epoch() const {
  return state_->memory_epoch.load();
}

void Receiver::set_release_hook(std::function<void(const std::string& reason)> hook) {
  std::lock_guard lock(state_->release_hook_mutex);
  state_->release_hook = std::move(hook);
}

void Receiver::set_resume_hook(std::function<void()> hook) {
  std::lock_guard lock(state_->release_hook_mutex);
  state_->resume_hook = std::move(hook);
}

EngineControl& Receiver::engine_control() const {
  return state_->engine_control;
}

std::vector<TagState> Receiver::memory_state() const {
  std::vector<TagState> out;
  if (!state_->has_layout.load(std::memory_order_acquire)) return out;
  for (const auto& t : state_->store->memory_state()) {
    out.push_back(TagState{t.tag, t.bytes + t.external_bytes, t.released,
                           store::policy_name(t.policy), t.contents_valid});
  }
  return out;
}

std::map<std::string, std::uint64_t> Receiver::fingerprints() const {
  auto& s = *state_;
  std::lock_guard lock(s.update_mutex);
  std::map<std::string, std::uint64_t> out;
  if (!s.store) return out;
  s.require_weights_resident();
  // Computed from the bytes in memory now, not remembered from the commit: this is what
  // verifies that release/resume and updates left exactly the expected weights.
  for (std::size_t i = 0; i < s.store->param_count(); ++i) {
    auto p = s.store->param(i);
    out[p.name] = update::fingerprint_param(p, s.threads());
  }
  return out;
}

const config::Config& Receiver::receiver_config() const {
  return state_->config;
}
const registry::Registry& Receiver::plugin_registry() const {
  return state_->registry;
}

std::vector<ferry_tensor_desc_t> Receiver::layout() const {
  std::vector<ferry_tensor_desc_t> out;
  if (!state_->has_layout.load(std::memory_order_acquire)) return out;
  for (const auto& p : state_->binding->layout()) {
    out.push_back(manifest::tensor_desc(p.name, p.dtype, p.shape));
  }
  return out;
}

std::vector<ferry_tensor_desc_t> Receiver::checkpoint_catalog() const {
  auto& s = *state_;
  {
    std::lock_guard lock(s.update_mutex);
    if (!s.catalog.empty()) {
      std::vector<ferry_tensor_desc_t> out;
      out.reserve(s.catalog.size());
      for (const auto& [name, desc] : s.catalog) out.push_back(desc);
      return out;
    }
  }
  return layout();
}

std::string Receiver::metrics_text() const {
  auto& s = *state_;
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value,
                    const std::string& labels = "") {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{} {}\n", name, help, name, type, name,
                       labels.empty() ? "" : "{" + labels + "}", value);
  };
  const auto h = health();
  const auto v = version();
  metric("ferry_ready", "gauge", "1 when the receiver serves committed weights", h.ready ? 1 : 0);
  metric("ferry_weight_version", "gauge", "number of the published version (only increases)",
         static_cast<double>(v.number), "label=\"" + escape_label(v.label) + "\"");
  if (s.has_layout.load(std::memory_order_acquire)) {
    const auto m = s.engine->metrics();
    metric("ferry_updates_committed_total", "counter", "updates committed", m.updates_committed);
    metric("ferry_updates_aborted_total", "counter", "updates aborted", m.updates_aborted);
    metric("ferry_update_rollbacks_total", "counter", "aborted updates restored from the mirror",
           m.rollbacks);
    metric("ferry_buckets_applied_total", "counter", "buckets applied", m.buckets_applied);
    metric("ferry_bytes_applied_total", "counter", "bucket bytes applied", m.bytes_applied);
    metric("ferry_apply_seconds_total", "counter", "seconds spent applying buckets",
           m.seconds_applying);
    metric("ferry_plan_cache_hits_total", "counter", "plans served from the cache",
           m.plan_cache_hits);
    metric("ferry_fenced", "gauge", "1 while a failed update left partial weights",
           m.fenced ? 1 : 0);
    metric("ferry_mirror_refresh_seconds", "gauge",
           "seconds the last host mirror refresh took, start to last byte",
           m.mirror_refresh_seconds);
    metric("ferry_mirror_refresh_waits_total", "counter",
           "calls that waited for a running host mirror refresh", m.mirror_refresh_waits);
    metric("ferry_commit_fingerprint_read_bytes", "gauge",
           "bytes the last commit read to fingerprint parameters (what no copy hashed as it "
           "wrote it)",
           static_cast<double>(m.commit_fingerprint_read_bytes));
    metric("ferry_mirror_version", "gauge",
           "version the last host mirror refresh copied whole (0 while one runs, after one failed, "
           "or before the first)",
           static_cast<double>(m.mirror_version));
    out += m.update_seconds.prometheus_text(
        "ferry_update_seconds", "seconds of each committed update, from its begin to published");
    out += m.update_bytes.prometheus_text("ferry_update_bytes",
                                          "bytes applied by each committed update");
  }
  for (const auto& t : memory_state()) {
    const std::string labels = "tag=\"" + escape_label(t.tag) + "\"";
    metric("ferry_memory_bytes", "gauge", "bytes of the tag's memory", t.bytes, labels);
    metric("ferry_memory_released", "gauge", "1 while the tag is released", t.released ? 1 : 0,
           labels);
  }
  return out;
}

void Receiver::register_params(const std::vector<EngineParam>& params) {
  auto& s = *state_;
  std::lock_guard lock(s.update_mutex);
  if (s.store || s.has_layout.load(std::memory_order_acquire)) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "the receiver has a layout already; register_params must come before any update");
  }
  if (params.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "register_params: no parameters");
  // The store of the configured device; engine-owned device tensors need the CUDA store of
  // their device.
  store::StoreDevice device = store::parse_store_device(s.config.receiver.device);
  for (const auto& p : params) {
    if (p.memory_kind == FERRY_MEMORY_CUDA) device = store::StoreDevice{true, p.device};
  }
  auto new_store = store::make_weight_store(device, s.config.update.apply_threads);
  new_store->set_policy(kWeightsTag, to_store_policy(s.config.memory.weights_policy));
  for (const auto& p : params) {
    if (p.data == nullptr) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "register_params: parameter '{}' has no data pointer",
           p.name);
    }
    new_store->register_external(kWeightsTag, p.name, p.dtype, p.shape, p.data, p.memory_kind);
  }
  s.engine_devices.clear();
  for (const auto& p : params) {
    if (p.memory_kind == FERRY_MEMORY_CUDA) s.engine_devices.push_back(p.device);
  }
  std::sort(s.engine_devices.begin(), s.engine_devices.end());
  s.engine_devices.erase(std::unique(s.engine_devices.begin(), s.engine_devices.end()),
                         s.engine_devices.end());
  s.cuda_device.store(device.cuda ? device.ordinal : -1);
  s.store = std::move(new_store);
  // When the model plugin maps the parameters onto themselves (identity), the layout exists now;
  // otherwise it is created by the first session, whose catalog the plugin needs.
  manifest::Manifest cat;
  for (const auto& p : params) {
    manifest::Entry e;
    e.name = p.name;
    e.dtype = p.dtype;
    e.shape = p.shape;
    e.size = byte_size(p.dtype, p.shape).value_or(0);
    cat.tensors.push_back(std::move(e));
  }
  try {
    s.create_layout_over_registered(cat, "");
  } catch (const Error& e) {
    logger("receiver")
        ->info("{} engine-owned parameters registered; the layout waits for the first session ({})",
               params.size(), e.what());
  }
}

void Receiver::set_engine_order(order::StreamOrder engine_order) {
  if (engine_order.wait == order::Wait::events) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "engine order: events are recorded once, and every update waits; name the engine's "
         "streams instead");
  }
  auto& s = *state_;
  std::lock_guard lock(s.update_mutex);
  s.engine_order = std::move(engine_order);
}

int Receiver::weights_cuda_device() const {
  return state_->cuda_device.load();
}

}  // namespace ferry::receiver
