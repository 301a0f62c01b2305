// tests/nccl/trainer_peer.cpp: nccl_trainer_peer, a real trainer process for nccl_two_rank_test:
// rank 0 of weight-update group 'g' (world size 2) on GPU 0, through NcclTrainerGroup, so the
// test can SIGKILL a trainer *process* mid-update. Driven line by line:
//   argv: PORT BUCKET_BYTES (the rendezvous port on 127.0.0.1; the bucket size the receiver is
//         told in each request)
//   stdout: "READY" once the group exists; per update "REQUEST <json body of
//           /update_weights_from_distributed>", then "DONE ok" / "DONE error <message>";
//           "STALLED" (see stall); "CLOSED <how>".
//   stdin:  "update STEP LABEL"   fill the model with STEP's bytes and broadcast it;
//           "stall STEP LABEL K"  announce the whole update but broadcast only its first K
//                                 buckets, then wait forever (the test kills the process);
//           "close"               destroy the group (concurrently with the receiver's destroy).
// Exit status: 0 after close, 2 on a usage error, 3 when the group could not be created.
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include <ferry/formats/broadcast_layout.hpp>
#include "registry/registry.hpp"
#include "group/trainer_group.hpp"
#include "trainer_model.hpp"

namespace {

using namespace std::chrono_literals;

std::unique_ptr<ferry::registry::Registry> make_registry() {
  std::vector<std::filesystem::path> dirs;
  const char* env = std::getenv("FERRY_TEST_PLUGIN_DIRS");
  for (std::string rest = env ? env : ""; !rest.empty();) {
    const auto colon = rest.find(':');
    dirs.emplace_back(rest.substr(0, colon));
    rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
  }
  return std::make_unique<ferry::registry::Registry>(dirs);
}

void say(const std::string& line) {
  std::cout << line << std::endl;  // flushed: the parent reads line by line
}

// The tensors of the first `k` buckets of `views`' plan: broadcasting them is exactly the first
// k collectives of the full update (buckets are cut greedily in order, identically here).
std::vector<ferry::session::TensorView> first_buckets(
    const std::vector<ferry::session::TensorView>& views, std::uint64_t bucket_bytes,
    std::size_t k) {
  std::vector<std::string> names, dtypes;
  std::vector<std::vector<std::uint64_t>> shapes;
  for (const auto& v : views) {
    names.push_back(v.name);
    dtypes.push_back(ferry::dtype_name(v.dtype));
    shapes.push_back(v.shape);
  }
  const auto buckets = ferry::nccl::plan_buckets(
      ferry::nccl::make_tensor_specs(names, dtypes, shapes), bucket_bytes, 0);
  std::size_t count = 0;
  for (std::size_t b = 0; b < k && b < buckets.size(); ++b) count += buckets[b].tensors.size();
  return {views.begin(), views.begin() + static_cast<std::ptrdiff_t>(count)};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: nccl_trainer_peer PORT BUCKET_BYTES\n");
    return 2;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  ferry::session::NcclTrainerOptions o;
  o.transport = "nccl";
  o.master_address = "127.0.0.1";
  o.master_port = static_cast<std::uint16_t>(std::atoi(argv[1]));
  o.world_size = 2;
  o.group_name = "g";
  o.device = 0;
  o.init_timeout = 60s;
  o.bucket_bytes = std::strtoull(argv[2], nullptr, 10);
  o.bucket_timeout = 30s;
  auto registry = make_registry();
  ferry::test::TrainerModel model(0);
  std::unique_ptr<ferry::session::NcclTrainerGroup> group;
  try {
    group = std::make_unique<ferry::session::NcclTrainerGroup>(*registry, o);
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "nccl_trainer_peer: %s\n", e.what());
    return 3;
  }
  say("READY");
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string verb, label;
    unsigned step = 0;
    in >> verb;
    if (verb == "close") {
      say("CLOSED " + group->close(20s));
      return 0;
    }
    in >> step >> label;
    model.fill(step);
    const auto views = model.views();
    say("REQUEST " + group->update_request(views, label));
    if (verb == "stall") {
      std::size_t k = 0;
      in >> k;
      try {
        group->broadcast(first_buckets(views, o.bucket_bytes, k));
      } catch (const ferry::Error& e) {
        say(std::string("DONE error ") + e.what());
        continue;
      }
      say("STALLED");
      while (true) std::this_thread::sleep_for(1s);
    }
    try {
      group->broadcast(views);
      say("DONE ok");
    } catch (const ferry::Error& e) {
      say(std::string("DONE error ") + e.what());
    }
  }
  return 0;
}
