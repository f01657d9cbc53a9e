// Store: the composition root. Opening (the components made in order, recovery, the tiers),
// shutdown, and the forwards and short compositions of the API to the components.
#include "store/store.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "cache/fault_io_engine.h"
#include "store/recovery.h"
#include "store/remote_tier.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMetaMapBytes = 64ull << 30;  // address space only; the file grows as needed

// Whether file ino has bytes not yet committed (the Publisher's `dirty`), read before the
// Publisher reads LMDB.
bool Uncommitted(OpenTable& files, uint64_t ino) {
  auto f = files.Find(ino);
  return f && f->dirty;
}

}  // namespace

Result<std::unique_ptr<Store>> Store::Open(const Config& cfg, PayloadScannerFactory scanners,
                                           std::unique_ptr<Backend> backend) {
  std::vector<std::unique_ptr<Backend>> tiers;
  if (backend) tiers.push_back(std::move(backend));
  return Open(cfg, std::move(scanners), std::move(tiers));
}

Result<std::unique_ptr<Store>> Store::Open(const Config& cfg, PayloadScannerFactory scanners,
                                           std::vector<std::unique_ptr<Backend>> tiers) {
  if (tiers.size() > static_cast<size_t>(kMaxTiers)) {
    return Invalid("at most " + std::to_string(kMaxTiers) + " remote tiers");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CacheDir> dir, CacheDir::Open(cfg.cache_dir));
  IoEngineOptions io;
  io.kind = cfg.io_engine;
  auto engine = MakeIoEngine(io);
  if (!engine.ok()) return engine.status();
  if (!cfg.cache_faults.empty()) {
    auto spec = CacheFaultSpec::Parse(cfg.cache_faults);
    if (!spec.ok()) return spec.status();
    GetLogger("store")->warn("injecting cache disk faults: {}", spec->ToString());
    *engine = std::make_unique<FaultIoEngine>(std::move(*engine), *spec);
  }
  auto meta = MetaStore::Open(cfg.cache_dir + "/meta", kMetaMapBytes);
  if (!meta.ok()) return meta.status();
  const bool clean = dir->clean();
  std::unique_ptr<Store> s(
      new Store(cfg, std::move(*engine), nullptr, std::move(*meta), std::move(dir)));
  const std::string boot_id = CurrentBootId();
  auto cache = ChunkCache::Open(cfg.cache_dir, s->engine_.get(), cfg.ram_cache_bytes, &s->metrics_);
  if (!cache.ok()) {
    s->closed_ = true;
    return cache.status();
  }
  s->cache_ = std::move(*cache);
  if (cfg.packs) s->cache_->AppendToPacks();  // the daemon's own chunks go to packs too
  if (!clean) s->cache_->DistrustPacks();
  s->chunks_ = std::make_unique<LocalChunks>(s->cfg_.cache_dir, s->cache_.get(), s->meta_.get(),
                                             &s->metrics_, s->log_, s->cfg_.write_threads);
  s->publisher_ = std::make_unique<Publisher>(s->cfg_, s->meta_.get(), s->cache_.get(),
                                              &s->metrics_, s->log_);
  Store* p = s.get();
  s->retention_ = std::make_unique<RetentionPass>(
      s->meta_.get(), s->chunks_.get(), s->log_,
      RetentionPass::Ops{
          .lookup = [p](uint64_t parent, std::string_view name) { return p->Lookup(parent, name); },
          .unlink = [p](uint64_t parent, std::string_view name) { return p->Unlink(parent, name); },
          .rmdir = [p](uint64_t parent, std::string_view name) { return p->Rmdir(parent, name); },
          .busy = [p](uint64_t ino) { return p->Busy(ino); },
          .ensure_sealed = [p](uint64_t ino) { return p->EnsureSealed(ino); },
          .forget = [p](uint64_t parent, const std::string& name) {
            p->TellChange(parent, name, 0);
          },
      });
  s->ns_ = std::make_unique<Namespace>(
      s->cfg_.cache_dir, s->meta_.get(), s->cache_.get(), s->chunks_.get(), s->publisher_.get(),
      &s->files_, s->log_, boot_id, s->cfg_.settle_interval_s,
      Namespace::Hooks{
          .show = [p](uint64_t ino, InodeRecord* rec) { p->sessions_->Show(ino, rec); },
      });
  Namespace* ns = s->ns_.get();
  s->sync_ = std::make_unique<NamespaceSync>(
      s->cfg_, s->meta_.get(), s->publisher_.get(), &s->files_, s->cache_.get(), s->chunks_.get(),
      &ns->fallbacks(), ns->mu(), s->log_,
      NamespaceSync::Hooks{
          .drop_link = [ns](MetaStore::Txn& txn, InodeRecord& rec, std::vector<ChunkId>* freed)
              REQUIRES(ns->mu()) { return ns->DropLink(txn, rec, freed); },
          .tell_change = [p](uint64_t parent, const std::string& name,
                             uint64_t ino) { p->TellChange(parent, name, ino); },
      });
  s->scanners_ = std::move(scanners);
  s->staging_ = std::make_unique<Staging>(
      s->cfg_, s->meta_.get(), &s->files_, s->chunks_.get(), s->cache_.get(), s->publisher_.get(),
      &s->metrics_, s->log_, ns, &s->reorder_budget_, s->cut_pool_.get(), s->scanners_, boot_id,
      Staging::Hooks{
          .check_room = [p] { return p->sessions_->CheckRoom(0); },
          .note_committed = [p](uint64_t ino) { p->retention_->NoteCommitted(ino); },
      });
  s->sessions_ = std::make_unique<FileSessions>(
      s->cfg_, s->meta_.get(), s->cache_.get(), s->chunks_.get(), &s->files_, ns,
      s->staging_.get(), s->publisher_.get(), &s->metrics_, s->log_, &s->reorder_budget_,
      s->cut_pool_.get(), s->scanners_,
      FileSessions::Hooks{
          .fetch_soon = [p](const std::vector<std::pair<ChunkId, uint64_t>>& chunks) {
            if (p->remote_tiers() > 0) p->prefetcher().ReaderWants(chunks);
          },
          .note_committed = [p](uint64_t ino) { p->retention_->NoteCommitted(ino); },
      });
  Status st = RecoverAtOpen({s->cfg_.cache_dir, *s->dir_, *s->meta_, *s->cache_, *s->ns_,
                             *s->staging_, s->log_},
                            clean);
  if (!st.ok()) {
    s->closed_ = true;
    return st;
  }
  if (!tiers.empty()) {
    st = s->AttachRemote(std::move(tiers));
    if (!st.ok()) {
      s->closed_ = true;
      return st;
    }
    // Pinned chunks are kept from eviction from the first request on.
    if (Status pins = s->LoadPins(); !pins.ok()) {
      s->log_->warn("loading pins (user.ckptfs.pin): {}", pins.ToString());
    }
  }
  s->staging_->ResumeSeals();
  s->ns_->fallbacks().Start();
  s->dir_->NoteOwner();
  return s;
}

