// cli/main.cpp: the `ferry` command (placeholder until the CLI lands).
#include <cstdio>

#include "ferry_build_config.h"

int main() {
  std::printf("ferry %s\n", FERRY_VERSION);
  return 0;
}
