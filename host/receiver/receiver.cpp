// The receiver: model binding + weight store + update engine behind the control operations
// (see receiver/receiver.hpp).
#include "receiver/receiver.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/bucket_packing.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/log.hpp"
#include "common/progress.hpp"
#include "config/config.hpp"
#include "receiver/client_input.hpp"
#include "receiver/source_reader.hpp"
#include "registry/registry.hpp"
#include "store/cpu_weight_store.hpp"
#include "store/host_mirror.hpp"
#include "store/store_device.hpp"
#include "update/model_binding.hpp"
#include "update/param_fingerprint.hpp"
#include "update/update_engine.hpp"

namespace ferry::receiver {
namespace {

update::MirrorRefreshMode mirror_refresh_mode(config::MirrorRefresh refresh) {
  switch (refresh) {
    case config::MirrorRefresh::background: return update::MirrorRefreshMode::background;
    case config::MirrorRefresh::complete: return update::MirrorRefreshMode::complete;
    case config::MirrorRefresh::commit: return update::MirrorRefreshMode::commit;
  }
  return update::MirrorRefreshMode::background;
}

namespace fs = std::filesystem;
constexpr const char* kWeightsTag = "weights";
constexpr std::uint64_t kMaxConfigJsonBytes = 16ull << 20;

// A long load from disk shows its progress as info lines of the log (config `progress`; never
// drawn in place, this is a log): none for "never", nor for "terminal" off a terminal.
ProgressMeter::Options load_progress(const config::Config& c) {
  ProgressMeter::Options o;
  o.style = progress_style(c.progress, stderr_is_terminal()) == ProgressStyle::none
                ? ProgressStyle::none
                : ProgressStyle::lines;
  o.interval = std::chrono::milliseconds(c.progress_interval_ms);
  return o;
}

store::Policy to_store_policy(config::ReleasePolicy p) {
  return p == config::ReleasePolicy::backup ? store::Policy::Backup : store::Policy::Discard;
}

// Reads config.json next to a checkpoint (the folder itself, or the folder of a file); "" when
// there is none. Never blocks: a FIFO or device there is refused.
std::string read_config_json(const fs::path& checkpoint) {
  fs::path dir = fs::is_directory(checkpoint) ? checkpoint : checkpoint.parent_path();
  return read_optional_text_file(dir / "config.json", kMaxConfigJsonBytes);
}

// The model family named by config.json's architectures / model_type: the family of the first
// receiver.model_family_hints entry ("SUBSTRING=FAMILY") whose substring is in one of them.
std::string detect_family(const std::string& config_json, const fs::path& checkpoint,
                          const std::vector<std::string>& hints) {
  if (config_json.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "cannot detect the model family of '{}': no config.json beside it; set "
         "receiver.model_family (or --model-family)",
         checkpoint.string());
  }
  auto doc = nlohmann::json::parse(config_json, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    fail(FERRY_STATUS_CORRUPT_DATA, "config.json beside '{}' is not a JSON object",
         checkpoint.string());
  }
  std::vector<std::string> names;
  if (auto it = doc.find("architectures"); it != doc.end() && it->is_array()) {
    for (const auto& a : *it) {
      if (a.is_string()) names.push_back(a.get<std::string>());
    }
  }
  if (auto it = doc.find("model_type"); it != doc.end() && it->is_string()) {
    names.push_back(it->get<std::string>());
  }
  for (const auto& n : names) {
    std::string lower = n;
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    for (const auto& hint : hints) {
      const auto eq = hint.find('=');
      if (eq == 0 || eq == std::string::npos || eq + 1 == hint.size()) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "receiver.model_family_hints entry '{}' is not SUBSTRING=FAMILY", hint);
      }
      if (lower.find(hint.substr(0, eq)) != std::string::npos) return hint.substr(eq + 1);
    }
  }
  fail(FERRY_STATUS_INVALID_ARGUMENT,
       "cannot detect the model family of '{}' from config.json (architectures/model_type; "
       "receiver.model_family_hints has no match); set receiver.model_family",
       checkpoint.string());
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

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

