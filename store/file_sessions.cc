// FileSessions: the bytes of open files (store/file_sessions.h).
#include "store/file_sessions.h"

#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <utility>

#include "store/remote_tier.h"

namespace ckptfs {

FileSessions::FileSessions(const Config& cfg, MetaStore* meta, ChunkCache* cache,
                           LocalChunks* chunks, OpenTable* files, Namespace* ns, Staging* staging,
                           Publisher* publisher, Metrics* metrics, Logger log,
                           MemoryBudget* reorder_budget, ThreadPool* cut_pool,
                           const PayloadScannerFactory& scanners, Hooks hooks)
    : cfg_(cfg),
      meta_(meta),
      cache_(cache),
      chunks_(chunks),
      files_(files),
      ns_(ns),
      staging_(staging),
      publisher_(publisher),
      metrics_(metrics),
      log_(std::move(log)),
      reorder_budget_(reorder_budget),
      cut_pool_(cut_pool),
      scanners_(scanners),
      hooks_(std::move(hooks)),
      queue_budget_(cfg.write_memory_bytes / 2),
      read_pool_(std::make_unique<ThreadPool>(cfg.read_threads)),
      write_pool_(std::make_unique<ThreadPool>(cfg.write_threads)) {}

Result<InodeRecord> FileSessions::GetAttr(uint64_t ino) {
  const OverlayState o = TakeOverlay(ino);  // before the read: see ApplyOverlay
  ASSIGN_OR_RETURN(InodeRecord rec, ns_->GetAttr(ino));
  ApplyOverlay(o, &rec);
  return rec;
}

Result<bool> FileSessions::Busy(uint64_t ino) {
  if (files_->Find(ino)) return true;
  ASSIGN_OR_RETURN(InodeRecord rec, GetAttr(ino));
  if (!S_ISDIR(rec.mode)) return false;
  bool busy = false;
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  RETURN_IF_ERROR(txn.WalkTree(ino, true, [&](const DirEntry& e) -> Status {
    if (!busy && files_->Find(e.ino)) busy = true;
    return Status::Ok();
  }));
  return busy;
}

FileSessions::OverlayState FileSessions::TakeOverlay(uint64_t ino) {
  OverlayState o;
  if (auto f = files_->Find(ino)) {
    std::lock_guard q(f->qmu);
    o.dirty = f->dirty;
    o.size = f->size;
    o.data_bytes = std::min(f->data_bytes.load(), o.size);
    o.mtime_ns = f->mtime_ns;
    o.staged = f->writing_fd;
  }
  // Being written by the kernel in passthrough mode: its staging file says what the file holds.
  struct stat st;
  if (o.staged && ::fstat(*o.staged, &st) == 0) {
    o.dirty = true;
    o.size = static_cast<uint64_t>(st.st_size);
    o.mtime_ns = MtimeNs(st);
    o.data_bytes = DataBytes(st);
  }
  return o;
}

void FileSessions::ApplyOverlay(const OverlayState& o, InodeRecord* rec) {
  if (!o.dirty) return;
  rec->size = o.size;
  rec->data_bytes = o.data_bytes;
  rec->mtime_ns = rec->ctime_ns = o.mtime_ns;
}

bool FileSessions::InSession(OpenFile& f, uint64_t fh) {
  if (fh == 0) return true;
  std::lock_guard q(f.qmu);
  return f.session.count(fh) > 0;
}

Status FileSessions::Open(uint64_t ino, bool truncate, uint64_t* fh, bool* keep_cache, bool write,
                   int* passthrough_fd) {
  // Without passthrough every byte is read from chunks: staged bytes are sealed first.
  if (passthrough_fd) {
    *passthrough_fd = -1;
  } else {
    RETURN_IF_ERROR(staging_->EnsureSealed(ino));
  }
  // Pinned before the inode is read: an Unlink from now on keeps the file as an orphan.
  auto f = files_->Pin(ino);
  const uint64_t handle = files_->NewHandle();
  bool seal_first = false;
  Status st = [&]() -> Status {
    std::unique_lock lock(f->mu);  // no commit of this file runs meanwhile
    if (passthrough_fd && !write && !truncate) {
      RETURN_IF_ERROR(staging_->WaitFailedRelease(ino, *f, lock));
    }
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    if (S_ISDIR(rec.mode)) return Status(Code::kIsDir, "open of a directory as a file");
    txn.Abort();  // EnsureWriter opens its own read transaction
    if (passthrough_fd && S_ISREG(rec.mode)) {
      ASSIGN_OR_RETURN(Staging::StagedOpen staged,
                       staging_->OpenStaged(ino, *f, write, truncate, handle, passthrough_fd));
      if (staged == Staging::StagedOpen::kYes) return Status::Ok();
      if (staged == Staging::StagedOpen::kSealFirst) {
        seal_first = true;
        return Status::Ok();
      }
    }
    ++f->cached_opens;
    {
      std::lock_guard q(f->qmu);
      f->committed_size = rec.size;
      f->committed_data = rec.data_bytes;
      if (!f->dirty) f->ShowCommitted();
    }
    if (!truncate || !S_ISREG(rec.mode)) return Status::Ok();
    RETURN_IF_ERROR(EnsureWriter(ino, *f));
    RETURN_IF_ERROR(f->writer->Truncate(0));
    std::lock_guard q(f->qmu);
    f->session.insert(handle);
    f->size = 0;
    f->data_bytes = 0;
    f->mtime_ns = NowNs();
    f->dirty = true;
    return Status::Ok();
  }();
  if (!st.ok() || seal_first) {
    if (files_->Unpin(ino)) (void)ns_->ReapIfOrphan(ino);
    if (!st.ok()) return st;
    // A writer of staged bytes: they are sealed first, then it takes the daemon's path.
    RETURN_IF_ERROR(staging_->EnsureSealed(ino));
    return Open(ino, truncate, fh, keep_cache, write, nullptr);
  }
  if (fh) *fh = handle;
  if (keep_cache && passthrough_fd && *passthrough_fd >= 0) {
    *keep_cache = false;  // the kernel refuses it with passthrough (no page cache of its own)
  } else if (keep_cache) {
    *keep_cache = !files_->TakeStale(ino);
  }
  return Status::Ok();
}

Status FileSessions::Release(uint64_t ino, uint64_t fh) {
  Status st;
  const std::shared_ptr<OpenFile> f = files_->Find(ino);
  if (f) {
    auto staged = staging_->ReleaseStaged(ino, *f, fh);
    if (!staged.ok()) st = staged.status();
    if (staged.ok() && !*staged) {
      std::lock_guard lock(f->mu);
      if (f->cached_opens > 0) --f->cached_opens;
    }
    bool last;
    {
      std::lock_guard lock(f->mu);
      last = f->cached_opens == 0 && (!f->stage || f->stage->handles.empty());
    }
    // The last release commits what is left (a truncate by path, say), whoever wrote it.
    Status flushed = Flush(ino, last ? 0 : fh);
    if (st.ok()) st = flushed;
  }
  if (files_->Unpin(ino)) {
    // The last handle is gone (two releases at once may both have seen another open): a new
    // file that no commit kept is kept now.
    if (f) {
      Status born = KeepCreated(ino, *f);
      if (st.ok()) st = born;
    }
    Status reap = ns_->ReapIfOrphan(ino);
    if (st.ok()) st = reap;
  }
  return st;
}

Status FileSessions::KeepCreated(uint64_t ino, OpenFile& f, uint64_t fh) {
  std::lock_guard lock(f.mu);
  if (!f.unborn || (fh != 0 && fh != f.creator_fh)) return Status::Ok();
  RETURN_IF_ERROR(ns_->KeepCreated(ino));
  f.unborn = false;
  return Status::Ok();
}

Status FileSessions::EnsureWriter(uint64_t ino, OpenFile& f) {
  if (f.writer) return Status::Ok();
  Manifest base;
  if (f.manifest) {
    base = *f.manifest;
  } else {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(auto m, txn.GetManifest(ino));
    if (m) base = std::move(*m);
  }
  {
    std::lock_guard q(f.qmu);
    f.committed_data = base.DataBytes();
  }
  f.writer = std::make_unique<FileWriter>(std::move(base), chunks_, cfg_.chunking,
                                          cfg_.reorder_bytes, metrics_, scanners_,
                                          reorder_budget_);
  f.writer->CutAhead(cut_pool_, cfg_.cut_threads + 1);
  return Status::Ok();
}

Status FileSessions::Write(uint64_t ino, uint64_t offset, const uint8_t* data, size_t len,
                    uint64_t fh) {
  auto f = files_->Find(ino);
  if (!f) return Internal("write to inode " + std::to_string(ino) + " that is not open");
  // Daemon-wide back-pressure first (not under the file's lock: its queue must keep draining).
  queue_budget_.Take(len);
  bool queued = false;
  struct Undo {
    MemoryBudget& b;
    size_t n;
    const bool& done;
    ~Undo() {
      if (!done) b.Release(n);
    }
  } undo{queue_budget_, len, queued};
  std::unique_lock q(f->qmu);
  // Back-pressure: wait for room, but a write larger than the whole queue still goes in alone.
  f->qcv.wait(q, [&] {
    return !f->async_error.ok() || f->queued_bytes == 0 ||
           f->queued_bytes + len <= cfg_.write_queue_bytes;
  });
  if (!f->async_error.ok()) return f->async_error;
  // Admission may wait for uploads to make room (up to remote_timeout): not under the queue
  // lock, which a stat, chmod or link of this file takes inside the namespace lock.
  q.unlock();
  Status room = AdmitWrite(len);
  q.lock();
  if (!room.ok()) {
    f->async_error = room;  // the file's new bytes are dropped at close, like any failed write
    return room;
  }
  if (!f->async_error.ok()) return f->async_error;
  unstored_bytes_ += len;
  QueuedWrite w{offset, std::unique_ptr<uint8_t[]>(new uint8_t[len]), len};
  std::memcpy(w.data.get(), data, len);
  f->queue.push_back(std::move(w));
  queued = true;  // Drain gives the budget back
  f->queued_bytes += len;
  if (fh) f->session.insert(fh);
  if (!f->dirty) f->ShowCommitted();  // a new session starts from the committed bytes
  f->size = std::max(f->size.load(), offset + len);
  f->data_bytes = std::min(f->data_bytes.load() + len, f->size.load());
  f->mtime_ns = NowNs();
  f->dirty = true;
  if (!f->draining) {
    f->draining = true;
    write_pool_->Submit([this, ino, f] { Drain(ino, f); });
  }
  return Status::Ok();
}

namespace {
constexpr size_t kLargeWrite = 128 << 10;
}  // namespace

Status FileSessions::WaitForRoom(size_t len) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(cfg_.remote_timeout_s * 1000));
  for (bool logged = false;;) {
    cache_->Evict();
    const ChunkCache::Usage u = cache_->usage();
    if (u.local_only + unstored_bytes_.load() + len <= cfg_.cache_bytes) return Status::Ok();
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(Code::kNoSpace,
                    "the local tier holds " + std::to_string(u.local_only >> 20) +
                        " MiB not yet uploaded to " + publisher_->backend(0).Describe() +
                        " (cache_size " + std::to_string(cfg_.cache_bytes >> 20) + " MiB)");
    }
    if (!logged) {
      log_->info("writers wait: the local tier is full of chunks still to upload");
      logged = true;
    }
    publisher_->Kick();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Status FileSessions::AdmitWrite(size_t len) {
  if (publisher_->tiers() > 0 && cfg_.cache_bytes > 0) RETURN_IF_ERROR(WaitForRoom(len));
  return CheckRoom(len);
}

