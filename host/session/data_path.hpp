// session/data_path.hpp: how bucket bytes move between a sender and one receiver during a session.
// Two kinds: "inline" (the bytes follow their BucketReady on the session socket itself; always
// available, the fallback) and a transport plugin (e.g. "ucx": put+flush into the receiver's
// registered staging slots where RMA is native, or a send into a receive the receiver posted where
// it is emulated). The session code (sender.cpp, receiver_session.cpp) drives both the same way:
//
//   receiver: slots registered -> Welcome carries address + slot keys -> connect(sender address)
//             -> per bucket: post(slot) [emulated RMA] ... receive(slot) -> apply -> Ack
//   sender:   connect(receiver address, keys) -> per bucket: pack into slot -> deliver(slot)
//             -> BucketReady -> after_header(slot) [inline: the data frame]
//
// Threading: one session thread drives each object; abort() may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "session/channel.hpp"

namespace ferry::config {
struct Config;
}
namespace ferry::registry {
class Registry;
}

namespace ferry::session {

// Staging memory aligned to 256 bytes (what manifests and kernels expect).
class SlotBuffer {
 public:
  explicit SlotBuffer(std::uint64_t capacity);
  std::span<std::byte> bytes() const noexcept { return bytes_; }

 private:
  std::unique_ptr<std::byte[]> storage_;
  std::span<std::byte> bytes_;
};

class ReceiverDataPath {
 public:
  virtual ~ReceiverDataPath() = default;
  virtual std::string name() const = 0;
  virtual std::size_t slot_count() const = 0;
  virtual std::span<std::byte> slot(std::uint32_t index) = 0;
  // The rendezvous blob of this side (empty for inline) and the packed remote key of a slot.
  virtual std::vector<std::uint8_t> address() { return {}; }
  virtual std::vector<std::uint8_t> slot_key(std::uint32_t) { return {}; }
  // True when slot keys are given (the sender may write slots by put+flush).
  virtual bool rma_native() const { return false; }
  // From the Begin: true when buckets arrive by put+flush before their BucketReady; false when
  // by a send into a receive this side posts (post()).
  virtual void set_via_put(bool /*via_put*/) {}
  virtual void connect(std::span<const std::uint8_t> /*sender_address*/,
                       const std::string& /*peer*/, Clock::time_point /*deadline*/) {}
  // Emulated RMA: posts the receive of bucket `bucket_index` into `slot` (the slot is free).
  virtual void post(std::uint32_t /*slot*/, std::uint32_t /*bucket_index*/,
                    Clock::time_point /*deadline*/) {}
  // Makes the `bytes` bytes of bucket `bucket_index` present in `slot` (inline: reads the data
  // frame that follows the header from `channel`; plugins: waits for the posted receive).
  virtual void receive(Channel& channel, std::uint32_t slot, std::uint32_t bucket_index,
                       std::uint64_t bytes, bool data_follows, Clock::time_point deadline,
                       const std::string& phase) = 0;
  virtual void abort(const std::string& /*reason*/) noexcept {}
};

class SenderDataPath {
 public:
  virtual ~SenderDataPath() = default;
  virtual std::string name() const = 0;
  virtual std::size_t slot_count() const = 0;
  // Local memory the sender packs bucket `slot` into (registered with the transport).
  virtual std::span<std::byte> slot(std::uint32_t index) = 0;
  virtual std::vector<std::uint8_t> address() { return {}; }
  // After the Welcome: the receiver's address and slot keys (empty when it offers no RMA).
  // Decides whether buckets go by put+flush (uses_put()) or by send.
  virtual void connect(std::span<const std::uint8_t> /*receiver_address*/,
                       const std::vector<std::vector<std::uint8_t>>& /*slot_keys*/,
                       bool /*rma_native*/, const std::string& /*peer*/,
                       Clock::time_point /*deadline*/) {}
  virtual bool uses_put() const { return false; }
  // Moves `bytes` bytes of local slot `slot` into the receiver's slot `slot` (complete and
  // visible when it returns), before the BucketReady is sent. Inline: nothing.
  virtual void deliver(std::uint32_t /*slot*/, std::uint32_t /*bucket_index*/,
                       std::uint64_t /*bytes*/, Clock::time_point /*deadline*/,
                       const std::string& /*phase*/) {}
  // True when the bytes follow the BucketReady on the session socket.
  virtual bool data_follows() const { return false; }
  virtual void after_header(Channel& /*channel*/, std::uint32_t /*slot*/, std::uint64_t /*bytes*/,
                            Clock::time_point /*deadline*/, const std::string& /*phase*/) {}
  virtual void abort(const std::string& /*reason*/) noexcept {}
};

std::unique_ptr<ReceiverDataPath> make_inline_receiver_path(std::uint64_t capacity,
                                                            std::size_t slots);
std::unique_ptr<SenderDataPath> make_inline_sender_path(std::uint64_t capacity, std::size_t slots);

// Transport plugins (data_path_plugin.cpp). `name` is the plugin's name ("ucx"). Throw
// ferry::Error when the plugin cannot be loaded or set up (the caller may fall back to inline).
std::unique_ptr<ReceiverDataPath> make_plugin_receiver_path(const registry::Registry& registry,
                                                            const config::Config& config,
                                                            const std::string& name,
                                                            std::uint64_t capacity,
                                                            std::size_t slots);
std::unique_ptr<SenderDataPath> make_plugin_sender_path(const registry::Registry& registry,
                                                        const config::Config& config,
                                                        const std::string& name,
                                                        std::uint64_t capacity, std::size_t slots);

}  // namespace ferry::session
