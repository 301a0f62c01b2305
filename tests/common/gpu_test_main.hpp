// tests/common/gpu_test_main.hpp: the one hook a GPU test program may define for the shared main()
// of the GPU test programs (gpu_test_main.cpp), which skips without a CUDA device and otherwise
// runs GoogleTest. Include as "tests/common/gpu_test_main.hpp".
#pragma once

#include <optional>

namespace ferry::test {

// Optional: a program that must act before its tests start (a child mode chosen by an environment
// variable, an environment setting for a library) defines this; the others leave it out, which
// the weak declaration allows. Called once, after a CUDA device was found and before GoogleTest
// reads argv. Returns std::nullopt to go on to the tests, or the exit code the program ends with.
[[gnu::weak]] std::optional<int> before_gpu_tests(int argc, char** argv);

}  // namespace ferry::test
