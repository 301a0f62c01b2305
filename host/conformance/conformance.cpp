// conformance/conformance.cpp: runs the FERRY-ABI-n requirements against one plugin file.
#include "conformance/conformance.hpp"

#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <elf.h>

#include <cstring>
#include <optional>

#include "conformance/elf_symbols.hpp"
#include "conformance/p2p.hpp"
#include "conformance/tracking_host.hpp"
#include "registry/loader.hpp"
#include "registry/plugin_file.hpp"

namespace ferry::conformance {
namespace {

using registry::PluginFileName;

constexpr const char* kUnknownOption = "ferry.conformance.unknown";
constexpr unsigned char kCanary = 0xA5;

// Why an error a plugin returned is not the expected one, or nullopt when it is.
// `must_mention` empty: any non-empty message.
std::optional<std::string> wrong_error(ferry_error_t* error, ferry_status_code_t expected,
                                       const std::string& must_mention) {
  if (error == nullptr) return std::string("returned success");
  const ErrorSeen seen = take_error(error);
  if (!seen.made_by_host) {
    return std::string("returned an error object not made with the host's error_new");
  }
  if (seen.code != expected) {
    return fmt::format("returned {} instead of {}: {}", status_name(seen.code),
                       status_name(expected), seen.message);
  }
  if (seen.message.empty()) return std::string("returned an error with an empty message");
  if (!must_mention.empty() && seen.message.find(must_mention) == std::string::npos) {
    return fmt::format("error message '{}' does not name '{}'", seen.message, must_mention);
  }
  return std::nullopt;
}

bool all_canary(const unsigned char* bytes, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    if (bytes[i] != kCanary) return false;
  }
  return true;
}

template <typename F>
bool present(F* f) {
  return f != nullptr;
}

class Suite {
 public:
  explicit Suite(std::filesystem::path plugin) {
    report_.plugin = std::move(plugin);
    for (const auto& r : requirements()) {
      report_.results.push_back({r.id, r.text, Outcome::kSkipped, "not checked"});
    }
  }

  Report run() {
    check_symbols();
    std::string why;
    const std::string filename = report_.plugin.filename().string();
    declared_ = registry::parse_plugin_file_name(filename, &name_problem_);

    auto opened = registry::open_library(report_.plugin, &why);
    if (!opened) {
      fail("FERRY-ABI-1", why);
      skip_rest("FERRY-ABI-1");
      return report_;
    }
    library_ = opened->library;
    entry_ = opened->entry;
    pass("FERRY-ABI-1", "exports " FERRY_PLUGIN_ENTRY_SYMBOL);

    const bool answered = check_negotiation();
    check_other_major();
    check_short_negotiation();
    if (!answered) {
      skip_rest("FERRY-ABI-2");
      return report_;
    }
    check_identity();
    if (!check_tables()) {
      skip_rest("FERRY-ABI-5");
      return report_;
    }
    if (kind_ == FERRY_PLUGIN_TRANSPORT) {
      check_transport_errors();
      check_transport_caps();
      check_transport_sets();
      check_transport_lifecycle();
      check_point_to_point();
    } else {
      check_model_errors();
      set("FERRY-ABI-7", Outcome::kNotApplicable, "model plugins have no capabilities");
      pass("FERRY-ABI-8", tables_.model.locate ? "optional locate is implemented"
                                               : "optional locate is NULL (not implemented)");
      check_model_lifecycle();
      for (const char* id : kPointToPointIds) {
        set(id, Outcome::kNotApplicable, "model plugins move no bytes");
      }
    }
    return report_;
  }

 private:
  void set(const std::string& id, Outcome outcome, std::string detail) {
    for (auto& result : report_.results) {
      if (result.id == id) {
        result.outcome = outcome;
        result.detail = std::move(detail);
      }
    }
  }
  void pass(const std::string& id, std::string detail) {
    set(id, Outcome::kPass, std::move(detail));
  }
  void fail(const std::string& id, std::string detail) {
    set(id, Outcome::kFail, std::move(detail));
  }
  // Marks every requirement still unchecked as skipped because of `because`.
  void skip_rest(const std::string& because) {
    for (auto& result : report_.results) {
      if (result.outcome == Outcome::kSkipped && result.detail == "not checked") {
        result.detail = "not checked: needs " + because;
      }
    }
  }