// What a file-backed host mirror keeps beside the weights (HostMirror metadata): the catalog the
// layout was made from and the checkpoint's config.json, so that a restart without
// receiver.model_path can make the same layout again.
std::string mirror_metadata(const manifest::Manifest& cat, const std::string& config_json) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& e : cat.tensors) {
    tensors.push_back({{"name", e.name}, {"dtype", dtype_name(e.dtype)}, {"shape", e.shape}});
  }
  const nlohmann::json doc{{"catalog", std::move(tensors)}, {"config_json", config_json}};
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The catalog and config.json text kept by mirror_metadata; CORRUPT_DATA naming `where` when the
// record is missing or malformed.
manifest::Manifest catalog_from_mirror_metadata(const std::string& text, const std::string& where,
                                                std::string& config_json) {
  auto refuse = [&](const std::string& why) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {} (it cannot give the layout without receiver.model_path)",
         where, why);
  };
  if (text.empty()) refuse("it records no checkpoint catalog");
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("catalog") ||
      !doc["catalog"].is_array() || !doc.value("config_json", nlohmann::json()).is_string()) {
    refuse("its catalog record is not the receiver's");
  }
  manifest::Manifest cat;
  for (const auto& t : doc["catalog"]) {
    manifest::Entry e;
    const auto dtype = t.is_object() && t.value("dtype", nlohmann::json()).is_string()
                           ? dtype_from_name(t["dtype"].get<std::string>())
                           : std::nullopt;
    if (!dtype || !t.value("name", nlohmann::json()).is_string() ||
        !t.value("shape", nlohmann::json()).is_array()) {
      refuse("a tensor of its catalog record is malformed");
    }
    e.name = t["name"].get<std::string>();
    e.dtype = *dtype;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned()) refuse(fmt::format("tensor '{}' has a malformed shape", e.name));
      e.shape.push_back(d.get<std::uint64_t>());
    }
    e.size = byte_size(e.dtype, e.shape).value_or(0);
    cat.tensors.push_back(std::move(e));
  }
  manifest::validate(cat);
  config_json = doc["config_json"].get<std::string>();
  return cat;
}

}  // namespace

struct Receiver::State {
  config::Config config;
  const registry::Registry& registry;
  std::mutex update_mutex;  // one mutating operation at a time
  std::atomic<bool> busy{false};
  std::atomic<const char*> activity{""};  // "loading" / "updating" while busy

  std::shared_ptr<const registry::LoadedPlugin> model_plugin;
  std::unique_ptr<update::ModelBinding> binding;
  std::unique_ptr<store::WeightStore> store;  // CPU or CUDA, from receiver.device
  std::unique_ptr<update::UpdateEngine> engine;
  // Set (release) once binding/store/engine exist; they never change afterwards. Lock-free
  // readers (health, version, metrics, memory state) check it (acquire) before touching them.
  std::atomic<bool> has_layout{false};
  std::map<std::string, ferry_tensor_desc_t> catalog;  // checkpoint tensors by name
  std::vector<std::string> catalog_names;                // owns the names `catalog` points at
  // manifest::catalog_key of the last session catalog found equal to `catalog` (open_session):
  // a session with the same tensor list skips the check. Cleared whenever `catalog` changes.
  std::string accepted_catalog;
  // Bumped by release() and resume(), under update_mutex (StreamingUpdate::memory_epoch).
  std::uint64_t memory_epoch = 0;
  std::mutex release_hook_mutex;  // guards release_hook (set from the endpoint's thread)
  std::function<void(const std::string&)> release_hook;
  // Stream ordering against the engine (set_engine_order; read under update_mutex). The devices
  // are those of engine-owned CUDA parameters: empty for ferry-owned weights.
  order::StreamOrder engine_order;
  std::vector<int> engine_devices;
  std::atomic<int> cuda_device{-1};  // weights_cuda_device() once a store exists

  // memory.mirror_path's file, opened by start() because it holds a committed version: the
  // first layout attaches it (attach_mirror checks its layout) instead of a fresh file.
  std::shared_ptr<store::HostMirror> mirror_to_restore;

  State(const config::Config& c, const registry::Registry& r) : config(c), registry(r) {}

  // The file-backed host mirror of a new store: the one start() opened, else a fresh file (which
  // replaces an old one) recording `cat` and `config_json` for a restart without model_path.
  std::shared_ptr<store::HostMirror> file_mirror(const store::WeightStore& new_store,
                                                 const manifest::Manifest& cat,
                                                 const std::string& config_json) {
    if (mirror_to_restore) return std::exchange(mirror_to_restore, nullptr);
    return store::HostMirror::create_file(config.memory.mirror_path, new_store.mirror_layout(),
                                          config.update.apply_threads,
                                          mirror_metadata(cat, config_json));
  }

  // start(): restores the committed version of memory.mirror_path's file when it holds one whose
  // layout is this receiver's (made from `model_path`'s headers, or from the mirror's own record
  // when `model_path` is empty). Returns false, having said why at warn (info when there is no
  // file yet), when it does not; a layout may exist then (the caller's load uses it).
  bool restore_at_start(const fs::path& model_path);

  unsigned threads() const { return config.update.apply_threads; }

