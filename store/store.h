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
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/backend.h"
#include "cache/chunk_cache.h"
#include "cache/io_engine.h"
#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/thread_pool.h"
#include "store/chunk_refs.h"
#include "store/fallbacks.h"
#include "store/file_sessions.h"
#include "store/file_writer.h"
#include "store/journal.h"
#include "store/local_chunks.h"
#include "store/meta_store.h"
#include "store/namespace.h"
#include "store/namespace_sync.h"
#include "store/open_file.h"
#include "store/open_table.h"
#include "store/fsck.h"
#include "store/prefetcher.h"
#include "store/publisher.h"
#include "store/retention_pass.h"
#include "store/staged_meta.h"
#include "store/staging.h"

namespace ckptfs {

class RemoteTier;
struct FileRecord;

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
  // Staged files (written in passthrough mode): the close of a writer commits the staging file
  // itself as the file's new bytes (one LMDB transaction, no copy), and a background seal then
  // cuts it into chunks, commits the manifest and removes it. Until then the inode record and
  // manifest describe the previous version; GetAttr shows the staged size. Seals whatever is
  // staged for ino and not open for writing now, so that its manifest is current (views, the
  // computed attributes and truncate by path call it). Ok at once when nothing is staged.
  Status EnsureSealed(uint64_t ino);
  // Seals every staged file that no writer has open now (EnsureSealed of each).
  Status SealAll();
  // Makes durable the newest version of every file committed without fsync (an fsync of each of
  // its chunk files, not of the whole disk), and drops the fallbacks that covered them. A thread
  // does it every settle_interval; tests call it directly. After a machine crash a file reads as
  // its newest version whose chunks are whole, or as the one before it that was durable (a
  // version closed since then may be lost, never torn or unreadable).
  Status Settle();

  // --- the remote tier ---
  // "local" (no backend, or bytes not committed yet), "uploading" (committed, a remote tier
  // does not hold this version yet) or "remote" (every tier holds it): user.ckptfs.state.
  Result<std::string> RemoteState(uint64_t ino);
  // A chunk for a peer node (peers/peer_server.h): the verified bytes of chunk `id` when a file
  // here references it with length `len`, from the local tier, or, when `fetch`, from the
  // remote tiers (sharing the readers' single flight). kNotFound when no file here references
  // it at that length, or it is not local and not to be fetched. Thread-safe.
  Result<ChunkRef> PeerChunk(const ChunkId& id, uint64_t len, bool fetch);
  // Per tier, nearest first: {"tiers":[{"backend":URL,"state":S},...]} (user.ckptfs.tiers), S
  // one of "local", "uploading", "remote", or "dropped" (past that tier's keep= policy).
  Result<std::string> TierStates(uint64_t ino);

  // Remote tier `tier` (nearest first); null without one.
  RemoteTier* remote(size_t tier = 0) { return publisher_->remote(tier); }
  size_t remote_tiers() const { return publisher_->tiers(); }

  // --- what other nodes publish (the namespace sync) ---
  // Told, from the sync thread, that parent/name now names ino (0: nothing), so that the kernel
  // drops what it cached of both. Set once, before the backend's first sync pass can run.
  using ChangeListener = std::function<void(uint64_t parent, const std::string& name, uint64_t ino)>;
  void SetChangeListener(ChangeListener fn);
  // One pass: lists the backend's files and applies every file another node published, replaced
  // or deleted since the last pass. A file open here, or with local changes not yet published
  // and newer than the remote version, is left alone. The sync thread runs a pass every
  // sync_interval; tests call it directly.
  // `progress`, when given, is told (entries applied or found current, entries listed) as the
  // pass goes, at most every 256 entries.
  using SyncProgress = NamespaceSync::Progress;
  // `listed` (optional) tells whether the backend's listing succeeded: the errors returned then
  // are of single entries.
  Status SyncFromRemote(const SyncProgress& progress = nullptr, bool* listed = nullptr);
  // The first pass, before the mount serves: retried with backoff until it succeeds or
  // `timeout_s` has passed, so that a mount never serves a namespace that does not yet hold what
  // the backend held when it started (a job would find an empty checkpoint directory and start
  // from scratch). Ok at once without a backend. Entries that cannot be applied for good (a
  // name that is no file name, ...) are logged and do not hold the mount; a listing or a record
  // that cannot be read is retried. Errors: the last pass's, naming the backend.
  Status InitialSync(double timeout_s, const SyncProgress& progress);
  // Starts the thread that runs SyncFromRemote every sync_interval (after SetChangeListener);
  // Close stops it.
  void StartSync();
  void StopSync();