Status FileSessions::CheckRoom(size_t len) {
  struct statvfs vfs;
  if (::statvfs(cfg_.cache_dir.c_str(), &vfs) != 0) {
    return Status::FromErrno(errno, "statvfs " + cfg_.cache_dir);
  }
  // Every write leaves room for the chunk a writer holds back and for the metadata to grow. A
  // large write also leaves a tail reserve that small writes may still use: a program that runs
  // out of room then fails on a data write, which it checks, rather than on the last few small
  // writes of its file (torch.save's zip end records), whose errors torch 1.13 drops.
  const uint64_t total = uint64_t{vfs.f_blocks} * vfs.f_frsize;
  const uint64_t base_reserve = std::min<uint64_t>(2ull * cfg_.chunking.max_bytes + (1ull << 20),
                                                   total / 32);
  const uint64_t tail_reserve = len >= kLargeWrite ? std::min<uint64_t>(8ull << 20, total / 16) : 0;
  const uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  const uint64_t need = unstored_bytes_.load() + len + base_reserve + tail_reserve;
  if (free_bytes >= need) {
    full_logged_ = false;
    return Status::Ok();
  }
  Status st(Code::kNoSpace, "the local tier " + cfg_.cache_dir + " has " +
                                std::to_string(free_bytes >> 20) + " MiB free, " +
                                std::to_string(need >> 20) + " MiB needed");
  if (!full_logged_.exchange(true)) log_->error("refusing writes: {}", st.message());
  return st;
}

