// ckpt_engine/ckpt_engine_transport.hpp: one instance of the checkpoint-engine transport (its
// options and the sources open on it, so abort() reaches them) and one update as a source of
// buckets (the worker on its REP socket): the objects behind the opaque handles, with the methods
// of the SDK's source group (ferry/sdk/transport_plugin.hpp; README.md says what each does on
// the wire).
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/transport_plugin.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ckpt_engine/zmq_worker.hpp"

struct ferry_transport {
  // Parses the options ([transport.ckpt_engine]); INVALID_ARGUMENT naming a bad one,
  // UNIMPLEMENTED for the sender role (the sender is checkpoint-engine's ParameterServer).
  explicit ferry_transport(const ferry_transport_create_args_t& args);

  // Connects to the ParameterServer's ZMQ address `uri`.
  std::unique_ptr<ferry_source> source_open(const char* uri);
  // Any thread: every open source is abandoned with `reason` (NULL or empty: "aborted by the
  // host"), and so is every source opened later.
  void abort(const char* reason) noexcept;

  int device = 0;
  ferry::ckpt_engine::ZmqWorkerOptions options;
  std::mutex mutex;
  std::set<ferry_source*> sources;  // guarded by mutex
  std::string abort_reason;         // guarded by mutex; set once abort() was called
};

// One update: the worker on its REP socket. Closed before its transport is destroyed.
struct ferry_source {
  // Answers the sender's last message: empty (success) when the host did not call abort(), the
  // abort reason otherwise (also when the update did not reach the sender's final None).
  ~ferry_source();

  // The protocol names no tensors in advance: the "catalog" is empty, and its bucket_bytes is the
  // largest bucket the sender can send (half its double buffer), so the host can size its
  // staging. Receiving it receives and opens the IPC handle (the first message).
  std::vector<std::uint8_t> catalog();
  // The next bucket copied into args.dst; END_OF_STREAM once the sender finished.
  ferry::sdk::SourceBucket read(const ferry_source_read_args_t& args);

  ferry_transport* transport = nullptr;
  std::unique_ptr<ferry::ckpt_engine::ZmqWorker> worker;
  bool opened = false;  // source_open succeeded: the transport lists it and the sender is owed
                        // an answer
};