Store::Store(Config cfg, std::unique_ptr<IoEngine> engine, std::unique_ptr<ChunkCache> cache,
             std::unique_ptr<MetaStore> meta, std::unique_ptr<CacheDir> dir)
    : dir_(std::move(dir)),
      cfg_(std::move(cfg)),
      log_(GetLogger("store")),
      engine_(std::move(engine)),
      cache_(std::move(cache)),
      meta_(std::move(meta)),
      reorder_budget_(cfg_.write_memory_bytes / 2),
      cut_pool_(cfg_.cut_threads ? std::make_unique<ThreadPool>(cfg_.cut_threads) : nullptr) {}

Store::Gauges Store::gauges() {
  Gauges g;
  g.cache = cache_->usage();
  g.write_queue_bytes = sessions_->queue_budget().used();
  g.write_queue_limit = sessions_->queue_budget().limit();
  const LocalChunks::Usage puts = chunks_->usage();
  g.put_copy_bytes = puts.put_copy_bytes;
  g.put_copy_limit = puts.put_copy_limit;
  g.put_copy_peak = puts.put_copy_peak;
  g.put_flights = puts.put_flights;
  g.open_files = files_.size();
  if (auto txn = meta_->Begin(false); txn.ok()) {
    (void)txn->ForEachFallback([&](uint64_t, const FallbackRecord&) { ++g.fallback_files; });
    for (size_t t = 0; t < publisher_->tiers(); ++t) {
      const RemoteTier* r = publisher_->remote(t);
      auto n = txn->CountRemoteOps(r->tier());
      g.ops_waiting.push_back(n.ok() ? *n : 0);
      const Status last = r->last_error();  // a file waiting out a gc round is no failure
      const bool failing = !last.ok() && !RemoteTier::IsGcWait(last);
      g.tier_names.push_back(r->backend()->Describe());
      g.tier_errors.push_back(failing ? last.ToString() : "");
    }
  }
  g.sync_mode = sync_->mode();
  g.journal_entry = sync_->journal_entry();
  return g;
}

Store::~Store() {
  Status st = Close();
  if (!st.ok()) log_->error("closing the store: {}", st.ToString());
}