void FileSessions::Drain(uint64_t ino, const std::shared_ptr<OpenFile>& f) {
  for (;;) {
    QueuedWrite w;
    {
      std::lock_guard q(f->qmu);
      if (f->queue.empty()) {
        f->draining = false;
        f->qcv.notify_all();
        return;
      }
      w = std::move(f->queue.front());
      f->queue.pop_front();
    }
    Status st;
    {
      std::lock_guard lock(f->mu);
      st = EnsureWriter(ino, *f);
      if (st.ok()) st = f->writer->Write(w.offset, w.data.get(), w.len);
    }
    unstored_bytes_ -= w.len;
    queue_budget_.Release(w.len);
    std::lock_guard q(f->qmu);
    f->queued_bytes -= w.len;
    if (!st.ok() && f->async_error.ok()) f->async_error = st;
    f->qcv.notify_all();
  }
}

void FileSessions::WaitDrained(OpenFile& f) {
  std::unique_lock q(f.qmu);
  f.qcv.wait(q, [&] { return !f.draining && f.queue.empty(); });
}

Status FileSessions::Read(uint64_t ino, uint64_t offset, size_t len, std::vector<ReadSlice>* out) {
  auto f = files_->Find(ino);
  if (!f) return Internal("read of inode " + std::to_string(ino) + " that is not open");
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<const Manifest> m;
    if (f->dirty) WaitDrained(*f);
    {
      std::lock_guard lock(f->mu);
      if (f->writer) return f->writer->Read(offset, len, out);
      if (!f->manifest) {
        ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
        ASSIGN_OR_RETURN(auto loaded, txn.GetManifest(ino));
        f->manifest = std::make_shared<const Manifest>(loaded ? std::move(*loaded) : Manifest());
      }
      m = f->manifest;
      if (offset < m->size() && len > 0) {
        const uint64_t last_byte = std::min<uint64_t>(offset + len, m->size()) - 1;
        ReadAhead(*f, m, m->Find(offset), m->Find(last_byte));
      }
    }
    // Committed bytes are immutable: read them without holding the file's lock.
    const size_t first = out->size();
    Status st = ReadManifest(
        *m, offset, len, [this](const ChunkId& id, size_t l) { return cache_->Get(id, l); }, out);
    if (st.code() != Code::kNotFound) return st;
    out->resize(first);
    bool replaced;
    {
      std::lock_guard lock(f->mu);
      replaced = f->writer || f->manifest != m;
    }
    // A commit through another handle replaced the bytes and reclaimed the old chunks: read the
    // new version. Otherwise the chunk is really gone.
    if (!replaced || attempt >= 3) {
      log_->error("inode {}: a chunk of its committed bytes is missing from the local tier ({})",
                  ino, st.message());
      return Corrupt(st.message());
    }
  }
}

