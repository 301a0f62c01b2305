// tests/capi/capi_test.cpp: the C API (ferry/ferry.h) as a program uses it: argument errors with
// their codes and messages, an engine's callbacks reached through the control API's routes, and a
// round trip from a sender into embedded receivers running in other processes
// (capi_receiver_main.c), checked byte for byte.
#include <ferry/ferry.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "capi_tensors.h"

extern char** environ;

namespace {

// Code and message of an error, which it frees; {OK, ""} for NULL.
struct Outcome {
  ferry_status_code_t code = FERRY_STATUS_OK;
  std::string message;
};
Outcome take(ferry_error_t* error) {
  Outcome o{ferry_error_code(error), ferry_error_message(error)};
  ferry_error_free(error);
  return o;
}

// The test's transport: FERRY_TEST_TRANSPORT or "auto" (ucx when loadable, else inline).
std::string test_transport() {
  const char* t = std::getenv("FERRY_TEST_TRANSPORT");
  return t != nullptr && t[0] != '\0' ? t : "auto";
}

struct SenderDeleter {
  void operator()(ferry_sender_t* s) const { ferry_sender_destroy(s); }
};
struct ReportDeleter {
  void operator()(ferry_push_report_t* r) const { ferry_push_report_free(r); }
};
struct ReceiverDeleter {
  void operator()(ferry_receiver_t* r) const { ferry_receiver_destroy(r); }
};
using SenderPtr = std::unique_ptr<ferry_sender_t, SenderDeleter>;
using ReportPtr = std::unique_ptr<ferry_push_report_t, ReportDeleter>;
using ReceiverPtr = std::unique_ptr<ferry_receiver_t, ReceiverDeleter>;

SenderPtr make_sender(const std::vector<std::string>& addresses) {
  std::vector<const char*> receivers;
  for (const auto& a : addresses) receivers.push_back(a.c_str());
  const std::string transport = test_transport();
  ferry_sender_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_sender_create_args_t, commit_timeout_ms);
  args.receivers = receivers.data();
  args.num_receivers = receivers.size();
  args.transport = transport.c_str();
  args.connect_timeout_ms = 5000;
  ferry_sender_t* sender = nullptr;
  const Outcome o = take(ferry_sender_create(&args, &sender));
  EXPECT_EQ(o.code, FERRY_STATUS_OK) << o.message;
  return SenderPtr(sender);
}

ReceiverPtr make_receiver() {
  ferry_receiver_t* receiver = nullptr;
  const Outcome o = take(ferry_receiver_create(nullptr, &receiver));
  EXPECT_EQ(o.code, FERRY_STATUS_OK) << o.message;
  return ReceiverPtr(receiver);
}

// A plain view of `data` with the given dtype and shape (kept alive for the whole test program).
ferry_tensor_t view(const char* name, ferry_dtype_t dtype, const std::vector<int64_t>& dims,
                    void* data, const int64_t* strides = nullptr) {
  static std::list<std::vector<int64_t>> shapes;
  const std::vector<int64_t>& shape = shapes.emplace_back(dims);
  ferry_tensor_t t{};
  t.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_t, device);
  t.name = name;
  t.dtype = dtype;
  t.ndim = static_cast<uint32_t>(shape.size());
  t.shape = shape.data();
  t.strides = strides;
  t.data = data;
  t.memory_kind = FERRY_MEMORY_HOST;
  return t;
}

Outcome push(ferry_sender_t* sender, const std::vector<const ferry_tensor_t*>& tensors,
             uint64_t version, ReportPtr* report = nullptr) {
  ferry_push_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_push_args_t, label);
  args.tensors = tensors.data();
  args.num_tensors = tensors.size();
  args.version = version;
  ferry_push_report_t* raw = nullptr;
  Outcome o = take(ferry_sender_push(sender, &args, &raw));
  if (report != nullptr) report->reset(raw);
  else ferry_push_report_free(raw);
  return o;
}

