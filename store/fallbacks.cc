// Fallbacks (store/fallbacks.h): the versions files go back to after a machine crash (see
// FallbackRecord).
//
// A commit without fsync makes the new manifest durable (LMDB syncs its commits) while the new
// chunks may still sit in the page cache. Without more, a machine crash then leaves a manifest
// whose chunks are gone, and the version before it, which was durable, is gone too. So a commit
// that is not durable keeps the version it replaces as the file's fallback, with its chunks
// referenced, unless the file already has one (that one is older and durable). Settle syncs the
// newest versions' chunk files every settle_interval and drops their fallbacks; fsync does the
// same for its file. Recovery after a machine crash checks each file that still has a fallback
// and serves the fallback when a chunk of the newest version is lost or torn.
//
// A rename over a file is the other way to replace one (torch.save to a temporary name, then
// rename): the renamed file's fallback becomes the replaced file's durable version.
#include "store/fallbacks.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "store/chunk_refs.h"
#include "store/remote_tier.h"

namespace ckptfs {

Fallbacks::Fallbacks(MetaStore* meta, ChunkCache* cache, LocalChunks* chunks, Mutex& ns_mu,
                     Logger log, std::string boot_id, double settle_interval_s)
    : meta_(meta),
      cache_(cache),
      chunks_(chunks),
      ns_mu_(ns_mu),
      log_(std::move(log)),
      boot_id_(std::move(boot_id)),
      settle_interval_s_(settle_interval_s),
      touch_(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count())) {}

Fallbacks::~Fallbacks() { Stop(); }

void Fallbacks::Start() {
  if (settle_interval_s_ > 0) settle_thread_ = std::thread([this] { SettleLoop(); });
}

void Fallbacks::Stop() {
  if (!settle_thread_.joinable()) return;
  {
    MutexLock lock(&settle_mu_);
    settle_stop_ = true;
  }
  settle_cv_.notify_all();
  settle_thread_.join();
}

Result<bool> Fallbacks::Cover(MetaStore::Txn& txn, const InodeRecord& rec,
                              const std::optional<Manifest>& old, bool durable,
                              std::vector<ChunkId>* freed) {
  ASSIGN_OR_RETURN(auto fb, txn.GetFallback(rec.ino));
  if (durable) {
    if (fb) RETURN_IF_ERROR(Drop(txn, rec.ino, freed));
    return false;
  }
  if (fb) {
    // The fallback is older and durable: it stays, now covering this commit.
    fb->staged = false;
    fb->touch = NextTouch();
    fb->boot_id = boot_id_;
    RETURN_IF_ERROR(txn.PutFallback(rec.ino, *fb));
    return false;
  }
  FallbackRecord n;
  if (old) n.manifest = *old;
  n.mtime_ns = rec.mtime_ns;
  n.absent = rec.generation == 0;  // never committed: the file goes, as a new file never closed
  n.touch = NextTouch();
  n.boot_id = boot_id_;
  RETURN_IF_ERROR(txn.PutFallback(rec.ino, n));
  return old.has_value();
}

Result<bool> Fallbacks::AtRisk(MetaStore::Txn& txn, uint64_t ino) {
  ASSIGN_OR_RETURN(auto fb, txn.GetFallback(ino));
  if (fb) return true;
  ASSIGN_OR_RETURN(auto staged, txn.GetStaged(ino));
  return staged && !staged->durable;
}

