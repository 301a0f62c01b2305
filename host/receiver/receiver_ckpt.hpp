// receiver/receiver_ckpt.hpp: the receiver's checkpoint-engine update (SGLang's
// /update_weights_from_ipc): the request (parsed by control/requests.hpp) and one update
// received from an unmodified checkpoint-engine ParameterServer through the ckpt_engine
// transport plugin (ZMQ + CUDA IPC, plugins/ckpt_engine/PROTOCOL.md), applied as one
// transaction.
//
// Threading: any thread; the receiver's update lock serializes updates (a second concurrent
// update is FAILED_PRECONDITION). Without CUDA (or on a CPU receiver) the update is refused with
// UNIMPLEMENTED / FAILED_PRECONDITION before the ParameterServer is contacted.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "receiver/engine_control.hpp"
#include "receiver/receiver.hpp"

namespace ferry::receiver {

struct IpcUpdateRequest {
  std::map<std::string, std::string> zmq_handles;  // GPU UUID -> the ParameterServer's address
  UpdateEffects effects;  // SGLang's fields around the update (control/engine routes run them)
  std::optional<std::string> weight_version;
  // ferry's optional field: the longest wait for any one message of the ParameterServer
  // (default: the transport option receive_timeout_s, else 120 s).
  std::optional<double> timeout_s;
};

// Where the buckets of one checkpoint-engine update come from: the transport plugin in
// production (update_weights_from_ipc), the worker loop with host memory in tests.
class CkptBucketSource {
 public:
  virtual ~CkptBucketSource() = default;
  // Receives and opens the sender's shared buffer; returns the largest bucket it can send.
  virtual std::uint64_t open() = 0;
  // The next bucket into dst[0, capacity): false at the sender's end signal.
  virtual bool read(void* dst, std::uint64_t capacity, std::vector<std::uint8_t>& manifest,
                    std::uint64_t& bytes) = 0;
  // The update failed: the sender is told `reason` instead of success.
  virtual void fail(const std::string& reason) noexcept = 0;
  // Gives the final answer (success unless fail() was called) and ends the exchange.
  virtual void close() noexcept = 0;
};

// Staging memory for the buckets: called once per update with the sender's largest bucket size;
// returns memory of `kind` (FERRY_MEMORY_CUDA: the parameters' device) valid until the update
// returns. The default allocates host memory.
struct CkptStaging {
  std::function<void*(std::uint64_t bytes)> allocate;
  ferry_memory_kind_t kind = FERRY_MEMORY_HOST;
};

// Runs one update from `source` into `receiver`. The receiver must have a layout (a loaded model
// or registered parameters): checkpoint-engine names no tensors before it sends them. Any failure
// aborts the update (the published version stays), tells the sender, and throws an Error naming
// the phase (and bucket).
UpdateReport apply_ckpt_engine_update(Receiver& receiver, CkptBucketSource& source,
                                      const std::optional<std::string>& label,
                                      const CkptStaging& staging = {});

// The whole operation on a CUDA receiver: picks the address of the receiver's GPU (by UUID) from
// request.zmq_handles, loads the ckpt_engine transport, allocates device staging for the
// sender's bucket size and runs apply_ckpt_engine_update.
UpdateReport update_weights_from_ipc(Receiver& receiver, const IpcUpdateRequest& request);

}  // namespace ferry::receiver
