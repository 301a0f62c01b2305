// The sender's side of the handshake (see session/sender/handshake.hpp and
// docs/session-protocol.md).
#include "session/sender/handshake.hpp"

#include <unistd.h>
#include <ferry/sdk/error.hpp>

#include "common/log.hpp"

namespace ferry::session {
namespace {

const char* delivery_name(config::Delivery d) {
  switch (d) {
    case config::Delivery::direct:
      return "direct";
    case config::Delivery::staged:
      return "staged";
    case config::Delivery::automatic:
      break;
  }
  return "auto";
}

// Direct delivery when the receiver offered it (a destination per tensor), the configuration
// allows it and every tensor is in CUDA memory the data path puts from. Fills the link's
// `destinations` and `chunk_bases`. `w`: the Welcome, or a Rejoined.
template <typename Reader>
bool choose_direct(const config::Config& config, Reader w, SenderDataPath& data, bool cuda_tensors,
                   std::size_t tensor_count, const std::string& peer, Link& link) {
  auto& destinations = link.destinations;
  if (config.update.delivery == config::Delivery::staged || !w.hasDestinations() ||
      w.getDestinations().size() != tensor_count || !cuda_tensors ||
      !data.delivers_pieces(FERRY_MEMORY_CUDA)) {
    return false;
  }
  std::vector<std::vector<std::uint8_t>> keys;
  for (auto k : w.getRegions()) keys.emplace_back(k.begin(), k.end());
  destinations.clear();
  link.chunk_bases.clear();
  for (auto d : w.getDestinations()) {
    if (d.getRegion() >= keys.size()) {
      fail(FERRY_STATUS_CORRUPT_DATA, "{}: welcome: destination in region {} of {}", peer,
           d.getRegion(), keys.size());
    }
    destinations.emplace_back(d.getRegion(), d.getOffset());
    std::optional<Link::ChunkPlace> place;
    if (d.getChunkHashes()) {
      place = Link::ChunkPlace{d.getChunkBase(), 0};
    } else if (d.getChunkHashesAfterHead()) {
      place = Link::ChunkPlace{d.getChunkBase(), d.getChunkHead()};
    }
    link.chunk_bases.push_back(place);
  }
  data.set_regions(std::move(keys));
  logger("sender")->info(
      "{}: direct delivery: tensors go straight into the receiver's "
      "parameters ({} shared regions)",
      peer, w.getRegions().size());
  return true;
}

// Whether this side offers its tensors to be read in place (Hello.lendsTensors): one sender of a
// whole catalog whose tensors are all CUDA memory, a data path that lends them, and
// update.delivery "auto" (reads are neither direct delivery nor staging).
bool lends_tensors(const SenderState& state, const PushPlan& plan, const SenderDataPath* data) {
  return !state.sharded() && data != nullptr && data->lends_tensors() && plan.cuda_tensors &&
         state.config.update.delivery == config::Delivery::automatic;
}

// Connects the data path to the receiver's (a Welcome, or a Rejoined): its address and slot keys.
// `slots_used`: false for the rejoin of a direct session, whose slots are only probed (the
// receiver gives it tiny ones).
template <typename Reader>
void connect_path(Reader w, SenderDataPath& data, std::uint64_t capacity, const std::string& peer,
                  Clock::time_point deadline, bool slots_used = true) {
  std::vector<std::vector<std::uint8_t>> keys;
  for (auto s : w.getSlots()) {
    keys.emplace_back(s.getRemoteKey().begin(), s.getRemoteKey().end());
    if (slots_used && s.getCapacity() < capacity) {
      fail(FERRY_STATUS_INCOMPATIBLE, "{}: slot of {} bytes, need {}", peer, s.getCapacity(),
           capacity);
    }
  }
  data.connect(std::span<const std::uint8_t>(w.getTransportAddress().begin(),
                                             w.getTransportAddress().size()),
               keys, w.getRmaNative(), peer, deadline);
}

void send_hello(const SenderState& state, Channel& ch, std::span<const TensorView> tensors,
                const PushPlan& plan, const TransportChoice& transport, SenderDataPath* data) {
  const SenderOptions& options = state.options;
  capnp::MallocMessageBuilder m;
  auto hello = m.initRoot<wire::Message>().initHello();
  hello.setProtocolVersion(options.claimed_protocol_version != 0 ? options.claimed_protocol_version
                                                                 : wire::PROTOCOL_VERSION);
  hello.setToken(options.token);
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  hello.setSenderName(fmt::format("{} pid {}", host, ::getpid()));
  if (state.sharded()) {
    // The global tensors this rank holds blocks of, and the blocks (docs/sharded.md).
    const auto declared = state.declared;
    auto list = hello.initTensors(static_cast<unsigned>(declared.size()));
    auto shard = hello.initShard();
    shard.setRank(state.shard.rank);
    shard.setWorld(state.shard.world);
    shard.setSendsNeeds(true);
    auto holdings = shard.initHoldings(static_cast<unsigned>(declared.size()));
    for (unsigned i = 0; i < declared.size(); ++i) {
      const TensorView& t = declared[i];
      const auto& global = t.global_shape.empty() ? t.shape : t.global_shape;
      list[i].setName(t.name);
      list[i].setDtype(static_cast<std::uint32_t>(t.dtype));
      auto shape = list[i].initShape(static_cast<unsigned>(global.size()));
      for (unsigned d = 0; d < global.size(); ++d) shape.set(d, global[d]);
      holdings[i].setTensor(i);
      auto offsets = holdings[i].initOffsets(static_cast<unsigned>(t.shape.size()));
      auto extents = holdings[i].initExtents(static_cast<unsigned>(t.shape.size()));
      for (unsigned d = 0; d < t.shape.size(); ++d) {
        offsets.set(d, t.offsets.empty() ? 0 : t.offsets[d]);
        extents.set(d, t.shape[d]);
      }
      holdings[i].setReplica(t.replica);
    }
  } else {
    auto list = hello.initTensors(static_cast<unsigned>(tensors.size()));
    for (unsigned i = 0; i < tensors.size(); ++i) {
      list[i].setName(tensors[i].name);
      list[i].setDtype(static_cast<std::uint32_t>(tensors[i].dtype));
      auto shape = list[i].initShape(static_cast<unsigned>(tensors[i].shape.size()));
      for (unsigned d = 0; d < tensors[i].shape.size(); ++d) shape.set(d, tensors[i].shape[d]);
    }
  }
  hello.setConfigJson(options.config_json);
  hello.setTransport(data ? transport.name : std::string("inline"));
  hello.setTransportRequired(transport.required);
  const auto addr = data ? data->address() : std::vector<std::uint8_t>{};
  hello.setTransportAddress(kj::arrayPtr(addr.data(), addr.size()));
  hello.setBucketBytes(plan.capacity);
  hello.setSlots(kSlots);
  hello.setDelivery(delivery_name(state.config.update.delivery));
  hello.setKeepSession(state.keep_sessions());
  hello.setRejoinAfterRelease(state.keep_sessions() && options.rejoin_after_release);
  hello.setRejoinsWhenResumed(state.keep_sessions() && options.rejoin_after_release &&
                              options.rejoin_when_resumed &&
                              state.config.update.rejoin_when_resumed);
  hello.setLendsTensors(lends_tensors(state, plan, data));
  ch.send(m, deadline_in(options.connect_timeout), "handshake (hello)");
}

}  // namespace

void open_session(SenderState& state, Link& link, std::size_t index,
                  std::span<const TensorView> tensors, const PushPlan& plan,
                  const TransportChoice& transport) {
  const config::Config& config = state.config;
  const SenderOptions& options = state.options;
  const std::string& address = options.receivers[index];
  Channel& ch = *link.channel;
  auto& data = link.data;
  const auto session_start = Clock::now();
  bool direct = false;  // direct delivery (the Welcome offered it and it was chosen)
  if (transport.name != "inline") {
    try {
      data = make_plugin_sender_path(state.registry, config, transport.name, plan.capacity, kSlots,
                                     plan.device);
    } catch (const Error& e) {
      if (transport.required) throw;
      logger("sender")->warn("transport '{}' unavailable ({}); using inline", transport.name,
                             e.what());
    }
  }
  state.track(data.get(), true);
  // Direct delivery through a transport whose copies fingerprint what they write needs no
  // separate pass over the tensors; anything else needs the plan's fingerprints. A rank of a
  // sharded trainer learns from the Welcome whether it sends its blocks whole (this plan) or
  // only what the receiver needs (a plan of the session's own).
  if (!state.sharded() && (!data || !data->fingerprints_pieces() || !plan.cuda_tensors ||
                           config.update.delivery == config::Delivery::staged)) {
    plan.seal();
  }
  bool writer_prints = false;  // direct, and the copies fingerprint what they write
  const double create_s = seconds_since(session_start);
  double connect_s = 0;  // the data path's connect, inside the handshake
  send_hello(state, ch, tensors, plan, transport, data.get());
  const std::string phase = "handshake (welcome)";
  auto msg = ch.recv(deadline_in(options.connect_timeout), phase);
  auto root = msg->root();
  throw_if_refused(root, fmt::format("receiver {} refused the session", address));
  if (root.which() != wire::Message::WELCOME) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: {}: unexpected message", ch.peer(), phase);
  }
  auto w = root.getWelcome();
  if (state.sharded() && !w.getSharded()) {
    fail(FERRY_STATUS_INCOMPATIBLE,
         "receiver {} does not assemble sharded updates (rank {} of {}): it answered the "
         "handshake as for one sender",
         address, state.shard.rank, state.shard.world);
  }
  if (state.sharded()) link.read_needs(w.getNeeds(), state.declared, ch.peer());
  const std::size_t sent_count = link.trims ? link.sent_count(state.declared) : tensors.size();
  const std::string chosen = text(w.getTransport());
  if (chosen == "inline") {
    if (data) {
      logger("sender")->warn("receiver {} has no '{}'; using inline", address, transport.name);
      state.track(data.get(), false);
    }
    auto replacement = make_inline_sender_path(plan.capacity, kSlots);
    data.swap(replacement);
  } else {
    if (!data || chosen != data->name()) {
      fail(FERRY_STATUS_INCOMPATIBLE, "{}: the receiver chose transport '{}'", ch.peer(), chosen);
    }
    const auto connect_start = Clock::now();
    connect_path(w, *data, plan.capacity, ch.peer(), deadline_in(options.connect_timeout));
    connect_s = seconds_since(connect_start);
    direct = choose_direct(config, w, *data, plan.cuda_tensors, sent_count, ch.peer(), link);
  }
  writer_prints = direct && data->fingerprints_pieces();
  if (!writer_prints && !link.trims) plan.seal();
  // Reads in place: the receiver maps the tensors this side lends and applies its plan from
  // them, where it would otherwise stage them (never instead of direct delivery).
  link.reads = !direct && w.getReadsTensors() && chosen != "inline" &&
               lends_tensors(state, plan, data.get());
  if (link.reads) {
    logger("sender")->info(
        "{}: the receiver reads the tensors in place and applies its plan "
        "from them (no staging copy)",
        ch.peer());
  }
  link.keep = w.getKeepSession();
  link.takes_pieces = !state.sharded() && w.getTakesPieces();
  link.prints_at_commit = w.getFingerprintsAtCommit();
  if (!direct && config.update.delivery == config::Delivery::direct) {
    fail(FERRY_STATUS_INCOMPATIBLE,
         "{}: update.delivery is \"direct\", but the receiver offers no direct delivery over "
         "'{}' (it needs CUDA tensors, a transport that writes device memory such as "
         "cuda_ipc, and a pure-copy plan for every tensor; see the receiver's log)",
         ch.peer(), data->name());
  }
  state.track(data.get(), true);
  link.direct = direct;
  link.writer_prints = writer_prints;
  link.transport = data->name();
  link.remember(tensors, plan);
  link.remember_shard(state.shard, state.declared);
  logger("sender")->debug(
      "{}: session opened: data path {:.3f} ms, handshake {:.3f} ms "
      "(connect {:.3f} ms)",
      address, create_s * 1e3, (seconds_since(session_start) - create_s) * 1e3, connect_s * 1e3);
}