  // Before an update's first write into engine-owned parameters: the engine's queued work on
  // them (a forward pass still reading them) is done. Caller holds update_mutex.
  void wait_for_engine(std::uint64_t version) const {
    if (engine_devices.empty()) return;
    order::wait(engine_order, engine_devices,
                fmt::format("update {}: waiting for the engine's work on its parameters", version));
  }

  // The layout from a catalog and the checkpoint's config.json text (may be empty); `checkpoint`
  // names the source (a path, or the sender of a session) in messages. With engine-owned
  // parameters registered (register_params) the layout must match them instead.
  void create_layout(const manifest::Manifest& cat, const std::string& config_json,
                     const fs::path& checkpoint) {
    if (store) {
      create_layout_over_registered(cat, config_json);
      return;
    }
    std::string family = config.receiver.model_family;
    if (family.empty()) {
      family = detect_family(config_json, checkpoint, config.receiver.model_family_hints);
    }
    model_plugin = registry.model(family);
    const auto& opts = config.models[family];
    std::vector<ferry_option_t> options = config::option_array(opts);
    ferry_model_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options);
    args.layout = config::layout_name(config.receiver.layout);
    args.tp_rank = config.receiver.tp_rank;
    args.tp_size = config.receiver.tp_size;
    args.ep_rank = config.receiver.ep_rank;
    args.ep_size = config.receiver.ep_size;
    args.config_json = config_json.empty() ? nullptr : config_json.c_str();
    args.options = options.data();
    args.num_options = options.size();
    auto new_binding = update::ModelBinding::create(model_plugin->model(), family, args, model_plugin);
    auto descs = manifest::tensor_descs(cat);
    const auto& layout = new_binding->target_layout(descs);

    const auto where = store::parse_store_device(config.receiver.device);
    auto new_store = store::make_weight_store(where, config.update.apply_threads);
    cuda_device.store(where.cuda ? where.ordinal : -1);
    std::vector<store::TensorSpec> specs;
    specs.reserve(layout.size());
    for (const auto& p : layout) specs.push_back({p.name, p.dtype, p.shape});
    new_store->place_all(kWeightsTag, to_store_policy(config.memory.weights_policy), specs);
    if (!config.memory.mirror_path.empty() &&
        config.memory.weights_policy == config::ReleasePolicy::backup) {
      new_store->attach_mirror(file_mirror(*new_store, cat, config_json));
    }
    update::UpdateOptions uopts;
    uopts.verify_fingerprints = config.update.verify_fingerprints;
    uopts.trust_writer_fingerprints =
        config.update.direct_verify == config::DirectVerify::writer;
    uopts.threads = config.update.apply_threads;
    uopts.mirror_refresh = mirror_refresh_mode(config.memory.mirror_refresh);
    auto new_engine = std::make_unique<update::UpdateEngine>(*new_store, *new_binding, uopts);

