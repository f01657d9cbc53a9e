// FileSessions: the bytes of open files — opens and releases, the write queues, reads, and the
// commits of sessions.
//
// Every Open is paired with one Release. An unlinked file lives on until its last Release.
//
// Sessions: the bytes written since a file's last commit form one session, committed whole or
// not at all. Each open gets a handle (*fh); a handle that writes (or truncates) joins the
// session, and only a flush, fsync or release through a handle of the session commits it (and
// reports its errors), so a reader's or another process's close never commits a half-written
// checkpoint. The last release commits whatever is left. Handle 0 stands for "any": calls with
// it act as a member of the session.
//
// truncate (open(2) with O_TRUNC): the file's bytes are dropped in its writer, committed like any
// write, so a crash before then leaves the previous version. *keep_cache: whether the kernel may
// keep the pages it has cached for the file.
//
// Passthrough (store/staging.h): when `passthrough_fd` is given (the mount can open files in FUSE
// passthrough mode) a handle may be served from a staging file on the local tier, which the
// kernel then reads and writes itself; *passthrough_fd is set to its descriptor (owned by the
// store, open until this handle's Release), else to -1. `write`: the handle may write.
//
// Writes are acknowledged once copied into the file's bounded queue; the write pool's threads
// chunk, hash and store them behind the writer (Drain), so the application and the daemon work
// in parallel. An error found there is returned by the file's next write, flush or fsync; a
// write that the local tier has no room for is refused at once (AdmitWrite). A commit's
// after-effects (Reclaim, which syncs LMDB; waking the uploaders; retention through
// Hooks::note_committed) run after the file's mu is released (RunAfterCommit).
//
// Durability: closing a file (Flush) commits its manifest after its chunks are written to the
// local tier's files, so a crash of the daemon never loses or tears a closed file. Fsync also
// syncs the chunks before the commit and the metadata after it, so the file survives a crash of
// the machine too.
//
// What only the store above can do (the prefetcher's readahead of chunks off the local tier,
// the retention passes) it asks through `Hooks`; below it are the namespace (store/namespace.h)
// and the staged files (store/staging.h).
//
// Thread-safe. Which lock guards what:
//   OpenFile::mu   a file's writer, manifest, cached_opens, unborn, creator_fh, after_freed,
//                  after_committed and its readahead state (prefetched_for, prefetched_upto,
//                  last_extent). Commit, CommitOrDrop, EnsureWriter and ReadAhead REQUIRE it
//                  held (written on each); the other calls take it (REQUIRES: not held).
//   OpenFile::qmu  a file's write queue (queue, queued_bytes, draining, async_error; qcv is its
//                  condition), its session (session) and what GetAttr shows (dirty, size,
//                  data_bytes, mtime_ns, committed_size, committed_data, writing_fd). Taken
//                  under mu or alone, never held while taking mu or the namespace lock.
//   queue_budget_  every file's queued writes (write_memory / 2); its own lock, a leaf. Taken by
//                  Write with no lock held, given back by Drain.
//   unstored_bytes_, full_logged_  atomics.
//   read_pool_, write_pool_  made by the constructor, joined by the destructor (write_pool_
//                  first); their queues have their own locks, leaves.
//   The other fields are set at construction and not changed after.
// Lock order, as in store/store.h: seal_mu -> mu -> qmu, and mu -> the namespace lock (ns_->mu())
// -> the leaves. Under mu a session call takes LocalChunks' holds_mu_ and the open-file table's
// lock (MarkStale), the pools' queues, and, through ReadAhead, Hooks::fetch_soon (the
// Prefetcher's locks). No lock is held across a wait for room (WaitForRoom) or a backend
// request; a file's own mu is held across its own chunk syncs (fsync). RunAfterCommit and
// Hooks::note_committed run with no lock held.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "cache/chunk_cache.h"
#include "common/chunk_id.h"
#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "store/file_writer.h"
#include "store/local_chunks.h"
#include "store/manifest.h"
#include "store/memory_budget.h"
#include "store/meta_store.h"
#include "store/namespace.h"
#include "store/open_file.h"
#include "store/open_table.h"
#include "store/publisher.h"
#include "store/staged_meta.h"
#include "store/staging.h"

namespace ckptfs {

class FileSessions {
 public:
  // What the sessions ask of the store above them.
  struct Hooks {
    // Chunks off the local tier that a reader reaches next (the Prefetcher's ReaderWants).
    // Called under the reading file's mu.
    std::function<void(const std::vector<std::pair<ChunkId, uint64_t>>& chunks)> fetch_soon;
    // A commit kept ino's new version (the retention passes). Called with no lock held.
    std::function<void(uint64_t ino)> note_committed;
  };