void rejoin_session(SenderState& state, Link& link, std::size_t index, std::size_t sent_count,
                    bool prepare) {
  const config::Config& config = state.config;
  const SenderOptions& options = state.options;
  const std::string& address = options.receivers[index];
  Channel& ch = *link.channel;
  const auto start = Clock::now();
  link.data = link.transport == "inline"
                  ? make_inline_sender_path(link.capacity(), kSlots)
                  : make_plugin_sender_path(state.registry, config, link.transport, link.capacity(),
                                            kSlots, link.device());
  SenderDataPath& data = *link.data;
  state.track(&data, true);
  const double create_s = seconds_since(start);
  {
    capnp::MallocMessageBuilder m;
    const auto addr = data.address();
    m.initRoot<wire::Message>().initRejoin().setTransportAddress(
        kj::arrayPtr(addr.data(), addr.size()));
    ch.send(m, deadline_in(options.connect_timeout), "rejoin");
  }
  auto msg = ch.recv(deadline_in(options.connect_timeout), "rejoin (rejoined)");
  // A `resumed` sent before the receiver read this Rejoin (this push rejoins first) is moot.
  while (msg->root().which() == wire::Message::RESUMED) {
    msg = ch.recv(deadline_in(options.connect_timeout), "rejoin (rejoined)");
  }
  auto root = msg->root();
  throw_if_refused(root, fmt::format("receiver {} refused the rejoin", address));
  if (root.which() == wire::Message::CLOSING) {
    fail(FERRY_STATUS_PEER_FAILED, "{}: rejoin: the receiver closed the session ({})", ch.peer(),
         text(root.getClosing().getReason()));
  }
  if (root.which() != wire::Message::REJOINED) {
    fail(FERRY_STATUS_CORRUPT_DATA, "{}: rejoin: unexpected message", ch.peer());
  }
  auto r = root.getRejoined();
  if (text(r.getTransport()) != data.name()) {
    fail(FERRY_STATUS_INCOMPATIBLE, "{}: rejoin: the receiver chose transport '{}', not '{}'",
         ch.peer(), text(r.getTransport()), data.name());
  }
  const double answered_s = seconds_since(start);
  if (data.name() != "inline") {
    connect_path(r, data, link.capacity(), ch.peer(), deadline_in(options.connect_timeout),
                 !link.direct);
  }
  const double connected_s = seconds_since(start);
  const bool direct =
      choose_direct(config, r, data, link.cuda_tensors(), sent_count, ch.peer(), link);
  if (direct != link.direct) {
    fail(FERRY_STATUS_INCOMPATIBLE,
         "{}: rejoin: the receiver {} direct delivery after its release, the session {}", ch.peer(),
         direct ? "offers" : "no longer offers", direct ? "was staged" : "delivered directly");
  }
  const double chosen_s = seconds_since(start);
  const std::size_t prepared =
      prepare && direct ? data.prepare_regions(deadline_in(options.connect_timeout)) : 0;
  link.suspended = false;
  logger("sender")->debug(
      "{}: kept session rejoined after the receiver's release in {:.3f} ms (data path {:.3f} "
      "ms, rejoin answered {:.3f} ms, connect {:.3f} ms{})",
      address, seconds_since(start) * 1e3, create_s * 1e3, (answered_s - create_s) * 1e3,
      (connected_s - answered_s) * 1e3,
      prepared == 0 ? std::string()
                    : fmt::format(", {} shared regions mapped {:.3f} ms", prepared,
                                  (seconds_since(start) - chosen_s) * 1e3));
}

}  // namespace ferry::session