void FileSessions::ReadAhead(OpenFile& f, const std::shared_ptr<const Manifest>& m, size_t first,
                      size_t last) {
  if (f.prefetched_for != m.get()) {
    f.prefetched_for = m.get();
    f.prefetched_upto = 0;
    f.last_extent = SIZE_MAX;
  }
  const bool sequential = f.last_extent != SIZE_MAX &&
                          (first == f.last_extent || first == f.last_extent + 1);
  f.last_extent = last;
  if (cfg_.readahead_chunks == 0) return;
  // A read that misses the local tier starts a window of its own: fetching costs far more than
  // reading ahead in vain, and a reader that jumps (torch.load going from record to record)
  // would otherwise wait for every chunk of each record in turn.
  const Extent& at = m->extents()[first];
  const bool cold = publisher_->tiers() > 0 && !at.hole() && !cache_->OnDisk(at.id);
  if (!sequential && !cold) return;
  const size_t until = std::min(last + cfg_.readahead_chunks, m->extents().size() - 1);
  const size_t from = sequential ? std::max(f.prefetched_upto + 1, last + 1) : last + 1;
  std::vector<std::pair<ChunkId, uint64_t>> fetch;
  for (size_t i = from; i <= until; ++i) {
    const Extent& e = m->extents()[i];
    if (e.hole()) continue;
    if (publisher_->tiers() > 0 && !cache_->OnDisk(e.id)) {
      fetch.emplace_back(e.id, e.len);
      continue;
    }
    // The manifest stays alive in the task; ChunkCache::Get's single flight lets the reader that
    // gets there first wait for this load instead of starting its own.
    read_pool_->Submit([this, m, id = e.id, len = e.len] { (void)cache_->Get(id, len); });
  }
  if (!fetch.empty()) hooks_.fetch_soon(fetch);
  f.prefetched_upto = std::max(f.prefetched_upto, until);
}

