// receiver/receiver_layout.cpp: the receiver's layout: the model family (named by the config or
// detected from config.json), its binding, the weight store and the update engine made from the
// first checkpoint's catalog or over engine-owned parameters, later catalogs checked against it,
// and the start from a file-backed host mirror (receiver_state.hpp).
#include "receiver/receiver_state.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/log.hpp"
#include "receiver/client_input.hpp"
#include "receiver/source_reader.hpp"
#include "store/host_mirror.hpp"
#include "store/store_device.hpp"

namespace ferry::receiver {

namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kMaxConfigJsonBytes = 16ull << 20;

update::MirrorRefreshMode mirror_refresh_mode(config::MirrorRefresh refresh) {
  switch (refresh) {
    case config::MirrorRefresh::background: return update::MirrorRefreshMode::background;
    case config::MirrorRefresh::complete: return update::MirrorRefreshMode::complete;
    case config::MirrorRefresh::commit: return update::MirrorRefreshMode::commit;
  }
  return update::MirrorRefreshMode::background;
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

// Reads config.json beside `checkpoint` (receiver_state.hpp).
std::string read_config_json(const fs::path& checkpoint) {
  fs::path dir = fs::is_directory(checkpoint) ? checkpoint : checkpoint.parent_path();
  return read_optional_text_file(dir / "config.json", kMaxConfigJsonBytes);
}

std::shared_ptr<store::HostMirror> Receiver::State::file_mirror(const store::WeightStore& new_store,
                                                              const manifest::Manifest& cat,
                                                              const std::string& config_json) {
  if (mirror_to_restore) return std::exchange(mirror_to_restore, nullptr);
  return store::HostMirror::create_file(config.memory.mirror_path, new_store.mirror_layout(),
                                        config.update.apply_threads,
                                        mirror_metadata(cat, config_json));
}

void Receiver::State::create_layout(const manifest::Manifest& cat, const std::string& config_json,
                                    const fs::path& checkpoint) {
  if (store) {
    create_layout_over_registered(cat, config_json);
    return;
  }
  std::string family = config.receiver.model_family;
  if (family.empty()) {
    family = detect_family(config_json, checkpoint, config.receiver.model_family_hints);
  }
  auto new_binding = make_binding(family, config_json);
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
  auto new_engine = std::make_unique<update::UpdateEngine>(*new_store, *new_binding, engine_options());

  binding = std::move(new_binding);
  store = std::move(new_store);
  engine = std::move(new_engine);
  keep_catalog(cat);  // for get_weights_by_name and checkpoint_catalog
  has_layout.store(true, std::memory_order_release);
  logger("receiver")->info("model family '{}' ({} layout, tp {}/{}): {} parameters", family,
                           config::layout_name(config.receiver.layout), config.receiver.tp_rank,
                           config.receiver.tp_size, layout.size());
}

std::unique_ptr<update::ModelBinding> Receiver::State::make_binding(
    const std::string& family, const std::string& config_json) {
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

update::UpdateOptions Receiver::State::engine_options() const {
  update::UpdateOptions uopts;
  uopts.verify_fingerprints = config.update.verify_fingerprints;
  uopts.trust_writer_fingerprints = config.update.direct_verify == config::DirectVerify::writer;
  uopts.threads = config.update.apply_threads;
  uopts.mirror_refresh = mirror_refresh_mode(config.memory.mirror_refresh);
  return uopts;
}

void Receiver::State::keep_catalog(const manifest::Manifest& cat) {
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

void Receiver::State::create_layout_over_registered(const manifest::Manifest& cat,
                                                     const std::string& config_json) {
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
  auto new_engine = std::make_unique<update::UpdateEngine>(*store, *new_binding, engine_options());
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

void Receiver::State::check_catalog(const manifest::Manifest& cat) const {
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

}  // namespace ferry::receiver
