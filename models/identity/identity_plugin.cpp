// models/identity: the identity model-family plugin: the target layout is the checkpoint itself
// (same names, dtypes, shapes) and every plan is one plain copy per tensor. For embedded receivers
// whose parameters carry the sender's names (a state_dict pushed into named_parameters()). The C
// table is the SDK's (ferry/sdk/model_plugin.hpp); this file is the family's logic.
#include <ferry/plugin.h>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/model_plugin.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct Param {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
};

// The catalog fixed by the last target_layout: parameters in catalog order and their indices.
struct Catalog {
  std::vector<Param> params;
  std::unordered_map<std::string, std::uint32_t> index;
};

// What the identity model needs beyond a well-formed description: a non-empty name, a known
// dtype and a shape whose byte size does not overflow. `i` and `what` name the tensor's place.
void check(const Param& p, size_t i, const char* what) {
  if (p.name.empty()) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: {} tensor {} has no name", what, i);
  }
  if (ferry::dtype_size(p.dtype) == 0) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: {} tensor '{}' has dtype value {}",
                what, p.name, static_cast<int>(p.dtype));
  }
  if (!ferry::byte_size(p.dtype, p.shape)) {
    ferry::fail(FERRY_STATUS_INVALID_ARGUMENT, "identity model: {} tensor '{}' shape {} overflows",
                what, p.name, ferry::shape_string(p.shape));
  }
}

void check_all(const std::vector<Param>& list, const char* what) {
  for (size_t i = 0; i < list.size(); ++i) check(list[i], i, what);
}

// One copy of the whole tensor: a single row of every element, dtype unchanged.
ferry_plan_op_t whole_copy(std::uint32_t src_tensor, std::uint32_t dst_param, const Param& p) {
  const std::uint64_t elements = *ferry::element_count(p.shape);
  ferry_plan_op_t op{};
  op.struct_size = FERRY_STRUCT_SIZE(ferry_plan_op_t, scale_param);
  op.src_tensor = src_tensor;
  op.src_dtype = p.dtype;
  op.src_offset = 0;
  op.src_row_stride = elements;
  op.dst_param = dst_param;
  op.dst_dtype = p.dtype;
  op.dst_offset = 0;
  op.dst_row_stride = elements;
  op.rows = 1;
  op.cols = elements;
  op.transform = FERRY_TRANSFORM_COPY;
  return op;
}

// One instance: the catalog of the last target_layout, swapped whole under the mutex so
// plan/locate (any thread) always see a complete one.
class IdentityModel {
 public:
  std::vector<Param> target_layout(const std::vector<Param>& checkpoint) {
    check_all(checkpoint, "checkpoint catalog");
    auto catalog = std::make_shared<Catalog>();
    catalog->params = checkpoint;
    for (std::uint32_t i = 0; i < catalog->params.size(); ++i) {
      if (!catalog->index.emplace(catalog->params[i].name, i).second) {
        ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                    "identity model: checkpoint tensor '{}' appears twice in the catalog",
                    catalog->params[i].name);
      }
    }
    const std::lock_guard lock(mutex_);
    catalog_ = std::move(catalog);
    return catalog_->params;
  }

  std::vector<ferry_plan_op_t> plan(const std::vector<Param>& entries) const {
    const auto catalog = current("plan");
    check_all(entries, "manifest entries");
    std::vector<ferry_plan_op_t> ops;
    ops.reserve(entries.size());
    std::vector<bool> seen(catalog->params.size(), false);
    for (std::uint32_t i = 0; i < entries.size(); ++i) {
      const std::uint32_t param = find(*catalog, entries[i]);
      if (seen[param]) {
        ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                    "identity model: tensor '{}' appears twice in one bucket", entries[i].name);
      }
      seen[param] = true;
      // A tensor without elements has nothing to copy.
      if (*ferry::element_count(entries[i].shape) > 0) {
        ops.push_back(whole_copy(i, param, entries[i]));
      }
    }
    return ops;
  }

  // An empty shape means "by name only"; otherwise it must be the parameter's.
  ferry_plan_op_t locate(const Param& tensor) const {
    const auto catalog = current("locate");
    const auto it = catalog->index.find(tensor.name);
    if (it == catalog->index.end()) {
      ferry::fail(FERRY_STATUS_NOT_FOUND, "identity model: no parameter named '{}'", tensor.name);
    }
    if (!tensor.shape.empty()) {
      check(tensor, 0, "locate");
      find(*catalog, tensor);
    }
    return whole_copy(0, it->second, catalog->params[it->second]);
  }

 private:
  std::shared_ptr<const Catalog> current(const char* call) const {
    const std::lock_guard lock(mutex_);
    if (!catalog_) {
      ferry::fail(FERRY_STATUS_FAILED_PRECONDITION,
                  "identity model: {} before target_layout (the layout is not known yet)", call);
    }
    return catalog_;
  }

  // The catalog index of `entry`, refusing a name, dtype or shape the catalog does not have.
  static std::uint32_t find(const Catalog& c, const Param& entry) {
    const auto it = c.index.find(entry.name);
    if (it == c.index.end()) {
      ferry::fail(FERRY_STATUS_NOT_FOUND,
                  "identity model: tensor '{}' is not a parameter of this receiver", entry.name);
    }
    const Param& p = c.params[it->second];
    if (p.dtype != entry.dtype || p.shape != entry.shape) {
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "identity model: tensor '{}' is {} {}, the parameter is {} {} (the identity "
                  "model copies without casting or reshaping)",
                  entry.name, ferry::dtype_name(entry.dtype), ferry::shape_string(entry.shape),
                  ferry::dtype_name(p.dtype), ferry::shape_string(p.shape));
    }
    return it->second;
  }

  mutable std::mutex mutex_;  // guards catalog_ (the pointer, not what it points to)
  std::shared_ptr<const Catalog> catalog_;
};

struct IdentityFamily {
  using Model = IdentityModel;
  using Tensor = Param;
  static constexpr const char* kName = "identity";
  static constexpr const char* kVersion = FERRY_IDENTITY_VERSION;
  static constexpr const char* const* kOptions = ferry::sdk::kNoOptions;  // it takes none

  static std::unique_ptr<Model> create(const ferry_model_create_args_t& args) {
    if (args.struct_size >= FERRY_STRUCT_SIZE(ferry_model_create_args_t, tp_size) &&
        args.tp_size != 1) {
      // 0 is malformed (conformance FERRY-ABI-6), above 1 would need a sharded layout.
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "identity model: tp_size {} is not supported (the identity layout is unsharded)",
                  args.tp_size);
    }
    if (args.struct_size >= FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options) &&
        args.num_options > 0) {
      const char* key =
          args.options != nullptr && args.options[0].key != nullptr ? args.options[0].key : "?";
      ferry::fail(FERRY_STATUS_INVALID_ARGUMENT,
                  "identity model: unknown option '{}' (the identity model takes no options)", key);
    }
    return std::make_unique<Model>();
  }
};

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT ferry_error_t* ferry_plugin_negotiate(
    ferry_plugin_negotiation_t* negotiation) {
  return ferry::sdk::ModelPlugin<IdentityFamily>::negotiate(negotiation);
}
