// torch_gloo/gloo_backend.cpp: libferry_torch_gloo_backend.so, the libtorch side of the
// torch_gloo transport (see gloo_backend.hpp): joins a torch.distributed gloo group through rank
// 0's TCPStore exactly as torch's own ranks do, and runs its broadcasts.
//
// Meeting the group the way SGLang's engine does (init_custom_process_group): a TCPStore client
// that counts itself among the store's workers (the trainer's TCPStore waits for world_size of
// them), the PrefixStore chain between that store and the process group (SGLang's group-name
// prefix, then torch's own: `group` on torch 1.x; `group/` and the device's `cpu/` on torch 2.x),
// then ProcessGroupGloo on one default device with two threads, as torch's Python binding builds
// it. Both sides must run the same torch major (the prefixes and gloo's wire format follow it).
// It links libtorch and the C++ runtime only (no fmt: it is built against whichever libtorch the
// machine runs, and carried alone).
#include "torch_gloo/gloo_backend.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <cstdlib>
#include <exception>
#include <string_view>

namespace ferry::torch_gloo {
namespace {

std::string expand(std::string_view pattern, const std::string& group) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size();) {
    if (pattern.substr(i, 7) == "{group}") {
      out += group;
      i += 7;
    } else {
      out += pattern[i++];
    }
  }
  return out;
}

std::vector<std::string> default_prefixes() {
#if TORCH_VERSION_MAJOR >= 2
  return {"{group}", "{group}/", "cpu/"};
#else
  return {"{group}", "{group}"};
#endif
}

// A failure reads as TIMEOUT when torch or gloo says a deadline passed; anything else that ends a
// collective or the join (a peer that closed its connection, a refused store) is the peers'.
ferry_status_code_t classify(std::string_view what) {
  for (std::string_view s : {"imed out", "imeout", "timeout"}) {
    if (what.find(s) != std::string_view::npos) return FERRY_STATUS_TIMEOUT;
  }
  return FERRY_STATUS_PEER_FAILED;
}

std::string describe_group(const JoinArgs& args) {
  return std::string("torch ") + TORCH_VERSION + " gloo group '" + args.group_name + "' rank " +
         std::to_string(args.rank) + "/" + std::to_string(args.world_size);
}

std::string first_line(const std::string& text) {
  const auto nl = text.find('\n');
  return nl == std::string::npos ? text : text.substr(0, nl);
}

Outcome failure(const std::string& context, const std::exception& e) {
  const std::string what = first_line(e.what());
  return {classify(what), context + ": " + what};
}

class GlooBroadcast final : public PendingBroadcast {
 public:
  GlooBroadcast(c10::intrusive_ptr<c10d::Work> work, std::string context)
      : work_(std::move(work)), context_(std::move(context)) {}

  bool wait_for(std::chrono::milliseconds slice, Outcome& outcome) noexcept override {
    try {
      if (!work_->isCompleted()) {
        if (slice.count() <= 0) return false;
        try {
          work_->wait(slice);
        } catch (const std::exception&) {
          if (!work_->isCompleted()) return false;  // the slice passed, the broadcast runs on
          throw;
        }
      }
      work_->wait();  // completed: rethrows its error, if any
      outcome = {};
      return true;
    } catch (const std::exception& e) {
      outcome = failure(context_, e);
      return true;
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string context_;
};

class GlooGroup final : public Group {
 public:
  explicit GlooGroup(const JoinArgs& args) : args_(args) {
    c10d::TCPStoreOptions store_options;
    store_options.port = args.port;
    store_options.isServer = args.rank == 0;
    store_options.numWorkers = args.world_size;
    store_options.waitWorkers = true;  // the trainer's store counts its workers in
    store_options.timeout = args.timeout;
    store_options.multiTenant = true;
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(args.host, store_options);
    store->setTimeout(args.timeout);
    const auto prefixes = args.prefixes.empty() ? default_prefixes() : args.prefixes;
    for (const auto& p : prefixes) {
      store = c10::make_intrusive<c10d::PrefixStore>(expand(p, args.group_name), store);
    }
    auto options = c10d::ProcessGroupGloo::Options::create(args.timeout);
    const char* env_interface = std::getenv("GLOO_SOCKET_IFNAME");
    const std::string interface =
        !args.interface.empty() ? args.interface : (env_interface ? env_interface : "");
    options->devices.push_back(
        interface.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                          : c10d::ProcessGroupGloo::createDeviceForInterface(interface));
    options->threads = 2;  // torch's binding: two per device
    group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
        store, static_cast<int>(args.rank), static_cast<int>(args.world_size), options);
    store_ = store;
  }

  std::unique_ptr<PendingBroadcast> broadcast(std::uint8_t* data, std::uint64_t bytes,
                                              Outcome& outcome) noexcept override {
    const std::string context = describe() + " broadcast #" + std::to_string(count_) + " (" +
                                std::to_string(bytes) + " bytes)";
    try {
      std::vector<at::Tensor> tensors{at::from_blob(
          data, {static_cast<std::int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte))};
      c10d::BroadcastOptions options;
      options.rootRank = 0;
      options.rootTensor = 0;
      options.timeout = args_.timeout;
      auto work = group_->broadcast(tensors, options);
      ++count_;
      outcome = {};
      return std::make_unique<GlooBroadcast>(std::move(work), context);
    } catch (const std::exception& e) {
      outcome = failure(context, e);
      return nullptr;
    }
  }

  std::string describe() const override {
    return describe_group(args_);
  }

 private:
  JoinArgs args_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  std::uint64_t count_ = 0;
};

}  // namespace
}  // namespace ferry::torch_gloo

extern "C" __attribute__((visibility("default"))) std::unique_ptr<ferry::torch_gloo::Group>
ferry_torch_gloo_join_v1(const ferry::torch_gloo::JoinArgs& args,
                         ferry::torch_gloo::Outcome& outcome) noexcept {
  using namespace ferry::torch_gloo;
  try {
    auto group = std::make_unique<GlooGroup>(args);
    outcome = {};
    return group;
  } catch (const std::exception& e) {
    outcome = failure(describe_group(args) + ": joining at " + args.host + ":" +
                          std::to_string(args.port),
                      e);
    return nullptr;
  }
}

// The entry's type, checked against the plugin's view of it.
static_assert(std::is_same_v<decltype(&ferry_torch_gloo_join_v1), ferry::torch_gloo::JoinFn>);
