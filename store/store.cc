// Store: opening, recovery, shutdown, the inode and chunk-reference bookkeeping shared by every
// operation, and the prefetch API's forwards to the Prefetcher.
#include "store/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <optional>
#include <utility>

#include "backends/timed_backend.h"
#include "cache/fault_io_engine.h"
#include "store/remote_tier.h"
#include "store/tree_walk.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMetaMapBytes = 64ull << 30;  // address space only; the file grows as needed

Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      std::string p = path.substr(0, i);
      if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) {
        return Status::FromErrno(errno, "mkdir " + p);
      }
    }
  }
  return Status::Ok();
}

void RemoveDirContents(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ::unlinkat(::dirfd(d), e->d_name, 0);
    }
    ::closedir(d);
  }
}

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
  const std::string& dir = cfg.cache_dir;
  RETURN_IF_ERROR(MakeDirs(dir));
  RETURN_IF_ERROR(MakeDirs(dir + "/staging"));
  RETURN_IF_ERROR(MakeDirs(dir + "/passthrough"));
  std::string lock_path = dir + "/lock";
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return Status::FromErrno(errno, "open " + lock_path);
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(lock_fd);
    if (err == EWOULDBLOCK) {
      return Status(Code::kBusy, "cache directory " + dir + " is in use by another ckptfs daemon");
    }
    return Status::FromErrno(err, "lock " + lock_path);
  }
  auto fail = [&](Status st) {
    ::close(lock_fd);
    return st;
  };
  // A clean stop leaves this marker; its absence means the last daemon died.
  std::string clean_path = dir + "/clean";
  bool existed = ::access((dir + "/meta").c_str(), F_OK) == 0;
  bool clean = !existed || ::access(clean_path.c_str(), F_OK) == 0;
  ::unlink(clean_path.c_str());

  IoEngineOptions io;
  io.kind = cfg.io_engine;
  auto engine = MakeIoEngine(io);
  if (!engine.ok()) return fail(engine.status());
  if (!cfg.cache_faults.empty()) {
    auto spec = CacheFaultSpec::Parse(cfg.cache_faults);
    if (!spec.ok()) return fail(spec.status());
    GetLogger("store")->warn("injecting cache disk faults: {}", spec->ToString());
    *engine = std::make_unique<FaultIoEngine>(std::move(*engine), *spec);
  }
  auto meta = MetaStore::Open(dir + "/meta", kMetaMapBytes);
  if (!meta.ok()) return fail(meta.status());
  std::unique_ptr<Store> s(new Store(cfg, std::move(*engine), nullptr, std::move(*meta), lock_fd));
  const std::string boot_id = CurrentBootId();
  auto cache = ChunkCache::Open(dir, s->engine_.get(), cfg.ram_cache_bytes, &s->metrics_);
  if (!cache.ok()) {
    s->closed_ = true;
    return cache.status();
  }
  s->cache_ = std::move(*cache);
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
  s->fallbacks_ = std::make_unique<Fallbacks>(s->meta_.get(), s->cache_.get(), s->chunks_.get(),
                                              s->ns_mu_, s->log_, boot_id,
                                              s->cfg_.settle_interval_s);
  s->sync_ = std::make_unique<NamespaceSync>(
      s->cfg_, s->meta_.get(), s->publisher_.get(), &s->files_, s->cache_.get(), s->chunks_.get(),
      s->fallbacks_.get(), s->ns_mu_, s->log_,
      NamespaceSync::Hooks{
          .drop_link = [p](MetaStore::Txn& txn, InodeRecord& rec, std::vector<ChunkId>* freed)
              REQUIRES(p->ns_mu_) { return p->DropLink(txn, rec, freed); },
          .tell_change = [p](uint64_t parent, const std::string& name,
                             uint64_t ino) { p->TellChange(parent, name, ino); },
      });
  s->scanners_ = std::move(scanners);
  s->staging_ = std::make_unique<Staging>(
      s->cfg_, s->meta_.get(), &s->files_, s->chunks_.get(), s->cache_.get(), s->publisher_.get(),
      &s->metrics_, s->log_, s->ns_mu_, &s->reorder_budget_, s->cut_pool_.get(), s->scanners_,
      boot_id,
      Staging::Hooks{
          .check_room = [p] { return p->CheckRoom(0); },
          .commit_manifest = [p](MetaStore::Txn& txn, uint64_t ino, const Manifest& m,
                                 int64_t mtime, bool durable, std::vector<ChunkId>* freed)
              REQUIRES(p->ns_mu_) {
                return p->CommitManifestTxn(txn, ino, m, mtime, durable, freed);
              },
          .remove_unborn = [p](MetaStore::Txn& txn, const InodeRecord& rec,
                               std::vector<ChunkId>* freed)
              REQUIRES(p->ns_mu_) { return p->RemoveUnborn(txn, rec, freed); },
          .reap_if_orphan = [p](uint64_t ino) { return p->ReapIfOrphan(ino); },
          .note_committed = [p](uint64_t ino) { p->retention_->NoteCommitted(ino); },
      });
  Status st = s->Recover(clean);
  if (!st.ok()) {
    s->closed_ = true;
    return st;
  }
  if (!tiers.empty()) {
    static_assert(kMetricTiers == kMaxTiers);
    for (size_t t = 0; t < tiers.size(); ++t) {  // every request timed, by tier
      tiers[t] = std::make_unique<TimedBackend>(std::move(tiers[t]), &s->metrics_,
                                                static_cast<int>(t));
    }
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
  s->fallbacks_->Start();
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd, 0) == 0) {
    [[maybe_unused]] ssize_t n = ::pwrite(lock_fd, pid.data(), pid.size(), 0);
  }
  return s;
}

