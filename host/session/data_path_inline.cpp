// The inline data path: bucket bytes travel as a raw frame on the session socket right after
// their BucketReady (see session/data_path.hpp). Always available; the fallback.
#include <ferry/sdk/error.hpp>

#include "session/data_path.hpp"

namespace ferry::session {
namespace {

class InlineReceiverPath final : public ReceiverDataPath {
 public:
  InlineReceiverPath(std::uint64_t capacity, std::size_t slots) {
    for (std::size_t i = 0; i < slots; ++i) slots_.emplace_back(capacity);
  }
  std::string name() const override { return "inline"; }
  std::size_t slot_count() const override { return slots_.size(); }
  std::span<std::byte> slot(std::uint32_t index) override { return slots_.at(index).bytes(); }
  void receive(Channel& channel, std::uint32_t slot, std::uint32_t bucket_index,
               std::uint64_t bytes, bool data_follows, Clock::time_point deadline,
               const std::string& phase) override {
    if (!data_follows) {
      fail(FERRY_STATUS_CORRUPT_DATA,
           "{}: {}: bucket {} announces no data frame, but the data path is inline",
           channel.peer(), phase, bucket_index);
    }
    channel.recv_data(slots_.at(slot).bytes().first(bytes), deadline, phase);
  }

 private:
  std::vector<SlotBuffer> slots_;
};

class InlineSenderPath final : public SenderDataPath {
 public:
  InlineSenderPath(std::uint64_t capacity, std::size_t slots) {
    for (std::size_t i = 0; i < slots; ++i) slots_.emplace_back(capacity);
  }
  std::string name() const override { return "inline"; }
  std::size_t slot_count() const override { return slots_.size(); }
  std::span<std::byte> slot(std::uint32_t index) override { return slots_.at(index).bytes(); }
  bool data_follows() const override { return true; }
  void after_header(Channel& channel, std::uint32_t slot, std::uint64_t bytes,
                    Clock::time_point deadline, const std::string& phase) override {
    channel.send_data(slots_.at(slot).bytes().first(bytes), deadline, phase);
  }

 private:
  std::vector<SlotBuffer> slots_;
};

}  // namespace

SlotBuffer::SlotBuffer(std::uint64_t capacity)
    : storage_(new std::byte[capacity + FERRY_BUCKET_ALIGNMENT]) {
  auto addr = reinterpret_cast<std::uintptr_t>(storage_.get());
  auto aligned = (addr + FERRY_BUCKET_ALIGNMENT - 1) & ~std::uintptr_t{FERRY_BUCKET_ALIGNMENT - 1};
  bytes_ = {storage_.get() + (aligned - addr), capacity};
}

std::unique_ptr<ReceiverDataPath> make_inline_receiver_path(std::uint64_t capacity,
                                                            std::size_t slots) {
  return std::make_unique<InlineReceiverPath>(capacity, slots);
}

std::unique_ptr<SenderDataPath> make_inline_sender_path(std::uint64_t capacity, std::size_t slots) {
  return std::make_unique<InlineSenderPath>(capacity, slots);
}

}  // namespace ferry::session