Status FileSessions::Flush(uint64_t ino, uint64_t fh) {
  auto f = files_->Find(ino);
  if (!f) return Status::Ok();
  {
    // A passthrough writer's close commits its staging file as the file's new bytes.
    std::lock_guard lock(f->mu);
    if (f->stage && fh != 0 && f->stage->handles.count(fh)) {
      if (!f->stage->handles[fh]) return Status::Ok();
      f->stage->closed.insert(fh);  // closed, whether its bytes commit or not
      return staging_->StageCommit(ino, *f, false);
    }
  }
  if (InSession(*f, fh)) {
    RETURN_IF_ERROR(CommitSession(ino, *f, false));
  }
  // The creator's close keeps a new file it wrote nothing to (its release comes later, async).
  return fh != 0 ? KeepCreated(ino, *f, fh) : Status::Ok();
}

Status FileSessions::Fsync(uint64_t ino, uint64_t fh) {
  if (auto f = files_->Find(ino)) {
    // Staged bytes: the staging file is synced, then its record (StageCommit).
    std::lock_guard lock(f->mu);
    if (f->stage && (f->stage->writers > 0 || f->stage->dirty)) {
      RETURN_IF_ERROR(staging_->StageCommit(ino, *f, true));
    }
  }
  if (auto f = files_->Find(ino); f && InSession(*f, fh)) {
    RETURN_IF_ERROR(CommitSession(ino, *f, true));
  }
  // A new file fsync'd with nothing written is kept too.
  if (auto f = files_->Find(ino)) RETURN_IF_ERROR(KeepCreated(ino, *f));
  // A file committed earlier by close(2) is made durable here too, and needs no fallback.
  RETURN_IF_ERROR(SettleCommitted(ino));
  // durability=remote: fsync returns once the tiers named by durability_tier (default: every
  // tier) hold the committed version.
  if (publisher_->tiers() > 0 && cfg_.durability == "remote") {
    ASSIGN_OR_RETURN(InodeRecord rec, GetAttr(ino));
    if (!S_ISREG(rec.mode)) return Status::Ok();
    // One deadline for all: the tiers upload side by side.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(cfg_.remote_timeout_s);
    for (size_t t = 0; t < publisher_->tiers(); ++t) {
      const auto& want = cfg_.durability_tiers;
      if (!want.empty() && std::find(want.begin(), want.end(), static_cast<int>(t)) == want.end()) {
        continue;
      }
      const double left = std::max(
          0.0, std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count());
      RETURN_IF_ERROR(publisher_->remote(t)->WaitPublished(ino, rec.generation, left));
    }
  }
  return Status::Ok();
}

