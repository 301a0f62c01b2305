// capi/push_report.hpp: the ferry_push_report_t handle: an immutable copy of one push's outcome
// per receiver, owning the strings the C accessors hand out.
#pragma once

#include <ferry/ferry.h>

#include <cstdint>
#include <string>
#include <vector>

struct ferry_push_report {
  struct Receiver {
    std::string address;
    bool committed = false;
    std::string error;
    std::uint64_t bytes = 0;
    std::uint64_t buckets = 0;
    double seconds = 0;
    std::string transport;
    bool direct = false;
    bool writer_fingerprints = false;
    bool reused_session = false;
    std::vector<std::uint64_t> rank_bytes;  // a sharded push's bytes moved per rank
    std::uint64_t needed_bytes = 0;
    bool reads_in_place = false;
  };
  std::uint64_t version = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
  double producer_wait_seconds = 0;
  std::vector<Receiver> receivers;
};
