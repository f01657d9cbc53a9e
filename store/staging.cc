// Staging: staged files and their seals (store/staging.h).
#include "store/staging.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <unordered_set>
#include <utility>

#include "common/file_lease.h"
#include "store/pack_sink.h"
#include "store/staged_meta.h"

namespace ckptfs {

namespace {

// How long a reader of a just-closed staged file waits for its writers' releases (Seal's
// wait_release). The kernel sends RELEASE right after close(2) returns; this bounds the wait
// should it be queued behind other background requests.
constexpr auto kReleaseWait = std::chrono::seconds(2);

// How often the seal of a file held for an unseen writer (a mapping) is tried again: quickly
// until kUnseenConfirm tries saw the writer, then every kUnseenRetry (store/staging.h).
constexpr auto kUnseenQuick = std::chrono::milliseconds(20);
constexpr int kUnseenConfirm = 10;
constexpr auto kUnseenRetry = std::chrono::seconds(1);

// Whether a staging file is also a pack's (a seal linked it: cache/packs.h), so never to change.
bool AlsoAPack(int fd) {
  struct stat st;
  return ::fstat(fd, &st) == 0 && st.st_nlink > 1;
}

}  // namespace

Staging::Staging(const Config& cfg, MetaStore* meta, OpenTable* files, LocalChunks* chunks,
                 ChunkCache* cache, Publisher* publisher, Metrics* metrics, Logger log,
                 Namespace* ns, MemoryBudget* reorder_budget, ThreadPool* cut_pool,
                 const PayloadScannerFactory& scanners, std::string boot_id, Hooks hooks)
    : cfg_(cfg),
      meta_(meta),
      files_(files),
      chunks_(chunks),
      cache_(cache),
      publisher_(publisher),
      metrics_(metrics),
      log_(std::move(log)),
      ns_(ns),
      reorder_budget_(reorder_budget),
      cut_pool_(cut_pool),
      scanners_(scanners),
      boot_id_(std::move(boot_id)),
      hooks_(std::move(hooks)),
      seal_pool_(std::make_unique<ThreadPool>(cfg_.write_threads)) {}

void Staging::ResumeSeals() {
  if (!resume_seals_.empty()) {
    log_->info("{} files closed before the last stop are cut into chunks in the background",
               resume_seals_.size());
  }
  for (uint64_t ino : resume_seals_) ScheduleSeal(ino);
  resume_seals_.clear();
}

void Staging::StopSeals() {
  seals_stopped_ = true;
  std::vector<uint64_t> held;
  {
    MutexLock lock(&unseen_mu_);
    unseen_stop_ = true;
    held.assign(unseen_.begin(), unseen_.end());
    unseen_.clear();
  }
  unseen_cv_.notify_all();
  if (unseen_thread_.joinable()) unseen_thread_.join();
  for (uint64_t ino : held) (void)files_->Unpin(ino);  // stays staged: resumed at the next mount
  seal_pool_.reset();
}

bool Staging::WrittenUnseen(uint64_t ino, OpenFile& f) {
  OpenFile::Stage& s = *f.stage;
  const std::string path = StagePath(cfg_.cache_dir, s.name);
  // The daemon's own descriptor is writable: a read-only one stands in for it while asking.
  const int ro = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ro < 0) return false;  // the seal that follows reports it
  ::close(s.fd);
  const Openers writers = WritersOf(ro);
  s.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (s.fd < 0) {
    log_->warn("inode {}: reopening its staging file: {}", ino, std::strerror(errno));
    s.fd = ro;  // reads still work; a change through it fails and says so
  } else {
    ::close(ro);
  }
  if (writers == Openers::kUnknown) {
    log_->warn("inode {}: the cache filesystem grants no file lease, so a mapping kept after "
               "its close cannot be told from none: {}", ino, std::strerror(errno));
  }
  return writers == Openers::kSome;
}

