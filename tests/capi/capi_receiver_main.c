/* tests/capi/capi_receiver_main.c: an inference engine in miniature, written in C99 against
 * ferry/ferry.h only: it allocates its own parameters (kCapiTestTensors, zeroed), registers them
 * with an embedded receiver, serves on a free port and answers commands on stdin:
 *   "check V"  -> "OK" when version V is published and every parameter holds the pattern of V,
 *                 else "VERSION <published>" or "MISMATCH <name>"
 *   "quit"     -> exits 0
 * Arguments are config overrides ("update.verify_fingerprints=true"). Prints "PORT <n>" once
 * serving, or "ERROR <code> <message>" and exits 1. */
#include <ferry/ferry.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi_tensors.h"

static int report_error(const char* what, ferry_error_t* error) {
  printf("ERROR %s %s: %s\n", ferry_status_name(ferry_error_code(error)), what,
         ferry_error_message(error));
  fflush(stdout);
  ferry_error_free(error);
  return 1;
}

int main(int argc, char** argv) {
  ferry_config_source_t config;
  ferry_receiver_t* receiver = NULL;
  ferry_error_t* error;
  unsigned char* params[CAPI_TEST_NUM_TENSORS];
  char line[256];
  int32_t port = 0;
  size_t i;

  memset(&config, 0, sizeof(config));
  config.struct_size = FERRY_STRUCT_SIZE(ferry_config_source_t, num_overrides);
  config.overrides = (const char* const*)(argv + 1);
  config.num_overrides = (size_t)(argc - 1);
  error = ferry_receiver_create(&config, &receiver);
  if (error != NULL) return report_error("create", error);

  for (i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) {
    const capi_test_tensor_t* t = &kCapiTestTensors[i];
    ferry_tensor_t param;
    params[i] = (unsigned char*)calloc(capi_test_bytes(t) + 1, 1);
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
  for (i = 0; i < CAPI_TEST_NUM_TENSORS; ++i) free(params[i]);
  return 0;
}