  // --- prefetch hints and pins (store/prefetcher.h): user.ckptfs.prefetch, .cached and .pin ---
  // The work runs on a few threads of its own (made on first use); a chunk being fetched holds
  // one buffer, nothing is kept in the RAM tier. Thread-safe.
  static constexpr std::string_view kPinXattr = Prefetcher::kPinXattr;
  // On a run directory: "keep_last=N[,keep_every=K]", applied after each checkpoint commits
  // (store/retention_pass.h).
  static constexpr std::string_view kRetainXattr = RetentionPass::kRetainXattr;
  // Pulls every chunk of file `ino`, or of every file under directory `ino` (all levels when
  // `recursive`, else its own files), onto the local disk tier in the background. Returns at
  // once; a request for an `ino` already pending is not queued twice. Without a backend every
  // chunk is local already and nothing is queued.
  Status Prefetch(uint64_t ino, bool recursive = true);
  // Drops the prefetch work queued for `ino` itself; the chunks being fetched now finish.
  void CancelPrefetch(uint64_t ino);
  // Whether prefetch work for `ino` is queued or running.
  bool Prefetching(uint64_t ino);
  // Whether file `ino`, or any file under directory `ino`, is open now (being written or read):
  // retention leaves such a checkpoint alone.
  Result<bool> Busy(uint64_t ino);
  using CacheUsage = ckptfs::CacheUsage;  // store/prefetcher.h
  // Of file `ino`, or of every file under directory `ino`, as committed (one LMDB snapshot, an
  // in-memory lookup per chunk); staged files are sealed first.
  Result<CacheUsage> Cached(uint64_t ino);

