// Store: the filesystem ckptfs serves, independent of FUSE. Namespace operations work on LMDB
// (store/meta_store.h); file bytes go through FileWriter into content-addressed chunks on the
// local tier (cache/chunk_cache.h) and come back through manifests.
//
// Thread-safe. Lock order, outermost first:
//   OpenFile::seal_mu (one seal of a file, store/staging.h)  ->  OpenFile::mu
//   OpenFile::mu (one file's bytes)  ->  OpenFile::qmu (its write queue)
//   OpenFile::mu  ->  the namespace lock, Namespace's mu_ (namespace changes and commits,
//   store/namespace.h; ns_->mu() here)  ->  the leaves
//   the namespace sync's pass_mu_ (one sync pass at a time, store/namespace_sync.h)  ->  the
//   namespace lock
// qmu is never held while taking mu or the namespace lock; the namespace lock may be held while
// taking a file's qmu (Namespace::Hooks::show: what chmod, utimens and link return). The leaves,
// under which no other store lock is taken: the open-file table's lock (store/open_table.h),
// LocalChunks' holds_mu_ (chunk holds and reclamation, store/local_chunks.h), the Publisher's
// unpublished_mu_ and restore_mu_ (store/publisher.h; the namespace lock is held around its
// queueing calls), the Prefetcher's pin_mu_ -> mu_ (store/prefetcher.h; a reader asks for chunks
// under its file's mu), the retention passes' queue lock (store/retention_pass.h), listener_mu_
// and the settle thread's settle_mu_ (store/fallbacks.h; the fallbacks' changes run under the
// namespace lock, and their settle pass takes it), the sync thread's stop_mu_
// (store/namespace_sync.h), the seal pool's queue (store/staging.h; seals are queued under a
// file's mu), and the write queues' budget and the read and write pools' queues
// (store/file_sessions.h; a file's writes and readahead are queued under its mu or qmu).
// Reads of metadata use LMDB read transactions and take no store lock.
//
// Waits: no lock that another file's operation could need (the namespace lock, the open-file
// table's, holds_mu_, a file's qmu, which stat takes) is held across a wait for room, a backend
// request or an fsync. A writer waits for room with no lock (FileSessions::Write); a commit's
// after-effects (Reclaim, which syncs LMDB; waking the uploaders; retention) run after the
// file's mu is released (FileSessions::RunAfterCommit), and a namespace change's after the
// namespace lock is (Namespace::Mutate).
// The exception is LMDB's own commit, which syncs inside the namespace lock: LMDB has one writer
// anyway. A file's own mu and seal_mu may be held across its own chunk syncs (fsync, a durable
// seal).
//
// Writes, sessions and durability: store/file_sessions.h.
#pragma once

#include <sys/statvfs.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "cache/chunk_cache.h"
#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/thread_pool.h"
#include "store/cache_dir.h"
#include "store/file_sessions.h"
#include "store/local_chunks.h"
#include "store/meta_store.h"
#include "store/namespace.h"
#include "store/namespace_sync.h"
#include "store/open_table.h"
#include "store/fsck.h"
#include "store/prefetcher.h"
#include "store/publisher.h"
#include "store/retention_pass.h"
#include "store/staging.h"

namespace ckptfs {

class RemoteTier;

class Store final {
 public:
  // Opens the cache directory named in cfg (creating it), takes its lock (one daemon per cache
  // directory), and recovers from an unclean stop. cfg must be validated. `scanners` (optional)
  // recognizes checkpoint formats in new files so chunks are cut at tensor boundaries. `tiers`
  // (optional, nearest first, at most kMaxTiers) are the remote tiers: committed files are
  // written back to each of them, chunks missing locally are fetched from the nearest that has
  // them, and the farthest is the shared namespace other nodes are synced from
  // (store/remote_tier.h).
  static Result<std::unique_ptr<Store>> Open(const Config& cfg, PayloadScannerFactory scanners,
                                             std::vector<std::unique_ptr<Backend>> tiers);
  static Result<std::unique_ptr<Store>> Open(const Config& cfg, PayloadScannerFactory scanners = {},
                                             std::unique_ptr<Backend> backend = nullptr);
  // Commits files still dirty and syncs everything (see Close).
  ~Store();
  // Commits every dirty file, makes everything durable and marks the stop clean. Idempotent.
  Status Close();