Status Store::Close() {
  if (closed_) return Status::Ok();
  closed_ = true;
  StopPrefetch();  // no chunk lands behind the final sync below
  publisher_->BeginStop();  // restores queued or running put nothing more
  // Seals not begun stay staged (resumed at the next mount); a running one finishes first.
  // A retention pass deletes through the namespace: the one running ends first, the queued ones
  // are dropped, and commits from here on (the files still open) queue none.
  if (retention_) retention_->Stop();
  staging_->StopSeals();
  ns_->fallbacks().Stop();  // the final syncs below make every version durable
  publisher_->StopRestores();
  // Uploads still queued stay in LMDB and resume at the next mount.
  StopSync();
  publisher_->StopTiers();
  Status first = sessions_->CommitAll();
  Status st = cache_->Sync();
  if (!st.ok() && first.ok()) first = st;
  st = meta_->Sync();
  if (!st.ok() && first.ok()) first = st;
  if (first.ok()) dir_->MarkClean();
  return first;
}

Status Store::AttachRemote(std::vector<std::unique_ptr<Backend>> tiers) {
  RETURN_IF_ERROR(publisher_->Attach(std::move(tiers)));
  {
    MutexLock lock(&ns_->mu());  // its transaction is one of the namespace's writes
    RETURN_IF_ERROR(publisher_->QueueUnpublished());
  }
  publisher_->Start();
  return Status::Ok();
}

Result<std::string> Store::RemoteState(uint64_t ino) {
  return publisher_->RemoteState(ino, Uncommitted(files_, ino));
}

Result<std::string> Store::TierStates(uint64_t ino) {
  return publisher_->TierStates(ino, Uncommitted(files_, ino));
}

Result<ChunkRef> Store::PeerChunk(const ChunkId& id, uint64_t len, bool fetch) {
  return chunks_->Referenced(id, len, fetch);
}

Status Store::SyncFromRemote(const SyncProgress& progress, bool* listed) {
  return sync_->SyncFromRemote(progress, listed);
}

Status Store::InitialSync(double timeout_s, const SyncProgress& progress) {
  return sync_->InitialSync(timeout_s, progress);
}

void Store::StartSync() { sync_->Start(); }

void Store::StopSync() { sync_->Stop(); }

void Store::SetChangeListener(ChangeListener fn) {
  MutexLock lock(&listener_mu_);  // a retention pass (resumed seals) may read it already
  on_change_ = std::move(fn);
}

void Store::TellChange(uint64_t parent, const std::string& name, uint64_t ino) {
  ChangeListener tell;
  {
    MutexLock lock(&listener_mu_);
    tell = on_change_;
  }
  if (tell) tell(parent, name, ino);
}

// --- the namespace (store/namespace.h), and what it shares with open files ---

Result<InodeRecord> Store::Lookup(uint64_t parent, std::string_view name) {
  ASSIGN_OR_RETURN(uint64_t ino, ns_->Lookup(parent, name));
  return GetAttr(ino);
}

Result<InodeRecord> Store::GetAttr(uint64_t ino) { return sessions_->GetAttr(ino); }

Result<InodeRecord> Store::ClearModeBits(uint64_t ino, uint32_t bits) {
  return ns_->ClearModeBits(ino, bits);
}

Result<InodeRecord> Store::SetAttr(uint64_t ino, const SetAttrRequest& req, uint64_t fh) {
  const int64_t now = NowNs();
  if (req.size) RETURN_IF_ERROR(sessions_->Truncate(ino, *req.size, fh, now));
  if (req.mtime_ns) {
    // ... and a live staging file's, which its next commit reads.
    const int64_t t = *req.mtime_ns == SetAttrRequest::kNow ? now : *req.mtime_ns;
    const timespec ts[2] = {{0, UTIME_OMIT}, {t / 1'000'000'000, t % 1'000'000'000}};
    auto set_mtime = [&](int fd) { return ::futimens(fd, ts) == 0 ? 0 : errno; };
    RETURN_IF_ERROR(staging_->ChangeStaged(ino, set_mtime, false).status());
  }
  return ns_->SetAttr(ino, req, now);  // the other attributes
}

Status Store::PunchHole(uint64_t ino, uint64_t offset, uint64_t len, uint64_t fh) {
  return sessions_->PunchHole(ino, offset, len, fh);
}

Result<InodeRecord> Store::MakeNode(uint64_t parent, std::string_view name, uint32_t mode,
                                    uint64_t rdev, const Caller& who) {
  return ns_->MakeNode(parent, name, mode, rdev, who, false);
}

