/* tests/capi/capi_receiver_main.c: an inference engine in miniature, written in C99 against
 * ferry/ferry.h only: it allocates its own parameters (kCapiTestTensors, zeroed, in one mapping
 * of their own), registers them with an embedded receiver, serves on a free port and answers
 * commands on stdin:
 *   "check V"  -> "OK" when version V is published and every parameter holds the pattern of V,
 *                 else "VERSION <published>" or "MISMATCH <name>"
 *   "release"  -> the engine lends its weights' memory, as a torch_memory_saver-style allocator
 *                 does: tells ferry (ferry_receiver_release of "weights"), then replaces the
 *                 mapping with an inaccessible one at the same addresses (any write into it
 *                 now kills the process); "OK" or "ERROR <code> <message>"
 *   "resume"   -> maps new zeroed memory at the same addresses, then tells ferry
 *                 (ferry_receiver_resume); "OK" or "ERROR ..."
 *   "quit"     -> exits 0
 * Arguments are config overrides ("update.verify_fingerprints=true"). Prints "PORT <n>" once
 * serving, or "ERROR <code> <message>" and exits 1. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS under -std=c99 */
#include <ferry/ferry.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "capi_tensors.h"

static int report_error(const char* what, ferry_error_t* error) {
  printf("ERROR %s %s: %s\n", ferry_status_name(ferry_error_code(error)), what,
         ferry_error_message(error));
  fflush(stdout);
  ferry_error_free(error);
  return 1;
}

/* Answers a failed command on stdout and goes on. */
static void answer(ferry_error_t* error) {
  if (error == NULL) {
    printf("OK\n");
  } else {
    printf("ERROR %s %s\n", ferry_status_name(ferry_error_code(error)),
           ferry_error_message(error));
    ferry_error_free(error);
  }
  fflush(stdout);
}

/* The parameters' mapping at `base`, replaced in place: accessible (new zero pages) or not. */
static int remap(unsigned char* base, size_t bytes, int accessible) {
  void* p = mmap(base, bytes, accessible ? PROT_READ | PROT_WRITE : PROT_NONE,
                 MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == base ? 0 : -1;
}

int main(int argc, char** argv) {
  ferry_config_source_t config;
  ferry_receiver_t* receiver = NULL;
  ferry_error_t* error;
  unsigned char* params[CAPI_TEST_NUM_TENSORS];
  char line[256];
  int32_t port = 0;
  size_t i;
  size_t total = 0;
  unsigned char* base;
  const char* weights_tag[] = {"weights"};

  memset(&config, 0, sizeof(config));
  config.struct_size = FERRY_STRUCT_SIZE(ferry_config_source_t, num_overrides);
  config.overrides = (const char* const*)(argv + 1);
  config.num_overrides = (size_t)(argc - 1);
  error = ferry_receiver_create(&config, &receiver);
  if (error != NULL) return report_error("create", error);

  /* One anonymous mapping for every parameter, each at a 256-byte aligned offset. */
  for (i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) {
    total += (capi_test_bytes(&kCapiTestTensors[i]) + 1 + 255) / 256 * 256;
  }
  base = (unsigned char*)mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                              -1, 0);
  if (base == MAP_FAILED) {
    printf("ERROR IO mmap of %zu bytes failed\n", total);
    return 1;
  }
  total = 0;
  for (i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) {
    const capi_test_tensor_t* t = &kCapiTestTensors[i];
    ferry_tensor_t param;
    params[i] = base + total;
    total += (capi_test_bytes(t) + 1 + 255) / 256 * 256;
    memset(&param, 0, sizeof(param));
    param.struct_size = FERRY_STRUCT_SIZE(ferry_tensor_t, device);
    param.name = t->name;
    param.dtype = t->dtype;
    param.ndim = t->ndim;
    param.shape = t->shape;
    param.data = params[i];
    param.memory_kind = FERRY_MEMORY_HOST;
    error = ferry_receiver_register_param(receiver, &param);
    if (error != NULL) return report_error("register_param", error);
  }

  error = ferry_receiver_serve(receiver, "127.0.0.1", 0, &port);
  if (error != NULL) return report_error("serve", error);
  printf("PORT %d\n", (int)port);
  fflush(stdout);

  while (fgets(line, sizeof(line), stdin) != NULL) {
    unsigned long long want = 0;
    if (strncmp(line, "quit", 4) == 0) break;
    if (strncmp(line, "release", 7) == 0) {
      error = ferry_receiver_release(receiver, weights_tag, 1);
      if (error == NULL && remap(base, total, 0) != 0) {
        printf("ERROR IO remapping the parameters inaccessible failed\n");
        fflush(stdout);
        continue;
      }
      answer(error);
      continue;
    }
    if (strncmp(line, "resume", 6) == 0) {
      if (remap(base, total, 1) != 0) {
        printf("ERROR IO mapping the parameters again failed\n");
        fflush(stdout);
        continue;
      }
      answer(ferry_receiver_resume(receiver, weights_tag, 1));
      continue;
    }
    if (sscanf(line, "check %llu", &want) == 1) {
      uint64_t number = 0;
      const char* mismatch = NULL;
      error = ferry_receiver_version(receiver, &number, NULL);
      if (error != NULL) return report_error("version", error);
      if (number != want) {
        printf("VERSION %llu\n", (unsigned long long)number);
        fflush(stdout);
        continue;
      }
      for (i = 0; i < CAPI_TEST_NUM_TENSORS && mismatch == NULL; ++i) {
        const size_t n = capi_test_bytes(&kCapiTestTensors[i]);
        size_t b;
        for (b = 0; b < n; ++b) {
          if (params[i][b] != capi_test_byte(b, i, number)) {
            mismatch = kCapiTestTensors[i].name;
            break;
          }
        }
      }
      if (mismatch != NULL) {
        printf("MISMATCH %s\n", mismatch);
      } else {
        printf("OK\n");
      }
      fflush(stdout);
    }
  }

  ferry_receiver_destroy(receiver);
  munmap(base, total);
  return 0;
}