    binding = std::move(new_binding);
    store = std::move(new_store);
    engine = std::move(new_engine);
    keep_catalog(cat);  // for get_weights_by_name and checkpoint_catalog
    has_layout.store(true, std::memory_order_release);
    logger("receiver")->info("model family '{}' ({} layout, tp {}/{}): {} parameters", family,
                             args.layout, args.tp_rank, args.tp_size, layout.size());
  }

  // The model binding of `family` for this rank (session and engine-owned paths).
  std::unique_ptr<update::ModelBinding> make_binding(const std::string& family,
                                                     const std::string& config_json) {
    model_plugin = registry.model(family);
    const auto& opts = config.models[family];
    std::vector<ferry_option_t> options = config::option_array(opts);
    ferry_model_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options);
    args.layout = config::layout_name(config.receiver.layout);
    args.tp_rank = config.receiver.tp_rank;
    args.tp_size = config.receiver.tp_size;
    args.ep_rank = config.receiver.ep_rank;
    args.ep_size = config.receiver.ep_size;
    args.config_json = config_json.empty() ? nullptr : config_json.c_str();
    args.options = options.data();
    args.num_options = options.size();
    return update::ModelBinding::create(model_plugin->model(), family, args, model_plugin);
  }

  void keep_catalog(const manifest::Manifest& cat) {
    auto descs = manifest::tensor_descs(cat);
    std::map<std::string, ferry_tensor_desc_t> new_catalog;
    catalog_names.clear();
    catalog_names.reserve(cat.tensors.size());
    for (const auto& e : cat.tensors) catalog_names.push_back(e.name);
    for (std::size_t i = 0; i < cat.tensors.size(); ++i) {
      ferry_tensor_desc_t d = descs[i];
      d.name = catalog_names[i].c_str();
      new_catalog[catalog_names[i]] = d;
    }
    catalog = std::move(new_catalog);
    accepted_catalog.clear();
  }

  // Engine-owned parameters exist (register_params): the model plugin's layout for `cat` must be
  // exactly the registered parameters (INCOMPATIBLE naming the first difference).
  void create_layout_over_registered(const manifest::Manifest& cat, const std::string& config_json) {
    std::string family = config.receiver.model_family.empty()
                             ? config.receiver.embedded_model_family
                             : config.receiver.model_family;
    auto new_binding = make_binding(family, config_json);
    auto descs = manifest::tensor_descs(cat);
    const auto& layout = new_binding->target_layout(descs);
    for (const auto& p : layout) {
      auto index = store->find(p.name);
      if (!index) {
        fail(FERRY_STATUS_INCOMPATIBLE,
             "layout parameter '{}' (from the model plugin '{}') is not a registered parameter",
             p.name, family);
      }
      const auto info = store->param(*index);
      if (info.dtype != p.dtype || info.shape != p.shape) {
        fail(FERRY_STATUS_INCOMPATIBLE,
             "layout parameter '{}' is {} {} but the registered parameter is {} {}", p.name,
             dtype_name(p.dtype), shape_string(p.shape), dtype_name(info.dtype),
             shape_string(info.shape));
      }
    }
    if (layout.size() != store->param_count()) {
      std::set<std::string> wanted;
      for (const auto& p : layout) wanted.insert(p.name);
      for (std::size_t i = 0; i < store->param_count(); ++i) {
        const auto info = store->param(i);
        if (!wanted.count(info.name)) {
          fail(FERRY_STATUS_INCOMPATIBLE,
               "registered parameter '{}' is not written by any checkpoint tensor (model plugin "
               "'{}')",
               info.name, family);
        }
      }
    }
    update::UpdateOptions uopts;
    uopts.verify_fingerprints = config.update.verify_fingerprints;
    uopts.trust_writer_fingerprints =
        config.update.direct_verify == config::DirectVerify::writer;
    uopts.threads = config.update.apply_threads;
    uopts.mirror_refresh = mirror_refresh_mode(config.memory.mirror_refresh);
    auto new_engine = std::make_unique<update::UpdateEngine>(*store, *new_binding, uopts);
    binding = std::move(new_binding);
    engine = std::move(new_engine);
    keep_catalog(cat);
    has_layout.store(true, std::memory_order_release);
    logger("receiver")->info("model family '{}' over {} engine-owned parameters", family,
                             layout.size());
    if (!config.memory.mirror_path.empty()) {
      logger("receiver")->warn(
          "memory.mirror_path {} is not used: the weights are the engine's own parameters (the "
          "engine loads them itself when it restarts); the host mirror is anonymous memory",
          config.memory.mirror_path);
    }
  }

  // A later checkpoint must describe the same tensors as the first one.
  void check_catalog(const manifest::Manifest& cat) const {
    for (const auto& e : cat.tensors) {
      auto it = catalog.find(e.name);
      if (it == catalog.end()) {
        fail(FERRY_STATUS_INCOMPATIBLE,
             "checkpoint tensor '{}' is not part of the loaded model's layout", e.name);
      }
      const auto& d = it->second;
      std::vector<std::uint64_t> shape(d.shape, d.shape + d.ndim);
      if (d.dtype != e.dtype || shape != e.shape) {
        fail(FERRY_STATUS_INCOMPATIBLE, "checkpoint tensor '{}' is {} {} but the layout expects {} {}",
             e.name, dtype_name(e.dtype), shape_string(e.shape), dtype_name(d.dtype),
             shape_string(shape));
      }
    }
    if (cat.tensors.size() < catalog.size()) {
      std::set<std::string> present;
      for (const auto& e : cat.tensors) present.insert(e.name);
      std::vector<std::string> missing;
      for (const auto& [name, d] : catalog) {
        if (!present.count(name) && missing.size() < 8) missing.push_back(name);
      }
      fail(FERRY_STATUS_INCOMPATIBLE, "checkpoint lacks {} tensor(s) of the layout, e.g. {}",
           catalog.size() - cat.tensors.size(), fmt::join(missing, ", "));
    }
  }

  void require_weights_resident() const {
    if (store && store->released(kWeightsTag)) {
      fail(FERRY_STATUS_FAILED_PRECONDITION,
           "weights are released; call resume_memory_occupation first");
    }
  }
};

namespace {
struct BusyGuard {
  std::atomic<bool>& busy;
  std::atomic<const char*>& activity;
  BusyGuard(std::atomic<bool>& b, std::atomic<const char*>& a, const char* what)
      : busy(b), activity(a) {
    activity.store(what);
    busy.store(true);
  }
  ~BusyGuard() {
    busy.store(false);
    activity.store("");
  }
};
}  // namespace