Store::Store(Config cfg, std::unique_ptr<IoEngine> engine, std::unique_ptr<ChunkCache> cache,
             std::unique_ptr<MetaStore> meta, int lock_fd)
    : cfg_(std::move(cfg)),
      log_(GetLogger("store")),
      engine_(std::move(engine)),
      cache_(std::move(cache)),
      meta_(std::move(meta)),
      lock_fd_(lock_fd),
      queue_budget_(cfg_.write_memory_bytes / 2),
      reorder_budget_(cfg_.write_memory_bytes / 2),
      cut_pool_(cfg_.cut_threads ? std::make_unique<ThreadPool>(cfg_.cut_threads) : nullptr),
      read_pool_(std::make_unique<ThreadPool>(cfg_.read_threads)),
      write_pool_(std::make_unique<ThreadPool>(cfg_.write_threads)) {}

Store::Gauges Store::gauges() {
  Gauges g;
  g.cache = cache_->usage();
  g.write_queue_bytes = queue_budget_.used();
  g.write_queue_limit = queue_budget_.limit();
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
  ::close(lock_fd_);
}

Status Store::Recover(bool clean) {
  RemoveDirContents(cfg_.cache_dir + "/staging");
  MutexLock lock(&ns_mu_);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  auto root = txn.GetInode(kRootIno);
  if (!root.ok()) {
    if (root.status().code() != Code::kNotFound) return root.status();
    InodeRecord r;
    r.ino = kRootIno;
    r.mode = S_IFDIR | 0755;
    r.uid = ::geteuid();
    r.gid = ::getegid();
    r.nlink = 2;
    r.atime_ns = r.mtime_ns = r.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutInode(r));
    log_->info("created a new store in {}", cfg_.cache_dir);
  }
  RETURN_IF_ERROR(txn.BackfillParents());
  // Files unlinked while open when the last daemon stopped: nobody can open them any more.
  // Files made by create(2) whose writer never committed or closed them: gone with their entry,
  // as a new file being written at a crash is absent (a loader must not meet an empty one).
  std::vector<std::pair<uint64_t, bool>> orphans;
  RETURN_IF_ERROR(
      txn.ForEachOrphan([&](uint64_t ino, bool unborn) { orphans.emplace_back(ino, unborn); }));
  std::vector<ChunkId> freed;
  size_t unborn_files = 0;
  for (const auto& [ino, unborn] : orphans) {
    auto rec = txn.GetInode(ino);
    if (rec.ok() && unborn) {
      // Only a file never committed (generation 0) is removed; one with committed bytes keeps
      // them, whatever mark is left (a commit clears it, so none should be).
      if (rec->generation == 0) {
        ++unborn_files;
        RETURN_IF_ERROR(RemoveUnborn(txn, *rec, &freed));
      }
    } else if (rec.ok()) {
      RETURN_IF_ERROR(DeleteInode(txn, *rec, &freed));
    }
    RETURN_IF_ERROR(txn.DelOrphan(ino));
  }
  // Files whose newest version a machine crash may have lost (store/fallbacks.h), then staged
  // files (store/staging.h), sealed once the store is open.
  Fallbacks::RecoverHooks hooks;
  hooks.staged_survives = [this](const StagedRecord& r, bool c) {
    return staging_->StagedSurvives(r, c);
  };
  hooks.stage_path = [this](const std::string& name) { return StagePath(cfg_.cache_dir, name); };
  hooks.remove_unborn = [this](MetaStore::Txn& t, const InodeRecord& rec,
                               std::vector<ChunkId>* f) REQUIRES(ns_mu_) {
    return RemoveUnborn(t, rec, f);
  };
  hooks.queue_remote = [this](MetaStore::Txn& t, const std::string& op) REQUIRES(ns_mu_) {
    return QueueRemote(t, op);
  };
  RETURN_IF_ERROR(fallbacks_->Recover(txn, clean, hooks, &freed));
  RETURN_IF_ERROR(staging_->RecoverStaged(txn, clean, &freed));
  std::unordered_map<ChunkId, uint64_t, ChunkIdHash> referenced;
  if (!clean) {
    RETURN_IF_ERROR(txn.ForEachChunk(
        [&](const ChunkId& id, const ChunkRecord& r) { referenced.emplace(id, r.len); }));
  }
  RETURN_IF_ERROR(txn.Commit());
  if (!freed.empty()) RETURN_IF_ERROR(meta_->Sync());
  for (const ChunkId& id : freed) RETURN_IF_ERROR(cache_->Remove(id));
  if (!clean) {
    // Chunks written for files whose commit never happened.
    uint64_t removed = 0;
    RETURN_IF_ERROR(cache_->ForEach([&](const ChunkId& id, uint64_t) {
      if (!referenced.count(id) && cache_->Remove(id).ok()) ++removed;
    }));
    log_->warn("recovered from an unclean stop: {} files unlinked while open, {} new files never "
               "closed, and {} unreferenced chunks removed",
               orphans.size() - unborn_files, unborn_files, removed);
  }
  return Status::Ok();
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
  fallbacks_->Stop();  // the final syncs below make every version durable
  publisher_->StopRestores();
  // Uploads still queued stay in LMDB and resume at the next mount.
  StopSync();
  publisher_->StopTiers();
  Status first;
  const std::vector<std::pair<uint64_t, std::shared_ptr<OpenFile>>> open = files_.All();
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
  Status st = cache_->Sync();
  if (!st.ok() && first.ok()) first = st;
  st = meta_->Sync();
  if (!st.ok() && first.ok()) first = st;
  if (first.ok()) {
    int fd = ::open((cfg_.cache_dir + "/clean").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) ::close(fd);
  }
  return first;
}