Result<InodeRecord> Store::CreateFile(uint64_t parent, std::string_view name, uint32_t mode,
                                      const Caller& who, uint64_t* fh, bool* keep_cache,
                                      int* passthrough_fd) {
  ASSIGN_OR_RETURN(InodeRecord rec,
                   ns_->MakeNode(parent, name, S_IFREG | (mode & 07777), 0, who, true));
  // In passthrough mode the new file's bytes start in a staging file (an empty one: "truncate").
  if (Status st = Open(rec.ino, passthrough_fd != nullptr, fh, keep_cache, true, passthrough_fd);
      !st.ok()) {
    // A create that fails leaves no file behind: the entry goes with the error.
    if (Status undo = ns_->UndoCreate(parent, name, rec.ino); !undo.ok()) {
      log_->warn("{}: removing the entry of a create that failed: {}",
                 std::string(name), undo.ToString());
    }
    return st;
  }
  if (auto f = files_.Find(rec.ino)) {
    std::lock_guard lock(f->mu);
    f->unborn = true;
    f->creator_fh = fh ? *fh : 0;
  }
  return rec;
}

Result<InodeRecord> Store::Symlink(uint64_t parent, std::string_view name,
                                   std::string_view target, const Caller& who) {
  return ns_->Symlink(parent, name, target, who);
}

Result<InodeRecord> Store::Link(uint64_t ino, uint64_t new_parent, std::string_view new_name) {
  return ns_->Link(ino, new_parent, new_name);
}

Result<std::string> Store::ReadLink(uint64_t ino) { return ns_->ReadLink(ino); }

Status Store::Unlink(uint64_t parent, std::string_view name) { return ns_->Unlink(parent, name); }

Status Store::Rmdir(uint64_t parent, std::string_view name) { return ns_->Rmdir(parent, name); }

Status Store::Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                     std::string_view new_name, unsigned flags) {
  // A file replaced while its newest durable bytes (fsync'd in passthrough mode) are only in
  // its staging file is sealed first, so that the fallback a not yet durable src keeps is that
  // version and not an older one, or none (which would remove the name after a machine crash).
  // A file a writer still has open cannot be sealed: after kSealTries, src's newest version is
  // made durable instead (MakeDurable), so that it needs no fallback. Only when src changes
  // again every time, kDurableTries later, does the rename go ahead with the replaced file's
  // last sealed version as src's fallback.
  constexpr int kSealTries = 8, kDurableTries = 8;
  for (int attempt = 0;; ++attempt) {
    uint64_t seal_first = 0, durable_first = 0;
    RETURN_IF_ERROR(
        ns_->Rename(parent, name, new_parent, new_name, flags,
                    attempt < kSealTries ? &seal_first : nullptr,
                    attempt < kSealTries + kDurableTries ? &durable_first : nullptr));
    if (seal_first) {
      RETURN_IF_ERROR(EnsureSealed(seal_first));
    } else if (durable_first) {
      RETURN_IF_ERROR(sessions_->MakeDurable(durable_first));
    } else {
      return Status::Ok();
    }
  }
}

Status Store::ReadDir(uint64_t dir, uint64_t offset,
                      const std::function<bool(const DirItem&)>& fn) {
  return ns_->ReadDir(dir, offset, fn);
}

Status Store::SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags) {
  return ns_->SetXattr(ino, name, value, flags);
}

Result<std::string> Store::GetXattr(uint64_t ino, std::string_view name) {
  return ns_->GetXattr(ino, name);
}

Result<std::vector<std::string>> Store::ListXattrs(uint64_t ino) { return ns_->ListXattrs(ino); }

Status Store::RemoveXattr(uint64_t ino, std::string_view name) {
  return ns_->RemoveXattr(ino, name);
}

Status Store::Settle() { return ns_->fallbacks().Settle(); }

// --- staged files and their seals: Staging (store/staging.h) ---

Status Store::EnsureSealed(uint64_t ino) { return staging_->EnsureSealed(ino); }

Status Store::SealAll() { return staging_->SealAll(); }

// --- file bytes: FileSessions (store/file_sessions.h) ---

Status Store::Open(uint64_t ino, bool truncate, uint64_t* fh, bool* keep_cache, bool write,
                   int* passthrough_fd) {
  return sessions_->Open(ino, truncate, fh, keep_cache, write, passthrough_fd);
}

Status Store::Release(uint64_t ino, uint64_t fh) { return sessions_->Release(ino, fh); }

Status Store::Write(uint64_t ino, uint64_t offset, const uint8_t* data, size_t len,
                    uint64_t fh) {
  return sessions_->Write(ino, offset, data, len, fh);
}

