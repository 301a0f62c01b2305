// torch_gloo/torch_gloo_transport.cpp: the torch_gloo transport's instances, groups,
// registrations and requests (see torch_gloo_transport.hpp), and the loading of its libtorch
// backend (gloo_backend.hpp).
#include "torch_gloo/torch_gloo_transport.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

using ferry::fail;
namespace tg = ferry::torch_gloo;

namespace {

constexpr auto kWaitSlice = std::chrono::milliseconds(50);

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The libraries an ELF shared object names as needed (DT_NEEDED), read from its file; empty when
// the file is not a 64-bit little-endian ELF object the reader understands.
std::vector<std::string> needed_libraries(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  auto at = [&](std::uint64_t offset, std::uint64_t size) {
    return offset <= bytes.size() && size <= bytes.size() - offset;
  };
  Elf64_Ehdr header{};
  if (!at(0, sizeof header)) return {};
  std::memcpy(&header, bytes.data(), sizeof header);
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64 ||
      header.e_ident[EI_DATA] != ELFDATA2LSB || header.e_phentsize != sizeof(Elf64_Phdr)) {
    return {};
  }
  std::vector<Elf64_Phdr> segments(header.e_phnum);
  if (!at(header.e_phoff, segments.size() * sizeof(Elf64_Phdr))) return {};
  std::memcpy(segments.data(), bytes.data() + header.e_phoff, segments.size() * sizeof(Elf64_Phdr));
  // The dynamic section's addresses are virtual: a loaded segment says where they lie in the file.
  auto file_offset = [&](std::uint64_t address) -> std::optional<std::uint64_t> {
    for (const auto& p : segments) {
      if (p.p_type == PT_LOAD && address >= p.p_vaddr && address - p.p_vaddr < p.p_filesz) {
        return p.p_offset + (address - p.p_vaddr);
      }
    }
    return std::nullopt;
  };
  for (const auto& p : segments) {
    if (p.p_type != PT_DYNAMIC || !at(p.p_offset, p.p_filesz)) continue;
    std::vector<Elf64_Dyn> entries(p.p_filesz / sizeof(Elf64_Dyn));
    std::memcpy(entries.data(), bytes.data() + p.p_offset, entries.size() * sizeof(Elf64_Dyn));
    std::optional<std::uint64_t> strings;
    for (const auto& d : entries) {
      if (d.d_tag == DT_STRTAB) strings = file_offset(d.d_un.d_ptr);
    }
    if (!strings) return {};
    std::vector<std::string> out;
    for (const auto& d : entries) {
      if (d.d_tag == DT_NULL) break;
      if (d.d_tag != DT_NEEDED || !at(*strings + d.d_un.d_val, 1)) continue;
      const char* name = bytes.data() + *strings + d.d_un.d_val;
      out.emplace_back(name, strnlen(name, bytes.size() - (*strings + d.d_un.d_val)));
    }
    return out;
  }
  return {};
}

// The libtorch_cpu libraries this process has loaded (their paths).
std::vector<std::string> loaded_libtorch() {
  std::vector<std::string> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        if (info->dlpi_name != nullptr) {
          const std::string name = std::filesystem::path(info->dlpi_name).filename().string();
          if (name.rfind("libtorch_cpu.so", 0) == 0) {
            static_cast<std::vector<std::string>*>(data)->emplace_back(info->dlpi_name);
          }
        }
        return 0;
      },
      &out);
  return out;
}

// The backend library beside this plugin, loaded once and never unloaded (libtorch does not
// survive being unloaded, and objects it made may outlive any one transport).
tg::JoinFn backend_join() {
  static std::mutex mutex;
  static tg::JoinFn join = nullptr;
  std::lock_guard lock(mutex);
  if (join != nullptr) return join;
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&backend_join), &self) == 0 || self.dli_fname == nullptr) {
    fail(FERRY_STATUS_INTERNAL, "torch_gloo: cannot find the plugin's own file (dladdr)");
  }
  const auto path = std::filesystem::path(self.dli_fname).parent_path() / tg::kBackendFile;
  // A second libtorch in one process aborts it while loading (its dispatcher registrations clash
  // with the first's: std::system_error, terminate). Where the process already runs a torch
  // (an engine embedding the receiver) whose library is not the one the backend was built
  // against, the backend is not loaded.
  const auto needed = needed_libraries(path);
  std::string wanted;
  for (const auto& n : needed) {
    if (n.rfind("libtorch_cpu.so", 0) == 0) wanted = n;
  }
  if (!wanted.empty()) {
    for (const auto& loaded : loaded_libtorch()) {
      if (std::filesystem::path(loaded).filename() != wanted) {
        fail(FERRY_STATUS_FAILED_PRECONDITION,
             "torch_gloo: this process runs the torch of {}, but the backend {} was built "
             "against {}: loading a second libtorch would abort the process. Build ferry's "
             "torch_gloo backend against the torch this process uses (meson's libtorch "
             "feature; scripts/bundle --torch-backend)",
             loaded, path.string(), wanted);
      }
    }
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    fail(FERRY_STATUS_FAILED_PRECONDITION,
         "torch_gloo: cannot load its libtorch backend {} ({}): it is installed beside the "
         "plugin and needs the libtorch it was built with",
         path.string(), why ? why : "unknown error");
  }
  auto* symbol = dlsym(handle, tg::kJoinSymbol);
  if (symbol == nullptr) {
    fail(FERRY_STATUS_INCOMPATIBLE, "torch_gloo: {} lacks {} (a backend of another ferry build)",
         path.string(), tg::kJoinSymbol);
  }
  join = reinterpret_cast<tg::JoinFn>(symbol);
  return join;
}

