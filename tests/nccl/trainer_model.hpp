// tests/nccl/trainer_model.hpp: the small dense-shaped bf16 model the NCCL two-rank tests
// broadcast: its tensors on a CUDA device, refilled with a step-dependent pattern, and the
// fingerprints a receiver must report for a step (computed from the host bytes, independently
// of any GPU). Shared by nccl_two_rank_test and the trainer process nccl_trainer_peer.
#pragma once

#include <cuda_runtime.h>
#include <ferry/kernels/cpu.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "session/sender/sender.hpp"

namespace ferry::test {

class TrainerModel {
 public:
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> shape;
    std::vector<std::uint8_t> host;  // the bytes last uploaded
    void* device = nullptr;
  };

  explicit TrainerModel(int device = 0) : device_(device) {
    auto add = [&](std::string name, std::vector<std::uint64_t> shape) {
      tensors_.push_back(Tensor{std::move(name), std::move(shape), {}, nullptr});
    };
    add("model.embed_tokens.weight", {8192, 512});
    for (int l = 0; l < 4; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "self_attn.qkv_proj.weight", {1536, 512});
      add(p + "self_attn.o_proj.weight", {512, 512});
      add(p + "mlp.gate_up_proj.weight", {2816, 512});
      add(p + "mlp.down_proj.weight", {512, 1408});
      add(p + "input_layernorm.weight", {512});
    }
    add("lm_head.weight", {8192, 512});
    cudaSetDevice(device_);
    for (auto& t : tensors_) {
      std::uint64_t n = 2;  // bf16
      for (auto d : t.shape) n *= d;
      t.host.resize(n);
      if (cudaMalloc(&t.device, n) != cudaSuccess) {
        throw std::runtime_error("trainer model: cudaMalloc failed for " + t.name);
      }
    }
  }
  ~TrainerModel() {
    for (auto& t : tensors_) cudaFree(t.device);
  }
  TrainerModel(const TrainerModel&) = delete;
  TrainerModel& operator=(const TrainerModel&) = delete;

  // The host bytes of `step` (deterministic), uploaded to the device.
  void fill(unsigned step) {
    fill_host(step);
    cudaSetDevice(device_);
    for (auto& t : tensors_) {
      if (cudaMemcpy(t.device, t.host.data(), t.host.size(), cudaMemcpyHostToDevice) !=
          cudaSuccess) {
        throw std::runtime_error("trainer model: upload failed for " + t.name);
      }
    }
  }

  // Only the host bytes of `step` (for a process that checks a receiver without broadcasting).
  void fill_host(unsigned step) {
    std::uint32_t x = step * 2654435761u + 17;
    for (auto& t : tensors_) {
      for (auto& b : t.host) {
        x = x * 1664525u + 1013904223u;
        b = static_cast<std::uint8_t>(x >> 24);
      }
    }
  }

  // GET /get_fingerprints' values for the host bytes.
  std::map<std::string, std::string> fingerprints() const {
    std::map<std::string, std::string> out;
    for (const auto& t : tensors_) {
      out[t.name] = fmt::format("{:016x}", kernels::fingerprint_cpu(t.host.data(), t.host.size()));
    }
    return out;
  }

  std::vector<session::TensorView> views() const {
    std::vector<session::TensorView> out;
    for (const auto& t : tensors_) {
      out.push_back(session::TensorView{t.name, FERRY_DTYPE_BF16, t.shape, t.device,
                                        FERRY_MEMORY_CUDA, device_});
    }
    return out;
  }

  const std::vector<Tensor>& tensors() const { return tensors_; }

 private:
  int device_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace ferry::test