Status Staging::HoldForUnseen(uint64_t ino, OpenFile& f) {
  files_->Pin(ino);
  bool added = false;
  int tries = 0;
  {
    MutexLock lock(&unseen_mu_);
    if (!unseen_stop_) {
      added = unseen_.insert(ino).second;
      if (added) tries = ++unseen_tries_[ino];
      if (!unseen_thread_.joinable()) unseen_thread_ = std::thread([this] { UnseenLoop(); });
    }
  }
  if (!added) {
    (void)files_->Unpin(ino);  // the caller's pin remains
    return Status::Ok();
  }
  if (tries < kUnseenConfirm) return Status::Ok();
  if (tries == kUnseenConfirm) {
    log_->info("inode {}: a process still writes it through a mapping kept after its close; "
               "it stays staged and is sealed once that mapping is gone", ino);
  }
  // msync reaches the staging file without the daemon: what it synced must stay the file's
  // through a machine crash, so the record is durable (the file synced first).
  return StageCommit(ino, f, /*durable=*/true);
}

void Staging::UnseenLoop() {
  for (;;) {
    std::vector<uint64_t> due;
    {
      MutexLock lock(&unseen_mu_);
      bool quick = false;
      for (uint64_t ino : unseen_) quick = quick || unseen_tries_[ino] < kUnseenConfirm;
      const auto wait = quick ? std::chrono::duration_cast<std::chrono::milliseconds>(kUnseenQuick)
                              : std::chrono::duration_cast<std::chrono::milliseconds>(kUnseenRetry);
      if (unseen_cv_.wait_for(lock.native(), wait,
                              [&]() REQUIRES(unseen_mu_) { return unseen_stop_; })) {
        return;
      }
      due.assign(unseen_.begin(), unseen_.end());
      unseen_.clear();
    }
    for (uint64_t ino : due) {  // each pinned by the set; a seal still held pins it again
      auto f = files_->Find(ino);
      Status st = f ? Seal(ino, *f) : Status::Ok();
      if (!st.ok()) log_->error("inode {}: sealing its staged bytes: {}", ino, st.ToString());
      if (files_->Unpin(ino)) (void)ns_->ReapIfOrphan(ino);
    }
  }
}

