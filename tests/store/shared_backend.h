// Stores (simulated nodes), each with its own cache directory, on one in-memory backend.
// SharedBackend forwards to a MemBackend shared by several Stores, so that each Store can own its
// own Backend object; hooks let a test act around a request, and `fail_rate`
// injects kIo (seeded) into any request but the listing. NodesTest is the fixture.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "backends/mem_backend.h"
#include "store/remote_tier.h"
#include "store/store.h"
#include "tests/test_util.h"

namespace ckptfs::test {

class SharedBackend : public Backend {
 public:
  explicit SharedBackend(MemBackend* m) : m_(m) {}

  std::function<void(const std::string& key)> on_put;   // after each Put, on the caller
  std::function<void(const std::string& key)> on_head;  // after each Head, before it answers
  std::function<void(const std::string& key)> on_get;   // after each Get, before it answers
  std::function<void(const std::string& key)> on_delete;  // before each Delete
  // Put fails with kIo while this returns true for its key (set before use).
  std::function<bool(const std::string& key)> fail_put;
  double fail_rate = 0;                                 // set before use
  uint64_t seed = 0;

  Status Put(const std::string& k, const void* d, size_t n) override {
    if (Fails() || (fail_put && fail_put(k))) return Status(Code::kIo, "injected fault: put " + k);
    Status st = m_->Put(k, d, n);
    if (on_put) on_put(k);
    return st;
  }
  Status PutIfAbsent(const std::string& k, const void* d, size_t n) override {
    if (Fails()) return Status(Code::kIo, "injected fault: put " + k);
    Status st = m_->PutIfAbsent(k, d, n);
    if (on_put) on_put(k);
    return st;
  }
  Result<size_t> Get(const std::string& k, uint64_t o, void* b, size_t n) override {
    if (Fails()) return Status(Code::kIo, "injected fault: get " + k);
    auto r = m_->Get(k, o, b, n);
    if (on_get) on_get(k);
    return r;
  }
  Result<ObjectInfo> Head(const std::string& k) override {
    if (Fails()) return Status(Code::kIo, "injected fault: head " + k);
    auto r = m_->Head(k);
    if (on_head) on_head(k);
    return r;
  }
  Status Delete(const std::string& k) override {
    if (Fails()) return Status(Code::kIo, "injected fault: delete " + k);
    if (on_delete) on_delete(k);
    return m_->Delete(k);
  }
  Status List(const std::string& p, const std::string& a,
              const std::function<bool(const ObjectInfo&)>& fn) override {
    return m_->List(p, a, fn);
  }
  std::string Describe() const override { return m_->Describe(); }

 private:
  bool Fails() {
    if (fail_rate <= 0) return false;
    std::lock_guard lock(mu_);
    if (!rng_seeded_) rng_.seed(seed), rng_seeded_ = true;
    return std::uniform_real_distribution<double>(0, 1)(rng_) < fail_rate;
  }

  MemBackend* m_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  bool rng_seeded_ = false;
};

class NodesTest : public ::testing::Test {
 protected:
  using Bytes = std::vector<uint8_t>;

  // The configuration of node `name` on `backends`, small chunks, no sync thread.
  Config NodeConfig(const std::string& name, std::vector<std::string> backends) {
    Config cfg;
    cfg.mountpoint = "/unused";
    cfg.cache_dir = dir_.Sub(name);
    cfg.chunking.min_bytes = 16 << 10;
    cfg.chunking.avg_bytes = 64 << 10;
    cfg.chunking.max_bytes = 256 << 10;
    cfg.backends = std::move(backends);
    cfg.sync_interval_s = 0;  // the tests run the sync passes themselves
    return cfg;
  }

  // A node on the shared backend; `tweak` adjusts its configuration.
  std::unique_ptr<Store> OpenStore(const std::string& name, SharedBackend** backend = nullptr,
                                   const std::function<void(Config&)>& tweak = {}) {
    Config cfg = NodeConfig(name, {"mem://"});
    if (tweak) tweak(cfg);
    EXPECT_TRUE(cfg.Validate().ok());
    auto shared = std::make_unique<SharedBackend>(&mem_);
    if (backend) *backend = shared.get();
    auto s = Store::Open(cfg, {}, std::move(shared));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // Creates or replaces parent/name with `data`; returns its inode.
  static uint64_t Write(Store& s, uint64_t parent, const std::string& name, const Bytes& data) {
    auto f = s.Lookup(parent, name);
    uint64_t ino = f.ok() ? f->ino : 0;
    if (!ino) {
      auto r = s.MakeNode(parent, name, S_IFREG | 0644, 0, Caller{});
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      ino = r->ino;
    }
    EXPECT_TRUE(s.Open(ino, true).ok());
    EXPECT_TRUE(s.Write(ino, 0, data.data(), data.size()).ok());
    EXPECT_TRUE(s.Flush(ino).ok());
    EXPECT_TRUE(s.Release(ino).ok());
    return ino;
  }

  // The whole file as the node reads it.
  static Bytes Read(Store& s, uint64_t ino) {
    EXPECT_TRUE(s.Open(ino).ok());
    std::vector<ReadSlice> slices;
    Status st = s.Read(ino, 0, 64 << 20, &slices);
    EXPECT_TRUE(st.ok()) << st.ToString();
    Bytes out;
    for (const ReadSlice& sl : slices) out.insert(out.end(), sl.data, sl.data + sl.len);
    EXPECT_TRUE(s.Release(ino).ok());
    return out;
  }

  // Whether `m` holds under files/<path> the version of file `ino` that node s has committed (its
  // generation and manifest): what a state of "remote" promises.
  static bool HoldsVersion(MemBackend& m, Store& s, uint64_t ino, const std::string& path) {
    auto bytes = m.GetObject("files/" + path);
    if (!bytes.ok()) return false;
    auto r = FileRecord::Decode(*bytes);
    auto rec = s.GetAttr(ino);
    auto committed = s.CommittedManifest(ino);
    return r.ok() && rec.ok() && committed.ok() && r->generation == rec->generation &&
           r->manifest == **committed;
  }

  TempDir dir_;
  MemBackend mem_;
};

}  // namespace ckptfs::test
