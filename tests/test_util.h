// Helpers shared by the unit tests: a temporary directory that cleans up after itself and a
// deterministic byte generator, so that every run sees the same data.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/chunk_id.h"

namespace ckptfs::test {

// The names in `dir` (none starting with '.'), sorted; none when it cannot be read.
inline std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n[0] != '.') out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A fresh directory under /tmp, removed with everything in it when the object goes away.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/ckptfs-test-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// splitmix64: small, fast and fully specified, so golden values do not depend on the C++ library.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : x_(seed) {}
  uint64_t Next() {
    uint64_t z = (x_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform enough in [0, n) for tests.
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t x_;
};

// Polls `cond` every millisecond until it holds or `seconds` pass; returns its last answer. For
// what another thread does after the call under test has returned (a server counting what it
// sent after the client has read it).
template <typename Cond>
bool Eventually(Cond cond, double seconds = 10) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= end) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng.Next();
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  return out;
}

// A chunk of `len` deterministic bytes and its id, for the cache tests.
struct TestChunk {
  std::vector<uint8_t> bytes;
  ChunkId id;
};
inline TestChunk MakeChunk(size_t len, uint64_t seed) {
  TestChunk c{RandomBytes(len, seed), {}};
  c.id = ChunkId::Of(c.bytes.data(), c.bytes.size());
  return c;
}

// A whole file's bytes; a missing fixture throws, which fails the test that asked.
inline std::string ReadFileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f.good()) throw std::runtime_error("missing fixture " + path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// FNV-1a 64 of s[off, off + len): the fixture generators in tests/formats/data write these.
inline uint64_t Fnv1a64(const std::string& s, uint64_t off, uint64_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = off; i < off + len; ++i) {
    h = (h ^ static_cast<uint8_t>(s[i])) * 0x100000001b3ull;
  }
  return h;
}

}  // namespace ckptfs::test