  // FERRY-ABI-9, from the file alone.
  void check_symbols() {
    std::vector<DynamicSymbol> symbols;
    try {
      symbols = read_dynamic_symbols(report_.plugin);
    } catch (const Error& e) {
      fail("FERRY-ABI-9", e.what());
      return;
    }
    static const char* const kTolerated[] = {"_init", "_fini", "__bss_start", "_edata", "_end"};
    std::vector<std::string> extra;
    bool entry_found = false;
    for (const auto& symbol : symbols) {
      if (!symbol.exported() || symbol.section == SHN_ABS) continue;
      if (symbol.name == FERRY_PLUGIN_ENTRY_SYMBOL) {
        entry_found = entry_found || symbol.type == STT_FUNC;
        continue;
      }
      bool tolerated = false;
      for (const char* name : kTolerated) tolerated = tolerated || symbol.name == name;
      if (!tolerated) extra.push_back(symbol.name);
    }
    if (!extra.empty()) {
      std::string list;
      for (std::size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
      if (extra.size() > 8) list += fmt::format(", ... ({} more)", extra.size() - 8);
      fail("FERRY-ABI-9", fmt::format("exports {} symbol(s) besides " FERRY_PLUGIN_ENTRY_SYMBOL
                                      ": {} (link with -Wl,--version-script=ferry_plugin.map)",
                                      extra.size(), list));
    } else if (!entry_found) {
      fail("FERRY-ABI-9",
           "the dynamic symbol table defines no function " FERRY_PLUGIN_ENTRY_SYMBOL);
    } else {
      pass("FERRY-ABI-9", "only " FERRY_PLUGIN_ENTRY_SYMBOL " is exported");
    }
  }

  // FERRY-ABI-2. Keeps the answer in answer_.
  bool check_negotiation() {
    answer_ = registry::host_negotiation(tracking_host_api());
    if (ferry_error_t* error = entry_(&answer_)) {
      const ErrorSeen seen = take_error(error);
      fail("FERRY-ABI-2",
           seen.made_by_host
               ? fmt::format("refused a host of ABI {}.{}: {}", FERRY_PLUGIN_ABI_MAJOR,
                             FERRY_PLUGIN_ABI_MINOR, seen.message)
               : std::string("refused the host with an error object not made "
                             "through the host's error_new"));
      return false;
    }
    if (auto reason = registry::check_abi_version(answer_)) {
      fail("FERRY-ABI-2", *reason);
      return false;
    }
    const int kind = static_cast<int>(answer_.kind);
    if (kind != FERRY_PLUGIN_TRANSPORT && kind != FERRY_PLUGIN_MODEL) {
      fail("FERRY-ABI-2", fmt::format("reports unknown kind {}", kind));
      return false;
    }
    for (auto [field, value] : {std::pair{"name", static_cast<const void*>(answer_.name)},
                                std::pair{"version", static_cast<const void*>(answer_.version)},
                                std::pair{"api", answer_.api}}) {
      if (value == nullptr) {
        fail("FERRY-ABI-2", fmt::format("left the answer field '{}' NULL", field));
        return false;
      }
    }
    pass("FERRY-ABI-2",
         fmt::format("answers ABI {}.{}", answer_.plugin_abi_major, answer_.plugin_abi_minor));
    return true;
  }

  // FERRY-ABI-3.
  void check_other_major() {
    ferry_plugin_negotiation_t other = registry::host_negotiation(tracking_host_api());
    other.host_abi_major = FERRY_PLUGIN_ABI_MAJOR + 1;
    ferry_error_t* error = entry_(&other);
    if (error == nullptr) {
      fail("FERRY-ABI-3", fmt::format("accepted a host of ABI {}.0", FERRY_PLUGIN_ABI_MAJOR + 1));
      return;
    }
    if (auto wrong = wrong_error(error, FERRY_STATUS_INCOMPATIBLE, "")) {
      fail("FERRY-ABI-3", "given a host of another major, " + *wrong);
      return;
    }
    pass("FERRY-ABI-3", fmt::format("refuses a host of ABI {}.0", FERRY_PLUGIN_ABI_MAJOR + 1));
  }

  // FERRY-ABI-10. Ends with a fresh negotiation so the plugin's state is the accepted one.
  void check_short_negotiation() {
    ferry_plugin_negotiation_t shortened;
    auto* bytes = reinterpret_cast<unsigned char*>(&shortened);
    std::memset(bytes, kCanary, sizeof shortened);
    const std::size_t size = FERRY_STRUCT_SIZE(ferry_plugin_negotiation_t, host);
    shortened.struct_size = size;
    shortened.host_abi_major = FERRY_PLUGIN_ABI_MAJOR;
    shortened.host_abi_minor = FERRY_PLUGIN_ABI_MINOR;
    shortened.host = tracking_host_api();
    ferry_error_t* error = entry_(&shortened);
    const bool untouched = all_canary(bytes, size, sizeof shortened);
    std::optional<std::string> wrong;
    if (error == nullptr) {
      wrong = "accepted a negotiation struct too short to hold its answer";
    } else {
      const ErrorSeen seen = take_error(error);
      if (!seen.made_by_host) wrong = "refused with an error object not made with error_new";
    }
    if (!untouched) {
      fail("FERRY-ABI-10", fmt::format("wrote past struct_size ({} bytes) of the negotiation "
                                       "struct",
                                       size));
      return;
    }
    if (wrong) {
      fail("FERRY-ABI-10", *wrong);
      return;
    }
    ferry_plugin_negotiation_t again = registry::host_negotiation(tracking_host_api());
    if (ferry_error_t* refused = entry_(&again)) {
      take_error(refused);
      fail("FERRY-ABI-10", "refused a second negotiation with the same host");
      return;
    }
    if (again.plugin_abi_major != answer_.plugin_abi_major ||
        again.plugin_abi_minor != answer_.plugin_abi_minor || again.kind != answer_.kind ||
        again.name != answer_.name || again.api != answer_.api) {
      fail("FERRY-ABI-10", "negotiating again gave a different answer");
      return;
    }
    pass("FERRY-ABI-10",
         fmt::format("refuses a {}-byte negotiation struct without writing past it", size));
  }

  // FERRY-ABI-4.
  void check_identity() {
    if (!declared_) {
      fail("FERRY-ABI-4", name_problem_);
      return;
    }
    std::string name, version;
    if (auto reason = registry::check_identity(answer_, *declared_, &name, &version)) {
      fail("FERRY-ABI-4", *reason);
      return;
    }
    pass("FERRY-ABI-4", fmt::format("{} plugin '{}' version '{}'",
                                    registry::kind_name(declared_->kind), name, version));
  }

  // FERRY-ABI-5. Copies the table into tables_.
  bool check_tables() {
    // The table is what the plugin says it is (checked to be a known kind in FERRY-ABI-2), even
    // when its file name claims another kind: calling a transport table as a model would crash.
    kind_ = answer_.kind;
    if (auto reason = registry::copy_tables(answer_, kind_, &tables_)) {
      fail("FERRY-ABI-5", *reason);
      return false;
    }
    pass("FERRY-ABI-5", fmt::format("{} table of {} bytes", registry::kind_name(kind_),
                                    tables_.plugin_struct_size));
    return true;
  }

  // FERRY-ABI-6 for transports.
  void check_transport_errors() {
    const ferry_option_t option{kUnknownOption, "1"};
    ferry_transport_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
    args.role = FERRY_ROLE_RECEIVER;
    args.options = &option;
    args.num_options = 1;
    args.device = -1;
    ferry_transport_t* instance = nullptr;
    ferry_error_t* error = tables_.transport.create(&args, &instance);
    if (error == nullptr && instance != nullptr) tables_.transport.destroy(instance);
    if (auto wrong = wrong_error(error, FERRY_STATUS_INVALID_ARGUMENT, kUnknownOption)) {
      fail("FERRY-ABI-6",
           fmt::format("create with unknown option '{}' {}", kUnknownOption, *wrong));
      return;
    }
    pass("FERRY-ABI-6", "create rejects an unknown option with INVALID_ARGUMENT naming it");
  }

  // FERRY-ABI-6 for models.
  void check_model_errors() {
    const ferry_option_t option{kUnknownOption, "1"};
    ferry_model_create_args_t args = default_model_args();
    args.options = &option;
    args.num_options = 1;
    ferry_model_t* instance = nullptr;
    ferry_error_t* error = tables_.model.create(&args, &instance);
    if (error == nullptr && instance != nullptr) tables_.model.destroy(instance);
    if (auto wrong = wrong_error(error, FERRY_STATUS_INVALID_ARGUMENT, kUnknownOption)) {
      fail("FERRY-ABI-6",
           fmt::format("create with unknown option '{}' {}", kUnknownOption, *wrong));
      return;
    }
    args = default_model_args();
    args.tp_size = 0;
    instance = nullptr;
    error = tables_.model.create(&args, &instance);
    if (error == nullptr && instance != nullptr) tables_.model.destroy(instance);
    if (auto wrong = wrong_error(error, FERRY_STATUS_INVALID_ARGUMENT, "")) {
      fail("FERRY-ABI-6", "create with tp_size = 0 " + *wrong);
      return;
    }
    pass("FERRY-ABI-6", "create rejects an unknown option and tp_size = 0 with INVALID_ARGUMENT");
  }

  static ferry_model_create_args_t default_model_args() {
    ferry_model_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options);
    args.layout = "hf";
    args.tp_rank = 0;
    args.tp_size = 1;
    args.ep_rank = 0;
    args.ep_size = 1;
    args.config_json = nullptr;
    return args;
  }