bool Receiver::State::restore_at_start(const fs::path& model_path) {
  const std::string path = config.memory.mirror_path;
  const std::string instead =
      model_path.empty()
          ? std::string("the receiver waits for the first update (no receiver.model_path)")
          : fmt::format("the receiver loads the initial checkpoint '{}' instead",
                        model_path.string());
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<store::HostMirror> mirror;
  try {
    mirror = store::HostMirror::open_file(path, nullptr, threads());
  } catch (const Error& e) {
    if (e.code() == FERRY_STATUS_NOT_FOUND) {
      logger("receiver")->info("no host mirror at {} yet: {}", path, instead);
      return false;
    }
    // A mirror in use by a running receiver is not replaced: refusing to start says so.
    if (e.code() == FERRY_STATUS_FAILED_PRECONDITION) throw;
    logger("receiver")->warn("{}; {} (the file is replaced)", e.what(), instead);
    return false;
  }
  const auto committed = mirror->committed();
  if (!committed) {
    logger("receiver")->warn("host mirror {} holds no committed version to restore: {}; {}",
                             path, mirror->uncommitted_reason(), instead);
    return false;
  }
  const auto written = mirror->committed_at();
  std::lock_guard lock(update_mutex);
  BusyGuard busy(this->busy, activity, "loading");
  try {
    manifest::Manifest cat;
    std::string config_json;
    fs::path source = model_path;
    if (!model_path.empty()) {
      // Only the checkpoint's headers: the layout, not the initial weights.
      SourceReader reader(registry.transport(config.receiver.transport),
                          config.transports[config.receiver.transport], model_path.string());
      cat = reader.catalog();
      config_json = read_config_json(model_path);
    } else {
      cat = catalog_from_mirror_metadata(mirror->metadata(), "host mirror " + path, config_json);
      source = "the host mirror " + path;
    }
    mirror_to_restore = mirror;
    create_layout(cat, config_json, source);
    mirror_to_restore.reset();
    engine->restore_from_mirror();
  } catch (const Error& e) {
    mirror_to_restore.reset();
    logger("receiver")->warn("host mirror {}: version {} is not restored: {}; {}", path,
                             committed->number, e.what(), instead);
    return false;
  }
  std::uint64_t bytes = 0;
  for (const auto& entry : mirror->entries()) bytes += entry.bytes;
  logger("receiver")->info(
      "restored version {} ('{}') from {}, written at {:%Y-%m-%d %H:%M:%S} UTC: {} parameters, "
      "{:.1f} MiB in {:.3f} s{}",
      committed->number, committed->label, path,
      fmt::gmtime(std::chrono::system_clock::to_time_t(written)), mirror->entries().size(),
      bytes / 1048576.0, seconds_since(start),
      model_path.empty() ? std::string()
                         : fmt::format(" (layout from the headers of '{}', whose weights are "
                                       "not loaded)",
                                       model_path.string()));
  return true;
}

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
      logger("receiver")->warn(
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

UpdateReport Receiver::update_from_disk(const fs::path& path,
                                        const std::optional<std::string>& label) {
  auto& s = *state_;
  const auto start = std::chrono::steady_clock::now();
  // Open and validate the whole checkpoint before touching anything, and before taking the
  // update lock: what a client names may be slow or malformed, and a refusal must not make other
  // updates wait (a FIFO or device is refused without opening it).
  check_checkpoint_path(path, "model_path");
  const std::string& source_name = s.config.receiver.transport;
  auto plugin = s.registry.transport(source_name);
  std::map<std::string, std::string> topts = s.config.transports[source_name];
  // update.read_threads reaches a source that declares a `read_threads` option of its own.
  const auto& declared = plugin->info().option_keys;
  const bool takes_threads =
      declared && std::find(declared->begin(), declared->end(), "read_threads") != declared->end();
  if (s.config.update.read_threads != 0 && takes_threads && !topts.count("read_threads")) {
    topts["read_threads"] = std::to_string(s.config.update.read_threads);
  }
  SourceReader reader(plugin, topts, path.string());
  const auto& cat = reader.catalog();
  // config.json matters to the first load only (the layout never changes afterwards).
  const std::string config_json =
      s.has_layout.load(std::memory_order_acquire) ? std::string() : read_config_json(path);

  std::unique_lock lock(s.update_mutex, std::try_to_lock);
  if (!lock.owns_lock()) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "another update is in progress");
  }
  s.require_weights_resident();
  BusyGuard busy(s.busy, s.activity, s.engine ? "updating" : "loading");
  if (!s.engine) {
    s.create_layout(cat, config_json, path);
  } else {
    s.check_catalog(cat);
  }

  std::uint64_t largest = 0, total = 0;
  for (const auto& e : cat.tensors) {
    largest = std::max(largest, e.size);
    total += e.size;
  }
  std::uint64_t capacity = std::max<std::uint64_t>(
      std::min<std::uint64_t>(s.config.update.bucket_bytes, total + FERRY_BUCKET_ALIGNMENT),
      largest + FERRY_BUCKET_ALIGNMENT);
  capacity = sdk::bucket_align_up(capacity);
  // Two staging buckets: bucket k+1 is read while bucket k is applied. The engine keeps them
  // across updates, page-locked on a CUDA receiver (reads feed the device's H2D copies directly).
  const std::span<std::byte> staging[2] = {s.engine->host_staging(0, capacity),
                                           s.engine->host_staging(1, capacity)};

  const auto previous = s.engine->version();
  const std::uint64_t number = previous.number + 1;
  const std::string version_label = label.value_or(std::to_string(number));
  s.wait_for_engine(number);
  s.engine->begin(number, version_label);
  ProgressMeter progress(load_progress(s.config), [](const std::string& line, ProgressStyle, bool) {
    logger("receiver")->info("{}", line);
  });
  progress.begin(fmt::format("update {} from disk", number), total);

  UpdateReport report;
  try {
    const unsigned read_threads = s.config.update.read_threads;
    struct Read {
      bool more = false;
      std::vector<std::uint8_t> manifest;
      std::uint64_t bytes = 0;
    };
    auto read_into = [&](int slot) {
      Read r;
      r.more = reader.read(staging[slot], read_threads, r.manifest, r.bytes);
      return r;
    };
    int slot = 0;
    Read current = read_into(slot);
    while (current.more) {
      auto next = std::async(std::launch::async, read_into, 1 - slot);
      try {
        const auto decoded = manifest::decode(current.manifest);
        s.engine->apply_bucket(staging[slot].first(decoded.bucket_bytes), current.manifest);
        report.bytes += current.bytes;
        report.tensors += decoded.tensors.size();
        report.buckets += 1;
        progress.update(0, report.bytes);
      } catch (...) {
        next.wait();
        throw;
      }
      current = next.get();
      slot = 1 - slot;
    }
    s.engine->commit();
  } catch (const std::exception& e) {
    s.engine->abort(e.what());
    throw;
  }
  report.version = version();
  report.seconds = seconds_since(start);
  logger("receiver")->info("update {} ('{}') from disk: {} tensors, {:.1f} MiB in {:.3f} s",
                           report.version.number, report.version.label, report.tensors,
                           report.bytes / 1048576.0, report.seconds);
  return report;
}