Status Fallbacks::FallBackToReplaced(MetaStore::Txn& txn, const InodeRecord& src,
                                     const InodeRecord& dst, std::vector<ChunkId>* freed) {
  if (!S_ISREG(src.mode) || !S_ISREG(dst.mode)) return Status::Ok();
  ASSIGN_OR_RETURN(const bool at_risk, AtRisk(txn, src.ino));
  if (!at_risk) return Status::Ok();  // src's newest version is durable
  ASSIGN_OR_RETURN(auto src_fb, txn.GetFallback(src.ino));
  ASSIGN_OR_RETURN(auto staged, txn.GetStaged(src.ino));
  const bool staged_at_risk = staged && !staged->durable;
  // dst's last durable version: its fallback, or else what it holds.
  FallbackRecord n;
  ASSIGN_OR_RETURN(auto dst_fb, txn.GetFallback(dst.ino));
  if (dst_fb) {
    n.manifest = dst_fb->manifest;
    n.mtime_ns = dst_fb->mtime_ns;
    n.absent = dst_fb->absent;
  } else {
    ASSIGN_OR_RETURN(auto m, txn.GetManifest(dst.ino));
    if (m) n.manifest = std::move(*m);
    n.mtime_ns = dst.mtime_ns;
    n.absent = dst.generation == 0;
  }
  RETURN_IF_ERROR(AddManifestRefs(txn, n.manifest, +1, nullptr));
  if (src_fb) RETURN_IF_ERROR(AddManifestRefs(txn, src_fb->manifest, -1, freed));
  n.staged = staged_at_risk;
  n.touch = NextTouch();
  n.boot_id = boot_id_;
  return txn.PutFallback(src.ino, n);
}

Status Fallbacks::Drop(MetaStore::Txn& txn, uint64_t ino, std::vector<ChunkId>* freed) {
  ASSIGN_OR_RETURN(auto fb, txn.GetFallback(ino));
  if (!fb) return Status::Ok();
  RETURN_IF_ERROR(AddManifestRefs(txn, fb->manifest, -1, freed));
  return txn.DelFallback(ino);
}

Status Fallbacks::Recover(MetaStore::Txn& txn, bool clean, const RecoverHooks& hooks,
                          std::vector<ChunkId>* freed) {
  std::vector<std::pair<uint64_t, FallbackRecord>> all;
  RETURN_IF_ERROR(txn.ForEachFallback(
      [&](uint64_t ino, const FallbackRecord& r) { all.emplace_back(ino, r); }));
  size_t reverted = 0, removed = 0;
  for (auto& [ino, fb] : all) {
    auto rec = txn.GetInode(ino);
    if (!rec.ok() && rec.status().code() != Code::kNotFound) return rec.status();
    if (clean || !rec.ok()) {  // a clean stop synced everything; a record with no file is stale
      RETURN_IF_ERROR(Drop(txn, ino, freed));
      continue;
    }
    if (fb.boot_id == boot_id_) continue;  // the daemon died, the page cache kept its bytes
    // A machine crash: is the newest version whole?
    ASSIGN_OR_RETURN(auto staged, txn.GetStaged(ino));
    bool lost = false;
    if (fb.staged && staged) {
      lost = !hooks.staged_survives(*staged, clean);  // what RecoverStaged keeps
    } else {
      ASSIGN_OR_RETURN(auto m, txn.GetManifest(ino));
      if (m) {
        for (const Extent& e : m->extents()) {
          if (e.hole()) continue;
          ASSIGN_OR_RETURN(ChunkRecord c, txn.GetChunk(e.id));
          if (c.remote()) continue;  // a remote tier holds it: the version is whole
          if (!cache_->Verify(e.id, e.len).ok()) {
            lost = true;
            break;
          }
        }
      }
    }
    if (!lost) {
      RETURN_IF_ERROR(Drop(txn, ino, freed));
      continue;
    }
    // Back to the fallback: its references become the manifest's.
    if (staged) {
      RETURN_IF_ERROR(txn.DelStaged(ino));
      ::unlink(hooks.stage_path(staged->name).c_str());
    }
    ASSIGN_OR_RETURN(auto m, txn.GetManifest(ino));
    if (m) RETURN_IF_ERROR(AddManifestRefs(txn, *m, -1, freed));
    RETURN_IF_ERROR(txn.DelFallback(ino));
    auto where = txn.PathOf(ino);
    const std::string path = where.ok() ? *where : "inode " + std::to_string(ino);
    if (fb.absent) {
      RETURN_IF_ERROR(txn.DelManifest(ino));
      rec->size = rec->data_bytes = 0;
      RETURN_IF_ERROR(txn.PutInode(*rec));
      ++removed;
      log_->warn("{}: its bytes had not reached the disk when the machine stopped, and it had "
                 "no earlier version: removed", path);
      RETURN_IF_ERROR(hooks.remove_unborn(txn, *rec, freed));
      continue;
    }
    RETURN_IF_ERROR(txn.PutManifest(ino, fb.manifest));
    rec->size = fb.manifest.size();
    rec->data_bytes = fb.manifest.DataBytes();
    rec->mtime_ns = rec->ctime_ns = fb.mtime_ns;
    ++rec->generation;
    RETURN_IF_ERROR(txn.PutInode(*rec));
    RETURN_IF_ERROR(hooks.queue_remote(txn, remote_op::PublishFile(ino, rec->path_epoch)));
    ++reverted;
    log_->warn("{}: its newest version had not reached the disk when the machine stopped; it "
               "reads as its last durable version ({} bytes)", path, rec->size);
  }
  if (reverted + removed > 0) {
    log_->warn("after a machine crash: {} files went back to their last durable version, {} new "
               "files whose bytes were lost were removed", reverted, removed);
  }
  return Status::Ok();
}

