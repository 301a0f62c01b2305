// capi/push_report.cpp: accessors of ferry_push_report_t (see ferry/ferry.h).
#include "capi/push_report.hpp"

#include <algorithm>

#include "capi/capi_boundary.hpp"

extern "C" {

FERRY_API uint64_t ferry_push_report_version(const ferry_push_report_t* report) {
  return report != nullptr ? report->version : 0;
}

FERRY_API uint64_t ferry_push_report_bytes(const ferry_push_report_t* report) {
  return report != nullptr ? report->bytes : 0;
}

FERRY_API double ferry_push_report_seconds(const ferry_push_report_t* report) {
  return report != nullptr ? report->seconds : 0.0;
}

FERRY_API double ferry_push_report_producer_wait_seconds(const ferry_push_report_t* report) {
  return report != nullptr ? report->producer_wait_seconds : 0.0;
}

FERRY_API int ferry_push_report_all_committed(const ferry_push_report_t* report) {
  if (report == nullptr || report->receivers.empty()) return 0;
  return std::all_of(report->receivers.begin(), report->receivers.end(),
                     [](const auto& r) { return r.committed; })
             ? 1
             : 0;
}

FERRY_API size_t ferry_push_report_num_receivers(const ferry_push_report_t* report) {
  return report != nullptr ? report->receivers.size() : 0;
}

FERRY_API ferry_error_t* ferry_push_report_receiver(const ferry_push_report_t* report,
                                                    size_t index, ferry_receiver_result_t* out) {
  static constexpr const char* kFn = "ferry_push_report_receiver";
  return ferry::capi::guard(kFn, [&] {
    ferry::capi::require(report, kFn, "report");
    if (index >= report->receivers.size()) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: index {} is out of range ({} receivers)",
                  kFn, index, report->receivers.size());
    }
    const auto& r = report->receivers[index];
    ferry_receiver_result_t value{};
    value.struct_size = FERRY_STRUCT_SIZE(ferry_receiver_result_t, reads_in_place);
    value.address = r.address.c_str();
    value.committed = r.committed ? 1 : 0;
    value.error = r.error.c_str();
    value.bytes = r.bytes;
    value.buckets = r.buckets;
    value.seconds = r.seconds;
    value.transport = r.transport.c_str();
    value.direct = r.direct ? 1 : 0;
    value.writer_fingerprints = r.writer_fingerprints ? 1 : 0;
    value.reused_session = r.reused_session ? 1 : 0;
    value.needed_bytes = r.needed_bytes;
    value.num_ranks = r.rank_bytes.size();
    value.rank_bytes = r.rank_bytes.empty() ? nullptr : r.rank_bytes.data();
    value.reads_in_place = r.reads_in_place ? 1 : 0;
    ferry::capi::write_struct(out, value, kFn, "out");
  });
}

FERRY_API void ferry_push_report_free(ferry_push_report_t* report) { delete report; }

}  // extern "C"
