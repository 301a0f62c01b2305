// tests/capi/transport_preference_test.cpp: the config chooses a sender's transport, and `auto`
// chooses an out-of-tree transport the host knows nothing of when the config prefers it and its
// declared capabilities fit. The vendor plugin is tests/plugins' loop transport (instances meet
// in one process), so the receiver is embedded in this test process through the C API; every
// push must commit through that transport, bit for bit.
#include <ferry/ferry.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string message_of(ferry_error_t* error) {
  std::string m = error != nullptr ? ferry_error_message(error) : "";
  ferry_error_free(error);
  return m;
}

// The config every side uses: the loop plugin's and the identity model's folders only, plus
// `extra` (TOML lines).
std::string config_text(const std::string& extra) {
  const auto loop = std::filesystem::path(env("FERRY_LOOP_PLUGIN")).parent_path().string();
  const auto model = std::filesystem::path(env("FERRY_IDENTITY_PLUGIN")).parent_path().string();
  return "plugin_dirs = ['" + loop + "', '" + model + "']\nlog_level = 'warn'\n" + extra;
}

struct Tensor {
  std::string name;
  std::vector<float> values;
  int64_t shape[1];
  ferry_tensor_t view() {
    ferry_tensor_t t{};
    t.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_t, device);
    t.name = name.c_str();
    t.dtype = FERRY_DTYPE_F32;
    t.ndim = 1;
    shape[0] = static_cast<int64_t>(values.size());
    t.shape = shape;
    t.data = values.data();
    t.memory_kind = FERRY_MEMORY_HOST;
    return t;
  }
};

std::vector<Tensor> tensors(float base) {
  std::vector<Tensor> out;
  for (int i = 0; i < 3; ++i) {
    Tensor t{"layer." + std::to_string(i) + ".weight", std::vector<float>(1000 + 37 * i), {0}};
    for (std::size_t j = 0; j < t.values.size(); ++j) t.values[j] = base + i * 0.5f + j * 1e-3f;
    out.push_back(std::move(t));
  }
  return out;
}

// Pushes `sent` with a sender configured by `extra` (transport NULL: the config decides) into an
// embedded receiver of the same config; returns the transport its report names.
std::string push_through(const std::string& extra, const char* transport = nullptr) {
  const std::string text = config_text(extra);
  ferry_config_source_t source{};
  source.struct_size = FERRY_STRUCT_SIZE(ferry_config_source_t, num_overrides);
  source.toml_text = text.c_str();

  // The engine's parameters outlive the receiver (declared first, destroyed last): the receiver
  // reads them until it is destroyed (its host mirror copies each committed version).
  auto engine = tensors(0.0f);
  ferry_receiver_t* receiver = nullptr;
  EXPECT_EQ(ferry_receiver_create(&source, &receiver), nullptr);
  std::unique_ptr<ferry_receiver_t, void (*)(ferry_receiver_t*)> keep(receiver,
                                                                      ferry_receiver_destroy);
  for (auto& t : engine) {
    const ferry_tensor_t v = t.view();
    ferry_error_t* e = ferry_receiver_register_param(receiver, &v);
    EXPECT_EQ(e, nullptr) << message_of(e);
  }
  int32_t port = 0;
  ferry_error_t* e = ferry_receiver_serve(receiver, "127.0.0.1", 0, &port);
  EXPECT_EQ(e, nullptr) << message_of(e);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const char* receivers[] = {address.c_str()};

  ferry_sender_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_sender_create_args_t, commit_timeout_ms);
  args.config = &source;
  args.receivers = receivers;
  args.num_receivers = 1;
  args.transport = transport;
  args.connect_timeout_ms = 5000;
  ferry_sender_t* sender = nullptr;
  e = ferry_sender_create(&args, &sender);
  EXPECT_EQ(e, nullptr) << message_of(e);
  std::unique_ptr<ferry_sender_t, void (*)(ferry_sender_t*)> keep_sender(sender,
                                                                        ferry_sender_destroy);
  auto sent = tensors(7.0f);
  std::vector<ferry_tensor_t> views;
  for (auto& t : sent) views.push_back(t.view());
  std::vector<const ferry_tensor_t*> pointers;
  for (const auto& v : views) pointers.push_back(&v);
  ferry_push_args_t push{};
  push.struct_size = FERRY_STRUCT_SIZE(ferry_push_args_t, label);
  push.tensors = pointers.data();
  push.num_tensors = pointers.size();
  push.version = 1;
  ferry_push_report_t* report = nullptr;
  e = ferry_sender_push(sender, &push, &report);
  EXPECT_EQ(e, nullptr) << message_of(e);
  std::string used;
  if (report != nullptr && ferry_push_report_num_receivers(report) == 1) {
    ferry_receiver_result_t r{};
    r.struct_size = FERRY_STRUCT_SIZE(ferry_receiver_result_t, reused_session);
    EXPECT_EQ(ferry_push_report_receiver(report, 0, &r), nullptr);
    EXPECT_EQ(r.committed, 1) << r.error;
    used = r.transport;
  }
  ferry_push_report_free(report);
  for (std::size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(std::memcmp(engine[i].values.data(), sent[i].values.data(),
                          sent[i].values.size() * sizeof(float)),
              0)
        << engine[i].name << " differs from what was sent";
  }
  return used;
}

class TransportPreference : public ::testing::Test {
 protected:
  void SetUp() override {
    if (env("FERRY_LOOP_PLUGIN").empty() || env("FERRY_IDENTITY_PLUGIN").empty()) {
      GTEST_FAIL() << "FERRY_LOOP_PLUGIN and FERRY_IDENTITY_PLUGIN must name the test plugins";
    }
  }
};

// A vendor plugin at the head of the preference list is chosen by auto: the loop transport is
// point-to-point over host memory, and nothing in it rules out a receiver in this process.
TEST_F(TransportPreference, AutoChoosesAPreferredOutOfTreeTransport) {
  EXPECT_EQ(push_through("[update]\ntransport_preference = ['loop']\n"), "loop");
}

// Plugins of the list that are missing are passed over; with none left, inline.
TEST_F(TransportPreference, MissingPreferredPluginsArePassedOver) {
  EXPECT_EQ(push_through("[update]\ntransport_preference = ['nosuch', 'loop']\n"), "loop");
  EXPECT_EQ(push_through("[update]\ntransport_preference = ['nosuch']\n"), "inline");
}

// update.transport names the sender's transport; the sender's own argument wins over it.
TEST_F(TransportPreference, TheConfigKeyChoosesTheSendersTransport) {
  EXPECT_EQ(push_through("[update]\ntransport = 'loop'\ntransport_preference = []\n"), "loop");
  EXPECT_EQ(push_through("[update]\ntransport = 'loop'\n", "inline"), "inline");
}

}  // namespace
