// A real Ceph radosgw for the S3 tests: started once per test binary by scripts/rgw.sh (which
// writes the endpoint and keys to DIR/env), one bucket made with boto3, stopped by the script at
// the end. Also the misbehaving proxy (s3_flaky_proxy.py) the retry tests put in front of it.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ckptfs::test {

inline const std::string kSourceDir = CKPTFS_SOURCE_DIR;
inline const std::string kBucket = "ckptfs-test";

// Runs `cmd` through bash; returns its exit status and (into *out) stdout+stderr.
inline int Shell(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
  int rc = ::pclose(p);
  if (out) *out = text;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

class RgwEnvironment : public ::testing::Environment {
 public:
  static RgwEnvironment*& Get() {
    static RgwEnvironment* env = nullptr;
    return env;
  }

  void SetUp() override {
    char tmpl[] = "/tmp/ckptfs-rgw-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::string out;
    int rc = Shell("bash " + kSourceDir + "/scripts/rgw.sh start " + dir_, &out);
    started_ = true;
    ASSERT_EQ(rc, 0) << "scripts/rgw.sh start " << dir_ << " failed; its output:\n" << out;
    // "export NAME=VALUE" lines; the values are set for this process, so that the backend's own
    // resolution (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) finds them.
    std::ifstream env(dir_ + "/env");
    for (std::string line; std::getline(env, line);) {
      if (line.rfind("export ", 0) == 0) line = line.substr(7);
      size_t eq = line.find('=');
      if (eq == std::string::npos) continue;
      std::string name = line.substr(0, eq), value = line.substr(eq + 1);
      if (value.size() >= 2 && (value.front() == '\'' || value.front() == '"')) {
        value = value.substr(1, value.size() - 2);
      }
      ::setenv(name.c_str(), value.c_str(), 1);
      vars_[name] = value;
    }
    ASSERT_TRUE(vars_.count("AWS_ENDPOINT_URL") && vars_.count("AWS_ACCESS_KEY_ID") &&
                vars_.count("AWS_SECRET_ACCESS_KEY"))
        << dir_ << "/env lacks the endpoint or the keys";
    rc = Admin("create-bucket " + kBucket, &out);
    ASSERT_EQ(rc, 0) << "creating bucket " << kBucket << ": " << out;
  }

  void TearDown() override {
    StopProxy();
    if (!started_) return;
    std::string out;
    if (Shell("bash " + kSourceDir + "/scripts/rgw.sh stop " + dir_, &out) != 0) {
      ADD_FAILURE() << "scripts/rgw.sh stop failed:\n" << out;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string Var(const std::string& name) const {
    auto it = vars_.find(name);
    return it == vars_.end() ? "" : it->second;
  }
  std::string endpoint() const { return Var("AWS_ENDPOINT_URL"); }

  // tests/backends/s3_admin.py with the environment above.
  int Admin(const std::string& args, std::string* out) {
    return Shell("/usr/bin/python3 " + kSourceDir + "/tests/backends/s3_admin.py " + args, out);
  }

  // The flaky proxy's URL, starting it on first use (it lives until TearDown). With tls, a second
  // one that speaks HTTPS, its certificate in TlsCaFile().
  std::string ProxyUrl(bool tls = false) {
    Proxy& p = proxies_[tls];
    if (p.pid > 0) return p.url;
    std::string port_file = dir_ + (tls ? "/tls-proxy.port" : "/proxy.port");
    std::string script = kSourceDir + "/tests/backends/s3_flaky_proxy.py";
    std::string upstream = endpoint();
    std::vector<const char*> argv = {"/usr/bin/python3", script.c_str(), "--upstream",
                                     upstream.c_str(),   "--port-file",  port_file.c_str()};
    if (tls) {
      argv.push_back("--tls-dir");
      argv.push_back(dir_.c_str());
    }
    argv.push_back(nullptr);
    if (::posix_spawn(&p.pid, argv[0], nullptr, nullptr, const_cast<char**>(argv.data()),
                      environ) != 0) {
      p.pid = 0;
      return "";
    }
    for (int i = 0; i < 400 && !std::filesystem::exists(port_file); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::ifstream in(port_file);
    std::string port;
    in >> port;
    p.url = port.empty() ? "" : std::string(tls ? "https" : "http") + "://127.0.0.1:" + port;
    return p.url;
  }
  std::string TlsCaFile() const { return dir_ + "/cert.pem"; }

  void StopProxy() {
    for (Proxy& p : proxies_) {
      if (p.pid <= 0) continue;
      ::kill(p.pid, SIGTERM);
      int status;
      ::waitpid(p.pid, &status, 0);
      p.pid = 0;
    }
  }

 private:
  std::string dir_;
  bool started_ = false;
  std::map<std::string, std::string> vars_;
  struct Proxy {
    pid_t pid = 0;
    std::string url;
  };
  Proxy proxies_[2];  // plain, TLS
};

inline RgwEnvironment& Rgw() { return *RgwEnvironment::Get(); }

// Call once, before RUN_ALL_TESTS (from a namespace-scope initializer when using gtest_main).
inline bool RegisterRgwEnvironment() {
  RgwEnvironment::Get() = new RgwEnvironment;
  ::testing::AddGlobalTestEnvironment(RgwEnvironment::Get());  // gtest owns it
  return true;
}

}  // namespace ckptfs::test
