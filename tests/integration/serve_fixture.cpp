// The integration-test fixture: tiny dense checkpoints, an independent dtype decoder and a real
// `ferry serve` process (see serve_fixture.hpp).
#include "serve_fixture.hpp"

#include <ferry/formats/safetensors.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ferry::test {
namespace fs = std::filesystem;
using nlohmann::json;

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "ferry-serve-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw std::runtime_error(std::string("environment variable ") + name +
                             " is not set (run the test through meson test)");
  }
  return value;
}

// ---- checkpoints ---------------------------------------------------------------------------

namespace {

std::size_t element_size(ferry_dtype_t dtype) {
  switch (dtype) {
    case FERRY_DTYPE_F64:
    case FERRY_DTYPE_I64: return 8;
    case FERRY_DTYPE_F32:
    case FERRY_DTYPE_I32: return 4;
    case FERRY_DTYPE_F16:
    case FERRY_DTYPE_BF16:
    case FERRY_DTYPE_I16: return 2;
    case FERRY_DTYPE_I8:
    case FERRY_DTYPE_U8:
    case FERRY_DTYPE_BOOL:
    case FERRY_DTYPE_F8_E4M3:
    case FERRY_DTYPE_F8_E5M2: return 1;
    default: throw std::runtime_error("element_size: invalid dtype");
  }
}

std::uint64_t load_le(const std::uint8_t* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

// Whether the raw bits (n bytes, little-endian) are an acceptable random element: finite and
// not zero (BOOL is handled by the caller).
bool acceptable(ferry_dtype_t dtype, std::uint64_t bits) {
  switch (dtype) {
    case FERRY_DTYPE_F64:
      return ((bits >> 52) & 0x7FF) != 0x7FF && (bits & 0x7FFFFFFFFFFFFFFFull) != 0;
    case FERRY_DTYPE_F32: return ((bits >> 23) & 0xFF) != 0xFF && (bits & 0x7FFFFFFF) != 0;
    case FERRY_DTYPE_BF16: return ((bits >> 7) & 0xFF) != 0xFF && (bits & 0x7FFF) != 0;
    case FERRY_DTYPE_F16: return ((bits >> 10) & 0x1F) != 0x1F && (bits & 0x7FFF) != 0;
    case FERRY_DTYPE_F8_E4M3: return (bits & 0x7F) != 0x7F && (bits & 0x7F) != 0;
    case FERRY_DTYPE_F8_E5M2: return ((bits >> 2) & 0x1F) != 0x1F && (bits & 0x7F) != 0;
    default: return bits != 0;
  }
}

}  // namespace

std::uint64_t Tensor::elements() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const Tensor& Checkpoint::at(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("no tensor " + name + " in the test checkpoint");
}

std::uint64_t Checkpoint::total_bytes() const {
  std::uint64_t n = 0;
  for (const auto& t : tensors) n += t.bytes.size();
  return n;
}

std::vector<std::pair<std::string, std::vector<std::uint64_t>>> dense_tensor_shapes(
    const DenseShape& s) {
  std::vector<std::pair<std::string, std::vector<std::uint64_t>>> out;
  out.push_back({"model.embed_tokens.weight", {s.vocab, s.hidden}});
  for (std::uint32_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {s.hidden}});
    out.push_back({p + "self_attn.q_proj.weight", {s.q_rows, s.hidden}});
    out.push_back({p + "self_attn.k_proj.weight", {s.kv_rows, s.hidden}});
    out.push_back({p + "self_attn.v_proj.weight", {s.kv_rows, s.hidden}});
    out.push_back({p + "self_attn.q_norm.weight", {s.head_dim}});
    out.push_back({p + "self_attn.k_norm.weight", {s.head_dim}});
    out.push_back({p + "self_attn.o_proj.weight", {s.hidden, s.q_rows}});
    out.push_back({p + "post_attention_layernorm.weight", {s.hidden}});
    out.push_back({p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}});
    out.push_back({p + "mlp.up_proj.weight", {s.intermediate, s.hidden}});
    out.push_back({p + "mlp.down_proj.weight", {s.hidden, s.intermediate}});
  }
  out.push_back({"model.norm.weight", {s.hidden}});
  if (s.lm_head) out.push_back({"lm_head.weight", {s.vocab, s.hidden}});
  return out;
}