std::vector<std::string> split_prefixes(std::string_view text) {
  std::vector<std::string> out;
  while (true) {
    const auto comma = text.find(',');
    out.emplace_back(text.substr(0, comma));
    if (out.back().empty()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "torch_gloo transport: option 'store_prefixes' holds an empty prefix (comma-separated, "
           "e.g. \"{{group}},{{group}}\")");
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

// "host:port" or "[v6]:port".
std::pair<std::string, std::uint16_t> parse_store_address(std::string_view text,
                                                          const std::string& group) {
  const auto colon = text.rfind(':');
  unsigned port = 0;
  std::string_view host = colon == std::string_view::npos ? text : text.substr(0, colon);
  const std::string_view digits =
      colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || digits.empty() || ec != std::errc() ||
      end != digits.data() + digits.size() || port == 0 || port > 65535) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "torch_gloo connect '{}': rank 0's store address '{}' is not host:port", group, text);
  }
  return {std::string(host), static_cast<std::uint16_t>(port)};
}

void throw_outcome(const tg::Outcome& outcome) {
  throw ferry::Error(outcome.code, outcome.message);
}

}  // namespace

ferry_peer::~ferry_peer() {
  group.reset();  // joins the process group's threads: no broadcast writes after this
  orphans.clear();
}

ferry_transport::ferry_transport(const ferry_transport_create_args_t& args) {
  for (size_t i = 0; i < args.num_options; ++i) {
    const std::string_view key = args.options[i].key ? args.options[i].key : "";
    const std::string_view value = args.options[i].value ? args.options[i].value : "";
    if (key == "interface") {
      interface_ = value;
    } else if (key == "store_prefixes") {
      prefixes_ = split_prefixes(value);
    } else {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "torch_gloo transport: unknown option '{}' (it takes interface, store_prefixes)", key);
    }
  }
  if (args.role != FERRY_ROLE_SENDER && args.role != FERRY_ROLE_RECEIVER) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "torch_gloo create: role {} is neither sender nor receiver",
         static_cast<int>(args.role));
  }
  role_ = args.role;
}

ferry_transport::~ferry_transport() = default;

std::vector<std::uint8_t> ferry_transport::address() {
  fail(FERRY_STATUS_FAILED_PRECONDITION,
       "torch_gloo get_address: the group meets at rank 0's TCPStore (GROUP_RENDEZVOUS); there "
       "is no address to carry");
}

ferry_peer* ferry_transport::connect(const ferry_connect_args_t& args) {
  const std::string name = args.peer_name ? args.peer_name : "";
  if (name.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "torch_gloo connect: peer_name (the group name) is empty");
  }
  if (args.group_size < 1 || args.local_rank >= args.group_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "torch_gloo connect '{}': rank {} is outside group size {}",
         name, args.local_rank, args.group_size);
  }
  if ((args.local_rank == 0) != (role_ == FERRY_ROLE_SENDER)) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "torch_gloo connect '{}': rank {} with role {} (rank 0 sends, the others receive)", name,
         args.local_rank, role_ == FERRY_ROLE_SENDER ? "sender" : "receiver");
  }
  if (args.num_remote != 1 || args.remote_addresses == nullptr ||
      args.remote_addresses[0].data == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "torch_gloo connect '{}': needs rank 0's store address as remote_addresses[0]", name);
  }
  const auto& blob = args.remote_addresses[0];
  auto [host, port] = parse_store_address(
      std::string_view(reinterpret_cast<const char*>(blob.data), blob.size), name);
  tg::JoinArgs join;
  join.host = std::move(host);
  join.port = port;
  join.group_name = name;
  join.rank = args.local_rank;
  join.world_size = args.group_size;
  join.prefixes = prefixes_;
  join.interface = interface_;
  const std::int64_t left_ns = args.deadline_ns > 0 ? args.deadline_ns - now_ns() : 0;
  join.timeout = std::max(std::chrono::milliseconds(1000),
                          std::chrono::milliseconds(left_ns / 1000000));
  tg::Outcome outcome;
  auto group = backend_join()(join, outcome);
  if (!group) throw_outcome(outcome);
  auto peer = std::make_unique<ferry_peer>();
  peer->group = std::move(group);
  peer->rank = args.local_rank;
  return peer.release();
}

