// capi/stream_order.cpp: ferry_cuda_consumer_stream: the stream a DLPack consumer hands producers
// (order/stream_order.hpp; the push and receiver fields that use it are in sender.cpp and
// receiver.cpp).
#include <ferry/ferry.h>

#include "capi/capi_boundary.hpp"
#include "order/stream_order.hpp"

extern "C" {

FERRY_API ferry_error_t* ferry_cuda_consumer_stream(int32_t device, uintptr_t* stream) {
  static constexpr const char* kFn = "ferry_cuda_consumer_stream";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(stream, kFn, "stream");
    *stream = 0;
    *stream = ferry::order::consumer_stream(device);
  });
}

}  // extern "C"