// A receiver process (capi_receiver_main) with pipes to its stdin and stdout.
class ReceiverProcess {
 public:
  ReceiverProcess() {
    const char* exe = std::getenv("FERRY_CAPI_RECEIVER");
    if (exe == nullptr) throw std::runtime_error("FERRY_CAPI_RECEIVER is not set");
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    posix_spawn_file_actions_addclose(&actions, to_child[1]);
    posix_spawn_file_actions_addclose(&actions, from_child[0]);
    char* argv[] = {const_cast<char*>(exe), nullptr};
    const int rc = posix_spawn(&pid_, exe, &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    if (rc != 0) throw std::runtime_error(std::string("cannot start ") + exe);
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
    const std::string first = read_line();
    if (first.rfind("PORT ", 0) != 0) throw std::runtime_error("receiver said: " + first);
    port_ = std::stoi(first.substr(5));
  }
  ~ReceiverProcess() {
    if (in_ != nullptr) {
      std::fputs("quit\n", in_);
      std::fclose(in_);
    }
    int status = 0;
    waitpid(pid_, &status, 0);
    if (out_ != nullptr) std::fclose(out_);
  }
  ReceiverProcess(const ReceiverProcess&) = delete;
  ReceiverProcess& operator=(const ReceiverProcess&) = delete;

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // "OK" when `version` is published and every parameter holds its pattern.
  std::string check(uint64_t version) {
    return command("check " + std::to_string(version));
  }
  // A command of capi_receiver_main ("release", "resume"); its answer line.
  std::string command(const std::string& line) {
    std::fprintf(in_, "%s\n", line.c_str());
    std::fflush(in_);
    return read_line();
  }

 private:
  std::string read_line() {
    char line[1024];
    if (std::fgets(line, sizeof(line), out_) == nullptr) return "<receiver exited>";
    std::string s(line);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  }

  pid_t pid_ = 0;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  int port_ = 0;
};

// Sender-side copies of kCapiTestTensors filled with the pattern of one version.
struct SenderTensors {
  explicit SenderTensors(uint64_t version) {
    for (size_t i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) {
      const capi_test_tensor_t& t = kCapiTestTensors[i];
      bytes.emplace_back(capi_test_bytes(&t) + 1);
      capi_test_fill(bytes.back().data(), i, version);
      shapes.emplace_back(t.shape, t.shape + t.ndim);
    }
  }
  std::vector<std::vector<unsigned char>> bytes;
  std::vector<std::vector<int64_t>> shapes;
};

// Every receiver committed; with `reused` set, each push went through the session kept from the
// previous one (1) or opened one (0), as ferry_receiver_result_t.reused_session (API 1.2) says.
void expect_committed(const ferry_push_report_t* report, size_t receivers, int reused = -1) {
  ASSERT_NE(report, nullptr);
  ASSERT_EQ(ferry_push_report_num_receivers(report), receivers);
  for (size_t i = 0; i < receivers; ++i) {
    ferry_receiver_result_t r{};
    r.struct_size = FERRY_STRUCT_SIZE(ferry_receiver_result_t, reused_session);
    r.reused_session = 7;  // overwritten: the library fills every field the caller declared
    ASSERT_EQ(take(ferry_push_report_receiver(report, i, &r)).code, FERRY_STATUS_OK);
    if (reused >= 0) {
      EXPECT_EQ(r.reused_session, reused) << r.address;
    }
    EXPECT_TRUE(r.reused_session == 0 || r.reused_session == 1) << r.reused_session;
    EXPECT_EQ(r.direct, 0) << "host tensors go through the staging slots";
    EXPECT_EQ(r.committed, 1) << r.address << ": " << r.error;
    EXPECT_GT(r.bytes, 0u);
    // "auto" picks ucx or inline; an explicit choice is what the receiver used.
    if (test_transport() == "auto") {
      EXPECT_TRUE(std::string(r.transport) == "ucx" || std::string(r.transport) == "inline")
          << r.transport;
    } else {
      EXPECT_EQ(std::string(r.transport), test_transport());
    }
  }
  EXPECT_EQ(ferry_push_report_all_committed(report), 1);
}

TEST(CApi, VersionMatchesHeader) {
  uint32_t major = 0, minor = 0;
  ferry_api_version(&major, &minor);
  EXPECT_EQ(major, static_cast<uint32_t>(FERRY_API_MAJOR));
  EXPECT_EQ(minor, static_cast<uint32_t>(FERRY_API_MINOR));
  EXPECT_STREQ(ferry_status_name(FERRY_STATUS_TIMEOUT), "TIMEOUT");
  EXPECT_STRNE(ferry_version_string(), "");
}

// ferry_dlpack_release calls each tensor's own deleter once, in order, and skips NULL entries and
// NULL deleters.
std::vector<int>* g_released = nullptr;
void record_release(DLManagedTensor* t) {
  g_released->push_back(static_cast<int>(reinterpret_cast<std::intptr_t>(t->manager_ctx)));
}

TEST(CApi, DlpackReleaseCallsEveryDeleterOnceInOrder) {
  std::vector<int> released;
  g_released = &released;
  DLManagedTensor a{}, b{}, c{}, no_deleter{};
  a.manager_ctx = reinterpret_cast<void*>(1);
  b.manager_ctx = reinterpret_cast<void*>(2);
  c.manager_ctx = reinterpret_cast<void*>(3);
  a.deleter = b.deleter = c.deleter = record_release;
  DLManagedTensor* const tensors[] = {&c, nullptr, &a, &no_deleter, &b};
  ferry_dlpack_release(tensors, 5);
  EXPECT_EQ(released, (std::vector<int>{3, 1, 2}));
  ferry_dlpack_release(nullptr, 3);  // nothing to release
  ferry_dlpack_release(tensors, 0);
  EXPECT_EQ(released.size(), 3u);
  g_released = nullptr;
}

TEST(CApi, NullArgumentsAreInvalidArgumentNamingTheParameter) {
  ferry_sender_t* sender = nullptr;
  Outcome o = take(ferry_sender_create(nullptr, &sender));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(o.message, "ferry_sender_create: args is NULL");
  o = take(ferry_sender_push(nullptr, nullptr, nullptr));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(o.message, "ferry_sender_push: sender is NULL");
  o = take(ferry_receiver_create(nullptr, nullptr));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(o.message, "ferry_receiver_create: out is NULL");
  o = take(ferry_receiver_register_param(nullptr, nullptr));
  EXPECT_EQ(o.message, "ferry_receiver_register_param: receiver is NULL");
}

TEST(CApi, StructSizeZeroIsRefusedWithTheFix) {
  ferry_sender_create_args_t args{};
  ferry_sender_t* sender = nullptr;
  const Outcome o = take(ferry_sender_create(&args, &sender));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(o.message.find("args->struct_size is 0"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("FERRY_STRUCT_SIZE"), std::string::npos) << o.message;
  EXPECT_EQ(sender, nullptr);
}

TEST(CApi, SenderWithoutReceiversIsRefused) {
  ferry_sender_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_sender_create_args_t, commit_timeout_ms);
  ferry_sender_t* sender = nullptr;
  const Outcome o = take(ferry_sender_create(&args, &sender));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(o.message, "ferry_sender_create: no receivers (num_receivers is 0)");
}

TEST(CApi, UnknownConfigKeyNamesTheKey) {
  const char* overrides[] = {"receiver.prot=8000"};
  ferry_config_source_t config{};
  config.struct_size = FERRY_STRUCT_SIZE(ferry_config_source_t, num_overrides);
  config.overrides = overrides;
  config.num_overrides = 1;
  ferry_receiver_t* receiver = nullptr;
  const Outcome o = take(ferry_receiver_create(&config, &receiver));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(o.message.find("receiver.prot"), std::string::npos) << o.message;
  EXPECT_EQ(receiver, nullptr);
}

TEST(CApi, PushRefusesBadTensorsBeforeConnecting) {
  // Nothing listens on port 1: each push below must fail on its arguments, not on the network.
  SenderPtr sender = make_sender({"127.0.0.1:1"});
  ASSERT_NE(sender, nullptr);
  float data[6] = {0, 1, 2, 3, 4, 5};

  ferry_tensor_t bad_dtype = view("w", static_cast<ferry_dtype_t>(99), {2, 3}, data);
  Outcome o = push(sender.get(), {&bad_dtype}, 1);
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(o.message.find("tensor 0 'w': dtype value 99 is not a dtype ferry supports"),
            std::string::npos)
      << o.message;

  const int64_t transposed[] = {1, 2};
  ferry_tensor_t strided = view("w", FERRY_DTYPE_F32, {2, 3}, data, transposed);
  o = push(sender.get(), {&strided}, 1);
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(o.message.find("strides [1, 2] (elements) are not row-major contiguous for shape "
                           "[2, 3]"),
            std::string::npos)
      << o.message;

  ferry_tensor_t a = view("w", FERRY_DTYPE_F32, {2, 3}, data);
  ferry_tensor_t b = view("w", FERRY_DTYPE_F32, {6}, data);
  o = push(sender.get(), {&a, &b}, 1);
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(o.message, "ferry_sender_push: tensor 1 'w': the name appears twice");

  ferry_tensor_t no_data = view("w", FERRY_DTYPE_F32, {2, 3}, nullptr);
  o = push(sender.get(), {&no_data}, 1);
  EXPECT_EQ(o.message, "ferry_sender_push: tensor 0 'w': data is NULL for 24 bytes");

  ferry_tensor_t unnamed = view(nullptr, FERRY_DTYPE_F32, {2, 3}, data);
  o = push(sender.get(), {&unnamed}, 1);
  EXPECT_EQ(o.message, "ferry_sender_push: tensor 0 has no name (name is NULL or empty)");

  // DLPack: complex64 has no ferry dtype; a dimension of extent 1 may have any stride.
  int64_t shape[] = {2, 1, 3};
  int64_t strides[] = {3, 99, 1};
  DLTensor dl{};
  dl.data = data;
  dl.device = {kDLCPU, 0};
  dl.ndim = 3;
  dl.dtype = {kDLComplex, 64, 1};
  dl.shape = shape;
  dl.strides = strides;
  ferry_tensor_t complex_tensor{};
  complex_tensor.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_t, dlpack);
  complex_tensor.name = "c";
  complex_tensor.dlpack = &dl;
  o = push(sender.get(), {&complex_tensor}, 1);
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(o.message.find("DLPack (code 5, bits 64, lanes 1) is not a dtype ferry supports"),
            std::string::npos)
      << o.message;