Status FileSessions::SettleCommitted(uint64_t ino) {
  std::optional<FallbackRecord> fb;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(fb, txn.GetFallback(ino));
  }
  RETURN_IF_ERROR(cache_->Sync());
  if (fb) RETURN_IF_ERROR(ns_->fallbacks().DropSettled({{ino, fb->touch}}));
  return meta_->Sync();
}

Status FileSessions::MakeDurable(uint64_t ino) {
  bool live = false;
  if (auto f = files_->Find(ino)) {
    std::lock_guard lock(f->mu);
    if (f->stage && f->stage->recorded) {
      live = true;  // the kernel may still write it: synced and recorded as fsync does
      if (!f->stage->durable) RETURN_IF_ERROR(staging_->StageCommit(ino, *f, true));
    }
  }
  // Staged and closed: its chunks, committed.
  if (!live) RETURN_IF_ERROR(staging_->EnsureSealed(ino));
  return SettleCommitted(ino);
}

Status FileSessions::CommitSession(uint64_t ino, OpenFile& f, bool durable) {
  WaitDrained(f);
  Status st;
  {
    std::lock_guard lock(f.mu);
    st = CommitOrDrop(ino, f, durable);
  }
  RunAfterCommit(ino, f);
  return st;
}

Status FileSessions::CommitOrDrop(uint64_t ino, OpenFile& f, bool durable) {
  Status failed;
  {
    std::lock_guard q(f.qmu);
    std::swap(failed, f.async_error);  // reported once, here
    f.session.clear();                 // its bytes are committed or dropped now
  }
  if (failed.ok()) return Commit(ino, f, durable);
  // A write since the last commit failed: none of the bytes written since then are committed,
  // so a checkpoint is either all there or still its previous version.
  if (f.writer) {
    std::unique_ptr<FileWriter> writer = std::move(f.writer);
    f.manifest = nullptr;
    {
      std::lock_guard q(f.qmu);
      f.EndSession();
    }
    chunks_->ReleaseHolds(writer->held());
    files_->MarkStale(ino);  // the kernel may cache the dropped bytes
  }
  log_->warn("inode {}: a write failed ({}); the file keeps its previously committed bytes", ino,
             failed.ToString());
  return failed;
}

Status FileSessions::Commit(uint64_t ino, OpenFile& f, bool durable) {
  if (!f.writer) return Status::Ok();
  std::unique_ptr<FileWriter> writer = std::move(f.writer);
  const int64_t mtime = f.mtime_ns.load();
  auto finished = writer->Finish();
  Status st = finished.status();
  if (st.ok() && durable) st = cache_->Sync();  // chunks first (invariant 2)
  std::vector<ChunkId> freed;
  std::shared_ptr<const Manifest> committed;
  if (st.ok()) {
    st = ns_->CommitManifest(ino, *finished, mtime, durable, &freed);
    if (st.ok()) f.unborn = false;
  }
  const uint64_t committed_size = st.ok() ? finished->size() : 0;
  const uint64_t committed_data = st.ok() ? finished->DataBytes() : 0;
  if (st.ok()) {
    committed = std::make_shared<const Manifest>(std::move(*finished));
    metrics_->file_commits.Add(1);
    metrics_->file_commit_bytes.Add(committed_size);
    if (durable) st = meta_->Sync();
  } else {
    freed.clear();
    log_->error("inode {}: its new bytes could not be committed and are dropped: {}", ino,
                st.ToString());
  }
  f.manifest = std::move(committed);  // null after a failure: reloaded from the committed state
  {
    // GetAttr shows the uncommitted size until the commit is in LMDB, and for as long as writes
    // acknowledged after the caller drained the queue wait to be applied: a smaller size would
    // move the kernel's end of file back (O_APPEND writes then land short of it).
    std::lock_guard q(f.qmu);
    if (st.ok()) {
      f.committed_size = committed_size;
      f.committed_data = committed_data;
    }
    f.EndSession();
  }
  if (!st.ok()) files_->MarkStale(ino);
  chunks_->ReleaseHolds(writer->held());
  // Reclaim (which syncs LMDB), the uploaders and retention run once the caller has released
  // f.mu (RunAfterCommit): a stat or open of this file must not wait for them.
  f.after_freed.insert(f.after_freed.end(), freed.begin(), freed.end());
  f.after_committed = f.after_committed || st.ok();
  return st;
}