  // cfg, meta, cache, chunks, files, ns, staging, publisher, metrics, reorder_budget, cut_pool
  // (optional) and scanners outlive this. The pools get cfg.read_threads and cfg.write_threads
  // threads, the write queues write_memory / 2.
  FileSessions(const Config& cfg, MetaStore* meta, ChunkCache* cache, LocalChunks* chunks,
               OpenTable* files, Namespace* ns, Staging* staging, Publisher* publisher,
               Metrics* metrics, Logger log, MemoryBudget* reorder_budget, ThreadPool* cut_pool,
               const PayloadScannerFactory& scanners, Hooks hooks);
  // Joins the pools.
  ~FileSessions() = default;
  FileSessions(const FileSessions&) = delete;
  FileSessions& operator=(const FileSessions&) = delete;

  // Store::Open, Release, Write and Read, as described above.
  Status Open(uint64_t ino, bool truncate, uint64_t* fh, bool* keep_cache, bool write,
              int* passthrough_fd);
  Status Release(uint64_t ino, uint64_t fh);
  Status Write(uint64_t ino, uint64_t offset, const uint8_t* data, size_t len, uint64_t fh);
  Status Read(uint64_t ino, uint64_t offset, size_t len, std::vector<ReadSlice>* out);
  // lseek(2)'s SEEK_DATA (data) and SEEK_HOLE: the holes of the committed manifest, or of the
  // staging file the kernel writes; bytes the daemon is being given count as data throughout
  // (no hole but the end). nullopt: offset at or past the end, or no data after it (ENXIO).
  Result<std::optional<uint64_t>> Seek(uint64_t ino, uint64_t offset, bool data);
  // Commits the file's session if fh belongs to it (close(2)).
  Status Flush(uint64_t ino, uint64_t fh);
  // Flush, and makes the file's committed bytes durable (fsync(2)); with durability=remote,
  // waits (up to remote_timeout) until the tiers named by durability_tier hold them.
  Status Fsync(uint64_t ino, uint64_t fh);
  // The size change of a SetAttr (Store::SetAttr), at time `now`: in a staging file the kernel
  // uses now, committed with it; else (the staged bytes sealed first) in the file's writer,
  // joining fh's session, or committed at once when nobody has the file open.
  Status Truncate(uint64_t ino, uint64_t size, uint64_t fh, int64_t now);
  // Store::PunchHole.
  Status PunchHole(uint64_t ino, uint64_t offset, uint64_t len, uint64_t fh);
  // Store::GetAttr: the record with what an open file holds uncommitted shown over it.
  Result<InodeRecord> GetAttr(uint64_t ino);
  // Shows over rec what ino holds uncommitted (Namespace::Hooks::show).
  void Show(uint64_t ino, InodeRecord* rec) { ApplyOverlay(TakeOverlay(ino), rec); }
  // Store::Busy: whether file ino, or any file under directory ino, is open now.
  Result<bool> Busy(uint64_t ino);
  // Commits every open file at the stop (Store::Close): a writer still open in passthrough mode
  // has its staging file recorded, every session is committed or dropped. The first error.
  Status CommitAll();

  // The file's committed bytes as they are now (writes not yet committed are not included),
  // without opening it; staged bytes are sealed first. Immutable: read it with ReadCommitted.
  Result<std::shared_ptr<const Manifest>> CommittedManifest(uint64_t ino);
  // Bytes of a manifest from CommittedManifest. kNotFound when one of its chunks has been
  // reclaimed since (the file changed): take a new snapshot.
  Status ReadCommitted(const Manifest& m, uint64_t offset, uint64_t len,
                       std::vector<ReadSlice>* out);
  // Loads the chunks of m that hold bytes [offset, offset + len) into the RAM tier in the
  // background (readahead for readers of committed snapshots, such as views). Returns at once.
  void WarmCommitted(const std::shared_ptr<const Manifest>& m, uint64_t offset, uint64_t len);
  // The chunks of m, and those of them other manifests reference too.
  struct ChunkUsage {
    uint64_t chunks = 0, bytes = 0;                // the manifest's chunks (holes excluded)
    uint64_t shared_chunks = 0, shared_bytes = 0;  // of those, referenced elsewhere too
  };
  Result<ChunkUsage> Usage(const Manifest& m);

  // Makes ino's newest committed version durable without committing a session: a staged record
  // is synced and recorded durable (as fsync does: the kernel's writes since are in it), a closed
  // staged file is sealed, and then SettleCommitted. For a rename that cannot seal the file it
  // replaces (see Store::Rename).
  Status MakeDurable(uint64_t ino);
  // AdmitWrite's check of the cache filesystem's free space, alone (no wait for uploads).
  // Takes no lock (Staging::Hooks::check_room).
  Status CheckRoom(size_t len);

