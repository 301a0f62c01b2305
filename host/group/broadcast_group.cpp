// group/broadcast_group.cpp: one member of a weight-update group driven through the NCCL
// transport's C table, with the TCP rendezvous and liveness-aware waits (see broadcast_group.hpp).
#include "group/broadcast_group.hpp"

#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <future>
#include <thread>

namespace ferry::nccl {
namespace {

constexpr auto kLivenessSlice = std::chrono::milliseconds(100);

std::int64_t to_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

void check_group_init(const GroupInit& init) {
  if (init.master_address.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "weight-update group: 'master_address' is empty");
  }
  if (init.group_name.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "weight-update group: 'group_name' is empty");
  }
  if (init.world_size < 1) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "weight-update group '{}': 'world_size' must be >= 1",
         init.group_name);
  }
  if (init.rank >= init.world_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "weight-update group '{}': rank {} (rank_offset {}) is outside world_size {}",
         init.group_name, init.rank, init.rank_offset, init.world_size);
  }
  if (init.backend != "nccl" && init.backend != "gloo") {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "weight-update group '{}': backend '{}' is not supported ('nccl' or 'gloo')",
         init.group_name, init.backend);
  }
  if (init.backend == "nccl" && init.device < 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "weight-update group '{}': CUDA device {} is invalid",
         init.group_name, init.device);
  }
}

BroadcastGroup::BroadcastGroup(const ferry_transport_api_t* api, const ferry_host_api_t* host,
                               GroupInit init)
    : api_(api), host_(host), init_(std::move(init)) {
  check_group_init(init_);
  if (api_ == nullptr || host_ == nullptr || api_->create == nullptr ||
      api_->connect == nullptr || api_->send_bucket == nullptr ||
      api_->recv_bucket == nullptr || api_->request_wait == nullptr ||
      api_->register_memory == nullptr) {
    fail(FERRY_STATUS_INCOMPATIBLE,
         "weight-update group '{}': the transport lacks broadcast functions (connect, "
         "send_bucket, recv_bucket, request_wait, register_memory)",
         init_.group_name);
  }
  caps_.struct_size = FERRY_STRUCT_SIZE(ferry_transport_caps_t, max_inflight_buckets);
  if (api_->get_caps == nullptr) {
    fail(FERRY_STATUS_INCOMPATIBLE, "{}: the transport has no get_caps", where());
  }
  if (ferry_error_t* e = api_->get_caps(&caps_)) rethrow(e, "get_caps");
  const auto deadline = Clock::now() + init_.init_timeout;
  const bool root = init_.rank == 0;

  // The instance first: a machine without a GPU is refused before any peer is contacted.
  ferry_transport_create_args_t create{};
  create.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
  create.role = root ? FERRY_ROLE_SENDER : FERRY_ROLE_RECEIVER;
  create.device = init_.device;
  if (ferry_error_t* e = api_->create(&create, &transport_)) rethrow(e, "create");

  try {
    GroupAddress address{init_.master_address, init_.master_port, init_.group_name,
                         init_.world_size};
    std::vector<std::uint8_t> id;
    if (own_rendezvous()) {
      // The plugin meets the group at rank 0's store: it gets only where that is.
      const std::string store = fmt::format("{}:{}", init_.master_address, init_.master_port);
      id.assign(store.begin(), store.end());
    } else if (root) {
      if (api_->get_address == nullptr) {
        fail(FERRY_STATUS_INCOMPATIBLE, "{}: the transport has no get_address", where());
      }
      ferry_blob_t blob{};
      blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
      if (ferry_error_t* e = api_->get_address(transport_, &blob)) rethrow(e, "get_address");
      id.assign(blob.data, blob.data + blob.size);
      if (blob.release != nullptr) blob.release(blob.data, blob.release_ctx);
      server_ = std::make_unique<RendezvousServer>(address, id);
      server_->serve(deadline);
    } else {
      client_ = std::make_unique<RendezvousClient>();
      id = client_->join(address, init_.rank, deadline);
    }

    ferry_blob_t remote{};
    remote.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    remote.data = id.data();
    remote.size = id.size();
    ferry_connect_args_t connect{};
    connect.struct_size = FERRY_STRUCT_SIZE(ferry_connect_args_t, deadline_ns);
    const bool carry = !root || own_rendezvous();
    connect.remote_addresses = carry ? &remote : nullptr;
    connect.num_remote = carry ? 1 : 0;
    connect.local_rank = init_.rank;
    connect.group_size = init_.world_size;
    connect.peer_name = init_.group_name.c_str();
    connect.deadline_ns = to_ns(deadline);
    if (ferry_error_t* e = api_->connect(transport_, &connect, &peer_)) {
      const auto dead = dead_ranks();
      rethrow(e, dead.empty() ? std::string("connect")
                              : fmt::format("connect ({} left the rendezvous)",
                                            describe_ranks(dead)));
    }
  } catch (...) {
    api_->destroy(transport_);
    transport_ = nullptr;
    throw;
  }
}

