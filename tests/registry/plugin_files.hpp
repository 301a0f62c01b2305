// tests/registry/plugin_files.hpp: test helpers shared by the registry and conformance tests:
// temporary plugin folders and where the test plugins were built (env vars set by meson).
#pragma once

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace ferry::testing {

namespace fs = std::filesystem;

// A folder the environment variable names (set by tests/*/meson.build).
inline fs::path env_dir(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    ADD_FAILURE() << name << " is not set (run the test through meson test)";
    return {};
  }
  return value;
}

// The conforming mocks: libferry_transport_mock.so and libferry_model_mock.so.
inline fs::path mock_dir() {
  return env_dir("FERRY_TEST_PLUGIN_DIR");
}
// libferry_<kind>_<case>.so for each broken case.
inline fs::path broken_dir() {
  return env_dir("FERRY_TEST_BROKEN_PLUGIN_DIR");
}

inline fs::path mock_transport() {
  return mock_dir() / "libferry_transport_mock.so";
}
inline fs::path mock_model() {
  return mock_dir() / "libferry_model_mock.so";
}
inline fs::path broken(const std::string& kase, const std::string& kind = "transport") {
  return broken_dir() / ("libferry_" + kind + "_" + kase + ".so");
}

// A fresh folder (mode 0700) removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "ferry-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    // Undo chmods a test made so removal works.
    for (auto it = fs::recursive_directory_iterator(path_, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory()) ::chmod(it->path().c_str(), 0700);
    }
    ::chmod(path_.c_str(), 0700);
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const fs::path& path() const { return path_; }

  // Makes and returns a subfolder (0755).
  fs::path folder(const std::string& name) const {
    fs::create_directories(path_ / name);
    ::chmod((path_ / name).c_str(), 0755);
    return path_ / name;
  }

 private:
  fs::path path_;
};

// Copies `plugin` into `dir` (optionally under another file name), mode 0755.
inline fs::path copy_plugin(const fs::path& plugin, const fs::path& dir, std::string as = "") {
  const fs::path target = dir / (as.empty() ? plugin.filename().string() : as);
  fs::copy_file(plugin, target, fs::copy_options::overwrite_existing);
  ::chmod(target.c_str(), 0755);
  return target;
}

// A text file where a plugin is expected.
inline fs::path write_text_plugin(const fs::path& dir, const std::string& filename) {
  const fs::path target = dir / filename;
  std::ofstream(target) << "this is a text file that only looks like a plugin by its name;\n"
                           "loading it must fail with a clear reason, never a crash.\n";
  ::chmod(target.c_str(), 0644);
  return target;
}

}  // namespace ferry::testing