  dl.device = {kDLVulkan, 0};
  dl.dtype = {kDLFloat, 32, 1};
  o = push(sender.get(), {&complex_tensor}, 1);
  EXPECT_NE(o.message.find("DLPack device type 7 is not supported"), std::string::npos)
      << o.message;
}

// Stream ordering (API 1.3): a bad order is refused before anything connects or waits.
TEST(CApi, PushRefusesBadStreamOrdersBeforeConnecting) {
  SenderPtr sender = make_sender({"127.0.0.1:1"});
  ASSERT_NE(sender, nullptr);
  float data[4] = {1, 2, 3, 4};
  ferry_tensor_t t = view("w", FERRY_DTYPE_F32, {4}, data);
  const ferry_tensor_t* tensors[] = {&t};
  const void* handles[] = {nullptr};
  auto push_with = [&](uint32_t order, size_t num_handles) {
    ferry_push_args_t args{};
    args.struct_size = FERRY_STRUCT_SIZE(ferry_push_args_t, num_order_handles);
    args.tensors = tensors;
    args.num_tensors = 1;
    args.version = 1;
    args.order = order;
    args.order_handles = num_handles > 0 ? handles : nullptr;
    args.num_order_handles = num_handles;
    return take(ferry_sender_push(sender.get(), &args, nullptr));
  };
  Outcome o = push_with(7, 0);
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(o.message.find("stream order 7 is not one of"), std::string::npos) << o.message;
  o = push_with(FERRY_ORDER_STREAMS, 0);
  EXPECT_NE(o.message.find("stream order 'streams' names no stream"), std::string::npos)
      << o.message;
  o = push_with(FERRY_ORDER_SYNC_DEVICES, 1);
  EXPECT_NE(o.message.find("takes no handles, and 1 were given"), std::string::npos) << o.message;
  o = push_with(FERRY_ORDER_EVENTS, 1);
  EXPECT_NE(o.message.find("event 0 is NULL"), std::string::npos) << o.message;
  // A consumer stream on a device that does not exist is named.
  uintptr_t stream = 1;
  o = take(ferry_cuda_consumer_stream(9999, &stream));
  EXPECT_NE(o.code, FERRY_STATUS_OK);
  EXPECT_NE(o.message.find("9999"), std::string::npos) << o.message;
  EXPECT_EQ(stream, 0u);
}