  // fsck (store/fsck.h): the chunks and records of file `ino`, or of everything under directory
  // `ino`, on every tier; staged files are sealed first.
  using FsckOptions = ckptfs::FsckOptions;
  using FsckReport = ckptfs::FsckReport;
  Result<FsckReport> Fsck(uint64_t ino, const FsckOptions& options);
  // Stores (pin) or removes (kNoData if absent) the attribute kPinXattr ("1") of file or
  // directory `ino`, then hands the cache the chunks it must keep whatever cache_size says (of
  // every pinned file and every file under a pinned directory) and prefetches them.
  Status SetPin(uint64_t ino, bool pin);
  // Finds the pinned inodes (one walk of the namespace) and applies their pins. Call once after
  // Open, before serving. While pins exist they are applied again every few seconds, so that
  // files written, synced or replaced under a pinned directory are kept and fetched too.
  Status LoadPins();
  // Predictive prefetch: file `ino` was opened for reading and belongs to the checkpoint stored
  // under `dir`. With a backend, and when not all of ino's chunks are local, prefetches `dir`
  // (see Prefetch), at most once per directory per kWarmIntervalS.
  static constexpr int kWarmIntervalS = Prefetcher::kWarmIntervalS;
  Status WarmCheckpoint(uint64_t ino, uint64_t dir, bool recursive);
  // The entry that last linked `ino`: (parent, name); kNotFound for the root.
  Result<std::pair<uint64_t, std::string>> ParentOf(uint64_t ino);
  // Stops the prefetch threads (work still queued is dropped). Before Close, so that no chunk
  // is written behind its final sync. Idempotent; Prefetch afterwards queues nothing.
  void StopPrefetch();

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
        std::unique_ptr<MetaStore> meta, int lock_fd);
  Status Recover(bool clean);
  // Attaches the remote tiers to the publisher, queues what they lack and starts them.
  Status AttachRemote(std::vector<std::unique_ptr<Backend>> tiers);
  // The tier other nodes' files are synced from: the farthest. REQUIRES: remote tiers.
  RemoteTier& sync_tier() { return publisher_->sync_tier(); }
  Backend& sync_backend() { return publisher_->sync_backend(); }

  const Config cfg_;
  // The writers' and the seals' format scanners: set once in Open, before any file is written.
  PayloadScannerFactory scanners_;
  Metrics metrics_;
  Logger log_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<ChunkCache> cache_;
  std::unique_ptr<MetaStore> meta_;
  int lock_fd_;
  bool closed_ = false;

  // write_memory: half for every file's queued writes (FileSessions' queue_budget_), half for
  // every reorder window (FileWriter spills to staging when it finds none). Declared before the
  // open files and the pools, so it outlives every writer and task that uses it.
  MemoryBudget reorder_budget_;
  // The files in use (store/open_table.h), with the handle numbers and the files whose pages
  // the kernel may cache stale.
  OpenTable files_;
  // The remote tiers: their backends, workers and queues (store/publisher.h); made in Open
  // before Recover (whose commits queue through it), the tiers attached after it. Declared
  // before the pools and threads that publish through it (seals, retention, reads that restore
  // chunks, prefetch), so it outlives them; its own members stop the tiers' workers and the
  // restore thread before the backends and the journal they use go.
  std::unique_ptr<Publisher> publisher_;
  // The listener the sync and retention tell what changed under the kernel. A leaf lock: held
  // only to copy it (TellChange calls it with no lock held).
  Mutex listener_mu_;
  ChangeListener on_change_ GUARDED_BY(listener_mu_);
  void TellChange(uint64_t parent, const std::string& name, uint64_t ino);
  // Last members: destroyed first, so their threads are joined before anything they use goes.
  // chunks_: the local tier's chunks as every FileWriter of the store sees them (its ChunkSink),
  // and the writers' holds (store/local_chunks.h); made in Open once the cache is open. Its put
  // threads write the chunks cut from staging files, which seals and commits of staged writers
  // submit; they are joined after the other pools.
  // cut_pool_: the threads that find a seal's cut candidates (FileWriter::CutAhead); joined last
  // (a seal waits for its parts before it ends).
  std::unique_ptr<ThreadPool> cut_pool_;
  std::unique_ptr<LocalChunks> chunks_;
  // The namespace (store/namespace.h): its records' changes, the namespace lock and the files'
  // fallbacks with their settle thread, which starts once the store is open and stops in Close
  // before the final syncs. Made in Open with chunks_, before Recover; declared after what it
  // uses (the metadata, the cache, the local chunks, the publisher, the open files), before
  // everything that changes the namespace through it.
  std::unique_ptr<Namespace> ns_;
  // The namespace sync (store/namespace_sync.h): its passes and its thread, which Close stops.
  // Made in Open with ns_; declared after everything it uses (the publisher, the local chunks,
  // the namespace, its lock and fallbacks, the open files, and through its hooks TellChange),
  // so that it is destroyed, its thread joined, before they go.
  std::unique_ptr<NamespaceSync> sync_;
  // The open files' sessions (store/file_sessions.h), with the write queues' budget and the read
  // and write pools; made in Open after staging_ (below it), before Recover. Declared here, after
  // everything its pools' tasks use, so that they are joined (the write pool first) before it
  // goes; before staging_, whose hooks reach it (check_room) and whose seal pool is joined
  // first.
  std::unique_ptr<FileSessions> sessions_;
  // Staged files and their seals (store/staging.h); made in Open before Recover (which recovers
  // the staged records through it). Its seal pool is stopped first at Close (what is left
  // resumes at the next mount). Declared after what its seals use (the cut pool, the local
  // chunks, the publisher, the open files, the namespace, the budgets), so that it is
  // destroyed, its pool joined, before they go; retention_, which its hooks reach, goes before
  // it, but Close has stopped the seals by then (and before Open ends no seal is queued).
  std::unique_ptr<Staging> staging_;
  // The passes of user.ckptfs.retain (store/retention_pass.h), which a commit that completes a
  // checkpoint queues; made in Open once the local chunks are, stopped at Close.
  std::unique_ptr<RetentionPass> retention_;
  // Prefetch work and pins (store/prefetcher.h), made on first use by prefetcher(), after
  // AttachRemote (its thread count depends on the remote tiers). Declared last: its threads stop
  // before the cache, the metadata and the backends they fetch through go.
  Prefetcher& prefetcher();
  std::once_flag prefetch_once_;
  std::unique_ptr<Prefetcher> prefetch_;
};

}  // namespace ckptfs