UpdateReport Receiver::apply_update(const std::vector<Bucket>& buckets, std::uint64_t version_hint,
                                    const std::optional<std::string>& label,
                                    const std::map<std::string, std::uint64_t>& expected) {
  auto& s = *state_;
  std::unique_lock lock(s.update_mutex, std::try_to_lock);
  if (!lock.owns_lock()) fail(FERRY_STATUS_FAILED_PRECONDITION, "another update is in progress");
  if (!s.engine) {
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "no layout yet: load a checkpoint from disk first (the first load defines the layout)");
  }
  s.require_weights_resident();
  const auto start = std::chrono::steady_clock::now();
  BusyGuard busy(s.busy, s.activity, "updating");
  const std::uint64_t number =
      version_hint != 0 ? version_hint : s.engine->version().number + 1;
  s.wait_for_engine(number);
  s.engine->begin(number, label.value_or(std::to_string(number)));
  UpdateReport report;
  try {
    if (!expected.empty()) s.engine->set_expected_fingerprints(expected);
    for (const auto& b : buckets) {
      s.engine->apply_bucket(b.data, b.manifest);
      report.bytes += b.data.size();
      report.buckets += 1;
    }
    s.engine->commit();
  } catch (const std::exception& e) {
    s.engine->abort(e.what());
    throw;
  }
  report.version = version();
  report.seconds = seconds_since(start);
  return report;
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
            case FERRY_DTYPE_I8: row[i] = static_cast<double>(*reinterpret_cast<const std::int8_t*>(p)); break;
            case FERRY_DTYPE_U8: row[i] = static_cast<double>(*reinterpret_cast<const std::uint8_t*>(p)); break;
            case FERRY_DTYPE_BOOL: row[i] = *reinterpret_cast<const std::uint8_t*>(p) ? 1.0 : 0.0; break;
            case FERRY_DTYPE_I16: { std::int16_t v; std::memcpy(&v, p, 2); row[i] = v; break; }
            case FERRY_DTYPE_I32: { std::int32_t v; std::memcpy(&v, p, 4); row[i] = v; break; }
            case FERRY_DTYPE_I64: { std::int64_t v; std::memcpy(&v, p, 8); row[i] = static_cast<double>(v); break; }
            default: fail(FERRY_STATUS_UNIMPLEMENTED, "cannot show values of dtype {}", dtype_name(info.dtype));
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
    return Health{false, what, std::string(what) == "loading" ? "loading the first weights"
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
}