TEST(CApi, LogLevelComesFromTheEnvironmentAndABadOneIsNamed) {
  ::setenv("FERRY_LOG_LEVEL", "chatty", 1);
  ferry_receiver_t* rx = nullptr;
  const Outcome bad = take(ferry_receiver_create(nullptr, &rx));
  ::setenv("FERRY_LOG_LEVEL", "warn", 1);
  const Outcome good = take(ferry_receiver_create(nullptr, &rx));
  ::unsetenv("FERRY_LOG_LEVEL");
  EXPECT_EQ(bad.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(bad.message.find("FERRY_LOG_LEVEL"), std::string::npos) << bad.message;
  EXPECT_NE(bad.message.find("chatty"), std::string::npos) << bad.message;
  EXPECT_EQ(good.code, FERRY_STATUS_OK) << good.message;
  ferry_receiver_destroy(rx);
}

// FERRY_LOG_LEVEL wins over the config's file or text, and the overrides over it
// (docs/config.md, "The log level"); the registry logs each plugin it loads at debug.
TEST(CApi, LogLevelFromTheEnvironmentWinsOverTheConfigTextAndLosesToOverrides) {
  ::setenv("FERRY_LOG_LEVEL", "debug", 1);
  ferry_config_source_t config{};
  config.struct_size = FERRY_STRUCT_SIZE(ferry_config_source_t, num_overrides);
  config.toml_text = "log_level = 'error'\n";
  ferry_receiver_t* rx = nullptr;
  ::testing::internal::CaptureStderr();
  const Outcome from_env = take(ferry_receiver_create(&config, &rx));
  const std::string env_log = ::testing::internal::GetCapturedStderr();
  ferry_receiver_destroy(rx);
  const char* quiet[] = {"log_level=warn"};
  config.overrides = quiet;
  config.num_overrides = 1;
  rx = nullptr;
  ::testing::internal::CaptureStderr();
  const Outcome overridden = take(ferry_receiver_create(&config, &rx));
  const std::string override_log = ::testing::internal::GetCapturedStderr();
  ferry_receiver_destroy(rx);
  ::unsetenv("FERRY_LOG_LEVEL");
  EXPECT_EQ(from_env.code, FERRY_STATUS_OK) << from_env.message;
  EXPECT_NE(env_log.find("[debug]"), std::string::npos) << env_log;
  EXPECT_EQ(overridden.code, FERRY_STATUS_OK) << overridden.message;
  EXPECT_EQ(override_log.find("[debug]"), std::string::npos) << override_log;
}

TEST(CApi, EngineOrderRefusesEventsAndBadValues) {
  ferry_receiver_t* rx = nullptr;
  ASSERT_EQ(take(ferry_receiver_create(nullptr, &rx)).code, FERRY_STATUS_OK);
  int dummy = 0;
  const void* handles[] = {&dummy};
  Outcome o = take(ferry_receiver_set_engine_order(rx, FERRY_ORDER_EVENTS, handles, 1));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(o.message.find("events are recorded once"), std::string::npos) << o.message;
  o = take(ferry_receiver_set_engine_order(rx, 42, nullptr, 0));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(take(ferry_receiver_set_engine_order(rx, FERRY_ORDER_NONE, nullptr, 0)).code,
            FERRY_STATUS_OK);
  ferry_receiver_destroy(rx);
}

TEST(CApi, PushToAnAbsentReceiverReportsItAndDoesNotFail) {
  SenderPtr sender = make_sender({"127.0.0.1:1"});
  ASSERT_NE(sender, nullptr);
  float data[4] = {1, 2, 3, 4};
  ferry_tensor_t t = view("w", FERRY_DTYPE_F32, {4}, data);
  ReportPtr report;
  const Outcome o = push(sender.get(), {&t}, 3, &report);
  ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;
  ASSERT_EQ(ferry_push_report_num_receivers(report.get()), 1u);
  EXPECT_EQ(ferry_push_report_all_committed(report.get()), 0);
  ferry_receiver_result_t r{};
  r.struct_size = FERRY_STRUCT_SIZE(ferry_receiver_result_t, transport);
  ASSERT_EQ(take(ferry_push_report_receiver(report.get(), 0, &r)).code, FERRY_STATUS_OK);
  EXPECT_STREQ(r.address, "127.0.0.1:1");
  EXPECT_EQ(r.committed, 0);
  EXPECT_STRNE(r.error, "");
  const Outcome range = take(ferry_push_report_receiver(report.get(), 1, &r));
  EXPECT_EQ(range.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(range.message, "ferry_push_report_receiver: index 1 is out of range (1 receivers)");
}

TEST(CApi, RegisterRefusesDuplicatesAndLateParameters) {
  ReceiverPtr receiver = make_receiver();
  ASSERT_NE(receiver, nullptr);
  float data[4] = {};
  ferry_tensor_t t = view("w", FERRY_DTYPE_F32, {4}, data);
  ASSERT_EQ(take(ferry_receiver_register_param(receiver.get(), &t)).code, FERRY_STATUS_OK);
  Outcome o = take(ferry_receiver_register_param(receiver.get(), &t));
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(o.message, "ferry_receiver_register_param: parameter 'w' is already registered");

  int32_t port = 0;
  o = take(ferry_receiver_serve(receiver.get(), "127.0.0.1", 0, &port));
  ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;
  EXPECT_GT(port, 0);
  o = take(ferry_receiver_serve(receiver.get(), "127.0.0.1", 0, nullptr));
  EXPECT_EQ(o.code, FERRY_STATUS_FAILED_PRECONDITION);
  ferry_tensor_t late = view("late", FERRY_DTYPE_F32, {4}, data);
  o = take(ferry_receiver_register_param(receiver.get(), &late));
  EXPECT_EQ(o.code, FERRY_STATUS_FAILED_PRECONDITION);
  EXPECT_NE(o.message.find("register every parameter before serving"), std::string::npos);

  uint64_t number = 99;
  char* label = nullptr;
  ASSERT_EQ(take(ferry_receiver_version(receiver.get(), &number, &label)).code, FERRY_STATUS_OK);
  EXPECT_EQ(number, 0u);
  ferry_string_free(label);
}

TEST(CApi, ReleaseNamesAnUnknownTag) {
  ReceiverPtr receiver = make_receiver();
  ASSERT_NE(receiver, nullptr);
  const char* tags[] = {"nope"};
  // Before any parameter exists there is nothing to release at all.
  Outcome o = take(ferry_receiver_release(receiver.get(), tags, 1));
  EXPECT_EQ(o.code, FERRY_STATUS_FAILED_PRECONDITION) << o.message;
  float data[4] = {};
  ferry_tensor_t t = view("w", FERRY_DTYPE_F32, {4}, data);
  ASSERT_EQ(take(ferry_receiver_register_param(receiver.get(), &t)).code, FERRY_STATUS_OK);
  ASSERT_EQ(take(ferry_receiver_serve(receiver.get(), "127.0.0.1", 0, nullptr)).code,
            FERRY_STATUS_OK);
  o = take(ferry_receiver_release(receiver.get(), tags, 1));
  EXPECT_EQ(o.code, FERRY_STATUS_NOT_FOUND);
  EXPECT_NE(o.message.find("'nope'"), std::string::npos) << o.message;
  const Outcome empty = take(ferry_receiver_release(receiver.get(), nullptr, 1));
  EXPECT_EQ(empty.message, "ferry_receiver_release: tags is NULL with 1 tags");
}

// An engine around an embedded receiver (API 1.4): each callback logs what it was asked into the
// object its user_data points at, and the one named by `fail` returns an error instead.
struct RecordingEngine {
  std::mutex mutex;  // the callbacks run on the control API's threads
  std::vector<std::string> calls;
  std::string fail;

  ferry_error_t* record(const std::string& callback, const std::string& call) {
    const std::lock_guard lock(mutex);
    calls.push_back(call);
    if (callback != fail) return nullptr;
    return ferry_error_create(FERRY_STATUS_OUT_OF_MEMORY,
                              (callback + " refused on purpose").c_str());
  }
  std::vector<std::string> take() {
    const std::lock_guard lock(mutex);
    return std::exchange(calls, {});
  }
};
RecordingEngine& engine_of(void* user_data) {
  return *static_cast<RecordingEngine*>(user_data);
}

ferry_error_t* engine_pause(void* user_data, ferry_pause_mode_t mode, uint64_t* num_paused) {
  static const char* const kModes[] = {"abort", "retract", "in_place"};
  *num_paused = 5;
  return engine_of(user_data).record("pause", std::string("pause:") + kModes[mode]);
}
ferry_error_t* engine_resume(void* user_data, int torch_empty_cache) {
  return engine_of(user_data).record("resume", "resume:" + std::to_string(torch_empty_cache));
}
ferry_error_t* engine_flush_cache(void* user_data, int torch_empty_cache) {
  return engine_of(user_data).record("flush_cache",
                                     "flush_cache:" + std::to_string(torch_empty_cache));
}
ferry_error_t* engine_post_load(void* user_data) {
  return engine_of(user_data).record("post_load", "post_load");
}
ferry_error_t* engine_memory(void* user_data, const char* const* tags, size_t num_tags,
                             int release) {
  std::string call = "memory:";
  for (size_t i = 0; i < num_tags; ++i) call += tags[i];
  return engine_of(user_data).record("memory", call + (release != 0 ? ":release" : ":resume"));
}

// A POST to the control API of a receiver served on 127.0.0.1:port: the status and JSON answer.
struct Answer {
  int status = 0;
  nlohmann::json body;
};
Answer post(int port, const std::string& path,
            const nlohmann::json& body = nlohmann::json::object()) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30, 0);
  const auto res = client.Post(path, body.dump(), "application/json");
  if (!res) return {0, nlohmann::json{{"message", httplib::to_string(res.error())}}};
  return {res->status, nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false)};
}

