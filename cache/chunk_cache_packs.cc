// ChunkCache's calls that work on many chunks and packs at once (cache/chunk_cache.h): removal
// of many chunks, compaction of sparse packs, fsck's check of where a chunk lives, and the
// chunks appended to packs (AppendToPacks; cache/append_pack.h).
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include "cache/append_pack.h"
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
  MutexLock removing(&remove_mu_);  // no compaction renames a chunk file of these meanwhile
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
  removing.Unlock();
  MutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (out[i].ok()) DiskDrop(ids[i]);
  }
  return out;
}

uint64_t ChunkCache::CompactPacks() {
  // Two passes at once would read and write the same extents twice and log each move twice.
  if (compacting_.exchange(true, std::memory_order_acquire)) return 0;
  struct Done {
    std::atomic<bool>* flag;
    ~Done() { flag->store(false, std::memory_order_release); }
  } done_pass{&compacting_};
  uint64_t moved = 0;
  for (const Packs::Sparse& pack : packs_->SparsePacks(kCompactPassPacks)) {
    std::vector<Packs::Entry> done;
    std::vector<ChunkId> ids;
    Status st;
    for (const Packs::Entry& e : pack.extents) {
      if (moved >= kCompactPassBytes) break;
      // Read from its extent and verified (a bad one is dropped there, as a read drops it), then
      // written as a chunk file (renamed over any file of it, whose bytes were not checked).
      // Never through Put: with append packs it would find the chunk's extent here and store
      // nothing, and the drop below would take the chunk's only copy.
      bool gone = false;
      auto data = LoadExtent(e.id, e.len, &gone);
      if (!data.ok()) continue;
      auto put = MoveIntoChunkFile(pack.name, e, (*data)->bytes.get());
      if (!put.ok()) {
        st = put.status();
        break;  // a full disk: no room to move anything more
      }
      if (!*put) continue;  // removed meanwhile: nothing to move
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

Result<bool> ChunkCache::MoveIntoChunkFile(const std::string& pack, const Packs::Entry& e,
                                           const uint8_t* data) {
  const std::string tmp = TmpPath(e.id);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "create chunk file " + tmp);
  RETURN_IF_ERROR(WriteTmp(e.id, fd, tmp, data, e.len, false));
  MutexLock removing(&remove_mu_);
  if (!packs_->Holds(pack, e)) {
    ::unlink(tmp.c_str());
    return false;
  }
  const std::string path = PathOf(e.id);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const Status w = Status::FromErrno(errno, "rename chunk file to " + path);
    ::unlink(tmp.c_str());
    return w;
  }
  return true;
}

void ChunkCache::CompactSoon() {
  MutexLock lock(&compact_mu_);
  if (compact_stop_) return;
  compact_asked_ = true;
  if (!compactor_.joinable()) compactor_ = std::thread([this] { CompactLoop(); });
  compact_cv_.notify_one();
}

void ChunkCache::CompactLoop() {
  MutexLock lock(&compact_mu_);
  for (;;) {
    compact_cv_.wait(lock.native(), [this]() NO_THREAD_SAFETY_ANALYSIS {
      return compact_asked_ || compact_stop_;
    });
    if (compact_stop_) return;
    compact_asked_ = false;
    lock.Unlock();
    // A pass is bounded (kCompactPassBytes); more passes while they move anything, so a large
    // removal is compacted whole, and a stop waits for one pass at most.
    while (CompactPacks() > 0) {
      MutexLock check(&compact_mu_);
      if (compact_stop_) break;
    }
    lock.Lock();
  }
}

Status ChunkCache::Present(const ChunkId& id) const {
  struct stat st;
  if (::stat(PathOf(id).c_str(), &st) == 0) return Status::Ok();
  return packs_->Check(id);
}

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
  bool moved = false;
  if (!LoadExtent(id, len, &moved).ok()) return false;
  packs_->Trust(id);
  return true;
}

}  // namespace ckptfs
