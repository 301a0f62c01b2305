# session.capnp: the messages of the sender<->receiver session protocol (docs/session-protocol.md).
# Each message travels as one length-prefixed frame holding a flat Cap'n Proto message (frame.hpp);
# bucket bytes of the inline data path travel as a raw frame right after their BucketReady.
#
# Evolution: ordinals are append-only, never reused or renumbered; defaults never change. A change
# a peer of the previous protocol version cannot ignore bumps kProtocolVersion.

@0xa597bb5d0b97b3af;

$import "/capnp/c++.capnp".namespace("ferry::session::wire");

# 2: fingerprints are xxh64-interleaved-v1 (Ack and Commit carry bare values, so a peer that
# computes another algorithm is refused at Hello rather than failing every commit).
const protocolVersion :UInt32 = 2;

# One tensor: a checkpoint tensor (Hello) or a parameter of the receiver's layout.
struct TensorDesc {
  name @0 :Text;
  dtype @1 :UInt32;   # ferry_dtype_t
  shape @2 :List(UInt64);
}

# sender -> receiver, first message.
struct Hello {
  protocolVersion @0 :UInt32;
  token @1 :Text;              # the receiver's control API token, when it has one
  senderName @2 :Text;         # for the receiver's log and errors
  tensors @3 :List(TensorDesc);  # the full checkpoint catalog (unsharded), in push order
  configJson @4 :Text;         # the checkpoint's config.json, or empty
  transport @5 :Text;          # "inline" or a transport plugin name ("ucx")
  transportRequired @6 :Bool;  # false: the receiver may fall back to "inline"
  transportAddress @7 :Data;   # the sender's rendezvous blob (e.g. UCX worker address)
  bucketBytes @8 :UInt64;      # capacity every staging slot must have
  slots @9 :UInt32;            # staging slots the sender wants (2: double buffering)
  delivery @10 :Text;          # "auto", "direct" or "staged" (config update.delivery); "": auto
  # The sender would keep this session after its commit for its next updates (same catalog):
  # another Begin then follows on this connection, without a new handshake.
  keepSession @11 :Bool;
  # A sharded update (docs/sharded.md): this sender is one rank of several; `tensors` are the
  # global tensors it holds blocks of (global shapes), one per holding, in holding order.
  shard @12 :ShardHello;
  # The sender takes a Closing with `suspend` (a kept session across a release of the receiver's
  # memory): it drops its data path, answers `pathDropped`, and rejoins with `rejoin` before its
  # next Begin. A receiver meets an older sender's Hello (false) with a plain Closing.
  rejoinAfterRelease @13 :Bool;
  # Reads in place (docs/architecture.md, "Three ways to deliver"): the sender's data path can
  # lend its CUDA tensors to the receiver, which then maps them and runs its plan from them
  # (Welcome.readsTensors). Sent only by a sender of one whole catalog (no shard).
  lendsTensors @14 :Bool;
  # The sender takes `resumed` on a suspended session (it then rejoins at once, between its
  # pushes, rather than at its next push). A receiver sends it to no other sender.
  rejoinsWhenResumed @15 :Bool;
}

# One block a sharded sender holds, in global coordinates.
struct Holding {
  tensor @0 :UInt32;            # index into Hello.tensors
  offsets @1 :List(UInt64);     # where the block starts, per dimension
  extents @2 :List(UInt64);     # its size per dimension (the manifest entry's shape)
  replica @3 :Bool;             # held here, but sent by the lowest rank holding it
}

struct ShardHello {
  rank @0 :UInt32;
  world @1 :UInt32;             # how many senders make up the update
  holdings @2 :List(Holding);
  # The sender sends of each block only what the receiver needs (Welcome.needs). A receiver
  # meets an older sender's Hello (false) by taking every block whole.
  sendsNeeds @3 :Bool;
}

# What a receiver needs of one block (Welcome.needs): the piece of the block its plan reads, a
# block of its own in global coordinates, within the block. Only dim 0 and, for 2-D tensors,
# dim 1 are ever narrowed: the rows it reads and, where it reads every row at the same columns
# (a tensor-parallel rank's column split), those columns.
struct Need {
  offsets @0 :List(UInt64);
  extents @1 :List(UInt64);
  none @2 :Bool;  # it needs none of the block (offsets and extents are then the block's)
}

