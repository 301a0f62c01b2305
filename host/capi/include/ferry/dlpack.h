/*
 * ferry/dlpack.h: the DLPack structs (ABI v0.x/v1.x legacy DLManagedTensor) that ferry/ferry.h
 * takes tensors in, declared from the DLPack ABI so that users of ferry need no other header.
 *
 * Layout and enum values are those of the DLPack ABI (https://github.com/dmlc/dlpack); they are
 * the same bytes any framework exchanges (PyTorch, NumPy, JAX, CuPy). If you also use the
 * upstream dlpack/dlpack.h, include it *before* this header: this header then uses its
 * definitions instead of declaring its own (the upstream guard DLPACK_DLPACK_H_ is checked).
 */
#ifndef FERRY_DLPACK_H_
#define FERRY_DLPACK_H_

#include <stdint.h>

#ifndef DLPACK_DLPACK_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Where the memory of a tensor lives. Values are fixed by the DLPack ABI. */
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3, /* page-locked host memory (cudaMallocHost) */
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id; /* the device ordinal (CUDA device index), 0 for the CPU */
} DLDevice;

/* Type codes. Values are fixed by the DLPack ABI. */
typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8_e3m4 = 7,
  kDLFloat8_e4m3 = 8,
  kDLFloat8_e4m3b11fnuz = 9,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e4m3fnuz = 11,
  kDLFloat8_e5m2 = 12,
  kDLFloat8_e5m2fnuz = 13
} DLDataTypeCode;

typedef struct {
  uint8_t code;   /* a DLDataTypeCode */
  uint8_t bits;   /* bits per lane: 8, 16, 32, 64 */
  uint16_t lanes; /* 1 for scalars (ferry accepts only 1) */
} DLDataType;

/* A view of a tensor. The element at index (i0, ..., in-1) lives at
 * (char*)data + byte_offset + sizeof(element) * sum(ik * strides[k]); strides are in elements and
 * NULL means compact row-major. */
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;   /* ndim entries */
  int64_t* strides; /* ndim entries, or NULL */
  uint64_t byte_offset;
} DLTensor;

/* A DLTensor with its owner: the consumer calls deleter(self) once when it no longer needs the
 * memory (deleter may be NULL). This is what a Python `__dlpack__()` capsule named "dltensor"
 * points to. */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DLPACK_DLPACK_H_ */

#endif /* FERRY_DLPACK_H_ */
