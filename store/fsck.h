// FsckPass: is every byte of the committed files where the store says it is? It checks the
// chunks of file `ino`, or of every file under directory `ino`, on the local tier and every
// remote tier, and (from the root) the chunk reference counts; and each tier's file records
// under the path.
// `deep` reads and verifies every chunk (local files, and tier objects by GET) instead of
// checking presence; `repair` refetches a missing or corrupt local chunk from the nearest tier
// with a good copy, puts a missing or corrupt tier chunk back from a verified local or other
// tier's copy, and publishes a bad or missing record again. Works on a live mount; the caller
// seals staged files first (Store::Fsck), so that their bytes are checked as chunks.
//
// Locks: FsckPass owns no state and holds no lock of its own. It reads LMDB in read transactions,
// and calls ChunkCache and the Publisher, which take their own (leaf) locks. A republish
// (repair) writes one LMDB transaction of its own, queueing the file's publish op for that tier,
// without the store's namespace lock, as it did inside the Store; LMDB's single writer orders it
// with the namespace's transactions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cache/chunk_cache.h"
#include "common/log.h"
#include "common/status.h"
#include "store/meta_store.h"
#include "store/publisher.h"

namespace ckptfs {

struct FsckOptions {
  bool deep = false;
  bool repair = false;
};

struct FsckReport {
  uint64_t files = 0, chunks = 0, bytes = 0;
  uint64_t local_missing = 0, local_corrupt = 0, local_repaired = 0;
  uint64_t remote_missing = 0, remote_corrupt = 0, remote_repaired = 0;
  // The backend's files/ records under the path; bad ones queued for publishing again.
  uint64_t records = 0, records_bad = 0, records_republished = 0;
  uint64_t records_missing = 0;  // files a tier holds by this node's account, without a record
  uint64_t refcount_errors = 0;           // chunk records whose count differs from the manifests'
  uint64_t unreferenced_chunk_files = 0;  // on disk, named by no chunk record (from the root)
  // Files with a chunk that no tier could supply after repair, by path (the first kMaxListed).
  std::vector<std::string> damaged;
  uint64_t damaged_files = 0;
  std::vector<std::string> problems;  // what was found, one line each (the first kMaxListed)
  static constexpr size_t kMaxListed = 100;
  // Nothing missing or corrupt that is still so, no bad record, no refcount error.
  bool Clean() const;
  std::string Json() const;
};

class FsckPass {
 public:
  // All outlive this.
  FsckPass(MetaStore* meta, ChunkCache* cache, Publisher* publisher, Logger log)
      : meta_(meta), cache_(cache), publisher_(publisher), log_(std::move(log)) {}

  Result<FsckReport> Run(uint64_t ino, const FsckOptions& options);

 private:
  // Tier `tier`'s records under `ino`.
  Status Records(int tier, uint64_t ino, const FsckOptions& options, FsckReport* r);

  MetaStore* const meta_;
  ChunkCache* const cache_;
  Publisher* const publisher_;
  Logger log_;
};

}  // namespace ckptfs