# Direct delivery: where one Hello tensor goes, as a byte offset into a shared region.
struct Destination {
  region @0 :UInt32;  # index into Welcome.regions
  offset @1 :UInt64;
  # The tensor is a piece of a parameter starting at byte chunkBase * 1 MiB of it: the receiver
  # takes the writing copy's chunk hashes of it, numbered from chunkBase, with the Commit
  # (Commit.chunkHashes), where the sender's transport computes them
  # (FERRY_TRANSPORT_CAP_PUT_CHUNK_HASHES), and makes the parameter's fingerprint from them.
  chunkHashes @2 :Bool;
  chunkBase @3 :UInt64;
  # The tensor is a piece of a parameter that starts inside a chunk: chunk chunkBase begins
  # chunkHead bytes into it. A sender that knows this field puts the first chunkHead bytes and
  # the rest as two copies and sends the chunk hashes of the rest, numbered from chunkBase
  # (chunkHashes stays false, so that an older sender sends none). Offered only where the
  # receiver takes the writing copies' fingerprints as its own (update.direct_verify "writer").
  chunkHead @4 :UInt64;
  chunkHashesAfterHead @5 :Bool;
}

struct Slot {
  capacity @0 :UInt64;
  remoteKey @1 :Data;  # the transport's packed key of this slot's registered memory (RMA)
}

# receiver -> sender: the handshake is accepted.
struct Welcome {
  protocolVersion @0 :UInt32;
  receiverName @1 :Text;
  layoutSignature @2 :UInt64;  # of this rank's target layout (names, dtypes, shapes)
  numParams @3 :UInt32;
  transport @4 :Text;          # the data path chosen: "inline" or the plugin name
  transportAddress @5 :Data;   # the receiver's rendezvous blob
  slots @6 :List(Slot);
  bucketTimeoutMs @7 :UInt64;  # the receiver's own deadlines (for the sender's information)
  commitTimeoutMs @8 :UInt64;
  rmaNative @9 :Bool;          # slot keys are given: the sender may put (it decides, see Begin)
  # Direct delivery is offered: the packed keys of the receiver's shared device memory, and one
  # destination per Hello tensor, in order. Empty when the receiver offers only staging.
  regions @10 :List(Data);
  destinations @11 :List(Destination);
  # The receiver keeps the session (Hello.keepSession): after Committed it waits for the next
  # Begin. Until then it holds no update lock; it may end the session with Closing.
  keepSession @12 :Bool;
  # The receiver takes writer fingerprints with the Commit (Begin.fingerprintsAtCommit).
  fingerprintsAtCommit @13 :Bool;
  # The receiver assembles a sharded update from Hello.shard (every rank of the world joined and
  # their holdings tile every tensor). Sent once all ranks' Hellos arrived.
  sharded @14 :Bool;
  # Hello.shard.sendsNeeds: what the receiver needs of each holding, one per Hello.shard.holdings
  # in order (replicas included, and ignored): the piece its plan reads. The sender sends exactly
  # these pieces, as blocks of their own, in holding order, empty pieces left out.
  needs @15 :List(Need);
  # Hello.lendsTensors accepted: where direct delivery is not offered (a plan that is not one
  # whole copy per tensor), the receiver reads the sender's tensors in place; a Begin with
  # readsTensors then sends every bucket's entries by their keys (BucketReady.sources).
  readsTensors @16 :Bool;
  # To a sender of one whole catalog: this receiver's plan reads only part of some tensors (a
  # tensor-parallel rank's slices), and a 1-rank sharded push of the same tensors (Hello.shard,
  # rank 0 of 1, every block whole) would send it only those parts, each into its parameters
  # where this session would write or read in place. The sender may push that way from its next
  # push on (docs/sharded.md, "One trainer, tensor-parallel engines"); this session's update
  # goes as the Welcome says.
  takesPieces @17 :Bool;
}

# Either direction: the peer refuses or gives up; the connection closes after it.
struct Refusal {
  code @0 :UInt32;  # ferry_status_code_t
  message @1 :Text;
}

struct Begin {
  version @0 :UInt64;
  label @1 :Text;
  bucketCount @2 :UInt32;
  totalBytes @3 :UInt64;
  viaPut @4 :Bool;  # transport plugin: buckets arrive by put+flush (else by send into posted recvs)
  direct @5 :Bool;  # the sender writes every tensor straight into its Welcome destination
  # Direct delivery: each manifest fingerprint was computed by the copy that wrote the tensor,
  # from the words as it stored them (one read of the data; FERRY_TRANSPORT_CAP_PUT_FINGERPRINT).
  # The receiver may take them as the fingerprints of what was written (update.direct_verify).
  writerFingerprints @6 :Bool;
  # With writerFingerprints (and Welcome.fingerprintsAtCommit): the bucket manifests carry no
  # fingerprints and each BucketReady goes out as soon as its copies are queued, before they
  # complete; the Commit, sent once every copy completed, carries the copies' fingerprints.
  # Nothing written in place is read before the Commit, so the early announcement is safe.
  fingerprintsAtCommit @7 :Bool;
  # Welcome.readsTensors: no byte is put; each BucketReady names where its entries are in the
  # sender's memory (sources), which stays final and lent until the Committed. The receiver
  # maps them, verifies each entry against the manifest's fingerprint, and runs its plan from
  # them.
  readsTensors @8 :Bool;
}