BroadcastGroup::~BroadcastGroup() {
  try {
    close(Clock::now() + kDefaultCloseTimeout, !aborted_.load());
  } catch (...) {
    // close() only throws when a thread cannot start: then the teardown is lost (logged by no
    // one); a destructor must not throw.
  }
}

const char* close_outcome_name(BroadcastGroup::CloseOutcome outcome) {
  switch (outcome) {
    case BroadcastGroup::CloseOutcome::finalized: return "finalized";
    case BroadcastGroup::CloseOutcome::aborted: return "aborted";
    case BroadcastGroup::CloseOutcome::background: return "continuing in the background";
    case BroadcastGroup::CloseOutcome::left: return "left";
  }
  return "unknown";
}

BroadcastGroup::CloseOutcome BroadcastGroup::close(Clock::time_point deadline, bool healthy,
                                                   std::function<void()> after) {
  if (closed_ || transport_ == nullptr) {
    if (after) after();
    return CloseOutcome::aborted;
  }
  closed_ = true;
  bool together = false;
  if (healthy && !aborted_.load()) {
    const auto window_end = std::min(deadline, Clock::now() + kLeaveWindow);
    together = server_ ? server_->leave_together(window_end)
                       : (client_ && client_->leave_together(window_end));
  }
  if (server_) server_->announce_leave(together);
  if (client_) client_->announce_leave(together);
  // A group met at rank 0's own rendezvous has no leave handshake: a healthy one just leaves
  // (nothing is in flight), a failed one aborts what still runs.
  const bool leave_alone = own_rendezvous() && healthy && !aborted_.load();
  if (!together && !leave_alone && api_->abort != nullptr) {
    // Local: the plugin's disconnect aborts a communicator with an abort request pending.
    api_->abort(transport_, "destroy_weights_update_group without every rank leaving together");
  }
  // Everything the teardown touches moves into it: this object may be gone when it runs.
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([api = api_, transport = transport_, peer = peer_, registrations = registrations_,
               server = std::move(server_), client = std::move(client_),
               after = std::move(after), done]() mutable {
    if (api->deregister_memory != nullptr) {
      for (ferry_memory_t* m : registrations) api->deregister_memory(transport, m);
    }
    if (peer != nullptr && api->disconnect != nullptr) api->disconnect(transport, peer);
    api->destroy(transport);
    server.reset();
    client.reset();
    try {
      if (after) after();
    } catch (...) {
      // `after` frees memory; a failure there leaks it, nothing more.
    }
    done->set_value();
  }).detach();
  transport_ = nullptr;
  peer_ = nullptr;
  registrations_.clear();
  if (finished.wait_until(deadline) != std::future_status::ready) return CloseOutcome::background;
  if (leave_alone) return CloseOutcome::left;
  return together ? CloseOutcome::finalized : CloseOutcome::aborted;
}

std::string BroadcastGroup::where() const {
  return fmt::format("weight-update group '{}' rank {}/{}", init_.group_name, init_.rank,
                     init_.world_size);
}

void BroadcastGroup::rethrow(ferry_error_t* error, const std::string& context) {
  const ferry_status_code_t code = host_->error_code(error);
  std::string message = host_->error_message(error);
  host_->error_free(error);
  throw Error(code, fmt::format("{} ({}): {}", where(), context, message));
}

std::vector<std::uint32_t> BroadcastGroup::dead_ranks() const {
  if (aborted_.load()) return {};
  if (server_) return server_->dead_ranks();
  if (client_ && !client_->root_alive()) return {0};
  return {};
}

ferry_memory_t* BroadcastGroup::register_device(void* base, std::uint64_t bytes) {
  return register_memory(base, bytes, FERRY_MEMORY_CUDA);
}

