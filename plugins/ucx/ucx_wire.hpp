// ucx/ucx_wire.hpp: the two opaque blobs the UCX transport hands to the host for its control
// channel (the worker address from get_address, the remote key from pack_key): their framing, a
// checksum so that garbage or truncated bytes are refused with a clear error before UCX parses
// them, and the 32-bit stream id both sides derive from the sender's address.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shared_segment.hpp"

namespace ferry::ucx {

// FNV-1a 64-bit: a checksum for framing, not a security measure.
std::uint64_t fnv1a64(std::span<const std::uint8_t> bytes, std::uint64_t seed = 0xcbf29ce484222325ull);

// What get_address publishes about this side.
struct AddressInfo {
  std::uint32_t error_mode = 1;     // the side's option: 0 none, 1 peer, 2 auto (ErrorMode)
  std::uint32_t pid = 0;
  // "<boot_id>/<pid namespace>" (/proc/sys/kernel/random/boot_id, /proc/self/ns/pid): equal on
  // both sides when they share a kernel and can see each other's /proc/<pid>.
  std::string process_space;
  std::string host;                 // host name, for messages
  std::vector<std::uint8_t> worker_address;  // ucp_worker_get_address bytes
};

std::vector<std::uint8_t> encode_address(const AddressInfo& info);
// Throws ferry::Error INVALID_ARGUMENT ("<what>: ...") for anything that is not a complete,
// intact address blob of this format version.
AddressInfo decode_address(std::span<const std::uint8_t> blob, const std::string& what);

// What pack_key publishes about one registered range.
struct KeyInfo {
  std::uint64_t base = 0;  // the registered range in the owner's address space
  std::uint64_t size = 0;
  std::vector<std::uint8_t> packed_rkey;  // ucp_rkey_pack bytes
  // Memory the owner's plugin allocated (alloc_memory): its shared segment, which a peer in the
  // same process space ("<boot_id>/<pid namespace>", as AddressInfo) maps; pid 0: none.
  SegmentId segment;
  std::string process_space;
  std::uint64_t checksum = 0;             // of the whole blob; identifies it in rkey caches
};

std::vector<std::uint8_t> encode_key(const KeyInfo& info);
// Throws ferry::Error INVALID_ARGUMENT as decode_address does.
KeyInfo decode_key(std::span<const std::uint8_t> blob, const std::string& what);

// The upper 32 bits of every tag of a sender->receiver stream: both sides compute it from the
// sender's worker address (the sender from its own, the receiver from the address it connected
// to), so a receiver fed by several senders on one worker never matches the wrong stream.
std::uint32_t stream_id(std::span<const std::uint8_t> sender_worker_address);

}  // namespace ferry::ucx
