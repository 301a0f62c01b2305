// capi/dlpack_release.cpp: ferry_dlpack_release: the deleters of many DLPack tensors in one call,
// so that a binding (Python's ferry.Sender.push) gives back the views it took of a model's
// hundreds of tensors without a foreign call per tensor on its push's critical path.
#include <ferry/ferry.h>

extern "C" {

FERRY_API void ferry_dlpack_release(DLManagedTensor* const* tensors, size_t count) {
  if (tensors == nullptr) return;
  for (size_t i = 0; i < count; ++i) {
    DLManagedTensor* t = tensors[i];
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  }
}

}  // extern "C"