Status Fallbacks::Settle() {
  // The fallbacks now, and the chunks of the versions they cover.
  std::vector<std::pair<uint64_t, uint64_t>> covered;
  std::vector<ChunkId> ids;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    std::vector<std::pair<uint64_t, FallbackRecord>> all;
    RETURN_IF_ERROR(txn.ForEachFallback(
        [&](uint64_t ino, const FallbackRecord& r) { all.emplace_back(ino, r); }));
    for (const auto& [ino, fb] : all) {
      if (fb.staged) {
        // Its newest version is a staged record: durable once fsync recorded it so.
        ASSIGN_OR_RETURN(auto staged, txn.GetStaged(ino));
        if (staged && !staged->durable) continue;
      }
      covered.emplace_back(ino, fb.touch);
      ASSIGN_OR_RETURN(auto m, txn.GetManifest(ino));
      if (!m) continue;
      for (const Extent& e : m->extents()) {
        if (!e.hole()) ids.push_back(e.id);
      }
    }
  }
  if (covered.empty()) return Status::Ok();
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  RETURN_IF_ERROR(cache_->SyncChunks(ids));
  return DropSettled(covered);
}

Status Fallbacks::DropSettled(const std::vector<std::pair<uint64_t, uint64_t>>& covered) {
  std::vector<ChunkId> freed;
  {
    MutexLock lock(&ns_mu_);
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    for (const auto& [ino, touch] : covered) {
      ASSIGN_OR_RETURN(auto fb, txn.GetFallback(ino));
      if (!fb || fb->touch != touch) continue;  // changed since: the next pass
      if (fb->staged) {
        ASSIGN_OR_RETURN(auto staged, txn.GetStaged(ino));
        if (staged && !staged->durable) continue;
      }
      RETURN_IF_ERROR(Drop(txn, ino, &freed));
    }
    RETURN_IF_ERROR(txn.Commit());
  }
  chunks_->Reclaim(freed);
  return Status::Ok();
}

void Fallbacks::SettleLoop() {
  MutexLock lock(&settle_mu_);
  const auto interval = std::chrono::duration<double>(settle_interval_s_);
  while (!settle_cv_.wait_for(lock.native(), interval,
                              [&]() REQUIRES(settle_mu_) { return settle_stop_; })) {
    lock.Unlock();
    Status st = Settle();
    if (!st.ok()) log_->error("syncing the newest versions of files closed without fsync: {}",
                              st.ToString());
    lock.Lock();
  }
}

}  // namespace ckptfs