void FileSessions::RunAfterCommit(uint64_t ino, OpenFile& f) {
  std::vector<ChunkId> freed;
  bool committed;
  {
    std::lock_guard lock(f.mu);
    freed.swap(f.after_freed);
    committed = std::exchange(f.after_committed, false);
  }
  chunks_->Reclaim(freed);
  if (committed) {
    publisher_->Kick();
    hooks_.note_committed(ino);
  }
}

Result<std::optional<uint64_t>> FileSessions::Seek(uint64_t ino, uint64_t offset, bool data) {
  const OverlayState o = TakeOverlay(ino);
  if (const auto& staged = o.staged) {  // its file position is not used: the kernel and the store read at offsets
    const off_t at = ::lseek(*staged, static_cast<off_t>(offset), data ? SEEK_DATA : SEEK_HOLE);
    if (at >= 0) return std::optional<uint64_t>(static_cast<uint64_t>(at));
    if (errno == ENXIO) return std::optional<uint64_t>();
    return Status::FromErrno(errno, "lseek in the staging file of inode " + std::to_string(ino));
  }
  if (o.dirty) {
    if (offset >= o.size) return std::optional<uint64_t>();
    return std::optional<uint64_t>(data ? offset : o.size);
  }
  ASSIGN_OR_RETURN(auto m, CommittedManifest(ino));
  return m->Seek(offset, data);
}

Result<std::shared_ptr<const Manifest>> FileSessions::CommittedManifest(uint64_t ino) {
  RETURN_IF_ERROR(staging_->EnsureSealed(ino));
  if (auto f = files_->Find(ino)) {
    std::lock_guard lock(f->mu);
    if (f->manifest) return f->manifest;
  }
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  if (!S_ISREG(rec.mode)) return Status(Code::kIsDir, "not a regular file");
  ASSIGN_OR_RETURN(auto m, txn.GetManifest(ino));
  return std::make_shared<const Manifest>(m ? std::move(*m) : Manifest());
}

Status FileSessions::ReadCommitted(const Manifest& m, uint64_t offset, uint64_t len,
                            std::vector<ReadSlice>* out) {
  return ReadManifest(
      m, offset, len, [this](const ChunkId& id, size_t l) { return cache_->Get(id, l); }, out);
}

void FileSessions::WarmCommitted(const std::shared_ptr<const Manifest>& m, uint64_t offset,
                          uint64_t len) {
  if (len == 0 || offset >= m->size()) return;
  const size_t last = m->Find(std::min(m->size(), offset + len) - 1);
  for (size_t i = m->Find(offset); i <= last && i < m->extents().size(); ++i) {
    const Extent& e = m->extents()[i];
    if (e.hole()) continue;
    read_pool_->Submit([this, m, id = e.id, l = e.len] { (void)cache_->Get(id, l); });
  }
}

Result<FileSessions::ChunkUsage> FileSessions::Usage(const Manifest& m) {
  std::unordered_map<ChunkId, uint64_t, ChunkIdHash> uses;  // references from this manifest
  ChunkUsage u;
  for (const Extent& e : m.extents()) {
    if (e.hole()) continue;
    ++uses[e.id];
    ++u.chunks;
    u.bytes += e.len;
  }
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  for (const Extent& e : m.extents()) {
    if (e.hole()) continue;
    ASSIGN_OR_RETURN(ChunkRecord r, txn.GetChunk(e.id));
    if (r.refs > uses[e.id]) {
      ++u.shared_chunks;
      u.shared_bytes += e.len;
    }
  }
  return u;
}