void Receiver::set_release_hook(std::function<void(const std::string& reason)> hook) {
  std::lock_guard lock(state_->release_hook_mutex);
  state_->release_hook = std::move(hook);
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

const config::Config& Receiver::receiver_config() const { return state_->config; }
const registry::Registry& Receiver::plugin_registry() const { return state_->registry; }

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
    metric("ferry_plan_cache_hits_total", "counter", "plans served from the cache", m.plan_cache_hits);
    metric("ferry_fenced", "gauge", "1 while a failed update left partial weights", m.fenced ? 1 : 0);
    metric("ferry_mirror_refresh_seconds", "gauge",
           "seconds the last host mirror refresh took, start to last byte", m.mirror_refresh_seconds);
    metric("ferry_mirror_refresh_waits_total", "counter",
           "calls that waited for a running host mirror refresh", m.mirror_refresh_waits);
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

// ---- session updates ----------------------------------------------------------------------

struct Receiver::StreamingUpdate::Impl {
  State& s;
  std::unique_lock<std::mutex> lock;
  std::optional<BusyGuard> busy;
  bool begun = false;
  bool finished = false;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  UpdateReport report;

  Impl(State& state, std::unique_lock<std::mutex> held) : s(state), lock(std::move(held)) {}
};

Receiver::StreamingUpdate::StreamingUpdate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Receiver::StreamingUpdate::~StreamingUpdate() {
  if (impl_ && impl_->begun && !impl_->finished) {
    try {
      impl_->s.engine->abort("the session ended before commit");
    } catch (...) {
      // abort() does not throw; nothing more can be done in a destructor.
    }
  }
}

std::uint64_t Receiver::StreamingUpdate::layout_signature() const {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  const auto& layout = impl_->s.binding->layout();
  mix(layout.size());
  for (const auto& p : layout) {
    mix(p.name.size());
    for (unsigned char c : p.name) {
      h ^= c;
      h *= 0x100000001b3ull;
    }
    mix(static_cast<std::uint64_t>(p.dtype));
    mix(p.shape.size());
    for (auto d : p.shape) mix(d);
  }
  return h;
}

std::size_t Receiver::StreamingUpdate::num_params() const {
  return impl_->s.binding->layout().size();
}

void Receiver::StreamingUpdate::begin(std::uint64_t version,
                                      const std::optional<std::string>& label) {
  auto& i = *impl_;
  if (i.begun) fail(FERRY_STATUS_FAILED_PRECONDITION, "the session's update has begun already");
  i.s.require_weights_resident();
  i.busy.emplace(i.s.busy, i.s.activity, "updating");
  i.start = std::chrono::steady_clock::now();
  i.s.wait_for_engine(version);
  i.s.engine->begin(version, label.value_or(std::to_string(version)));
  i.begun = true;
}

void Receiver::StreamingUpdate::apply_bucket(std::span<const std::byte> bucket,
                                             std::span<const std::uint8_t> manifest_bytes,
                                             ferry_memory_kind_t bucket_kind) {
  auto& i = *impl_;
  if (!i.begun || i.finished) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "no session update is active");
  }
  try {
    i.s.engine->apply_bucket(bucket, manifest_bytes, bucket_kind);
  } catch (...) {
    i.finished = true;  // the engine ended the update (rolled back or fenced)
    i.busy.reset();
    throw;
  }
  i.report.bytes += bucket.size();
  i.report.buckets += 1;
}

std::vector<std::optional<update::UpdateEngine::DirectDestination>>
Receiver::StreamingUpdate::direct_destinations(std::span<const ferry_tensor_desc_t> tensors) {
  return impl_->s.engine->direct_destinations(tensors);
}

void Receiver::StreamingUpdate::begin_direct_writes(bool writer_fingerprints) {
  auto& i = *impl_;
  if (!i.begun || i.finished) fail(FERRY_STATUS_FAILED_PRECONDITION, "no session update is active");
  i.s.engine->begin_direct_writes(writer_fingerprints);
}

void Receiver::StreamingUpdate::record_direct_bucket(std::span<const std::uint8_t> manifest) {
  record_in_place([&](update::UpdateEngine& engine) { engine.record_direct_bucket(manifest); });
}