Status Store::Read(uint64_t ino, uint64_t offset, size_t len, std::vector<ReadSlice>* out) {
  return sessions_->Read(ino, offset, len, out);
}

Result<std::optional<uint64_t>> Store::Seek(uint64_t ino, uint64_t offset, bool data) {
  return sessions_->Seek(ino, offset, data);
}

Status Store::Flush(uint64_t ino, uint64_t fh) { return sessions_->Flush(ino, fh); }

Status Store::Fsync(uint64_t ino, uint64_t fh) { return sessions_->Fsync(ino, fh); }

Result<bool> Store::Busy(uint64_t ino) { return sessions_->Busy(ino); }

Result<std::shared_ptr<const Manifest>> Store::CommittedManifest(uint64_t ino) {
  return sessions_->CommittedManifest(ino);
}

Status Store::ReadCommitted(const Manifest& m, uint64_t offset, uint64_t len,
                            std::vector<ReadSlice>* out) {
  return sessions_->ReadCommitted(m, offset, len, out);
}

void Store::WarmCommitted(const std::shared_ptr<const Manifest>& m, uint64_t offset,
                          uint64_t len) {
  sessions_->WarmCommitted(m, offset, len);
}

Result<Store::ChunkUsage> Store::Usage(const Manifest& m) { return sessions_->Usage(m); }

Result<struct statvfs> Store::StatFs() {
  struct statvfs st;
  if (::statvfs(cfg_.cache_dir.c_str(), &st) != 0) {
    return Status::FromErrno(errno, "statvfs " + cfg_.cache_dir);
  }
  st.f_namemax = 255;
  return st;
}

// --- prefetch hints and pins: the Prefetcher (store/prefetcher.h), made on first use ---

Prefetcher& Store::prefetcher() {
  std::call_once(prefetch_once_, [this] {
    // Without a backend nothing is ever fetched or evicted: no threads.
    const bool remote = remote_tiers() > 0;
    const unsigned threads = remote ? std::clamp<unsigned>(cfg_.upload_threads, 1, 8) : 0;
    prefetch_ = std::make_unique<Prefetcher>(meta_.get(), cache_.get(), log_, remote, threads);
  });
  return *prefetch_;
}

Status Store::Prefetch(uint64_t ino, bool recursive) {
  ASSIGN_OR_RETURN(InodeRecord rec, GetAttr(ino));
  (void)rec;
  if (remote_tiers() == 0) return Status::Ok();
  prefetcher().Add(ino, recursive);
  return Status::Ok();
}

void Store::CancelPrefetch(uint64_t ino) { prefetcher().Cancel(ino); }

bool Store::Prefetching(uint64_t ino) { return prefetcher().Pending(ino); }

void Store::StopPrefetch() { prefetcher().Stop(); }

Result<Store::CacheUsage> Store::Cached(uint64_t ino) {
  RETURN_IF_ERROR(SealAll());  // what staged files hold is counted once it is in chunks
  return CountCached(*meta_, *cache_, ino);
}

Status Store::SetPin(uint64_t ino, bool pin) {
  ASSIGN_OR_RETURN(InodeRecord rec, GetAttr(ino));
  if (!S_ISREG(rec.mode) && !S_ISDIR(rec.mode)) {
    return Invalid("only files and directories can be pinned");
  }
  if (pin) {
    RETURN_IF_ERROR(SetXattr(ino, kPinXattr, "1", 0));
  } else {
    RETURN_IF_ERROR(RemoveXattr(ino, kPinXattr));
  }
  Prefetcher& p = prefetcher();
  p.NotePin(ino, pin);
  return p.ApplyPins(pin);
}

Status Store::LoadPins() { return prefetcher().LoadPins(); }

Status Store::WarmCheckpoint(uint64_t ino, uint64_t dir, bool recursive) {
  if (remote_tiers() == 0) return Status::Ok();
  ASSIGN_OR_RETURN(auto m, sessions_->CommittedManifest(ino));
  if (!prefetcher().ShouldWarm(dir, *m)) return Status::Ok();
  log_->debug("inode {} opened with chunks off the local tier: warming directory {}", ino, dir);
  return Prefetch(dir, recursive);
}

Result<Store::FsckReport> Store::Fsck(uint64_t ino, const FsckOptions& options) {
  RETURN_IF_ERROR(SealAll());  // staged bytes are checked once they are chunks
  return FsckPass(meta_.get(), cache_.get(), publisher_.get(), log_).Run(ino, options);
}

Result<std::pair<uint64_t, std::string>> Store::ParentOf(uint64_t ino) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  return txn.GetParent(ino);
}

}  // namespace ckptfs