  // FERRY-ABI-7.
  void check_transport_caps() {
    const auto& api = tables_.transport;
    struct {
      ferry_transport_caps_t caps;
      unsigned char tail[32];
    } guarded;
    auto* bytes = reinterpret_cast<unsigned char*>(&guarded);
    std::memset(bytes, kCanary, sizeof guarded);
    const std::size_t short_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, memory_kinds);
    guarded.caps.struct_size = short_size;
    if (ferry_error_t* error = api.get_caps(&guarded.caps)) {
      const ErrorSeen seen = take_error(error);
      fail("FERRY-ABI-7", "get_caps failed: " + seen.message);
      return;
    }
    if (!all_canary(bytes, short_size, sizeof guarded)) {
      fail("FERRY-ABI-7",
           fmt::format("get_caps wrote past caps->struct_size ({} bytes)", short_size));
      return;
    }
    ferry_transport_caps_t caps{};
    caps.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
    if (ferry_error_t* error = api.get_caps(&caps)) {
      const ErrorSeen seen = take_error(error);
      fail("FERRY-ABI-7", "get_caps failed: " + seen.message);
      return;
    }
    const std::uint32_t known_flags = (1u << 11) - 1;  // through PUT_CHUNK_HASHES (ABI 1.8)
    const std::uint32_t known_kinds = FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED | FERRY_MEMORY_CUDA;
    std::vector<std::string> problems;
    if ((caps.flags & ~known_flags) != 0) {
      problems.push_back(fmt::format("unknown flag bits {:#x}", caps.flags & ~known_flags));
    }
    if ((caps.memory_kinds & ~known_kinds) != 0) {
      problems.push_back(
          fmt::format("unknown memory kind bits {:#x}", caps.memory_kinds & ~known_kinds));
    }
    if ((caps.memory_kinds & known_kinds) == 0) problems.push_back("declares no memory kind");
    const std::uint32_t topology = FERRY_TRANSPORT_CAP_POINT_TO_POINT |
                                   FERRY_TRANSPORT_CAP_BROADCAST | FERRY_TRANSPORT_CAP_SOURCE;
    if ((caps.flags & topology) == 0) {
      problems.push_back("declares no topology (POINT_TO_POINT, BROADCAST or SOURCE)");
    }
    if ((caps.flags & FERRY_TRANSPORT_CAP_GROUP_RENDEZVOUS) != 0 &&
        (caps.flags & FERRY_TRANSPORT_CAP_BROADCAST) == 0) {
      problems.push_back("GROUP_RENDEZVOUS without BROADCAST (it says how a group meets)");
    }
    auto need = [&](std::uint32_t flag, const char* flag_name,
                    std::initializer_list<std::pair<const char*, bool>> functions) {
      if ((caps.flags & flag) == 0) return;
      for (const auto& [function, has] : functions) {
        if (!has)
          problems.push_back(fmt::format("{} needs {}, which is NULL", flag_name, function));
      }
    };
    need(FERRY_TRANSPORT_CAP_DIRECT_WRITE, "DIRECT_WRITE",
         {{"register_memory", present(api.register_memory)},
          {"pack_key", present(api.pack_key)},
          {"put", present(api.put)},
          {"flush", present(api.flush)}});
    if ((caps.flags & FERRY_TRANSPORT_CAP_PUT_FINGERPRINT) != 0 &&
        (caps.flags & FERRY_TRANSPORT_CAP_DIRECT_WRITE) == 0) {
      problems.push_back("PUT_FINGERPRINT needs DIRECT_WRITE");
    }
    if ((caps.flags & FERRY_TRANSPORT_CAP_PUT_DEFERRED) != 0 &&
        (caps.flags & FERRY_TRANSPORT_CAP_DIRECT_WRITE) == 0) {
      problems.push_back("PUT_DEFERRED needs DIRECT_WRITE");
    }
    if ((caps.flags & FERRY_TRANSPORT_CAP_PUT_CHUNK_HASHES) != 0 &&
        (caps.flags & FERRY_TRANSPORT_CAP_PUT_FINGERPRINT) == 0) {
      problems.push_back("PUT_CHUNK_HASHES needs PUT_FINGERPRINT");
    }
    if (present(api.put_many) && (caps.flags & FERRY_TRANSPORT_CAP_PUT_DEFERRED) == 0) {
      problems.push_back("put_many needs PUT_DEFERRED");
    }
    need(FERRY_TRANSPORT_CAP_ASYNC, "ASYNC",
         {{"request_test", present(api.request_test)},
          {"request_wait", present(api.request_wait)},
          {"request_free", present(api.request_free)}});
    need(FERRY_TRANSPORT_CAP_SOURCE, "SOURCE",
         {{"source_open", present(api.source_open)},
          {"source_catalog", present(api.source_catalog)},
          {"source_read", present(api.source_read)},
          {"source_close", present(api.source_close)}});
    const bool moves = present(api.send_bucket) || present(api.recv_bucket);
    for (auto [flag, flag_name] : {std::pair{FERRY_TRANSPORT_CAP_POINT_TO_POINT, "POINT_TO_POINT"},
                                   std::pair{FERRY_TRANSPORT_CAP_BROADCAST, "BROADCAST"}}) {
      need(flag, flag_name,
           {{"get_address", present(api.get_address)},
            {"connect", present(api.connect)},
            {"disconnect", present(api.disconnect)},
            {"send_bucket or recv_bucket", moves}});
    }
    if (!problems.empty()) {
      std::string text;
      for (const auto& p : problems) text += (text.empty() ? "" : "; ") + p;
      fail("FERRY-ABI-7", text);
      return;
    }
    pass("FERRY-ABI-7",
         fmt::format("flags {:#x}, memory kinds {:#x}", caps.flags, caps.memory_kinds));
  }

