// receiver/source_reader.hpp: drives a source transport plugin (CAP_SOURCE, e.g. disk) through
// its C table: open a URI, read the catalog, fill staging buckets. Owns the plugin instance and
// the open source; every plugin error becomes a ferry::Error naming the plugin and the call.
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/manifest.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ferry::registry {
class LoadedPlugin;
}

namespace ferry::receiver {

class SourceReader {
 public:
  // Creates an instance of `plugin` (which must declare CAP_SOURCE) with `options` and opens
  // `uri`. Validation of the source happens here, before any bucket is read.
  SourceReader(std::shared_ptr<const registry::LoadedPlugin> plugin,
               const std::map<std::string, std::string>& options, const std::string& uri);
  ~SourceReader();
  SourceReader(const SourceReader&) = delete;
  SourceReader& operator=(const SourceReader&) = delete;

  // Every tensor of the source (sizes, no offsets).
  const manifest::Manifest& catalog() const noexcept { return catalog_; }

  // Fills `dst` with the next tensors. Returns false at the end of the stream; otherwise sets
  // `manifest_bytes` (the bucket's manifest) and `bytes_written`.
  bool read(std::span<std::byte> dst, unsigned threads, std::vector<std::uint8_t>& manifest_bytes,
            std::uint64_t& bytes_written);

 private:
  std::shared_ptr<const registry::LoadedPlugin> plugin_;
  const ferry_transport_api_t* api_ = nullptr;
  std::string name_;
  ferry_transport_t* transport_ = nullptr;
  ferry_source_t* source_ = nullptr;
  manifest::Manifest catalog_;
};

}  // namespace ferry::receiver
