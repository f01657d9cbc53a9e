// ChunkCache: the local tier. Chunk bytes live as one file per chunk under <dir>/chunks/, named by
// their id; recently read chunks also live in a RAM LRU. Every byte read from disk is verified
// against its id before anyone sees it (invariant 1).
//
// Thread-safe. One ChunkCache owns its directory; the store's lock file keeps a second daemon out.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/chunk_id.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status.h"

namespace ckptfs {

class IoEngine;

// An immutable, verified chunk. Shared by every reader that asked for it while it is cached.
struct ChunkData {
  std::unique_ptr<uint8_t[]> bytes;
  size_t size = 0;
};
using ChunkRef = std::shared_ptr<const ChunkData>;

class ChunkCache {
 public:
  // `dir` must exist. The engine and metrics outlive the cache.
  static Result<std::unique_ptr<ChunkCache>> Open(const std::string& dir, IoEngine* engine,
                                                  uint64_t ram_bytes, Metrics* metrics);
  ~ChunkCache();

  // Makes sure the chunk named `id` (whose bytes are data[0..len)) is on disk. Returns true when
  // it was written now, false when it was already there. The chunk appears under its final name
  // only once complete (written to a temporary name, then renamed), so a crash never leaves a
  // torn chunk under a real name. ENOSPC comes back as kNoSpace with nothing left behind.
  // REQUIRES: id == ChunkId::Of(data, len).
  Result<bool> Put(const ChunkId& id, const void* data, size_t len);

  // The verified bytes of chunk `id`, which is `len` bytes long. One disk read serves all
  // concurrent callers for the same id. kCorrupt when the bytes on disk are not the chunk's (the
  // file is moved aside to <dir>/chunks/corrupt/ so that the next Put writes it anew); kNotFound
  // when absent.
  Result<ChunkRef> Get(const ChunkId& id, size_t len);

  bool Contains(const ChunkId& id) const;
  // Removes the chunk from disk and RAM. A missing chunk is not an error.
  Status Remove(const ChunkId& id);
  // Makes every chunk written so far durable (one syncfs over the tier's filesystem).
  Status Sync();
  // Calls fn for every chunk file on disk (recovery and garbage collection).
  Status ForEach(const std::function<void(const ChunkId&, uint64_t size)>& fn) const;

  std::string PathOf(const ChunkId& id) const;
  const std::string& dir() const { return dir_; }

 private:
  struct Inflight;
  ChunkCache(std::string dir, int dirfd, IoEngine* engine, uint64_t ram_bytes, Metrics* metrics);
  Result<ChunkRef> Load(const ChunkId& id, size_t len);
  ChunkRef RamGet(const ChunkId& id);
  void RamPut(const ChunkId& id, const ChunkRef& data);

  const std::string dir_;  // <cache_dir>/chunks
  const int dirfd_;
  IoEngine* const engine_;
  const uint64_t ram_budget_;
  Metrics* const metrics_;
  Logger log_;

  mutable std::mutex mu_;  // guards everything below
  using Lru = std::list<std::pair<ChunkId, ChunkRef>>;
  Lru lru_;  // most recent first
  std::unordered_map<ChunkId, Lru::iterator, ChunkIdHash> ram_;
  uint64_t ram_used_ = 0;
  std::unordered_map<ChunkId, std::shared_ptr<Inflight>, ChunkIdHash> inflight_;
  uint64_t tmp_seq_ = 0;
};

}  // namespace ckptfs
