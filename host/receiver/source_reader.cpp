// Drives a source transport plugin through its C table (see receiver/source_reader.hpp).
#include "receiver/source_reader.hpp"

#include "common/host_api.hpp"
#include "registry/registry.hpp"

namespace ferry::receiver {
namespace {

// Copies a blob's bytes and releases it.
std::vector<std::uint8_t> take_blob(ferry_blob_t& blob) {
  std::vector<std::uint8_t> bytes;
  if (blob.data != nullptr && blob.size > 0) bytes.assign(blob.data, blob.data + blob.size);
  if (blob.release != nullptr) blob.release(blob.data, blob.release_ctx);
  blob = ferry_blob_t{};
  return bytes;
}

}  // namespace

SourceReader::SourceReader(std::shared_ptr<const registry::LoadedPlugin> plugin,
                           const std::map<std::string, std::string>& options,
                           const std::string& uri)
    : plugin_(std::move(plugin)) {
  api_ = plugin_->transport();
  name_ = plugin_->info().name;
  const auto& caps = plugin_->info().transport_caps;
  if (api_ == nullptr || !caps || (caps->flags & FERRY_TRANSPORT_CAP_SOURCE) == 0 ||
      api_->source_open == nullptr || api_->source_catalog == nullptr ||
      api_->source_read == nullptr || api_->source_close == nullptr) {
    fail(FERRY_STATUS_INCOMPATIBLE, "transport '{}' cannot read sources (no CAP_SOURCE)", name_);
  }
  std::vector<ferry_option_t> opts;
  for (const auto& [k, v] : options) opts.push_back({k.c_str(), v.c_str()});
  ferry_transport_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_transport_create_args_t, device);
  args.role = FERRY_ROLE_RECEIVER;
  args.options = opts.data();
  args.num_options = opts.size();
  args.device = -1;
  throw_if_error(api_->create(&args, &transport_), "transport '" + name_ + "' create");
  try {
    throw_if_error(api_->source_open(transport_, uri.c_str(), &source_), "");
    ferry_blob_t blob{};
    blob.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
    throw_if_error(api_->source_catalog(source_, &blob), "transport '" + name_ + "' catalog");
    catalog_ = manifest::decode(take_blob(blob));
  } catch (...) {
    if (source_ != nullptr) api_->source_close(source_);
    api_->destroy(transport_);
    throw;
  }
}

SourceReader::~SourceReader() {
  if (source_ != nullptr) api_->source_close(source_);
  if (transport_ != nullptr) api_->destroy(transport_);
}

bool SourceReader::read(std::span<std::byte> dst, unsigned threads,
                        std::vector<std::uint8_t>& manifest_bytes, std::uint64_t& bytes_written) {
  ferry_source_read_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_source_read_args_t, bytes_written);
  args.dst = dst.data();
  args.dst_capacity = dst.size();
  args.num_threads = threads;
  args.deadline_ns = 0;
  args.manifest.struct_size = FERRY_STRUCT_SIZE(ferry_blob_t, release_ctx);
  ferry_error_t* error = api_->source_read(source_, &args);
  if (error != nullptr && error_code(error) == FERRY_STATUS_END_OF_STREAM) {
    ErrorPtr owned(error);
    take_blob(args.manifest);
    return false;
  }
  throw_if_error(error, "");
  manifest_bytes = take_blob(args.manifest);
  bytes_written = args.bytes_written;
  return true;
}

}  // namespace ferry::receiver
