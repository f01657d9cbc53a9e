// What a node's namespace sync costs against a bucket of N files (default 100,000), in requests
// to the backend (an in-memory one that counts them) and in the node's memory, with the change
// journal (store/journal.h) and with a full listing every pass (sync_full_interval=0, how every
// pass went before the journal):
//   first   the pass a new mount makes (every record read)
//   idle    a pass with no change anywhere
//   10      a pass after another node changed 10 files
// and, last, the first pass of a new mount when the bucket holds a record snapshot
// (store/snapshot.h) with 100 journal entries after it (mode "snapshot").
// The other node's files are put in the bucket directly (records with empty manifests, each
// announced in the journal as a node's RemoteTier does), so that only the reader is measured.
// Usage: sync_bench [FILES=100000] [WORK DIR=/var/tmp/ckptfs-sync-bench]
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "backends/mem_backend.h"
#include "store/journal.h"
#include "store/snapshot.h"
#include "store/remote_tier.h"
#include "store/store.h"

using namespace ckptfs;

namespace {

// Hands the Store a backend that stays ours to count.
class Forward : public Backend {
 public:
  explicit Forward(MemBackend* m) : m_(m) {}
  Status Put(const std::string& k, const void* d, size_t n) override { return m_->Put(k, d, n); }
  Status PutIfAbsent(const std::string& k, const void* d, size_t n) override {
    return m_->PutIfAbsent(k, d, n);
  }
  Result<size_t> Get(const std::string& k, uint64_t o, void* b, size_t n) override {
    return m_->Get(k, o, b, n);
  }
  Result<std::string> GetObject(const std::string& k) override { return m_->GetObject(k); }
  Result<ObjectInfo> Head(const std::string& k) override { return m_->Head(k); }
  Status Delete(const std::string& k) override { return m_->Delete(k); }
  // Counted as S3 counts them: a LIST request returns up to 1,000 keys.
  Status List(const std::string& p, const std::string& a,
              const std::function<bool(const ObjectInfo&)>& fn) override {
    uint64_t n = 0;
    Status st = m_->List(p, a, [&](const ObjectInfo& o) { return ++n, fn(o); });
    list_pages += n / 1000 + 1;
    return st;
  }
  std::string Describe() const override { return m_->Describe(); }

  uint64_t list_pages = 0;

 private:
  MemBackend* m_;
};
Forward* g_forward = nullptr;

std::string Path(size_t i) {
  return "ckpt/step" + std::to_string(i / 1000) + "/rank" + std::to_string(i % 1000) + ".pt";
}

void Publish(MemBackend* mem, NamespaceJournal* journal, size_t i, uint64_t generation) {
  FileRecord r;
  r.mode = S_IFREG | 0644;
  r.mtime_ns = 1;
  r.generation = generation;
  r.origin = "writer-node";
  const std::string bytes = r.Encode();
  const std::string key = "files/" + Path(i);
  if (!mem->Put(key, bytes.data(), bytes.size()).ok() || !journal->Append(key).ok()) {
    std::fprintf(stderr, "publishing %s failed\n", key.c_str());
    std::exit(1);
  }
}

long RssKiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return 0;
}

struct Cost {
  uint64_t requests, lists, gets, heads;
  double seconds;
};

template <typename F>
Cost Measure(MemBackend* mem, F&& f) {
  mem->ResetStats();
  g_forward->list_pages = 0;
  auto t0 = std::chrono::steady_clock::now();
  f();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto st = mem->stats();
  const uint64_t lists = g_forward->list_pages;
  return Cost{lists + st.gets + st.heads + st.puts + st.deletes, lists, st.gets, st.heads, s};
}

void Print(const char* mode, const char* pass, const Cost& c) {
  std::printf("%-8s %-6s requests %8llu  (LIST pages %llu, GETs %llu, HEADs %llu)  %.2f s\n", mode,
              pass, static_cast<unsigned long long>(c.requests),
              static_cast<unsigned long long>(c.lists), static_cast<unsigned long long>(c.gets),
              static_cast<unsigned long long>(c.heads), c.seconds);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 100000;
  const std::string work = argc > 2 ? argv[2] : "/var/tmp/ckptfs-sync-bench";
  std::filesystem::remove_all(work);
  MemBackend mem("bucket");
  NamespaceJournal writer(&mem, "writer-node");
  for (size_t i = 0; i < n; ++i) Publish(&mem, &writer, i, 1);
  std::printf("bucket: %zu files, %zu journal entries\n", n, n);
  uint64_t generation = 2;
  for (const char* mode : {"listing", "journal", "snapshot"}) {
    const bool snapshot = std::string(mode) == "snapshot";
    if (snapshot) {
      NamespaceSnapshot::WriteOptions opts;
      auto t0 = std::chrono::steady_clock::now();
      auto w = NamespaceSnapshot::Write(mem, opts);
      if (!w.ok()) {
        std::fprintf(stderr, "snapshot: %s\n", w.status().ToString().c_str());
        return 1;
      }
      std::printf("snapshot: %zu parts, %.1f MiB, written in %.2f s (journal entry %llu)\n",
                  w->manifest.parts.size(), static_cast<double>(w->bytes) / (1 << 20),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  static_cast<unsigned long long>(w->manifest.journal));
      for (size_t i = 0; i < 100; ++i) Publish(&mem, &writer, (i * 7919 + 3) % n, generation);
      ++generation;
      std::printf("bucket: 100 journal entries after the snapshot\n");
    }
    Config cfg;
    cfg.mountpoint = "/unused";
    cfg.cache_dir = work + "/" + mode;
    cfg.backends = {"mem://"};
    cfg.sync_interval_s = 0;  // the passes are run here
    cfg.sync_full_interval_s = std::string(mode) == "listing" ? 0 : 600;
    // (the journal mode's mount finds no snapshot yet: it is written before the last mode)
    if (Status v = cfg.Validate(); !v.ok()) {
      std::fprintf(stderr, "config: %s\n", v.ToString().c_str());
      return 1;
    }
    const long rss0 = RssKiB();
    auto forward = std::make_unique<Forward>(&mem);
    g_forward = forward.get();
    auto store = Store::Open(cfg, {}, std::move(forward));
    if (!store.ok()) {
      std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
      return 1;
    }
    Store& s = **store;
    auto run = [&] {
      if (Status st = s.SyncFromRemote(); !st.ok()) {
        std::fprintf(stderr, "sync: %s\n", st.ToString().c_str());
        std::exit(1);
      }
    };
    Print(mode, "first", Measure(&mem, run));
    const long rss1 = RssKiB();
    Print(mode, "idle", Measure(&mem, run));
    for (size_t i = 0; i < 10; ++i) Publish(&mem, &writer, i * 997 % n, generation);
    ++generation;
    Print(mode, "10", Measure(&mem, run));
    std::error_code ec;
    uintmax_t lmdb = 0;
    for (auto& e : std::filesystem::recursive_directory_iterator(cfg.cache_dir, ec)) {
      if (e.is_regular_file() && e.path().filename().string().find("mdb") != std::string::npos) {
        lmdb += e.file_size();
      }
    }
    std::printf("%-8s memory: RSS +%ld MiB after the first pass, LMDB files %.1f MiB\n", mode,
                (rss1 - rss0) / 1024, static_cast<double>(lmdb) / (1 << 20));
    (void)s.Close();
  }
  std::filesystem::remove_all(work);
  return 0;
}
