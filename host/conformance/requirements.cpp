// conformance/requirements.cpp: the numbered requirements every plugin must meet. The same
// numbers and wording are in docs/plugin-abi.md; change both together.
#include "conformance/conformance.hpp"

namespace ferry::conformance {

const std::vector<Requirement>& requirements() {
  static const std::vector<Requirement> kRequirements = {
      {"FERRY-ABI-1",
       "The file is a loadable ELF shared object that exports ferry_plugin_negotiate."},
      {"FERRY-ABI-2",
       "ferry_plugin_negotiate accepts a host of its own ABI major and answers every field: "
       "ABI major equal to the host's, minor not older than the host's minimum, a known kind, "
       "and non-NULL name, version and api."},
      {"FERRY-ABI-3",
       "ferry_plugin_negotiate refuses a host of another ABI major with an INCOMPATIBLE error "
       "object made through the host's error_new, with a non-empty message."},
      {"FERRY-ABI-4",
       "The kind and name the plugin reports equal those of its file name "
       "(libferry_transport_<name>.so / libferry_model_<name>.so, name in [a-z0-9_-])."},
      {"FERRY-ABI-5",
       "The function table's struct_size covers every required function, every required "
       "function is non-NULL, and every non-NULL function points into loaded code."},
      {"FERRY-ABI-6",
       "Failures are error objects made through the host's error_new with the right code and a "
       "message: create with an unknown option fails with INVALID_ARGUMENT naming the key (model "
       "plugins: also tp_size = 0 fails with INVALID_ARGUMENT)."},
      {"FERRY-ABI-7",
       "Transport get_caps writes nothing past caps->struct_size, sets only known flag and "
       "memory-kind bits, declares a topology (point-to-point, broadcast or source) and a memory "
       "kind, and provides the functions each flag needs (DIRECT_WRITE: register_memory, "
       "pack_key, put, flush; PUT_FINGERPRINT and PUT_DEFERRED: DIRECT_WRITE; PUT_CHUNK_HASHES: "
       "PUT_FINGERPRINT; put_many: "
       "PUT_DEFERRED; ASYNC: request_test, request_wait, request_free; SOURCE: "
       "source_open, source_catalog, source_read, source_close; POINT_TO_POINT/BROADCAST: "
       "get_address, connect, disconnect, send_bucket or recv_bucket)."},
      {"FERRY-ABI-8",
       "Optional functions come in usable sets, a NULL one meaning only 'not implemented': "
       "connect with disconnect and get_address, register_memory with deregister_memory, "
       "pack_key with register_memory, send_bucket/recv_bucket/put/flush with connect, "
       "put_many and prepare_puts with put, map_peer_memory with pack_key, "
       "alloc_memory with deregister_memory, "
       "request_test/request_wait with request_free, source_catalog/source_read with "
       "source_open and source_close."},
      {"FERRY-ABI-9",
       "The dynamic symbol table defines no global function or object other than "
       "ferry_plugin_negotiate (link with the version script ferry_plugin.map)."},
      {"FERRY-ABI-10",
       "Negotiation honours struct_size: given a negotiation struct too short to hold the "
       "answer, the plugin writes nothing past struct_size and refuses with an error; "
       "negotiating again gives the same answer."},
      {"FERRY-ABI-11",
       "create with default arguments (transport: receiver, no options, device -1; model: "
       "layout \"hf\", tp and ep size 1, no config) either succeeds and destroy then releases the "
       "instance, or fails with a well-formed error object."},
      {"FERRY-ABI-12",
       "A point-to-point transport moves bytes between a loopback pair of instances connected "
       "in the host's order (the receiver connects to the sender's address first): with "
       "DIRECT_WRITE, put + flush land exactly the bytes given at the offset given; with "
       "send_bucket/recv_bucket, a bucket sent into a posted receive arrives intact; nothing "
       "outside a registered range or past a bucket is read or written (guard pages follow "
       "every range)."},
      {"FERRY-ABI-13",
       "Deadlines and abort hold: an idle flush completes, a receive with nothing sent ends "
       "with TIMEOUT by its deadline, and abort from another thread ends a waiting receive "
       "with ABORTED; no call outlives its deadline by more than 3 s."},
      {"FERRY-ABI-14",
       "Instances are independent and thread-safe as plugin.h says: create and destroy run on 8 "
       "threads at once, and 4 loopback pairs move buckets at once, one thread each, every "
       "bucket arriving intact at its own receiver."},
  };
  return kRequirements;
}

const char* outcome_name(Outcome outcome) noexcept {
  switch (outcome) {
    case Outcome::kPass:
      return "PASS";
    case Outcome::kFail:
      return "FAIL";
    case Outcome::kSkipped:
      return "SKIP";
    case Outcome::kNotApplicable:
      return "N/A";
  }
  return "?";
}

}  // namespace ferry::conformance