void Receiver::StreamingUpdate::record_direct_bucket(const manifest::Manifest& manifest) {
  record_in_place([&](update::UpdateEngine& engine) { engine.record_direct_bucket(manifest); });
}

void Receiver::StreamingUpdate::attach_direct_fingerprints(std::span<const std::uint64_t> prints) {
  auto& i = *impl_;
  if (!i.begun || i.finished) fail(FERRY_STATUS_FAILED_PRECONDITION, "no session update is active");
  try {
    i.s.engine->attach_direct_fingerprints(prints);
  } catch (...) {
    i.finished = true;  // the engine ended the update (rolled back or fenced)
    i.busy.reset();
    throw;
  }
}

void Receiver::StreamingUpdate::record_in_place(
    const std::function<void(update::UpdateEngine&)>& record) {
  auto& i = *impl_;
  if (!i.begun || i.finished) fail(FERRY_STATUS_FAILED_PRECONDITION, "no session update is active");
  try {
    record(*i.s.engine);
    i.report.buckets += 1;
  } catch (...) {
    i.finished = true;  // the engine ended the update (rolled back or fenced)
    i.busy.reset();
    throw;
  }
}

UpdateReport Receiver::StreamingUpdate::commit() {
  auto& i = *impl_;
  if (!i.begun || i.finished) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "no session update is active");
  }
  i.finished = true;
  try {
    i.s.engine->commit();
  } catch (...) {
    i.busy.reset();
    throw;
  }
  i.busy.reset();
  const auto v = i.s.engine->version();
  i.report.version = VersionInfo{v.number, v.label};
  i.report.tensors = i.s.catalog.size();
  i.report.seconds = seconds_since(i.start);
  logger("receiver")->info("update {} ('{}') from a session: {} buckets, {:.1f} MiB in {:.3f} s",
                           v.number, v.label, i.report.buckets, i.report.bytes / 1048576.0,
                           i.report.seconds);
  return i.report;
}

std::uint64_t Receiver::StreamingUpdate::memory_epoch() const { return impl_->s.memory_epoch; }

void Receiver::StreamingUpdate::abort(const std::string& reason) {
  auto& i = *impl_;
  if (i.begun && !i.finished) i.s.engine->abort(reason);
  i.finished = true;
  i.busy.reset();
}

std::unique_ptr<Receiver::StreamingUpdate> Receiver::open_session(
    std::span<const ferry_tensor_desc_t> catalog, const std::string& config_json,
    const std::string* catalog_key) {
  auto& s = *state_;
  std::unique_lock lock(s.update_mutex, std::try_to_lock);
  if (!lock.owns_lock()) fail(FERRY_STATUS_FAILED_PRECONDITION, "another update is in progress");
  if (catalog.empty()) fail(FERRY_STATUS_INVALID_ARGUMENT, "the sender's catalog is empty");
  // The same tensor list as the last session's (the usual case: every push of a training run)
  // was checked then; only a different one is built, validated and checked (~1 us per tensor).
  std::string key = catalog_key != nullptr ? *catalog_key : manifest::catalog_key(catalog);
  if (s.engine && !s.accepted_catalog.empty() && key == s.accepted_catalog) {
    s.require_weights_resident();
    return std::unique_ptr<StreamingUpdate>(
        new StreamingUpdate(std::make_unique<StreamingUpdate::Impl>(s, std::move(lock))));
  }
  manifest::Manifest cat;
  cat.tensors.reserve(catalog.size());
  for (const auto& d : catalog) {
    manifest::Entry e;
    e.name = d.name != nullptr ? d.name : "";
    e.dtype = d.dtype;
    if (d.ndim > FERRY_MAX_DIMS) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "catalog tensor '{}' has {} dims (at most {})", e.name,
           d.ndim, FERRY_MAX_DIMS);
    }
    e.shape.assign(d.shape, d.shape + d.ndim);
    e.size = byte_size(d.dtype, e.shape).value_or(0);
    cat.tensors.push_back(std::move(e));
  }
  manifest::validate(cat);
  if (!s.engine) {
    BusyGuard busy(s.busy, s.activity, "loading");
    s.create_layout(cat, config_json, fs::path("the session's catalog"));
  } else {
    s.check_catalog(cat);
  }
  s.accepted_catalog = std::move(key);
  s.require_weights_resident();
  return std::unique_ptr<StreamingUpdate>(
      new StreamingUpdate(std::make_unique<StreamingUpdate::Impl>(s, std::move(lock))));
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
    logger("receiver")->info(
        "{} engine-owned parameters registered; the layout waits for the first session ({})",
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

int Receiver::weights_cuda_device() const { return state_->cuda_device.load(); }

}  // namespace ferry::receiver