// SGLang's engine routes reach the C callbacks with the engine's user_data, and a callback's
// error is the route's answer: its code and message (docs/c-api.md, "Engine callbacks").
TEST(CApi, EngineCallbacksRunWithTheirUserDataAndAFailureIsTheRoutesAnswer) {
  RecordingEngine engine;  // outlives the receiver, as user_data must
  ReceiverPtr receiver = make_receiver();
  ASSERT_NE(receiver, nullptr);
  float data[4] = {};
  ferry_tensor_t t = view("w", FERRY_DTYPE_F32, {4}, data);
  ASSERT_EQ(take(ferry_receiver_register_param(receiver.get(), &t)).code, FERRY_STATUS_OK);
  const char* tags[] = {"kv_cache"};
  ferry_engine_callbacks_t cb{};
  cb.struct_size = FERRY_STRUCT_SIZE(ferry_engine_callbacks_t, num_memory_tags);
  cb.user_data = &engine;
  cb.pause = engine_pause;
  cb.resume = engine_resume;
  cb.flush_cache = engine_flush_cache;
  cb.post_load = engine_post_load;
  cb.memory = engine_memory;
  cb.memory_tags = tags;
  cb.num_memory_tags = 1;
  Outcome o = take(ferry_receiver_set_engine_callbacks(receiver.get(), &cb));
  ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;
  int32_t port = 0;
  o = take(ferry_receiver_serve(receiver.get(), "127.0.0.1", 0, &port));
  ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;

  Answer a = post(port, "/pause_generation", {{"mode", "retract"}});
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.body["num_paused_requests"], 5);
  for (const char* path : {"/flush_cache", "/begin_weight_update", "/end_weight_update"}) {
    a = post(port, path);
    EXPECT_EQ(a.status, 200) << path << ": " << a.body;
  }
  a = post(port, "/continue_generation", {{"torch_empty_cache", false}});
  EXPECT_EQ(a.status, 200) << a.body;
  for (const char* path : {"/release_memory_occupation", "/resume_memory_occupation"}) {
    a = post(port, path, {{"tags", {"kv_cache"}}});
    EXPECT_EQ(a.status, 200) << path << ": " << a.body;
  }
  EXPECT_EQ(engine.take(),
            (std::vector<std::string>{"pause:retract", "flush_cache:0", "post_load", "resume:0",
                                      "memory:kv_cache:release", "memory:kv_cache:resume"}));

  engine.fail = "flush_cache";
  a = post(port, "/flush_cache");
  EXPECT_EQ(a.status, 507) << a.body;  // OUT_OF_MEMORY, the callback's code
  EXPECT_EQ(a.body["code"], "OUT_OF_MEMORY") << a.body;
  EXPECT_NE(a.body["message"].get<std::string>().find("flush_cache refused on purpose"),
            std::string::npos)
      << a.body;
  engine.fail = "post_load";
  ASSERT_EQ(post(port, "/begin_weight_update").status, 200);
  a = post(port, "/end_weight_update");
  EXPECT_EQ(a.status, 507) << a.body;
  EXPECT_NE(a.body["message"].get<std::string>().find("post_load refused on purpose"),
            std::string::npos)
      << a.body;
  EXPECT_EQ(engine.take(), (std::vector<std::string>{"flush_cache:0", "post_load"}));

  // NULL removes them: the routes are answered as `ferry serve` answers them.
  o = take(ferry_receiver_set_engine_callbacks(receiver.get(), nullptr));
  ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;
  a = post(port, "/pause_generation");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.body["num_paused_requests"], 0);
  EXPECT_EQ(post(port, "/continue_generation").status, 200);
  EXPECT_TRUE(engine.take().empty());
}

