// ChunkCache's calls that work on many chunks and packs at once (cache/chunk_cache.h): removal
// of many chunks, compaction of sparse packs, and fsck's check of where a chunk lives.
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "cache/chunk_cache.h"

namespace ckptfs {

std::vector<Status> ChunkCache::RemoveMany(const std::vector<ChunkId>& ids) {
  {
    MutexLock lock(&mu_);
    for (const ChunkId& id : ids) {
      auto it = ram_.find(id);
      if (it == ram_.end()) continue;
      ram_used_ -= it->second->second->capacity();
      lru_.erase(it->second);
      ram_.erase(it);
    }
  }
  std::vector<Status> out(ids.size());
  std::vector<ChunkId> files_gone;  // their extents go too
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string path = PathOf(ids[i]);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      out[i] = Status::FromErrno(errno, "unlink chunk " + path);
    } else {
      files_gone.push_back(ids[i]);
    }
  }
  if (Status st = packs_->DropMany(files_gone); !st.ok()) {
    // The extents of the pack whose index failed are still there.
    for (size_t i = 0; i < ids.size(); ++i) {
      if (out[i].ok() && packs_->Contains(ids[i])) out[i] = st;
    }
  }
  MutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (out[i].ok()) DiskDrop(ids[i]);
  }
  return out;
}

uint64_t ChunkCache::CompactPacks() {
  uint64_t moved = 0;
  for (const Packs::Sparse& pack : packs_->SparsePacks(kCompactPassPacks)) {
    std::vector<Packs::Entry> done;
    std::vector<ChunkId> ids;
    Status st;
    for (const Packs::Entry& e : pack.extents) {
      if (moved >= kCompactPassBytes) break;
      // Read from its extent and verified (a bad one is dropped there, as a read drops it), then
      // written as a chunk file (renamed over any file of it, whose bytes were not checked).
      bool gone = false;
      auto data = LoadExtent(e.id, e.len, &gone);
      if (!data.ok()) continue;
      auto put = PutDirect(e.id, (*data)->bytes.get(), e.len);
      if (!put.ok()) {
        st = put.status();
        break;  // a full disk: no room to move anything more
      }
      done.push_back(e);
      ids.push_back(e.id);
      moved += e.len;
    }
    // The files and their names durable before any '-' record is: never in neither home.
    if (!done.empty() && st.ok()) st = SyncChunks(ids);
    if (!done.empty() && st.ok()) st = packs_->DropMoved(pack.name, done);
    if (!st.ok()) {
      log_->warn("compacting pack {}: {}", pack.name, st.ToString());
      break;
    }
    log_->info("pack {}: {} of its {} extents moved into chunk files (compaction)", pack.name,
               done.size(), pack.extents.size());
    if (moved >= kCompactPassBytes) break;
  }
  return moved;
}

Status ChunkCache::Present(const ChunkId& id) const {
  struct stat st;
  if (::stat(PathOf(id).c_str(), &st) == 0) return Status::Ok();
  return packs_->Check(id);
}

}  // namespace ckptfs