Status Store::AttachRemote(std::vector<std::unique_ptr<Backend>> tiers) {
  RETURN_IF_ERROR(publisher_->Attach(std::move(tiers)));
  {
    MutexLock lock(&ns_mu_);  // its transaction is one of the namespace's writes
    RETURN_IF_ERROR(publisher_->QueueUnpublished());
  }
  publisher_->Start();
  return Status::Ok();
}

Status Store::QueueRemote(MetaStore::Txn& txn, const std::string& op) {
  return publisher_->Queue(txn, op);
}

Status Store::QueueTree(MetaStore::Txn& txn, uint64_t ino, const std::string& path,
                        bool publish) {
  return publisher_->QueueTree(txn, ino, path, publish);
}

Result<std::string> Store::RemoteState(uint64_t ino) {
  return publisher_->RemoteState(ino, Uncommitted(files_, ino));
}

Result<std::string> Store::TierStates(uint64_t ino) {
  return publisher_->TierStates(ino, Uncommitted(files_, ino));
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

Status Store::DeleteInode(MetaStore::Txn& txn, const InodeRecord& rec,
                          std::vector<ChunkId>* freed) {
  ASSIGN_OR_RETURN(auto m, txn.GetManifest(rec.ino));
  if (m) RETURN_IF_ERROR(AddManifestRefs(txn, *m, -1, freed));
  RETURN_IF_ERROR(txn.DelManifest(rec.ino));
  RETURN_IF_ERROR(fallbacks_->Drop(txn, rec.ino, freed));
  // Bytes staged and not sealed go with it (nothing has the file open: no handle uses them).
  ASSIGN_OR_RETURN(auto staged, txn.GetStaged(rec.ino));
  if (staged) {
    RETURN_IF_ERROR(txn.DelStaged(rec.ino));
    ::unlink(StagePath(cfg_.cache_dir, staged->name).c_str());
  }
  RETURN_IF_ERROR(txn.DelSymlink(rec.ino));
  RETURN_IF_ERROR(txn.DelAllXattrs(rec.ino));
  return txn.DelInode(rec.ino);
}

Status Store::RemoveUnborn(MetaStore::Txn& txn, InodeRecord rec, std::vector<ChunkId>* freed) {
  auto where = txn.GetParent(rec.ino);
  if (where.ok()) {
    const auto& [parent, name] = *where;
    auto e = txn.GetEntry(parent, name);
    auto dir = txn.GetInode(parent);
    if (e.ok() && e->ino == rec.ino && dir.ok()) {
      RETURN_IF_ERROR(txn.DelEntry(parent, name));
      dir->mtime_ns = dir->ctime_ns = NowNs();
      RETURN_IF_ERROR(txn.PutInode(*dir));
      log_->info("removed {}: created, never closed before the stop", ChildPath(txn, parent, name));
      return DropLink(txn, rec, freed);
    }
  }
  if (rec.nlink == 0) return DeleteInode(txn, rec, freed);
  return Status::Ok();  // linked elsewhere since: it stays, as its last link made it
}

Status Store::DropLink(MetaStore::Txn& txn, InodeRecord& rec, std::vector<ChunkId>* freed) {
  const bool dir = S_ISDIR(rec.mode);
  rec.nlink = dir ? 0 : rec.nlink - 1;
  rec.ctime_ns = NowNs();
  if (rec.nlink > 0) return txn.PutInode(rec);
  if (!dir && files_.IsOpen(rec.ino)) {
    RETURN_IF_ERROR(txn.AddOrphan(rec.ino));
    return txn.PutInode(rec);
  }
  return DeleteInode(txn, rec, freed);
}

Status Store::ReapIfOrphan(uint64_t ino) {
  std::vector<ChunkId> freed;
  {
    MutexLock lock(&ns_mu_);
    if (files_.IsOpen(ino)) return Status::Ok();
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    auto rec = txn.GetInode(ino);
    if (!rec.ok()) return rec.status().code() == Code::kNotFound ? Status::Ok() : rec.status();
    if (rec->nlink > 0) return Status::Ok();
    RETURN_IF_ERROR(DeleteInode(txn, *rec, &freed));
    RETURN_IF_ERROR(txn.DelOrphan(ino));
    RETURN_IF_ERROR(txn.Commit());
  }
  chunks_->Reclaim(freed);
  return Status::Ok();
}

Status Store::Settle() { return fallbacks_->Settle(); }

// --- staged files and their seals: Staging (store/staging.h) ---

Status Store::EnsureSealed(uint64_t ino) { return staging_->EnsureSealed(ino); }

Status Store::SealAll() { return staging_->SealAll(); }

Result<bool> Store::ChangeStaged(uint64_t ino, const std::function<int(int fd)>& fn, bool bytes) {
  return staging_->ChangeStaged(ino, fn, bytes);
}

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

void Store::FetchSoon(const std::vector<std::pair<ChunkId, uint64_t>>& chunks) {
  if (remote_tiers() > 0) prefetcher().ReaderWants(chunks);
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
  ASSIGN_OR_RETURN(auto m, CommittedManifest(ino));
  const auto& extents = m->extents();
  const bool all_local = std::all_of(extents.begin(), extents.end(), [&](const Extent& e) {
    return e.hole() || cache_->OnDisk(e.id);
  });
  if (all_local || !prefetcher().ShouldWarm(dir)) return Status::Ok();
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
