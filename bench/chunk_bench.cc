// Chunking and hashing throughput per core, and the cost of putting chunks on the local tier.
// Prints GB/s for: the FastCDC scan alone, XXH3-128 alone, both, and both plus ChunkCache::Put.
// Usage: chunk_bench [MiB=1024] [cache dir for the Put pass]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cache/chunk_cache.h"
#include "cache/io_engine.h"
#include "common/chunk_id.h"
#include "store/chunker.h"

using namespace ckptfs;

template <typename F>
double Seconds(F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int main(int argc, char** argv) {
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
    std::printf("put (%s)   %6.2f GB/s (hash + tmp file + rename, page cache)\n",
                (*engine)->name(), gb / t_put);
  }
  return sink == 42 ? 1 : 0;
}