  // FERRY-ABI-8.
  void check_transport_sets() {
    const auto& api = tables_.transport;
    std::vector<std::string> problems;
    auto needs = [&](bool has, const char* function, bool has_other, const char* other) {
      if (has && !has_other) problems.push_back(fmt::format("{} without {}", function, other));
    };
    needs(present(api.connect), "connect", present(api.disconnect), "disconnect");
    needs(present(api.connect), "connect", present(api.get_address), "get_address");
    needs(present(api.register_memory), "register_memory", present(api.deregister_memory),
          "deregister_memory");
    needs(present(api.pack_key), "pack_key", present(api.register_memory), "register_memory");
    for (auto [has, name] :
         {std::pair{present(api.send_bucket), "send_bucket"},
          std::pair{present(api.recv_bucket), "recv_bucket"}, std::pair{present(api.put), "put"},
          std::pair{present(api.flush), "flush"}}) {
      needs(has, name, present(api.connect), "connect");
    }
    needs(present(api.put_many), "put_many", present(api.put), "put");
    needs(present(api.prepare_puts), "prepare_puts", present(api.put), "put");
    needs(present(api.map_peer_memory), "map_peer_memory", present(api.pack_key), "pack_key");
    needs(present(api.alloc_memory), "alloc_memory", present(api.deregister_memory),
          "deregister_memory");
    needs(present(api.request_test), "request_test", present(api.request_free), "request_free");
    needs(present(api.request_wait), "request_wait", present(api.request_free), "request_free");
    needs(present(api.source_open), "source_open", present(api.source_close), "source_close");
    for (auto [has, name] : {std::pair{present(api.source_catalog), "source_catalog"},
                             std::pair{present(api.source_read), "source_read"}}) {
      needs(has, name, present(api.source_open), "source_open");
    }
    if (!problems.empty()) {
      std::string text;
      for (const auto& p : problems) text += (text.empty() ? "" : "; ") + p;
      fail("FERRY-ABI-8", text);
      return;
    }
    pass("FERRY-ABI-8", "optional functions come in complete sets");
  }