struct Ready {
  version @0 :UInt64;
}

# sender -> receiver: bucket `index` is in staging slot `slot` (or follows as a raw frame).
struct BucketReady {
  index @0 :UInt32;
  slot @1 :UInt32;
  bytes @2 :UInt64;      # bucket bytes; equals the manifest's bucketBytes
  manifest @3 :Data;     # tensor_meta.capnp Manifest bytes
  dataFollows @4 :Bool;  # inline data path: a raw frame of `bytes` bytes comes next
  # Begin.readsTensors: one key per manifest entry, in order, from the sender's transport
  # (pack_key of the entry's memory, its bytes from offset 0); empty for an empty entry.
  sources @5 :List(Data);
}

# receiver -> sender: bucket `index` was applied; its slot may be reused.
struct Ack {
  index @0 :UInt32;
  slot @1 :UInt32;
  fingerprints @2 :List(UInt64);  # xxh64-interleaved-v1 of each manifest entry as received, in order
}

struct Commit {
  version @0 :UInt64;
  # Begin.fingerprintsAtCommit: the writing copies' fingerprint of every manifest entry, buckets
  # in order, entries in manifest order.
  fingerprints @1 :List(UInt64);
  # With them, for the entries whose Destination asked for chunk hashes: the writing copy's hash
  # of each 1 MiB chunk (Destination.chunkBase on); one list per fingerprint, empty for the
  # others, or no lists at all.
  chunkHashes @2 :List(List(UInt64));
}

struct Committed {
  version @0 :UInt64;
  label @1 :Text;
  seconds @2 :Float64;  # receiver-side time from Begin to the published version
  # A sharded update: the bytes each rank sent (by rank) and the bytes of every tensor once.
  rankBytes @3 :List(UInt64);
  neededBytes @4 :UInt64;
}

struct Abort {
  reason @0 :Text;
}

# receiver -> sender, on a kept session between updates: the receiver is about to release the
# memory the session shares (or stops). The sender drops its data path (unmapping anything of the
# receiver's it imported), then closes the connection; the receiver waits for that close.
# With `suspend` (only to a sender whose Hello said rejoinAfterRelease, and only for a release)
# the connection stays: the sender drops its data path and answers `pathDropped`; the receiver
# then drops its own (its registrations of the memory about to go) and only then releases. The
# session, its catalog and layout stay; the next update starts with Rejoin.
struct Closing {
  reason @0 :Text;
  suspend @1 :Bool;
}

# sender -> receiver, first on a suspended session's next update: the sender's new data path
# (its transport's rendezvous blob; the transport is the one the Welcome chose). The receiver
# takes the update lock, checks that its memory is back, makes its own data path, shares its
# memory again and answers Rejoined, or refuses (the session then ends).
struct Rejoin {
  transportAddress @0 :Data;
}

# receiver -> sender: the suspended session's new data path, as the Welcome gave the first one.
# The Begin follows.
struct Rejoined {
  transport @0 :Text;
  transportAddress @1 :Data;
  slots @2 :List(Slot);
  rmaNative @3 :Bool;
  regions @4 :List(Data);
  destinations @5 :List(Destination);
}

struct Message {
  union {
    hello @0 :Hello;
    welcome @1 :Welcome;
    refusal @2 :Refusal;
    begin @3 :Begin;
    ready @4 :Ready;
    bucket @5 :BucketReady;
    ack @6 :Ack;
    commit @7 :Commit;
    committed @8 :Committed;
    abort @9 :Abort;
    closing @10 :Closing;
    pathDropped @11 :Void;  # sender -> receiver: answer to Closing.suspend
    rejoin @12 :Rejoin;
    rejoined @13 :Rejoined;
    # receiver -> sender, on a suspended session whose Hello set rejoinsWhenResumed: its memory
    # is back (resume_memory_occupation). The sender may rejoin now; one that rejoins at its
    # next push meets this before its Rejoined and skips it.
    resumed @14 :Void;
  }
}