ferry_memory_t* BroadcastGroup::register_host(void* base, std::uint64_t bytes) {
  return register_memory(base, bytes, FERRY_MEMORY_HOST);
}

ferry_memory_t* BroadcastGroup::register_memory(void* base, std::uint64_t bytes,
                                                ferry_memory_kind_t kind) {
  ferry_memory_desc_t desc{};
  desc.struct_size = FERRY_STRUCT_SIZE(ferry_memory_desc_t, device);
  desc.base = base;
  desc.size = bytes;
  desc.kind = kind;
  desc.device = kind == FERRY_MEMORY_CUDA ? init_.device : -1;
  ferry_memory_t* memory = nullptr;
  if (ferry_error_t* e = api_->register_memory(transport_, &desc, &memory)) {
    rethrow(e, "register_memory");
  }
  registrations_.push_back(memory);
  return memory;
}

BroadcastGroup::Pending BroadcastGroup::issue(ferry_memory_t* memory, std::uint64_t offset,
                                              std::uint64_t bytes, std::uint32_t bucket_index,
                                              std::chrono::milliseconds timeout) {
  Pending pending;
  pending.bucket_index = bucket_index;
  pending.deadline = Clock::now() + timeout;
  ferry_bucket_io_t io{};
  io.struct_size = FERRY_STRUCT_SIZE(ferry_bucket_io_t, deadline_ns);
  io.data.struct_size = FERRY_STRUCT_SIZE(ferry_memory_range_t, size);
  io.data.memory = memory;
  io.data.offset = offset;
  io.data.size = bytes;
  io.bucket_index = bucket_index;
  io.deadline_ns = to_ns(pending.deadline);
  auto call = init_.rank == 0 ? api_->send_bucket : api_->recv_bucket;
  if (ferry_error_t* e = call(transport_, peer_, &io, &pending.request)) {
    rethrow(e, fmt::format("{} bucket {}", init_.rank == 0 ? "send" : "receive", bucket_index));
  }
  return pending;
}

void BroadcastGroup::discard(Pending& pending) noexcept {
  if (pending.request != nullptr && api_->request_free != nullptr) {
    api_->request_free(transport_, pending.request);
  }
  pending.request = nullptr;
}

void BroadcastGroup::wait(Pending& pending) {
  if (pending.request == nullptr) return;  // completed when issued
  while (true) {
    const auto slice = std::min(Clock::now() + kLivenessSlice, pending.deadline);
    ferry_error_t* e = api_->request_wait(transport_, pending.request, to_ns(slice));
    if (e == nullptr) {
      discard(pending);
      return;
    }
    const bool soft = host_->error_code(e) == FERRY_STATUS_TIMEOUT && Clock::now() < pending.deadline;
    if (soft) {
      host_->error_free(e);
      const auto dead = dead_ranks();
      if (dead.empty()) continue;
      const std::string reason = fmt::format(
          "{} left the group (its rendezvous link closed) during the broadcast of bucket {} "
          "(phase 'broadcast')",
          describe_ranks(dead), pending.bucket_index);
      abort(reason);
      discard(pending);
      fail(FERRY_STATUS_PEER_FAILED, "{}: {}; communicator aborted", where(), reason);
    }
    if (host_->error_code(e) == FERRY_STATUS_TIMEOUT && api_->request_test != nullptr) {
      // The slice and the bucket's deadline ended together: let the plugin apply the hard one
      // (it aborts the communicator).
      host_->error_free(e);
      int done = 0;
      e = api_->request_test(transport_, pending.request, &done);
      if (e == nullptr && done) {
        discard(pending);
        return;
      }
      if (e == nullptr) {
        abort("bucket deadline passed");
        e = api_->request_wait(transport_, pending.request, 0);
        if (e == nullptr) {
          discard(pending);
          return;
        }
      }
    }
    discard(pending);
    const auto dead = dead_ranks();
    rethrow(e, fmt::format("bucket {}{}", pending.bucket_index,
                           dead.empty() ? std::string()
                                        : fmt::format(", {} left the rendezvous",
                                                      describe_ranks(dead))));
  }
}

void BroadcastGroup::abort(const std::string& reason) noexcept {
  aborted_.store(true);
  if (transport_ != nullptr && api_->abort != nullptr) api_->abort(transport_, reason.c_str());
  if (server_) server_->shutdown_links();
  if (client_) client_->shutdown_link();
}

}  // namespace ferry::nccl
