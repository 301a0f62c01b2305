// tests/plugins/mock_transport.hpp: the in-memory loopback transport used by tests. Its table is
// shared by the mock plugin's entry and by the deliberately broken plugins, each of which changes
// exactly one thing about it.
#pragma once

#include <ferry/plugin.h>

namespace ferry::test_plugins {

// A conforming transport table: POINT_TO_POINT over process-local queues, host/pinned memory,
// synchronous send/recv. Option "channel" (default: "mock-<n>", one per instance) names the queue
// this instance receives from; get_address returns it, so a sender that connects to that address
// delivers there.
extern const ferry_transport_api_t kMockTransportApi;

}  // namespace ferry::test_plugins