  // FERRY-ABI-12 to 14: a point-to-point transport's data path, each in a forked child.
  void check_point_to_point() {
    ferry_transport_caps_t caps{};
    caps.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
    ferry_error_t* error = tables_.transport.get_caps(&caps);
    if (error != nullptr) take_error(error);
    const auto& api = tables_.transport;
    const bool p2p = error == nullptr && (caps.flags & FERRY_TRANSPORT_CAP_POINT_TO_POINT) != 0;
    // A device transport (one node, CUDA memory: cuda_ipc) shares device memory only; the host
    // gives its receivers device slots, so a host-memory pair says nothing about it.
    const bool device_transport = (caps.flags & FERRY_TRANSPORT_CAP_SAME_NODE_ONLY) != 0 &&
                                  (caps.memory_kinds & FERRY_MEMORY_CUDA) != 0;
    const bool host_memory =
        !device_transport && (caps.memory_kinds & (FERRY_MEMORY_HOST | FERRY_MEMORY_PINNED)) != 0;
    const bool wired = api.get_address != nullptr && api.connect != nullptr &&
                       api.disconnect != nullptr && api.register_memory != nullptr &&
                       api.deregister_memory != nullptr;
    std::string why_not;
    if (!p2p) {
      why_not = "not a point-to-point transport";
    } else if (!host_memory) {
      why_not = "shares device memory only (its receivers' ranges are CUDA memory; checked on a "
                "GPU by the plugin's own tests)";
    } else if (!wired) {
      why_not = "needs get_address, connect, disconnect, register_memory and deregister_memory "
                "(FERRY-ABI-7 and 8)";
    }
    if (!why_not.empty()) {
      for (const char* id : kPointToPointIds) {
        const bool applies = p2p && host_memory;  // but cannot be checked
        set(id, applies ? Outcome::kSkipped : Outcome::kNotApplicable,
            applies ? "not checked: " + why_not : why_not);
      }
      return;
    }
    for (auto& r : run_point_to_point(api, caps)) set(r.id, r.outcome, std::move(r.detail));
  }