Status FileSessions::Truncate(uint64_t ino, uint64_t size, uint64_t fh, int64_t now) {
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    if (S_ISDIR(rec.mode)) return Status(Code::kIsDir, "truncate of a directory");
    if (!S_ISREG(rec.mode)) return Invalid("truncate of a special file");
  }
  // The size changed in a staging file the kernel uses now: committed with it.
  ASSIGN_OR_RETURN(bool staged_live, staging_->ChangeStaged(ino, [&](int fd) {
                     return ::ftruncate(fd, static_cast<off_t>(size)) == 0 ? 0 : errno;
                   }, true));
  if (staged_live) return Status::Ok();
  RETURN_IF_ERROR(staging_->EnsureSealed(ino));
  auto f = files_->Pin(ino);
  WaitDrained(*f);
  Status st = [&]() -> Status {
    std::lock_guard lock(f->mu);
    RETURN_IF_ERROR(EnsureWriter(ino, *f));
    RETURN_IF_ERROR(f->writer->Truncate(size));
    bool alone;
    {
      std::lock_guard q(f->qmu);
      if (!f->dirty) f->data_bytes = f->committed_data;
      f->size = f->writer->size();
      f->data_bytes = std::min(f->data_bytes.load(), f->size.load());
      f->mtime_ns = now;
      f->dirty = true;
      if (fh) f->session.insert(fh);
    }
    // No handle has it open (a seal's pin is none).
    alone = f->cached_opens == 0 && (!f->stage || f->stage->handles.empty());
    // ftruncate is part of its handle's session, committed at its close; truncate(2) by path
    // commits at once unless the file is open, then with its session or last release.
    if (fh || !alone) return Status::Ok();
    return CommitOrDrop(ino, *f, false);
  }();
  RunAfterCommit(ino, *f);
  if (files_->Unpin(ino)) RETURN_IF_ERROR(ns_->ReapIfOrphan(ino));
  return st;
}

Status FileSessions::PunchHole(uint64_t ino, uint64_t offset, uint64_t len, uint64_t fh) {
  ASSIGN_OR_RETURN(bool staged, staging_->ChangeStaged(ino, [&](int fd) {
                     return ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                        static_cast<off_t>(offset), static_cast<off_t>(len)) == 0
                                ? 0
                                : errno;
                   }, true));
  if (staged) return Status::Ok();
  RETURN_IF_ERROR(staging_->EnsureSealed(ino));
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    if (!S_ISREG(rec.mode)) return Invalid("a hole in a file that is not regular");
    // The file moves to a staging file of its size on the cache disk: room for it first.
    RETURN_IF_ERROR(AdmitWrite(rec.size));
  }
  auto f = files_->Pin(ino);
  WaitDrained(*f);  // after the writes queued before it
  Status st = [&]() -> Status {
    std::lock_guard lock(f->mu);
    RETURN_IF_ERROR(EnsureWriter(ino, *f));
    RETURN_IF_ERROR(f->writer->PunchHole(offset, len));
    std::lock_guard q(f->qmu);
    // The punched bytes still count until the commit.
    if (!f->dirty) f->data_bytes = f->committed_data;
    f->mtime_ns = NowNs();
    f->dirty = true;
    if (fh) f->session.insert(fh);
    return Status::Ok();
  }();
  if (files_->Unpin(ino)) RETURN_IF_ERROR(ns_->ReapIfOrphan(ino));
  return st;
}

Status FileSessions::CommitAll() {
  Status first;
  const std::vector<std::pair<uint64_t, std::shared_ptr<OpenFile>>> open = files_->All();
  for (auto& [ino, f] : open) {
    WaitDrained(*f);
    std::lock_guard lock(f->mu);
    if (f->stage && f->stage->writers > 0) {
      Status st = staging_->StageCommit(ino, *f, false);  // a writer still open at the stop
      if (!st.ok() && first.ok()) first = st;
    }
    Status st = CommitOrDrop(ino, *f, false);
    if (!st.ok() && first.ok()) first = st;
  }
  for (auto& [ino, f] : open) RunAfterCommit(ino, *f);
  return first;
}

}  // namespace ckptfs
