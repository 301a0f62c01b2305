/* tests/capi/capi_tensors.h: the parameter set and byte pattern that the C API round-trip tests
 * share between the sender (capi_test.cpp) and the embedded receiver process
 * (capi_receiver_main.c). C99 so that both languages include it. */
#ifndef FERRY_TESTS_CAPI_TENSORS_H_
#define FERRY_TESTS_CAPI_TENSORS_H_

#include <ferry/ferry.h>

#include <stddef.h>
#include <stdint.h>

typedef struct capi_test_tensor {
  const char* name;
  ferry_dtype_t dtype;
  uint32_t ndim;
  int64_t shape[3];
} capi_test_tensor_t;

/* Every dtype family once, a scalar, and one tensor of 1 MiB. */
static const capi_test_tensor_t kCapiTestTensors[] = {
    {"embed.weight", FERRY_DTYPE_F32, 2, {64, 32, 0}},
    {"layers.0.norm.weight", FERRY_DTYPE_BF16, 1, {32, 0, 0}},
    {"layers.0.mlp.weight", FERRY_DTYPE_F16, 2, {32, 48, 0}},
    {"layers.0.experts", FERRY_DTYPE_I8, 3, {4, 5, 6}},
    {"step", FERRY_DTYPE_I64, 0, {0, 0, 0}},
    {"mask", FERRY_DTYPE_U8, 2, {7, 3, 0}},
    {"lm_head.weight", FERRY_DTYPE_F32, 2, {256, 1024, 0}},
};
#define CAPI_TEST_NUM_TENSORS (sizeof(kCapiTestTensors) / sizeof(kCapiTestTensors[0]))

static inline size_t capi_test_elem_size(ferry_dtype_t dtype) {
  switch (dtype) {
    case FERRY_DTYPE_F64:
    case FERRY_DTYPE_I64: return 8;
    case FERRY_DTYPE_F32:
    case FERRY_DTYPE_I32: return 4;
    case FERRY_DTYPE_F16:
    case FERRY_DTYPE_BF16:
    case FERRY_DTYPE_I16: return 2;
    default: return 1;
  }
}

static inline size_t capi_test_bytes(const capi_test_tensor_t* t) {
  size_t n = capi_test_elem_size(t->dtype);
  uint32_t k;
  for (k = 0; k < t->ndim; ++k) n *= (size_t)t->shape[k];
  return n;
}

/* The bytes of tensor `index` in update `version`: different per tensor and per version. */
static inline unsigned char capi_test_byte(size_t i, size_t index, uint64_t version) {
  return (unsigned char)((i * 131u + index * 17u + (size_t)version * 29u + (i >> 8)) & 0xffu);
}

static inline void capi_test_fill(unsigned char* dst, size_t index, uint64_t version) {
  size_t i;
  const size_t n = capi_test_bytes(&kCapiTestTensors[index]);
  for (i = 0; i < n; ++i) dst[i] = capi_test_byte(i, index, version);
}

#endif /* FERRY_TESTS_CAPI_TENSORS_H_ */