  // FERRY-ABI-11 for transports.
  void check_transport_lifecycle() {
    ferry_transport_create_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
    args.role = FERRY_ROLE_RECEIVER;
    args.device = -1;
    ferry_transport_t* instance = nullptr;
    // Call first: the order in which function arguments are evaluated is unspecified.
    ferry_error_t* created = tables_.transport.create(&args, &instance);
    finish_lifecycle(created, instance != nullptr, [&] { tables_.transport.destroy(instance); });
  }

  // FERRY-ABI-11 for models.
  void check_model_lifecycle() {
    const ferry_model_create_args_t args = default_model_args();
    ferry_model_t* instance = nullptr;
    ferry_error_t* created = tables_.model.create(&args, &instance);
    finish_lifecycle(created, instance != nullptr, [&] { tables_.model.destroy(instance); });
  }

  template <typename Destroy>
  void finish_lifecycle(ferry_error_t* error, bool made, Destroy destroy) {
    if (error == nullptr) {
      if (!made) {
        fail("FERRY-ABI-11", "create returned success but no instance");
        return;
      }
      destroy();
      pass("FERRY-ABI-11", "create with default arguments succeeded; destroyed");
      return;
    }
    const ErrorSeen seen = take_error(error);
    if (!seen.made_by_host) {
      fail("FERRY-ABI-11", "create failed with an error object not made with error_new");
    } else if (seen.code == FERRY_STATUS_OK || seen.message.empty()) {
      fail("FERRY-ABI-11", "create failed with an error without a code or message");
    } else {
      pass("FERRY-ABI-11", fmt::format("create with default arguments failed cleanly ({}: {})",
                                       status_name(seen.code), seen.message));
    }
  }

  Report report_;
  std::optional<PluginFileName> declared_;
  std::string name_problem_;
  registry::LibraryPtr library_;
  ferry_plugin_negotiate_fn entry_ = nullptr;
  ferry_plugin_negotiation_t answer_{};
  ferry_plugin_kind_t kind_ = FERRY_PLUGIN_TRANSPORT;
  registry::Tables tables_;
};

}  // namespace

bool Report::passed() const {
  for (const auto& result : results) {
    if (result.outcome == Outcome::kFail || result.outcome == Outcome::kSkipped) return false;
  }
  return true;
}

const Result& Report::result(const std::string& id) const {
  for (const auto& result : results) {
    if (result.id == id) return result;
  }
  fail(FERRY_STATUS_NOT_FOUND, "no conformance requirement '{}'", id);
}

Report run(const std::filesystem::path& plugin) {
  return Suite(plugin).run();
}

}  // namespace ferry::conformance