std::vector<std::uint8_t> random_elements(ferry_dtype_t dtype, std::uint64_t count,
                                          std::mt19937_64& rng) {
  const std::size_t size = element_size(dtype);
  std::vector<std::uint8_t> out(count * size);
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint8_t* p = out.data() + i * size;
    if (dtype == FERRY_DTYPE_BOOL) {
      *p = i == 0 ? 1 : i == 1 ? 0 : static_cast<std::uint8_t>(rng() & 1);
      continue;
    }
    std::uint64_t bits = 0;
    do {
      bits = rng();
      if (size < 8) bits &= (std::uint64_t{1} << (8 * size)) - 1;
    } while (!acceptable(dtype, bits));
    for (std::size_t b = 0; b < size; ++b) p[b] = static_cast<std::uint8_t>(bits >> (8 * b));
  }
  return out;
}

Checkpoint make_dense_checkpoint(const DenseShape& shape,
                                 const std::function<ferry_dtype_t(const std::string&)>& dtype_of,
                                 std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Checkpoint c;
  for (auto& [name, dims] : dense_tensor_shapes(shape)) {
    Tensor t;
    t.name = name;
    t.dtype = dtype_of(name);
    t.shape = dims;
    t.bytes = random_elements(t.dtype, t.elements(), rng);
    c.tensors.push_back(std::move(t));
  }
  return c;
}

void write_checkpoint(const fs::path& dir, const Checkpoint& checkpoint, unsigned shards) {
  fs::create_directories(dir);
  std::uint32_t layers = 0;
  for (const auto& t : checkpoint.tensors) {
    if (t.name.starts_with("model.layers.")) {
      const auto index = std::stoul(t.name.substr(std::strlen("model.layers.")));
      layers = std::max<std::uint32_t>(layers, static_cast<std::uint32_t>(index) + 1);
    }
  }
  json config = {{"architectures", {"Qwen3ForCausalLM"}},
                 {"model_type", "qwen3"},
                 {"num_hidden_layers", layers},
                 {"tie_word_embeddings", false}};
  std::ofstream(dir / "config.json") << config.dump(2) << "\n";

  auto to_data = [](const Tensor& t) {
    return safetensors::TensorData{t.name, t.dtype, t.shape, t.bytes};
  };
  if (shards <= 1) {
    std::vector<safetensors::TensorData> data;
    for (const auto& t : checkpoint.tensors) data.push_back(to_data(t));
    safetensors::write_safetensors((dir / "model.safetensors").string(), data);
    return;
  }
  std::map<std::string, std::string> weight_map;
  const std::size_t n = checkpoint.tensors.size();
  for (unsigned s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", s + 1, shards);
    std::vector<safetensors::TensorData> data;
    for (std::size_t i = n * s / shards; i < n * (s + 1) / shards; ++i) {
      data.push_back(to_data(checkpoint.tensors[i]));
      weight_map[checkpoint.tensors[i].name] = name;
    }
    safetensors::write_safetensors((dir / name).string(), data);
  }
  safetensors::write_index((dir / safetensors::kIndexFileName).string(), weight_map,
                           checkpoint.total_bytes());
}

double decode_element(ferry_dtype_t dtype, const std::uint8_t* bytes, std::uint64_t index) {
  const std::size_t size = element_size(dtype);
  const std::uint64_t bits = load_le(bytes + index * size, size);
  switch (dtype) {
    case FERRY_DTYPE_F64: {
      double v;
      std::memcpy(&v, &bits, 8);
      return v;
    }
    case FERRY_DTYPE_F32: {
      const auto b = static_cast<std::uint32_t>(bits);
      float v;
      std::memcpy(&v, &b, 4);
      return v;
    }
    case FERRY_DTYPE_BF16: {
      const auto b = static_cast<std::uint32_t>(bits) << 16;
      float v;
      std::memcpy(&v, &b, 4);
      return v;
    }
    case FERRY_DTYPE_F16: {
      const double sign = (bits & 0x8000) ? -1.0 : 1.0;
      const int e = static_cast<int>((bits >> 10) & 0x1F);
      const int m = static_cast<int>(bits & 0x3FF);
      if (e == 0x1F) return m ? std::nan("") : sign * INFINITY;
      if (e == 0) return sign * std::ldexp(m, -24);
      return sign * std::ldexp(1024 + m, e - 25);
    }
    case FERRY_DTYPE_F8_E4M3: {  // bias 7, no infinities, S.1111.111 is NaN
      const double sign = (bits & 0x80) ? -1.0 : 1.0;
      const int e = static_cast<int>((bits >> 3) & 0xF);
      const int m = static_cast<int>(bits & 0x7);
      if (e == 0xF && m == 0x7) return std::nan("");
      if (e == 0) return sign * std::ldexp(m, -9);
      return sign * std::ldexp(8 + m, e - 10);
    }
    case FERRY_DTYPE_F8_E5M2: {  // bias 15, IEEE-like
      const double sign = (bits & 0x80) ? -1.0 : 1.0;
      const int e = static_cast<int>((bits >> 2) & 0x1F);
      const int m = static_cast<int>(bits & 0x3);
      if (e == 0x1F) return m ? std::nan("") : sign * INFINITY;
      if (e == 0) return sign * std::ldexp(m, -16);
      return sign * std::ldexp(4 + m, e - 17);
    }
    case FERRY_DTYPE_I64: return static_cast<double>(static_cast<std::int64_t>(bits));
    case FERRY_DTYPE_I32: return static_cast<std::int32_t>(static_cast<std::uint32_t>(bits));
    case FERRY_DTYPE_I16: return static_cast<std::int16_t>(static_cast<std::uint16_t>(bits));
    case FERRY_DTYPE_I8: return static_cast<std::int8_t>(static_cast<std::uint8_t>(bits));
    case FERRY_DTYPE_U8: return static_cast<double>(bits);
    case FERRY_DTYPE_BOOL: return bits != 0 ? 1.0 : 0.0;
    default: throw std::runtime_error("decode_element: invalid dtype");
  }
}