TEST(CApi, AbortWithoutARunningPushIsANoOp) {
  SenderPtr sender = make_sender({"127.0.0.1:1"});
  ASSERT_NE(sender, nullptr);
  EXPECT_EQ(take(ferry_sender_abort(sender.get(), "test")).code, FERRY_STATUS_OK);
  EXPECT_EQ(take(ferry_sender_abort(sender.get(), nullptr)).code, FERRY_STATUS_OK);
}

TEST(CApi, RoundTripIntoTwoEmbeddedReceiversIsBitIdentical) {
  ReceiverProcess first, second;
  SenderPtr sender = make_sender({first.address(), second.address()});
  ASSERT_NE(sender, nullptr);

  // Version 1 as plain views.
  SenderTensors v1(1);
  std::vector<ferry_tensor_t> views;
  for (size_t i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) {
    views.push_back(view(kCapiTestTensors[i].name, kCapiTestTensors[i].dtype, v1.shapes[i],
                         v1.bytes[i].data()));
  }
  std::vector<const ferry_tensor_t*> pointers;
  for (const auto& t : views) pointers.push_back(&t);
  ReportPtr report;
  Outcome o = push(sender.get(), pointers, 1, &report);
  ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;
  expect_committed(report.get(), 2, /*reused=*/0);
  EXPECT_EQ(ferry_push_report_version(report.get()), 1u);
  EXPECT_EQ(first.check(1), "OK");
  EXPECT_EQ(second.check(1), "OK");

  // Version 2 as DLPack tensors (the dtypes spelled the DLPack way).
  SenderTensors v2(2);
  std::vector<DLTensor> dls(CAPI_TEST_NUM_TENSORS);
  std::vector<ferry_tensor_t> named(CAPI_TEST_NUM_TENSORS);
  pointers.clear();
  for (size_t i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) {
    const capi_test_tensor_t& t = kCapiTestTensors[i];
    DLTensor& dl = dls[i];
    dl = DLTensor{};
    dl.data = v2.bytes[i].data();
    dl.device = {kDLCPU, 0};
    dl.ndim = static_cast<int32_t>(t.ndim);
    dl.shape = v2.shapes[i].data();
    switch (t.dtype) {
      case FERRY_DTYPE_F32: dl.dtype = {kDLFloat, 32, 1}; break;
      case FERRY_DTYPE_BF16: dl.dtype = {kDLBfloat, 16, 1}; break;
      case FERRY_DTYPE_F16: dl.dtype = {kDLFloat, 16, 1}; break;
      case FERRY_DTYPE_I8: dl.dtype = {kDLInt, 8, 1}; break;
      case FERRY_DTYPE_I64: dl.dtype = {kDLInt, 64, 1}; break;
      default: dl.dtype = {kDLUInt, 8, 1}; break;
    }
    named[i] = ferry_tensor_t{};
    named[i].struct_size = FERRY_STRUCT_SIZE(ferry_tensor_t, dlpack);
    named[i].name = t.name;
    named[i].dlpack = &dl;
    pointers.push_back(&named[i]);
  }
  o = push(sender.get(), pointers, 2, &report);
  ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;
  expect_committed(report.get(), 2, /*reused=*/1);  // the same tensors: the kept sessions
  EXPECT_EQ(first.check(2), "OK");
  EXPECT_EQ(second.check(2), "OK");

  ferry_push_report_t* status = nullptr;
  ASSERT_EQ(take(ferry_sender_status(sender.get(), &status)).code, FERRY_STATUS_OK);
  EXPECT_EQ(ferry_push_report_all_committed(status), 1);
  ferry_push_report_free(status);
}