  // The write queues' memory (Store::Gauges).
  const MemoryBudget& queue_budget() const { return queue_budget_; }

 private:
  // What GetAttr shows for a file with uncommitted bytes, taken before reading LMDB (a commit
  // lands in LMDB before it clears the mark), then applied to the record read.
  struct OverlayState {
    bool dirty = false;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    uint64_t data_bytes = 0;  // st_blocks' bytes (OpenFile::data_bytes, or the staging file's)
    // The staging file the kernel writes in passthrough mode (OpenFile::writing_fd), if any.
    std::shared_ptr<const int> staged;
  };
  OverlayState TakeOverlay(uint64_t ino);
  static void ApplyOverlay(const OverlayState& o, InodeRecord* rec);
  // Whether handle fh takes part in f's session (fh 0: always). REQUIRES: f.qmu not held.
  bool InSession(OpenFile& f, uint64_t fh);
  // REQUIRES: f.mu held.
  Status EnsureWriter(uint64_t ino, OpenFile& f);
  // After a read of m over extents [first, last]: when the reader is sequential, or extent
  // `first` was off the local tier, brings the next readahead_chunks chunks into the RAM tier in
  // the background (through Hooks::fetch_soon for those off the local tier). REQUIRES: f.mu held.
  void ReadAhead(OpenFile& f, const std::shared_ptr<const Manifest>& m, size_t first, size_t last);
  // Refuses a write of len bytes with kNoSpace when the local tier could not hold it on top of
  // the bytes already acknowledged and not yet stored, so that a full disk fails the write(2)
  // itself instead of a close(2) that many programs never check.
  Status AdmitWrite(size_t len);
  // Waits until the local tier has room for `len` more bytes of chunks the backend does not
  // hold yet (cache_size); kNoSpace after remote_timeout.
  Status WaitForRoom(size_t len);
  // Applies f's queued writes (a pool task).
  void Drain(uint64_t ino, const std::shared_ptr<OpenFile>& f);
  // Waits until every queued write of f is applied. REQUIRES: f.mu not held.
  void WaitDrained(OpenFile& f);
  // REQUIRES: f.mu held, f's queue drained. Commits f's writer, if any. durable: sync chunks
  // before, metadata after. Its after-effects wait in f for RunAfterCommit.
  Status Commit(uint64_t ino, OpenFile& f, bool durable);
  // Commit, unless a write since the last commit failed: then drops the writer and returns that
  // error (the file keeps its committed bytes). REQUIRES: as Commit.
  Status CommitOrDrop(uint64_t ino, OpenFile& f, bool durable);
  // Flush's and Fsync's commit of f's session: waits for its queue, CommitOrDrop under f.mu,
  // then RunAfterCommit. REQUIRES: f.mu not held.
  Status CommitSession(uint64_t ino, OpenFile& f, bool durable);
  // REQUIRES: f.mu not held. Runs what commits of f left to do: reclaims the chunks they freed
  // (an LMDB sync), wakes the uploaders, queues retention. Every caller of Commit or CommitOrDrop
  // calls it once it has released f.mu.
  void RunAfterCommit(uint64_t ino, OpenFile& f);
  // Makes ino's committed version durable and drops its fallback (fsync(2) after its commit).
  Status SettleCommitted(uint64_t ino);
  // A file made by CreateFile that no commit has kept yet (nothing was written) is kept, and
  // published: at its creator's close (fh, which FUSE's flush runs before close returns), at an
  // fsync or at the last release (fh 0: any).
  Status KeepCreated(uint64_t ino, OpenFile& f, uint64_t fh = 0);

  const Config& cfg_;
  MetaStore* const meta_;
  ChunkCache* const cache_;
  LocalChunks* const chunks_;
  OpenTable* const files_;
  Namespace* const ns_;
  Staging* const staging_;
  Publisher* const publisher_;
  Metrics* const metrics_;
  const Logger log_;
  // What writers get: the reorder windows' memory, the cut threads (may be null) and the format
  // scanners, the store's, shared with the seals.
  MemoryBudget* const reorder_budget_;
  ThreadPool* const cut_pool_;
  const PayloadScannerFactory& scanners_;
  const Hooks hooks_;

  // write_memory / 2 for every file's queued writes (Write waits for room). Declared before the
  // pools, so it outlives every task that uses it.
  MemoryBudget queue_budget_;
  std::atomic<uint64_t> unstored_bytes_{0};  // acknowledged writes still in queues
  std::atomic<bool> full_logged_{false};
  // Last: joined (write_pool_ first) before anything their tasks use goes.
  std::unique_ptr<ThreadPool> read_pool_;
  std::unique_ptr<ThreadPool> write_pool_;
};

}  // namespace ckptfs