void ferry_transport::disconnect(ferry_peer* peer) noexcept { delete peer; }

ferry_memory* ferry_transport::register_memory(const ferry_memory_desc_t& desc) {
  if (desc.kind != FERRY_MEMORY_HOST && desc.kind != FERRY_MEMORY_PINNED) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "torch_gloo register_memory: memory kind {} is not host memory (gloo broadcasts host "
         "memory only)",
         static_cast<int>(desc.kind));
  }
  if (desc.base == nullptr && desc.size > 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "torch_gloo register_memory: base is NULL");
  }
  auto memory = std::make_unique<ferry_memory>();
  memory->base = static_cast<std::uint8_t*>(desc.base);
  memory->size = desc.size;
  return memory.release();
}

void ferry_transport::deregister_memory(ferry_memory* memory) noexcept { delete memory; }

ferry_request* ferry_transport::send_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket) {
  return issue(peer, bucket, true);
}

ferry_request* ferry_transport::recv_bucket(ferry_peer* peer, const ferry_bucket_io_t& bucket) {
  return issue(peer, bucket, false);
}

ferry_request* ferry_transport::issue(ferry_peer* peer, const ferry_bucket_io_t& bucket,
                                      bool root) {
  const char* what = root ? "send_bucket" : "recv_bucket";
  if ((peer->rank == 0) != root) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "torch_gloo {}: {} cannot {} (rank 0 sends)", what,
         peer->group->describe(), root ? "send" : "receive");
  }
  if (aborted_.load()) {
    std::lock_guard lock(reason_mutex_);
    fail(FERRY_STATUS_ABORTED, "torch_gloo {}: aborted: {}", what, abort_reason_);
  }
  const ferry_memory_range_t& range = bucket.data;
  if (range.memory == nullptr || range.offset > range.memory->size ||
      range.size > range.memory->size - range.offset) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "torch_gloo {}: bucket {} range [{}, +{}) is outside its registered memory", what,
         bucket.bucket_index, range.offset, range.size);
  }
  auto request = std::make_unique<ferry_request>();
  request->peer = peer;
  request->bucket_index = bucket.bucket_index;
  request->hard_deadline_ns = bucket.deadline_ns;
  tg::Outcome outcome;
  request->broadcast =
      peer->group->broadcast(range.memory->base + range.offset, range.size, outcome);
  if (!request->broadcast) throw_outcome(outcome);
  return request.release();
}

void ferry_transport::settle(ferry_request* request) {
  if (!request->outcome.ok()) throw_outcome(request->outcome);
}

bool ferry_transport::request_test(ferry_request* request) {
  if (!request->complete) {
    request->complete = request->broadcast->wait_for(std::chrono::milliseconds(0), request->outcome);
  }
  if (request->complete) settle(request);
  return request->complete;
}

void ferry_transport::request_wait(ferry_request* request, std::int64_t deadline_ns) {
  while (!request->complete) {
    // The bucket's own deadline first: a host that aborts because it passed reads TIMEOUT.
    const std::int64_t now = now_ns();
    if (request->hard_deadline_ns > 0 && now > request->hard_deadline_ns) {
      fail(FERRY_STATUS_TIMEOUT, "{}: bucket {} did not arrive by its deadline",
           request->peer->group->describe(), request->bucket_index);
    }
    if (aborted_.load()) {
      std::lock_guard lock(reason_mutex_);
      fail(FERRY_STATUS_ABORTED, "{}: bucket {} aborted: {}", request->peer->group->describe(),
           request->bucket_index, abort_reason_);
    }
    if (deadline_ns > 0 && now > deadline_ns) {
      fail(FERRY_STATUS_TIMEOUT,
           "{}: bucket {} not complete yet at the wait's deadline (the request stays valid)",
           request->peer->group->describe(), request->bucket_index);
    }
    request->complete = request->broadcast->wait_for(kWaitSlice, request->outcome);
  }
  settle(request);
}

void ferry_transport::request_free(ferry_request* request) noexcept {
  if (!request->complete && request->broadcast) {
    // A collective cannot be cancelled: keep it (and the memory it writes) until the group goes.
    try {
      request->peer->orphans.push_back(std::move(request->broadcast));
    } catch (...) {
      // No room: waiting for it to end is the only safe alternative.
      tg::Outcome ignored;
      while (!request->broadcast->wait_for(kWaitSlice, ignored)) {
      }
    }
  }
  delete request;
}

void ferry_transport::abort(const char* reason) noexcept {
  try {
    std::lock_guard lock(reason_mutex_);
    abort_reason_ = reason ? reason : "";
  } catch (...) {
    // The flag alone still aborts.
  }
  aborted_.store(true);
}