  // --- namespace ---
  Result<InodeRecord> Lookup(uint64_t parent, std::string_view name);
  Result<InodeRecord> GetAttr(uint64_t ino);
  // A size change through a handle (ftruncate) joins that handle's session; one by path commits
  // at once when nobody has the file open, else with the session that is open.
  Result<InodeRecord> SetAttr(uint64_t ino, const SetAttrRequest& req, uint64_t fh = 0);
  // Clears `bits` (set-id bits) from ino's mode in one transaction, so that a chmod running
  // meanwhile is neither undone nor lost. The record as it is after.
  Result<InodeRecord> ClearModeBits(uint64_t ino, uint32_t bits);
  // fallocate(2) PUNCH_HOLE and ZERO_RANGE: bytes [offset, offset + len) within the size read as
  // zeros and become a hole in the manifest (no chunk, no st_blocks). Joins handle fh's session,
  // committed at its close like ftruncate.
  Status PunchHole(uint64_t ino, uint64_t offset, uint64_t len, uint64_t fh);
  // Creates a file, directory, fifo, socket or device node (by the type bits of mode).
  Result<InodeRecord> MakeNode(uint64_t parent, std::string_view name, uint32_t mode,
                               uint64_t rdev, const Caller& who);
  // create(2): a new regular file, opened (as Open). Until its first commit or its last close
  // it is "new": a restart after a crash removes it, so a file being written at a crash is
  // absent if it was new. Published to the backend only once committed or closed.
  // With `passthrough_fd`, the new file is written through a staging file (see Open).
  Result<InodeRecord> CreateFile(uint64_t parent, std::string_view name, uint32_t mode,
                                 const Caller& who, uint64_t* fh, bool* keep_cache,
                                 int* passthrough_fd = nullptr);
  Result<InodeRecord> Symlink(uint64_t parent, std::string_view name, std::string_view target,
                              const Caller& who);
  Result<InodeRecord> Link(uint64_t ino, uint64_t new_parent, std::string_view new_name);
  Result<std::string> ReadLink(uint64_t ino);
  Status Unlink(uint64_t parent, std::string_view name);
  Status Rmdir(uint64_t parent, std::string_view name);
  // flags: 0, RENAME_NOREPLACE or RENAME_EXCHANGE.
  Status Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                std::string_view new_name, unsigned flags);
  // Lists `dir` from readdir offset `offset` ("." and ".." included) until fn returns false.
  Status ReadDir(uint64_t dir, uint64_t offset, const std::function<bool(const DirItem&)>& fn);
  // flags: 0, XATTR_CREATE or XATTR_REPLACE.
  Status SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags);
  Result<std::string> GetXattr(uint64_t ino, std::string_view name);
  Result<std::vector<std::string>> ListXattrs(uint64_t ino);
  Status RemoveXattr(uint64_t ino, std::string_view name);
  Result<struct statvfs> StatFs();

  // --- file bytes: FileSessions (store/file_sessions.h) ---
  // Every Open is paired with one Release; sessions, truncate, *keep_cache and passthrough_fd
  // are described there.
  Status Open(uint64_t ino, bool truncate = false, uint64_t* fh = nullptr,
              bool* keep_cache = nullptr, bool write = false, int* passthrough_fd = nullptr);
  Status Release(uint64_t ino, uint64_t fh = 0);
  Status Write(uint64_t ino, uint64_t offset, const uint8_t* data, size_t len, uint64_t fh = 0);
  Status Read(uint64_t ino, uint64_t offset, size_t len, std::vector<ReadSlice>* out);
  Result<std::optional<uint64_t>> Seek(uint64_t ino, uint64_t offset, bool data);
  Status Flush(uint64_t ino, uint64_t fh = 0);
  Status Fsync(uint64_t ino, uint64_t fh = 0);

  // --- what a file holds, for describing it (fs/ serves user.ckptfs.* attributes with these;
  // store/file_sessions.h) ---
  Result<std::shared_ptr<const Manifest>> CommittedManifest(uint64_t ino);
  Status ReadCommitted(const Manifest& m, uint64_t offset, uint64_t len,
                       std::vector<ReadSlice>* out);
  void WarmCommitted(const std::shared_ptr<const Manifest>& m, uint64_t offset, uint64_t len);
  using ChunkUsage = FileSessions::ChunkUsage;
  Result<ChunkUsage> Usage(const Manifest& m);
  // Staged files (passthrough writes) and their seals: store/staging.h. Views, the computed
  // attributes and truncate by path seal a file first, so that its manifest is current.
  Status EnsureSealed(uint64_t ino);
  Status SealAll();
  // Makes durable every version committed without fsync (store/fallbacks.h); a thread does it
  // every settle_interval, tests call it directly.
  Status Settle();

  // --- the remote tiers: user.ckptfs.state and user.ckptfs.tiers (store/publisher.h) ---
  Result<std::string> RemoteState(uint64_t ino);
  Result<std::string> TierStates(uint64_t ino);
  // A chunk for a peer node (peers/peer_server.h): LocalChunks::Referenced.
  Result<ChunkRef> PeerChunk(const ChunkId& id, uint64_t len, bool fetch);

  // Remote tier `tier` (nearest first); null without one.
  RemoteTier* remote(size_t tier = 0) { return publisher_->remote(tier); }
  size_t remote_tiers() const { return publisher_->tiers(); }

  // --- what other nodes publish (the namespace sync) ---
  // Told, from the sync thread and retention, that parent/name now names ino (0: nothing), so
  // that the kernel drops what it cached of both. Set once, before the first sync pass can run.
  using ChangeListener = std::function<void(uint64_t parent, const std::string& name, uint64_t ino)>;
  void SetChangeListener(ChangeListener fn);
  // The passes (store/namespace_sync.h): one now, the first one before the mount serves, and
  // the thread that runs one every sync_interval (started after SetChangeListener; Close stops
  // it).
  using SyncProgress = NamespaceSync::Progress;
  Status SyncFromRemote(const SyncProgress& progress = nullptr, bool* listed = nullptr);
  Status InitialSync(double timeout_s, const SyncProgress& progress);
  void StartSync();
  void StopSync();

  // --- prefetch hints and pins (store/prefetcher.h): user.ckptfs.prefetch, .cached and .pin ---
  static constexpr std::string_view kPinXattr = Prefetcher::kPinXattr;
  static constexpr int kWarmIntervalS = Prefetcher::kWarmIntervalS;
  // On a run directory: "keep_last=N[,keep_every=K]", applied after each checkpoint commits
  // (store/retention_pass.h).
  static constexpr std::string_view kRetainXattr = RetentionPass::kRetainXattr;
  // Pulls the chunks of file `ino`, or of the files under directory `ino` (all levels when
  // `recursive`), onto the local disk tier in the background (Prefetcher::Add); without a
  // backend every chunk is local already and nothing is queued.
  Status Prefetch(uint64_t ino, bool recursive = true);
  void CancelPrefetch(uint64_t ino);
  bool Prefetching(uint64_t ino);
  // Stops the prefetch threads, before Close (no chunk is written behind its final sync).
  void StopPrefetch();
  // Of file `ino`, or of every file under directory `ino`, as committed (CountCached); staged
  // files are sealed first.
  using CacheUsage = ckptfs::CacheUsage;
  Result<CacheUsage> Cached(uint64_t ino);
  // Stores (pin) or removes (kNoData if absent) kPinXattr on file or directory `ino`, then
  // hands the cache the chunks it must keep whatever cache_size says, and prefetches them.
  Status SetPin(uint64_t ino, bool pin);
  // Applies the pins found by one walk of the namespace (Prefetcher::LoadPins); once, at open.
  Status LoadPins();
  // Predictive prefetch: file `ino`, opened for reading, belongs to the checkpoint under `dir`.
  // With a backend, and when not all of ino's chunks are local, prefetches `dir`, at most once
  // per directory per kWarmIntervalS.
  Status WarmCheckpoint(uint64_t ino, uint64_t dir, bool recursive);

  // Whether file `ino`, or any file under directory `ino`, is open now (being written or read):
  // retention leaves such a checkpoint alone.
  Result<bool> Busy(uint64_t ino);
  // The entry that last linked `ino`: (parent, name); kNotFound for the root.
  Result<std::pair<uint64_t, std::string>> ParentOf(uint64_t ino);
  // fsck (store/fsck.h): the chunks and records of file `ino`, or of everything under directory
  // `ino`, on every tier; staged files are sealed first.
  using FsckOptions = ckptfs::FsckOptions;
  using FsckReport = ckptfs::FsckReport;
  Result<FsckReport> Fsck(uint64_t ino, const FsckOptions& options);

  // The memory the aligned copies of chunks cut from staging files may hold at once, all cuts
  // together (Gauges::put_copy_*).
  static constexpr uint64_t kPutCopyLimit = LocalChunks::kPutCopyLimit;

  // What the metrics exporter shows as gauges, read now.
  struct Gauges {
    ChunkCache::Usage cache;
    uint64_t write_queue_bytes = 0, write_queue_limit = 0;  // acknowledged, not yet chunked
    // Chunk copies on their way to the local disk: now, the limit, the most held at once.
    uint64_t put_copy_bytes = 0, put_copy_limit = 0, put_copy_peak = 0;
    uint64_t put_flights = 0;  // chunks with puts on their way (others of the same chunk join them)
    uint64_t open_files = 0;
    // Files whose newest version is not yet known durable (a fallback kept; Settle ends them).
    uint64_t fallback_files = 0;
    std::vector<uint64_t> ops_waiting;  // per remote tier, nearest first: files and names to publish
    std::vector<std::string> tier_names;   // per remote tier: where it is (Backend::Describe)
    // Per remote tier: the error its write-back is retrying ("" when none: not failing).
    std::vector<std::string> tier_errors;
    // The namespace sync: "journal" (its passes read the change journal, last read up to
    // journal_entry), "listing" (every pass lists the bucket), "" before the first pass.
    std::string sync_mode;
    uint64_t journal_entry = 0;
  };
  Gauges gauges();

  const Metrics& metrics() const { return metrics_; }
  Metrics& metrics() { return metrics_; }
  const Config& config() const { return cfg_; }

 private:
  Store(Config cfg, std::unique_ptr<IoEngine> engine, std::unique_ptr<ChunkCache> cache,
        std::unique_ptr<MetaStore> meta, std::unique_ptr<CacheDir> dir);
  // Attaches the remote tiers to the publisher, queues what they lack and starts them.
  Status AttachRemote(std::vector<std::unique_ptr<Backend>> tiers);

  // Members are declared after what they use, so that each is destroyed (its threads joined)
  // before what it uses goes; Open makes them in the order below, Close stops their threads.
  std::unique_ptr<CacheDir> dir_;  // the lock goes last
  const Config cfg_;
  PayloadScannerFactory scanners_;  // the writers' and seals' format scanners, set in Open
  Metrics metrics_;
  Logger log_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<ChunkCache> cache_;
  std::unique_ptr<MetaStore> meta_;
  bool closed_ = false;
  // write_memory: half for every file's queued writes (FileSessions), half for every reorder
  // window (FileWriter spills to staging when it finds none).
  MemoryBudget reorder_budget_;
  OpenTable files_;  // the files in use, their handles, the pages the kernel may hold stale
  // The remote tiers (store/publisher.h): made before recovery (whose commits queue through
  // it), the tiers attached after it; outlives every pool and thread that publishes.
  std::unique_ptr<Publisher> publisher_;
  // What the sync and retention tell the kernel changed. A leaf lock, held only to copy it.
  Mutex listener_mu_;
  ChangeListener on_change_ GUARDED_BY(listener_mu_);
  void TellChange(uint64_t parent, const std::string& name, uint64_t ino);
  // The seals' cut candidates (FileWriter::CutAhead): joined last, a seal waits for its parts.
  std::unique_ptr<ThreadPool> cut_pool_;
  std::unique_ptr<LocalChunks> chunks_;  // every writer's ChunkSink, holds and put threads
  std::unique_ptr<Namespace> ns_;  // records, the namespace lock, fallbacks and settle thread
  std::unique_ptr<NamespaceSync> sync_;
  // Sessions before staging_, whose hooks reach them (check_room) and whose seal pool is
  // joined first; Close stops the seals (what is left resumes at the next mount) and retention
  // before anything else goes, so staging_'s hooks never reach a retention_ destroyed.
  std::unique_ptr<FileSessions> sessions_;
  std::unique_ptr<Staging> staging_;
  std::unique_ptr<RetentionPass> retention_;
  // Made on first use, after the tiers are attached (its thread count depends on them); last,
  // so its threads stop before the cache, the metadata and the backends go.
  Prefetcher& prefetcher();
  std::once_flag prefetch_once_;
  std::unique_ptr<Prefetcher> prefetch_;
};

}  // namespace ckptfs