std::vector<std::uint8_t> shard_bytes(const Tensor& tensor, int dim, unsigned rank,
                                      unsigned size) {
  const std::size_t esize = element_size(tensor.dtype);
  if (dim == 0) {
    const std::uint64_t rows = tensor.shape.at(0) / size;
    const std::uint64_t row_bytes = tensor.bytes.size() / tensor.shape.at(0);
    const auto begin = tensor.bytes.begin() + static_cast<std::ptrdiff_t>(rank * rows * row_bytes);
    return {begin, begin + static_cast<std::ptrdiff_t>(rows * row_bytes)};
  }
  if (dim != 1 || tensor.shape.size() != 2) throw std::runtime_error("shard_bytes: 2-D, dim 0/1");
  const std::uint64_t rows = tensor.shape[0], cols = tensor.shape[1], part = cols / size;
  std::vector<std::uint8_t> out;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const auto begin =
        tensor.bytes.begin() + static_cast<std::ptrdiff_t>((r * cols + rank * part) * esize);
    out.insert(out.end(), begin, begin + static_cast<std::ptrdiff_t>(part * esize));
  }
  return out;
}

int dense_shard_dim(const std::string& name) {
  for (const char* s : {"o_proj.weight", "down_proj.weight"}) {
    if (name.ends_with(s)) return 1;
  }
  for (const char* s : {"embed_tokens.weight", "lm_head.weight", "q_proj.weight", "k_proj.weight",
                        "v_proj.weight", "gate_proj.weight", "up_proj.weight"}) {
    if (name.ends_with(s)) return 0;
  }
  return -1;
}

std::vector<std::uint8_t> dense_expected_shard(const Tensor& t, unsigned rank, unsigned size) {
  const int dim = dense_shard_dim(t.name);
  return dim < 0 ? t.bytes : shard_bytes(t, dim, rank, size);
}

std::vector<std::uint64_t> dense_shard_shape(const Tensor& t, unsigned size) {
  auto shape = t.shape;
  const int dim = dense_shard_dim(t.name);
  if (dim >= 0) shape[static_cast<std::size_t>(dim)] /= size;
  return shape;
}

std::map<std::string, std::vector<std::uint8_t>> dense_expected_params(const Checkpoint& c,
                                                                       const std::string& layout,
                                                                       unsigned rank,
                                                                       unsigned size) {
  static const std::vector<std::pair<std::string, std::string>> kFused = {
      {"self_attn.q_proj.weight", "self_attn.qkv_proj.weight"},
      {"self_attn.k_proj.weight", "self_attn.qkv_proj.weight"},
      {"self_attn.v_proj.weight", "self_attn.qkv_proj.weight"},
      {"mlp.gate_proj.weight", "mlp.gate_up_proj.weight"},
      {"mlp.up_proj.weight", "mlp.gate_up_proj.weight"}};
  std::map<std::string, std::vector<std::uint8_t>> out;
  for (const auto& t : c.tensors) {
    std::string param = t.name;
    if (layout == "engine") {
      for (const auto& [part, fused] : kFused) {
        if (t.name.ends_with(part)) param = t.name.substr(0, t.name.size() - part.size()) + fused;
      }
    }
    const auto bytes = dense_expected_shard(t, rank, size);
    auto& dst = out[param];  // checkpoints list q, k, v and gate, up in the fused order
    dst.insert(dst.end(), bytes.begin(), bytes.end());
  }
  return out;
}