// The first receiver's outcome: committed, and its error text.
std::pair<bool, std::string> first_outcome(const ferry_push_report_t* report) {
  ferry_receiver_result_t r{};
  r.struct_size = FERRY_STRUCT_SIZE(ferry_receiver_result_t, reused_session);
  if (take(ferry_push_report_receiver(report, 0, &r)).code != FERRY_STATUS_OK) return {false, ""};
  return {r.committed == 1, r.error != nullptr ? r.error : ""};
}

// A push whose descriptions are byte for byte the last push's reuses what was read of them (an
// RL trainer pushes the same tensors every step through the same array): every change the
// caller makes is still seen, also one made in place in the buffers the descriptions point to
// (a name's characters, a shape's extents), never a stale description.
TEST(CApi, APushOfTheSameDescriptionsSeesEveryChangeToThem) {
  ReceiverProcess receiver;
  SenderPtr sender = make_sender({receiver.address()});
  ASSERT_NE(sender, nullptr);
  SenderTensors tensors(1);
  std::vector<std::string> names;
  for (size_t i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) names.emplace_back(kCapiTestTensors[i].name);
  std::vector<ferry_tensor_t> views;
  for (size_t i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) {
    views.push_back(view(names[i].data(), kCapiTestTensors[i].dtype, tensors.shapes[i],
                         tensors.bytes[i].data()));
    views.back().shape = tensors.shapes[i].data();  // the caller's own arrays
  }
  std::vector<const ferry_tensor_t*> pointers;
  for (const auto& t : views) pointers.push_back(&t);
  ReportPtr report;
  auto push_ok = [&](uint64_t version) {
    const Outcome o = push(sender.get(), pointers, version, &report);
    ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;
    expect_committed(report.get(), 1);
    EXPECT_EQ(receiver.check(version), "OK") << "version " << version;
  };
  push_ok(1);
  // The same descriptions, new values in the same memory.
  for (size_t i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) capi_test_fill(tensors.bytes[i].data(), i, 2);
  push_ok(2);
  // The same descriptions, other memory (a description changed).
  SenderTensors moved(3);
  for (size_t i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) views[i].data = moved.bytes[i].data();
  push_ok(3);
  // A name changed in its buffer: the new name is what the receiver is sent (and refuses).
  names[0][0] = 'X';
  Outcome o = push(sender.get(), pointers, 4, &report);
  ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;
  auto [committed, error] = first_outcome(report.get());
  EXPECT_FALSE(committed);
  EXPECT_NE(error.find("Xmbed.weight"), std::string::npos) << error;
  names[0][0] = 'e';
  // An extent changed in its array: the new shape is what is sent (and refused).
  tensors.shapes[0][0] += 1;
  moved.bytes[0].resize(moved.bytes[0].size() * 2);  // room for the larger shape's bytes
  views[0].data = moved.bytes[0].data();
  o = push(sender.get(), pointers, 4, &report);
  ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;
  std::tie(committed, error) = first_outcome(report.get());
  EXPECT_FALSE(committed);
  EXPECT_NE(error.find("embed.weight"), std::string::npos) << error;
  tensors.shapes[0][0] -= 1;
  capi_test_fill(moved.bytes[0].data(), 0, 4);
  for (size_t i = 1; i < CAPI_TEST_NUM_TENSORS; ++i) capi_test_fill(moved.bytes[i].data(), i, 4);
  push_ok(4);
  // A duplicate name made in place is refused as at a first push.
  std::snprintf(names[1].data(), names[1].size() + 1, "%s", names[0].c_str());
  o = push(sender.get(), pointers, 5, &report);
  EXPECT_EQ(o.code, FERRY_STATUS_INVALID_ARGUMENT) << o.message;
  EXPECT_NE(o.message.find("appears twice"), std::string::npos) << o.message;
}

