// tests/integration/serve_fixture.hpp: what the receiver's integration tests share: tiny dense
// (Qwen3-like) checkpoints with random, never-zero data written as real safetensors files, an
// independent decoder of every dtype's raw bits, and a real `ferry serve` process (fork/exec)
// with JSON helpers over HTTP.
#pragma once

#include <ferry/plugin.h>
#include <httplib.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace ferry::test {

// A fresh temporary directory, removed with its contents when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// The value of an environment variable the meson test definition sets; fails the test (throws)
// when it is missing.
std::string required_env(const char* name);

// ---- checkpoints -----------------------------------------------------------------------

struct Tensor {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint8_t> bytes;  // row-major, little-endian

  std::uint64_t elements() const;
};

struct Checkpoint {
  std::vector<Tensor> tensors;  // in file order
  const Tensor& at(const std::string& name) const;
  std::uint64_t total_bytes() const;
};

// Shapes of a tiny dense model. The defaults divide by tp_size 1, 2 and 4 everywhere.
struct DenseShape {
  std::uint64_t vocab = 16;
  std::uint64_t hidden = 8;
  std::uint64_t q_rows = 8;   // heads x head_dim
  std::uint64_t kv_rows = 4;  // kv heads x head_dim
  std::uint64_t head_dim = 2;  // q_norm / k_norm length (Qwen3)
  std::uint64_t intermediate = 16;
  std::uint32_t layers = 2;
  bool lm_head = true;
};

// Every tensor name of the model in file order (Qwen3 names: q/k norms, lm_head when asked).
std::vector<std::pair<std::string, std::vector<std::uint64_t>>> dense_tensor_shapes(
    const DenseShape& shape);

// Random bytes for `count` elements of `dtype`: never zero, never NaN or infinite (so every
// value survives JSON), subnormals included where the type has them; BOOL elements are 0 or 1
// with both present.
std::vector<std::uint8_t> random_elements(ferry_dtype_t dtype, std::uint64_t count,
                                          std::mt19937_64& rng);

// A dense checkpoint whose tensor `name` has dtype `dtype_of(name)`.
Checkpoint make_dense_checkpoint(const DenseShape& shape,
                                 const std::function<ferry_dtype_t(const std::string&)>& dtype_of,
                                 std::uint64_t seed);

// Writes `checkpoint` into `dir` with a config.json (architectures: Qwen3ForCausalLM,
// num_hidden_layers). shards == 1: model.safetensors; otherwise model-0000i-of-0000n.safetensors
// (tensors dealt out in order) plus model.safetensors.index.json.
void write_checkpoint(const std::filesystem::path& dir, const Checkpoint& checkpoint,
                      unsigned shards = 1);

// Element `index` of `bytes` (of `dtype`) as a double, decoded from the raw bits by this test
// code alone (not the kernels): bf16 is bits << 16 as f32, f16/f8 by their exponent and mantissa
// fields, integers by sign extension, BOOL as 0/1.
double decode_element(ferry_dtype_t dtype, const std::uint8_t* bytes, std::uint64_t index);

// Rank `rank`'s shard (of `size`) of a row-major tensor along `dim` (0 or 1), as raw bytes.
std::vector<std::uint8_t> shard_bytes(const Tensor& tensor, int dim, unsigned rank, unsigned size);

// What the dense plugin does with a checkpoint tensor under tensor parallelism (models/dense/
// README.md), restated independently: -1 replicated (norms), 0 (q/k/v, gate/up, embedding,
// lm_head) or 1 (o_proj, down_proj).
int dense_shard_dim(const std::string& name);
// Rank `rank`'s part of the tensor (the whole tensor when replicated) and its shape.
std::vector<std::uint8_t> dense_expected_shard(const Tensor& tensor, unsigned rank, unsigned size);
std::vector<std::uint64_t> dense_shard_shape(const Tensor& tensor, unsigned size);
// Every parameter of one rank with its expected bytes, by parameter name. layout "engine" fuses
// q,k,v into self_attn.qkv_proj.weight and gate,up into mlp.gate_up_proj.weight (this rank's
// rows of each part, in that order); "hf" keeps the checkpoint names.
std::map<std::string, std::vector<std::uint8_t>> dense_expected_params(const Checkpoint& checkpoint,
                                                                       const std::string& layout,
                                                                       unsigned rank, unsigned size);

// ---- the `ferry serve` process --------------------------------------------------------------

struct ServeOptions {
  std::string model_path;  // empty: start without weights
  std::string layout = "engine";
  unsigned tp_rank = 0;
  unsigned tp_size = 1;
  std::string token;
  std::vector<std::string> sets;  // --set key=value
  std::string model_family = "dense";
  double ready_deadline_s = 60;
  std::string log_level = "warn";  // --log-level of the process (its log())
  std::vector<std::string> serve_args;  // more arguments of `serve`, after the others
  std::map<std::string, std::string> env;  // set in the process's environment
};

struct Reply {
  int status = 0;  // 0: no answer (connection failed)
  std::string text;
  nlohmann::json body;  // parsed text, or null when it is not JSON
};

class ServeProcess {
 public:
  // Spawns FERRY_EXE serve ... --port 0 --ready-file F and waits (up to ready_deadline_s) until
  // F names the port. Throws std::runtime_error with the process's log when it exits or the
  // deadline passes first.
  explicit ServeProcess(ServeOptions options);
  // SIGTERM, then SIGKILL when it has not exited after 10 s.
  ~ServeProcess();
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  const ServeOptions& options() const { return options_; }

  // Sends SIGTERM and waits up to `deadline_s`; returns the exit status (WEXITSTATUS), or
  // nullopt when it was still running (then it is killed) or died of a signal.
  std::optional<int> terminate(double deadline_s);

  // Resident set size (bytes) from /proc/<pid>/statm.
  std::uint64_t rss_bytes() const;
  // The process's stderr so far (for failure messages).
  std::string log() const;

  Reply get(const std::string& path, const httplib::Headers& headers = {}) const;
  Reply post(const std::string& path, const nlohmann::json& body,
             const httplib::Headers& headers = {}) const;
  Reply post_raw(const std::string& path, const std::string& body,
                 const httplib::Headers& headers = {}) const;

  // Headers carrying the configured token (empty when no token).
  httplib::Headers auth() const;

  // Convenience: POST /update_weights_from_disk with the token.
  Reply update_from_disk(const std::string& path) const;
  // GET /get_fingerprints -> parameter name -> hex text.
  std::map<std::string, std::string> fingerprints() const;
  // POST /get_weights_by_name.
  Reply weights(const std::string& name, std::uint64_t truncate_size) const;

 private:
  ServeOptions options_;
  std::unique_ptr<TempDir> dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool reaped_ = false;
};

}  // namespace ferry::test
