// ChunkCache's chunks appended to packs (AppendToPacks; cache/append_pack.h).
#include <cstdint>

#include "cache/append_pack.h"
#include "cache/chunk_cache.h"

namespace ckptfs {

void ChunkCache::AppendToPacks(uint64_t bound) {
  append_ = std::make_unique<AppendPacks>(packs_.get(), engine_, metrics_, dir_ + "/packs", bound,
                                          log_);
}

Result<bool> ChunkCache::PutAppended(const ChunkId& id, const void* data, size_t len,
                                     bool aligned) {
  ASSIGN_OR_RETURN(bool stored, append_->Put(id, static_cast<const uint8_t*>(data), len, aligned));
  MutexLock lock(&mu_);
  DiskAdd(id, len);
  return stored;
}

bool ChunkCache::ExtentSure(const ChunkId& id, size_t len) {
  if (packs_->Sure(id)) return true;
  // Once: a bad extent is dropped by the read (then the chunk is stored anew), a good one trusted.
  if (!LoadExtent(id, len).ok()) return false;
  packs_->Trust(id);
  return true;
}

}  // namespace ckptfs
