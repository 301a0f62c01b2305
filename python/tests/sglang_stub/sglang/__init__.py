"""python/tests/sglang_stub: SGLang's FlattenedTensorBucket (sglang.srt.weight_sync.tensor_bucket)
under its own module path, so a test trainer pickles its metadata exactly as SGLang does (a
pickle names the class by module and name). Written for the tests from SGLang's published layout:
each tensor's bytes (a uint8 view) one after the other, no padding; metadata start_idx, end_idx
and numel in bytes."""
