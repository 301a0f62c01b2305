// Shared helpers of the session tests (see session_fixture.hpp).
#include "session_fixture.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ferry/kernels/cpu.hpp>

#include <fstream>
#include <sstream>
#include <thread>

namespace ferry::test {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

pid_t spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
            const std::string& log) {
  std::vector<std::string> full = {required_env("FERRY_EXE")};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
  for (const auto& [k, v] : env) env_text.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
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
  return pid;
}

bool wait_for(pid_t pid, double deadline_s, ChildResult& result) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  while (true) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      result.exited = WIFEXITED(status);
      result.status = WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status);
      return true;
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

TwoVersions::TwoVersions() {
  auto f32 = [](const std::string&) { return FERRY_DTYPE_F32; };
  v1 = make_dense_checkpoint(DenseShape{}, f32, 11);
  v2 = make_dense_checkpoint(DenseShape{}, f32, 22);
  write_checkpoint(dir.path() / "v1", v1, 1);
  write_checkpoint(dir.path() / "v2", v2, 2);
}

std::map<std::string, std::string> expected_fingerprints(const Checkpoint& checkpoint,
                                                         unsigned rank, unsigned size) {
  std::map<std::string, std::string> out;
  for (const auto& [name, bytes] : dense_expected_params(checkpoint, "engine", rank, size)) {
    out[name] = fmt::format("{:016x}", kernels::fingerprint_cpu(bytes.data(), bytes.size(), 1));
  }
  return out;
}

std::string address_of(const ServeProcess& serve) {
  return "127.0.0.1:" + std::to_string(serve.port());
}

ServeOptions receiver_options(const std::string& model_path, unsigned tp_rank, unsigned tp_size,
                              std::uint64_t bucket_timeout_ms) {
  ServeOptions o;
  o.model_path = model_path;
  o.tp_rank = tp_rank;
  o.tp_size = tp_size;
  o.sets = {"update.bucket_timeout_ms=" + std::to_string(bucket_timeout_ms),
            "update.commit_timeout_ms=" + std::to_string(bucket_timeout_ms),
            "update.apply_threads=1"};
  return o;
}

ChildResult run_ferry(const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& env, double deadline_s) {
  TempDir dir;
  const std::string log = dir.file("log");
  const pid_t pid = spawn(args, env, log);
  ChildResult result;
  if (!wait_for(pid, deadline_s, result)) {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    result.exited = false;
    result.status = SIGKILL;
    result.output = "(killed after the deadline) ";
  }
  result.output += read_all(log);
  return result;
}

PushProcess::PushProcess(const std::vector<std::string>& args,
                         const std::map<std::string, std::string>& env)
    : dir_(std::make_unique<TempDir>()) {
  pid_ = spawn(args, env, dir_->file("log"));
}

PushProcess::~PushProcess() { kill_now(); }

void PushProcess::kill_now() {
  if (reaped_ || pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  reaped_ = true;
}

bool PushProcess::wait(double deadline_s, ChildResult& result) {
  if (reaped_) return true;
  if (!wait_for(pid_, deadline_s, result)) return false;
  reaped_ = true;
  result.output = read_all(dir_->file("log"));
  return true;
}

std::vector<session::TensorView> views_of(const Checkpoint& checkpoint) {
  std::vector<session::TensorView> out;
  for (const auto& t : checkpoint.tensors) {
    out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), FERRY_MEMORY_HOST, 0});
  }
  return out;
}

bool eventually(const std::function<bool()>& predicate, double deadline_s) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  while (true) {
    if (predicate()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

long long version_of(const ServeProcess& serve) {
  const auto r = serve.get("/get_weight_version");
  if (r.status != 200 || !r.body.is_object()) return -1;
  return r.body.value("version", -1LL);
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace ferry::test
