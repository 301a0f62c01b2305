// tests/common/gpu_test_main.cpp: the main() of every GPU test program: without a visible CUDA
// device it prints one SKIP line and exits 77 (meson's skip code); otherwise it runs the
// program's hook, if it has one (gpu_test_main.hpp), then its GoogleTest tests.
#include "tests/common/gpu_test_main.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string_view>

namespace {

// The program's file name, for the SKIP line (argv[0] may be a path, or absent).
std::string_view program_name(int argc, char** argv) {
  if (argc < 1 || argv[0] == nullptr) return "this test program";
  std::string_view path = argv[0];
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    const std::string_view name = program_name(argc, argv);
    std::printf("SKIP: %.*s needs a CUDA device (none visible)\n", static_cast<int>(name.size()),
                name.data());
    return 77;
  }
  if (ferry::test::before_gpu_tests != nullptr) {
    if (const std::optional<int> code = ferry::test::before_gpu_tests(argc, argv)) return *code;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