// ---- the `ferry serve` process -------------------------------------------------------------

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Reply to_reply(const httplib::Result& result) {
  Reply r;
  if (!result) return r;
  r.status = result->status;
  r.text = result->body;
  r.body = json::parse(r.text, nullptr, /*allow_exceptions=*/false);
  if (r.body.is_discarded()) r.body = nullptr;
  return r;
}

}  // namespace

ServeProcess::ServeProcess(ServeOptions options)
    : options_(std::move(options)), dir_(std::make_unique<TempDir>()) {
  const std::string exe = required_env("FERRY_EXE");
  const std::string ready = dir_->file("ready");
  const std::string log = dir_->file("log");
  std::vector<std::string> args = {exe, "--log-level", options_.log_level};
  for (const auto& s : options_.sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  args.insert(args.end(), {"serve", "--port", "0", "--ready-file", ready, "--layout",
                           options_.layout, "--tp-rank", std::to_string(options_.tp_rank),
                           "--tp-size", std::to_string(options_.tp_size)});
  if (!options_.model_family.empty()) {
    args.insert(args.end(), {"--model-family", options_.model_family});
  }
  if (!options_.model_path.empty()) args.insert(args.end(), {"--model-path", options_.model_path});
  if (!options_.token.empty()) args.insert(args.end(), {"--token", options_.token});
  args.insert(args.end(), options_.serve_args.begin(), options_.serve_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The environment, made before the fork (the child may only make async-signal-safe calls).
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (!options_.env.count(entry.substr(0, entry.find('=')))) env_text.push_back(entry);
  }
  for (const auto& [key, value] : options_.env) env_text.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);

  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // Only async-signal-safe calls from here on.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
    if (::getppid() != parent) ::_exit(126);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::close(fd);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }

  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(options_.ready_deadline_s);
  for (;;) {
    const std::string text = read_text(ready);
    if (!text.empty() && text.back() == '\n') {
      port_ = std::stoi(text);
      return;
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      throw std::runtime_error("ferry serve exited (status " + std::to_string(status) +
                               ") before it was ready: " + read_text(log));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
      throw std::runtime_error("ferry serve was not ready within the deadline: " +
                               read_text(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

ServeProcess::~ServeProcess() {
  if (!reaped_) terminate(10);
}

std::optional<int> ServeProcess::terminate(double deadline_s) {
  if (reaped_) return std::nullopt;
  ::kill(pid_, SIGTERM);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  int status = 0;
  for (;;) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  reaped_ = true;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return std::nullopt;
}

std::uint64_t ServeProcess::rss_bytes() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/statm");
  std::uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) throw std::runtime_error("cannot read /proc/<pid>/statm");
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

std::string ServeProcess::log() const { return read_text(dir_->file("log")); }

Reply ServeProcess::get(const std::string& path, const httplib::Headers& headers) const {
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(120, 0);
  return to_reply(client.Get(path.c_str(), headers));
}

Reply ServeProcess::post(const std::string& path, const json& body,
                         const httplib::Headers& headers) const {
  return post_raw(path, body.dump(), headers);
}

Reply ServeProcess::post_raw(const std::string& path, const std::string& body,
                             const httplib::Headers& headers) const {
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(120, 0);
  return to_reply(client.Post(path.c_str(), headers, body, "application/json"));
}

httplib::Headers ServeProcess::auth() const {
  if (options_.token.empty()) return {};
  return {{"Authorization", "Bearer " + options_.token}};
}

Reply ServeProcess::update_from_disk(const std::string& path) const {
  return post("/update_weights_from_disk", json{{"model_path", path}}, auth());
}

std::map<std::string, std::string> ServeProcess::fingerprints() const {
  const Reply r = get("/get_fingerprints");
  if (r.status != 200 || !r.body.is_object() || !r.body.contains("fingerprints")) {
    throw std::runtime_error("GET /get_fingerprints failed: " + std::to_string(r.status) + " " +
                             r.text);
  }
  return r.body["fingerprints"].get<std::map<std::string, std::string>>();
}

Reply ServeProcess::weights(const std::string& name, std::uint64_t truncate_size) const {
  return post("/get_weights_by_name", json{{"name", name}, {"truncate_size", truncate_size}});
}

}  // namespace ferry::test