// An engine whose allocator lends its weights' memory (torch_memory_saver style) tells ferry
// before it unmaps and after it maps new memory at the same addresses: the trainer's kept session
// is suspended (nothing writes the inaccessible mapping: a write would kill the engine), the
// weights come back from ferry's host mirror at the resume, and the next push rejoins the session.
TEST(CApi, AnEngineThatRemapsItsWeightsTellsFerryAndTheKeptSessionRejoins) {
  ReceiverProcess engine;
  SenderPtr sender = make_sender({engine.address()});
  ASSERT_NE(sender, nullptr);
  std::vector<std::unique_ptr<SenderTensors>> versions;
  const auto push_version = [&](uint64_t version, ReportPtr* report) {
    versions.push_back(std::make_unique<SenderTensors>(version));
    std::vector<ferry_tensor_t> views;
    for (size_t i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) {
      views.push_back(view(kCapiTestTensors[i].name, kCapiTestTensors[i].dtype,
                           versions.back()->shapes[i], versions.back()->bytes[i].data()));
    }
    std::vector<const ferry_tensor_t*> pointers;
    for (const auto& t : views) pointers.push_back(&t);
    return push(sender.get(), pointers, version, report);
  };
  ReportPtr report;
  ASSERT_EQ(push_version(1, &report).code, FERRY_STATUS_OK);
  expect_committed(report.get(), 1, /*reused=*/0);
  ASSERT_EQ(engine.check(1), "OK");
  for (uint64_t v = 2; v <= 4; ++v) {
    ASSERT_EQ(engine.command("release"), "OK");
    ASSERT_EQ(engine.command("resume"), "OK");
    EXPECT_EQ(engine.check(v - 1), "OK") << "the weights were not restored into the new memory";
    const Outcome o = push_version(v, &report);
    ASSERT_EQ(o.code, FERRY_STATUS_OK) << o.message;
    expect_committed(report.get(), 1, /*reused=*/1);
    EXPECT_EQ(engine.check(v), "OK");
  }
  // A push while the weights are lent is refused, naming why, and touches nothing.
  ASSERT_EQ(engine.command("release"), "OK");
  const Outcome refused = push_version(5, &report);
  EXPECT_EQ(refused.code, FERRY_STATUS_OK) << refused.message;  // the report carries the failure
  ASSERT_NE(report, nullptr);
  ferry_receiver_result_t r{};
  r.struct_size = FERRY_STRUCT_SIZE(ferry_receiver_result_t, reused_session);
  ASSERT_EQ(take(ferry_push_report_receiver(report.get(), 0, &r)).code, FERRY_STATUS_OK);
  EXPECT_EQ(r.committed, 0);
  EXPECT_NE(std::string(r.error == nullptr ? "" : r.error).find("released"), std::string::npos)
      << (r.error == nullptr ? "" : r.error);
  ASSERT_EQ(engine.command("resume"), "OK");
  EXPECT_EQ(engine.check(4), "OK");
  ASSERT_EQ(push_version(6, &report).code, FERRY_STATUS_OK);
  expect_committed(report.get(), 1);
  EXPECT_EQ(engine.check(6), "OK");
}

}  // namespace
