# tensor_meta.capnp: the metadata of one bucket (its manifest), the only structured data that
# crosses the plugin ABI and the wire. It crosses as bytes (a single-segment or multi-segment
# Cap'n Proto message); readers apply traversal and nesting limits and validate every offset,
# size and shape product before use (host/manifest/, plugin_api/sdk/).
#
# Evolution: ordinals are append-only, never reused or renumbered; defaults never change.

@0x8c9ea4ddd04e7dec;

$import "/capnp/c++.capnp".namespace("ferry::schema");

# Element types; ordinals equal ferry_dtype_t in ferry/plugin.h.
enum DType {
  invalid @0;
  f64 @1;
  f32 @2;
  f16 @3;
  bf16 @4;
  i64 @5;
  i32 @6;
  i16 @7;
  i8 @8;
  u8 @9;
  bool @10;
  f8E4m3 @11;
  f8E5m2 @12;
}

# A fingerprint of a tensor's bytes (docs/fingerprint.md).
struct Fingerprint {
  algorithm @0 :Text;   # "xxh64-interleaved-v1"
  value @1 :UInt64;
}

# Quantization the bytes carry (already-quantized checkpoints) or ask for on arrival.
struct Quantization {
  scheme @0 :Text;      # "fp8-block"
  blockRows @1 :UInt32; # 128
  blockCols @2 :UInt32; # 128
  scaleDtype @3 :DType; # f32
  scaleFormat @4 :Text; # "" or "ue8m0"
}

# Which part of a larger logical tensor these bytes are.
struct Sharding {
  dim @0 :UInt32;
  index @1 :UInt32;
  count @2 :UInt32;
}

# Which block of a larger global tensor these bytes are, in global coordinates: the entry's shape
# is the block's extent per dimension, `offsets` where it starts; the bytes are the block's own
# row-major elements (a sharded push, docs/sharded.md). A whole tensor needs none.
struct Block {
  globalShape @0 :List(UInt64);
  offsets @1 :List(UInt64);
}

struct TensorEntry {
  name @0 :Text;
  dtype @1 :DType;
  shape @2 :List(UInt64);
  offset @3 :UInt64;      # byte offset in the bucket
  size @4 :UInt64;        # bytes; must equal product(shape) * size of dtype
  fingerprint @5 :Fingerprint;   # optional (absent pointer = none)
  quantization @6 :Quantization; # optional
  sharding @7 :Sharding;         # optional
  block @8 :Block;               # optional: a block of a global tensor (sharded senders)
}

struct Manifest {
  version @0 :UInt64;     # the update's weight version (monotonic per sender)
  bucketIndex @1 :UInt32;
  bucketCount @2 :UInt32; # 0 in a source catalog
  bucketBytes @3 :UInt64; # the bucket's length; every entry lies inside it
  tensors @4 :List(TensorEntry);
  versionLabel @5 :Text;  # free-form weight_version string as the control API names it
}