Result<Staging::StagedOpen> Staging::OpenStaged(uint64_t ino, OpenFile& f, bool write,
                                                bool truncate, uint64_t fh, int* passthrough_fd) {
  *passthrough_fd = -1;
  bool fresh = false;  // a new staging file: empty already
  if (!f.stage || f.stage->handles.empty()) {
    // The kernel refuses passthrough while a handle uses the inode's page cache.
    if (f.cached_opens > 0 || f.writer || f.dirty) return StagedOpen::kNo;
    // Staged and not sealed yet (closed a moment ago, or before a restart)?
    RETURN_IF_ERROR(LoadStage(ino, f));
    std::string replaces;
    if (f.stage && f.stage->recorded) {
      // Its bytes are the file's committed version: a writer must not change them in place
      // (a crash would tear them). A new version goes to a new staging file, which replaces
      // this one at its commit; any other change waits for the seal and takes the daemon's path.
      if (truncate) {
        replaces = f.stage->name;
        f.stage.reset();  // the file stays until the new version is committed
      } else if (write) {
        return StagedOpen::kSealFirst;
      }
    }
    if (!f.stage) {
      // Bytes that live in chunks are read and changed through the daemon; a new version
      // (O_TRUNC, create) is written into a new staging file.
      if (!truncate) return StagedOpen::kNo;
      // Near a full cache disk the daemon's own path refuses writes before they fail.
      if (!hooks_.check_room().ok() && replaces.empty()) return StagedOpen::kNo;
      auto stage = std::make_unique<OpenFile::Stage>();
      stage->name = std::to_string(ino) + "." + std::to_string(NowNs());
      stage->fd = ::open(StagePath(cfg_.cache_dir, stage->name).c_str(),
                         O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (stage->fd < 0) {
        return Status::FromErrno(errno, "create of a staging file for inode " + std::to_string(ino));
      }
      stage->dirty = true;
      stage->replaces = std::move(replaces);
      metrics_->staged_files.Add(1);
      f.stage = std::move(stage);
      fresh = true;
    }
    // Pages the kernel cached before the staging file are stale once it changes the bytes.
    files_->MarkStale(ino);
  }
  OpenFile::Stage& s = *f.stage;
  if ((write || truncate) && !fresh && AlsoAPack(s.fd)) {
    // Adopted as a pack by a seal whose commit failed, and still read through passthrough (the
    // kernel lets no other file back this inode meanwhile): its bytes must not change.
    return Status(Code::kBusy, "inode " + std::to_string(ino) +
                                   ": its staging file holds chunks and is still being read");
  }
  // (Not a fresh file: truncating it to 0 would also make ext4 write all of it back at its close,
  // its heuristic for files replaced by truncation, inside the writer's close(2).)
  if (truncate && !fresh && ::ftruncate(s.fd, 0) != 0) {
    return Status::FromErrno(errno, "truncate of the staging file of inode " + std::to_string(ino));
  }
  if (truncate) s.failed = Status::Ok();  // a new session
  if (write || truncate) {
    ++s.writers;
    s.epoch = ++stage_epoch_;
    s.dirty = true;
  }
  s.handles[fh] = write || truncate;
  *passthrough_fd = s.fd;
  TrackWriters(f);
  return StagedOpen::kYes;
}

Status Staging::WaitFailedRelease(uint64_t ino, OpenFile& f,
                                  std::unique_lock<std::mutex>& lock) {
  // A staging file whose session failed, still held by writer handles: the kernel serves every
  // open of the inode from it, and it holds bytes that are not the file's.
  auto held_failed = [&] { return f.stage && !f.stage->failed.ok() && f.stage->writers > 0; };
  if (!held_failed()) return Status::Ok();
  // Their close has failed and their release is on its way (the kernel sends it after close(2)
  // returns): it drops those bytes.
  f.released.wait_for(lock, kReleaseWait, [&] { return !held_failed(); });
  if (!held_failed()) return Status::Ok();
  return Status(Code::kIo, "inode " + std::to_string(ino) +
                               ": a writer whose bytes could not be committed still has it open");
}

void Staging::TrackWriters(OpenFile& f) {
  const bool writing = f.stage && f.stage->writers > 0;
  {
    std::lock_guard q(f.qmu);
    if (writing == (f.writing_fd != nullptr)) return;
    if (!writing) {
      f.writing_fd.reset();
      return;
    }
  }
  const int fd = ::dup(f.stage->fd);
  if (fd < 0) return;  // GetAttr then shows the last committed size
  std::shared_ptr<const int> owned(new int(fd), [](const int* p) {
    ::close(*p);
    delete p;
  });
  std::lock_guard q(f.qmu);
  f.writing_fd = std::move(owned);
}

Status Staging::StageCommit(uint64_t ino, OpenFile& f, bool durable) {
  OpenFile::Stage& s = *f.stage;
  // Once fsync made the record durable, every later record of the file is: replacing it with
  // one a machine crash may undo would take the fsync'd bytes with it.
  durable = durable || s.durable;
  // The kernel's writes into the staging file do not pass here: a write that failed for room
  // (ENOSPC, which its writer saw) left a short file this close would commit. On a cache
  // filesystem that is out of room the close fails instead, and the file keeps its previous
  // version (the room AdmitWrite keeps free for the daemon's own writes is the margin).
  if (!s.failed.ok()) return s.failed;  // this session's bytes are dropped already
  if (Status room = hooks_.check_room(); !room.ok()) {
    s.failed = Status(Code::kNoSpace, "inode " + std::to_string(ino) + " is not committed: " +
                                          room.message() + " (a write into it may have failed)");
    // Its bytes are dropped: their room comes back now, not at the release that follows (the
    // unlink or rewrite that usually comes next needs it). Not a staging file that holds the
    // committed version (a record names it).
    if (!s.recorded && ::ftruncate(s.fd, 0) != 0) {
      log_->warn("inode {}: freeing its dropped staging file: {}", ino, std::strerror(errno));
    }
    return s.failed;
  }
  if (!s.replaces.empty() && !durable) {
    // Replacing a version that fsync made durable (staged, not sealed yet): this one must be
    // durable before that one's file goes.
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(auto old, txn.GetStaged(ino));
    durable = old && old->name == s.replaces && old->durable;
  }
  if (durable && ::fdatasync(s.fd) != 0) {
    return Status::FromErrno(errno, "fdatasync of the staging file of inode " + std::to_string(ino));
  }
  struct stat st;
  if (::fstat(s.fd, &st) != 0) return Status::FromErrno(errno, "fstat of a staging file");
  const StagedRecord::Stamp stamp{static_cast<uint64_t>(st.st_size), MtimeNs(st),
                                  int64_t{st.st_ctim.tv_sec} * 1'000'000'000 + st.st_ctim.tv_nsec};
  if (s.recorded && s.stamp == stamp && durable == s.durable) return Status::Ok();  // as recorded
  StagedRecord r{s.name, static_cast<uint64_t>(st.st_size), MtimeNs(st), DataBytes(st), durable,
                 boot_id_};
  Status committed = [&]() -> Status {
    MutexLock ns(&ns_->mu());
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    RETURN_IF_ERROR(txn.GetInode(ino).status());
    RETURN_IF_ERROR(txn.PutStaged(ino, r));
    RETURN_IF_ERROR(txn.ClearUnborn(ino));
    return txn.Commit();
  }();
  if (!committed.ok()) {
    log_->error("inode {}: its new bytes could not be committed: {}", ino, committed.ToString());
    // The close that reported this failed: these bytes are never the file's, not even if a
    // later commit (the release's) would succeed. No reader is served them (WaitFailedRelease).
    s.failed = committed;
    return committed;
  }
  s.recorded = true;
  s.durable = durable;
  s.stamp = stamp;
  if (durable) RETURN_IF_ERROR(meta_->Sync());
  if (!s.replaces.empty()) {
    // the version this one replaced, after the commit
    ::unlink(StagePath(cfg_.cache_dir, s.replaces).c_str());
    s.replaces.clear();
  }
  f.unborn = false;
  return Status::Ok();
}

Result<bool> Staging::ReleaseStaged(uint64_t ino, OpenFile& f, uint64_t fh) {
  std::lock_guard lock(f.mu);
  if (!f.stage || !f.stage->handles.count(fh)) return false;
  OpenFile::Stage& s = *f.stage;
  const bool writer = s.handles[fh];
  s.handles.erase(fh);
  s.closed.erase(fh);
  Status st;
  if (writer) {
    --s.writers;
    f.released.notify_all();
  }
  TrackWriters(f);
  bool seal = false;
  if (writer && s.writers == 0 && s.dirty) {
    // The last writer is gone: what it left is committed (a close normally did so already) and
    // cut into chunks behind it.
    st = StageCommit(ino, f, false);
    seal = st.ok();
  }
  // The last reader of staged bytes (a seal that ran meanwhile left them to it).
  if (s.handles.empty() && s.dirty && s.recorded) seal = true;
  // Bytes no commit took (a failed close) are dropped with the last handle; so is a sealed
  // staging file, unless a mapping kept after its close still writes it: then it is the file's
  // newest version again.
  if (s.handles.empty() && !s.dirty && s.writers == 0 && WrittenUnseen(ino, f)) {
    s.dirty = true;
    st = StageCommit(ino, f, /*durable=*/true);
    seal = st.ok();
  } else if (s.handles.empty() && (!s.dirty || (!st.ok() && !s.recorded))) {
    DropStage(ino, f);
    seal = false;
  }
  if (seal) ScheduleSeal(ino);
  if (!st.ok()) return st;
  return true;
}

void Staging::DropStage(uint64_t ino, OpenFile& f) {
  ::unlink(StagePath(cfg_.cache_dir, f.stage->name).c_str());
  f.stage.reset();  // closes it
  files_->MarkStale(ino);
}

void Staging::ScheduleSeal(uint64_t ino) {
  if (seals_stopped_) return;
  files_->Pin(ino);  // the staging file's state lives in the open-file entry
  seal_pool_->Submit([this, ino] {
    if (!seals_stopped_) {
      auto f = files_->Find(ino);
      Status st = f ? Seal(ino, *f) : Status::Ok();
      if (!st.ok()) log_->error("inode {}: sealing its staged bytes: {}", ino, st.ToString());
    }
    if (files_->Unpin(ino)) (void)ns_->ReapIfOrphan(ino);
  });
}

Status Staging::SealAll() {
  std::vector<uint64_t> staged;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    RETURN_IF_ERROR(
        txn.ForEachStaged([&](uint64_t ino, const StagedRecord&) { staged.push_back(ino); }));
  }
  Status first;
  for (uint64_t ino : staged) {
    Status st = EnsureSealed(ino);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

Status Staging::Seal(uint64_t ino, OpenFile& f, bool wait_release) {
  std::lock_guard one(f.seal_mu);
  // What is sealed is the record's staging file: the file's committed bytes. It may be the live
  // stage (then no writer may have it open), or a version a new writer is replacing.
  std::optional<StagedRecord> rec;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(rec, txn.GetStaged(ino));
  }
  if (!rec) return Status::Ok();
  int fd;
  bool live;
  uint64_t epoch = 0;
  {
    std::unique_lock lock(f.mu);
    auto closed_all = [&] {  // live, and every writer handle has been closed
      if (!f.stage || f.stage->name != rec->name || f.stage->writers == 0) return false;
      for (const auto& [fh, writes] : f.stage->handles) {
        if (writes && !f.stage->closed.count(fh)) return false;
      }
      return true;
    };
    if (wait_release && closed_all()) {
      f.released.wait_for(lock, kReleaseWait, [&] {
        return !f.stage || f.stage->name != rec->name || f.stage->writers == 0;
      });
    }
    // A closed handle's own reference may go a moment after its release (see the header): a
    // seal asked for (wait_release) waits that long before it leaves the file to UnseenLoop.
    for (int tries = 1;; ++tries) {
      live = f.stage && f.stage->name == rec->name;
      if (!live || f.stage->writers > 0 || !f.stage->handles.empty()) break;
      if (!WrittenUnseen(ino, f)) {
        MutexLock unseen(&unseen_mu_);
        unseen_tries_.erase(ino);
        break;
      }
      if (!wait_release || tries >= kUnseenConfirm) return HoldForUnseen(ino, f);
      f.released.wait_for(lock, kUnseenQuick);
    }
    if (live) {
      if (f.stage->writers > 0) return Status::Ok();  // being written: sealed after its close
      fd = ::dup(f.stage->fd);
      epoch = f.stage->epoch;
    } else {
      fd = ::open(StagePath(cfg_.cache_dir, rec->name).c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
      return Status::FromErrno(errno, "open of the staging file of inode " + std::to_string(ino));
    }
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat of a staging file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // With packs, the staging file becomes the home of its new chunks (store/pack_sink.h).
  std::optional<PackSink> packer;
  if (cfg_.packs) packer.emplace(chunks_, cache_, metrics_);
  ChunkSink* sink = packer ? static_cast<ChunkSink*>(&*packer) : chunks_;
  const bool alone = packer && PackSink::NoOtherOpens(fd);
  FileWriter writer(Manifest(), sink, cfg_.chunking, cfg_.reorder_bytes, metrics_, scanners_,
                    reorder_budget_);
  writer.CutAhead(cut_pool_, cfg_.cut_threads + 1);
  // The writer reads the file with pread, data regions only (holes stay holes). A writer may
  // truncate it under the seal: a short read then fails the cut, and the epoch check below
  // discards it.
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  Status adopted = writer.AdoptFile(fd, size);
  auto finished = adopted.ok() ? writer.Finish() : Result<Manifest>(adopted);
  std::vector<ChunkId> freed;
  Status done = [&]() -> Status {
    std::lock_guard lock(f.mu);
    const bool still_live = f.stage && f.stage->name == rec->name;
    if (still_live != live ||
        (live && (f.stage->epoch != epoch || f.stage->writers > 0))) {
      return Status::Ok();  // written again meanwhile: the next seal cuts the new bytes
    }
    RETURN_IF_ERROR(finished.status());
    if (packer) {
      // A passthrough reader still holding the staging file keeps it writable by the next
      // writer the kernel lets in beside it, and a writer the daemon does not see may hold it
      // (PackSink::NoOtherOpens): a pack must never change, so its chunks are copied.
      if ((live && !f.stage->handles.empty()) || !alone || !PackSink::NoOtherOpens(fd)) {
        RETURN_IF_ERROR(packer->Copy(fd));
      } else {
        RETURN_IF_ERROR(packer->Adopt(StagePath(cfg_.cache_dir, rec->name), rec->name));
      }
    }
    // fsync'd bytes stay durable: their chunks are synced before the commit, and the commit
    // before the staging file goes below. The record may become durable while the chunks are
    // not synced yet: then they are synced and the commit tried again.
    bool synced = false;
    for (bool durable = rec->durable;;) {
      if (durable && !synced) {
        std::vector<ChunkId> ids;
        for (const Extent& e : finished->extents()) ids.push_back(e.id);
        RETURN_IF_ERROR(cache_->SyncChunks(ids));
        synced = true;
      }
      MutexLock ns(&ns_->mu());
      ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
      ASSIGN_OR_RETURN(auto now, txn.GetStaged(ino));
      if (!now || now->name != rec->name) return Status::Ok();  // unlinked, or staged anew
      if (now->durable && !synced) {
        durable = true;
        continue;
      }
      RETURN_IF_ERROR(ns_->CommitManifestTxn(txn, ino, *finished, now->mtime_ns, synced, &freed));
      RETURN_IF_ERROR(txn.Commit());
      break;
    }
    const bool durable = synced;
    if (durable) RETURN_IF_ERROR(meta_->Sync());
    f.manifest = std::make_shared<const Manifest>(std::move(*finished));
    {
      std::lock_guard q(f.qmu);
      f.committed_size = f.manifest->size();
      f.committed_data = f.manifest->DataBytes();
    }
    f.unborn = false;
    metrics_->file_commits.Add(1);
    metrics_->file_commit_bytes.Add(f.manifest->size());
    metrics_->staged_seals.Add(1);
    metrics_->staged_seal_bytes.Add(size);
    if (live) {
      f.stage->dirty = false;
      f.stage->recorded = false;
      if (f.stage->handles.empty()) DropStage(ino, f);
    } else {
      // A version being replaced by a new writer's staging file, or one nobody opened.
      ::unlink(StagePath(cfg_.cache_dir, rec->name).c_str());
      if (f.stage && f.stage->replaces == rec->name) f.stage->replaces.clear();
    }
    // The staging file's own name is gone: the pack alone names it, nobody writes it.
    if (packer) packer->Punch(rec->name, log_);
    return Status::Ok();
  }();
  chunks_->ReleaseHolds(writer.held());
  if (!done.ok()) return done;
  chunks_->Reclaim(freed);
  publisher_->Kick();
  hooks_.note_committed(ino);
  return Status::Ok();
}

Result<bool> Staging::ChangeStaged(uint64_t ino, const std::function<int(int fd)>& fn,
                                   bool bytes) {
  auto f = files_->Find(ino);
  if (!f) return false;
  std::lock_guard lock(f->mu);
  if (!f->stage || f->stage->handles.empty()) return false;
  OpenFile::Stage& s = *f->stage;
  if (bytes && AlsoAPack(s.fd)) {
    return Status(Code::kBusy, "inode " + std::to_string(ino) +
                                   ": its staging file holds chunks and is still being read");
  }
  if (int err = fn(s.fd); err != 0) {
    return Status::FromErrno(err, "change of the staging file of inode " + std::to_string(ino));
  }
  if (!bytes) return true;
  s.epoch = ++stage_epoch_;
  s.dirty = true;
  if (s.writers == 0) {
    RETURN_IF_ERROR(StageCommit(ino, *f, false));
    ScheduleSeal(ino);
  }
  return true;
}

Status Staging::EnsureSealed(uint64_t ino) {
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(auto rec, txn.GetStaged(ino));
    if (!rec) return Status::Ok();
  }
  auto f = files_->Pin(ino);
  Status st = Seal(ino, *f, /*wait_release=*/true);
  if (files_->Unpin(ino)) (void)ns_->ReapIfOrphan(ino);
  return st;
}

Status Staging::LoadStage(uint64_t ino, OpenFile& f) {
  if (f.stage) return Status::Ok();
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(auto rec, txn.GetStaged(ino));
  if (!rec) return Status::Ok();
  auto stage = std::make_unique<OpenFile::Stage>();
  stage->name = rec->name;
  stage->fd = ::open(StagePath(cfg_.cache_dir, rec->name).c_str(), O_RDWR | O_CLOEXEC);
  if (stage->fd < 0) {
    return Status::FromErrno(errno, "open of the staging file of inode " + std::to_string(ino));
  }
  stage->dirty = true;  // staged, not sealed
  stage->recorded = true;
  f.stage = std::move(stage);
  return Status::Ok();
}

bool Staging::StagingFilePresent(const StagedRecord& r) const {
  struct stat st;
  return ::stat(StagePath(cfg_.cache_dir, r.name).c_str(), &st) == 0 &&
         static_cast<uint64_t>(st.st_size) == r.size;
}

bool Staging::StagedSurvives(const StagedRecord& r, bool clean) const {
  // A clean stop synced every staging file: their bytes outlive a reboot after it.
  return StagingFilePresent(r) && (r.durable || r.boot_id == boot_id_ || clean);
}

Status Staging::RecoverStaged(MetaStore::Txn& txn, bool clean, std::vector<ChunkId>* freed) {
  ns_->mu().AssertHeld();  // the caller holds it (Store::Recover)
  std::vector<std::pair<uint64_t, StagedRecord>> staged;
  RETURN_IF_ERROR(txn.ForEachStaged(
      [&](uint64_t ino, const StagedRecord& r) { staged.emplace_back(ino, r); }));
  std::unordered_set<std::string> kept;
  std::vector<uint64_t> seal;
  for (auto& [ino, r] : staged) {
    const bool present = StagingFilePresent(r);
    const bool survived = StagedSurvives(r, clean);
    auto rec = txn.GetInode(ino);
    if (survived && rec.ok()) {
      kept.insert(r.name);
      seal.push_back(ino);
      continue;
    }
    RETURN_IF_ERROR(txn.DelStaged(ino));
    if (!rec.ok()) continue;
    if (rec->generation == 0) {
      // A new file whose only bytes were lost with the machine: absent, as if never closed.
      RETURN_IF_ERROR(ns_->RemoveUnborn(txn, *rec, freed));
    }
    log_->warn("inode {}: bytes closed without fsync before a machine crash are gone ({}); the "
               "file keeps its previous version", ino, present ? "another boot" : "staging file lost");
  }
  // Staging files of writers that never closed: their files keep their previous bytes.
  const std::string dir = cfg_.cache_dir + "/passthrough";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.' && !kept.count(e->d_name)) ::unlinkat(::dirfd(d), e->d_name, 0);
    }
    ::closedir(d);
  }
  resume_seals_ = std::move(seal);
  return Status::Ok();
}

}  // namespace ckptfs
