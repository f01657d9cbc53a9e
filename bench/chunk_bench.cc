// Chunking and hashing throughput per core, and the cost of putting chunks on the local tier.
// Prints GB/s for: the FastCDC scan alone, XXH3-128 alone, both, and both plus ChunkCache::Put.
// Usage: chunk_bench [MiB=1024] [cache dir for the Put pass]
//        chunk_bench --file CHECKPOINT: the write path's chunking and hashing (FileWriter with the
//        format scanner, 1 MiB writes, chunks discarded) on a real file, with tensor boundaries
//        and with content-defined chunking alone.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cache/chunk_cache.h"
#include "cache/io_engine.h"
#include "common/chunk_id.h"
#include "formats/payload_scan.h"
#include "store/chunker.h"
#include "store/file_writer.h"

using namespace ckptfs;

template <typename F>
double Seconds(F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Counts the chunks a FileWriter cuts and drops their bytes.
class NullSink : public ChunkSink {
 public:
  Status PutChunk(const ChunkId&, const uint8_t*, size_t) override {
    ++chunks;
    return Status::Ok();
  }
  Result<ChunkRef> GetChunk(const ChunkId&, size_t) override { return Internal("not kept"); }
  std::string NewStagingPath() override { return "/nonexistent"; }
  size_t chunks = 0;
};

int FileMode(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return std::perror(path), 1;
  std::vector<uint8_t> data;
  uint8_t buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;)
    data.insert(data.end(), buf, buf + n);
  std::fclose(f);
  for (bool tensors : {true, false}) {
    ChunkingOptions opts;
    opts.tensor_boundaries = tensors;
    Metrics m;
    NullSink sink;
    double best = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      FileWriter w({}, &sink, opts, 64 << 20, &m,
                   [] { return NewPayloadScanner(PayloadScanOptions{}); });
      best = std::min(best, Seconds([&] {
                        for (size_t off = 0; off < data.size(); off += 1 << 20) {
                          const size_t n = std::min<size_t>(1 << 20, data.size() - off);
                          if (!w.Write(off, data.data() + off, n).ok()) std::abort();
                        }
                        if (!w.Finish().ok()) std::abort();
                      }));
    }
    std::printf("write path, %-22s %6.2f GB/s per core (%zu chunks per pass)\n",
                tensors ? "tensor boundaries:" : "content-defined only:", data.size() / 1e9 / best,
                sink.chunks / 3);
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--file") return FileMode(argv[2]);
  size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1024;
  std::string dir = argc > 2 ? argv[2] : "";
  std::vector<uint8_t> data(mib << 20);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    uint64_t v = rng();
    __builtin_memcpy(&data[i], &v, 8);
  }
  const double gb = data.size() / 1e9;
  ChunkingOptions opts;
  std::vector<std::pair<size_t, size_t>> cuts;
  double t_cdc = Seconds([&] {
    Chunker c(opts);
    for (size_t pos = 0; pos < data.size();) {
      size_t n = c.FindCut(data.data() + pos, data.size() - pos);
      if (n == 0) n = data.size() - pos;
      cuts.emplace_back(pos, n);
      pos += n;
    }
  });
  uint64_t sink = 0;
  double t_hash = Seconds([&] {
    for (auto [p, n] : cuts) sink ^= ChunkId::Of(data.data() + p, n).lo;
  });
  // The same cuts read off candidates found ahead (what a seal does with cut_threads): the
  // candidate scan on one core, then the cuts from the list.
  std::vector<uint64_t> found;
  double t_find = Seconds([&] {
    Chunker c(opts);
    c.FindCandidates(data.data(), data.size(), 0, 0, &found);
  });
  size_t same = 0;
  double t_cut = Seconds([&] {
    Chunker c(opts);
    CutCandidates list;
    list.begin = 63;
    list.end = data.size();
    list.at = found;
    size_t k = 0;
    for (size_t pos = 0; pos < data.size();) {
      size_t n = c.FindCutWith(list, pos, data.data() + pos, data.size() - pos);
      if (n == 0) n = data.size() - pos;
      same += k < cuts.size() && cuts[k++].second == n;
      pos += n;
    }
  });
  std::printf("cdc candidates %5.2f GB/s per core, cuts from them %.0f GB/s (%zu of %zu cuts as scanned)\n",
              gb / t_find, gb / t_cut, same, cuts.size());
  std::printf("cdc scan      %6.2f GB/s  (%zu chunks, mean %.0f KiB)\n", gb / t_cdc, cuts.size(),
              data.size() / 1024.0 / cuts.size());
  std::printf("xxh3-128      %6.2f GB/s\n", gb / t_hash);
  std::printf("cdc+xxh3      %6.2f GB/s per core\n", gb / (t_cdc + t_hash));
  if (!dir.empty()) {
    Metrics m;
    IoEngineOptions io;
    if (const char* k = std::getenv("CKPTFS_IO")) io.kind = k;
    auto engine = MakeIoEngine(io);
    auto cache = ChunkCache::Open(dir, engine->get(), 0, &m);
    if (!cache.ok()) return std::fprintf(stderr, "%s\n", cache.status().ToString().c_str()), 1;
    double t_put = Seconds([&] {
      for (auto [p, n] : cuts) {
        auto r = (*cache)->Put(ChunkId::Of(data.data() + p, n), data.data() + p, n);
        if (!r.ok()) std::abort();
      }
    });
    std::printf("put (%s)   %6.2f GB/s (hash + tmp file + rename, page cache)\n", (*engine)->name(),
                gb / t_put);
  }
  return sink == 42 ? 1 : 0;
}
