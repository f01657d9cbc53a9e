// Namespace: the files' names, inodes, links, attributes and xattrs, as records in LMDB
// (store/meta_store.h), and the lock that orders every change of them. It also owns the files'
// fallbacks (store/fallbacks.h), whose records change under the same lock, and the commit's
// metadata (CommitManifestTxn), which the store's commits and seals run under it.
//
// A change is one LMDB write transaction under mu_ (Mutate): the records, and what the remote
// tiers must learn of them (queued through the Publisher inside that transaction, so that its
// commit makes them durable with the change). What a change leaves to do runs after mu_ is
// released: waking the uploaders (Publisher::Kick) and reclaiming the chunks it left
// unreferenced (LocalChunks::Reclaim, which syncs LMDB). Reads take no lock: each is one LMDB
// read transaction.
//
// It knows nothing of open files' bytes: the store above overlays what an open file holds and
// LMDB does not yet (Hooks::show), seals a staged file a rename would replace (Rename's
// seal_first), and opens what CreateFile made.
//
// Thread-safe. Which lock guards what:
//   mu_  every namespace write: the inode, entry, symlink, xattr, orphan and new-file records,
//        the manifests' commits, the staged records' and the fallbacks' changes, and the remote
//        ops queued with them. Taken here by each change (EXCLUDES(mu_)); the functions that run
//        inside a caller's write transaction REQUIRE it (the store's commits, seals, recovery,
//        the namespace sync's applies and the fallbacks' settle pass take mu() themselves).
//   The other fields are set at construction and not changed after.
// Lock order: a file's mu (OpenFile::mu, seal_mu before it) -> mu_ -> the LMDB writer -> the
// leaves: the open-file table's lock (DropLink asks IsOpen), the Publisher's unpublished_mu_
// (QueueTree, CommitManifestTxn's HoldUnpublished), and, through Hooks::show, the shown file's
// qmu. The namespace sync's pass_mu_ is taken before mu_. Nothing under mu_ waits for a backend
// or another file's operation; LMDB's commit syncs inside it (LMDB has one writer anyway).
// Publisher::Kick and LocalChunks::Reclaim run after mu_ is released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/chunk_cache.h"
#include "common/chunk_id.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "store/fallbacks.h"
#include "store/local_chunks.h"
#include "store/manifest.h"
#include "store/meta_store.h"
#include "store/open_table.h"
#include "store/publisher.h"

namespace ckptfs {

struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
};

struct SetAttrRequest {
  std::optional<uint32_t> mode;  // permission bits; the file type is kept
  std::optional<uint32_t> uid;
  std::optional<uint32_t> gid;
  std::optional<uint64_t> size;
  std::optional<int64_t> atime_ns;  // kNow: the current time
  std::optional<int64_t> mtime_ns;
  static constexpr int64_t kNow = INT64_MIN;
};

struct DirItem {
  std::string_view name;
  uint64_t ino;
  uint32_t mode;         // file type bits
  uint64_t next_offset;  // the readdir offset that continues after this item
};

class Namespace {
 public:
  // What the namespace asks of the store above it.
  struct Hooks {
    // Shows in *rec what the open file ino holds and LMDB does not yet (its uncommitted size,
    // stored bytes and mtime), for the records ClearModeBits, SetAttr and Link return. Called
    // after their commit with mu_ still held, so that no commit of the file lands in between;
    // takes the file's qmu (mu_ -> qmu).
    std::function<void(uint64_t ino, InodeRecord* rec)> show;
  };

  // meta, cache, chunks, publisher and files outlive this. cache_dir: where the staging files
  // of deleted inodes are. boot_id and settle_interval_s: the fallbacks' (store/fallbacks.h).
  Namespace(std::string cache_dir, MetaStore* meta, ChunkCache* cache, LocalChunks* chunks,
            Publisher* publisher, OpenTable* files, Logger log, std::string boot_id,
            double settle_interval_s, Hooks hooks);
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;

  // The namespace lock, for callers that write LMDB inside it (see the top comment).
  Mutex& mu() RETURN_CAPABILITY(mu_) { return mu_; }
  // The files' fallbacks; their record changes run under mu().
  Fallbacks& fallbacks() { return *fallbacks_; }

  // --- reads: one LMDB read transaction each, no lock ---
  // The inode parent/name names.
  Result<uint64_t> Lookup(uint64_t parent, std::string_view name);
  // ino's record, with what a staged file holds shown (OverlayStaged); not what an open file
  // holds (the store overlays that).
  Result<InodeRecord> GetAttr(uint64_t ino);
  Result<std::string> ReadLink(uint64_t ino);
  // Store::ReadDir.
  Status ReadDir(uint64_t dir, uint64_t offset, const std::function<bool(const DirItem&)>& fn);
  Result<std::string> GetXattr(uint64_t ino, std::string_view name);
  Result<std::vector<std::string>> ListXattrs(uint64_t ino);

  // --- changes: each one transaction under mu_, taken here ---
  // Store::ClearModeBits (shown through Hooks::show).
  Result<InodeRecord> ClearModeBits(uint64_t ino, uint32_t bits) EXCLUDES(mu_);
  // Every attribute of req but the size (which the store changes through the file's bytes),
  // with `now` for kNow and ctime; an mtime is mirrored into the open file and the staged
  // record. The record after, shown through Hooks::show.
  Result<InodeRecord> SetAttr(uint64_t ino, const SetAttrRequest& req, int64_t now) EXCLUDES(mu_);
  // Store::MakeNode; `unborn`: a regular file for CreateFile, marked new and not yet published.
  Result<InodeRecord> MakeNode(uint64_t parent, std::string_view name, uint32_t mode,
                               uint64_t rdev, const Caller& who, bool unborn) EXCLUDES(mu_);
  // CreateFile's open of the file it made failed: removes parent/name and the inode, unless a
  // commit or another open has kept the file since.
  Status UndoCreate(uint64_t parent, std::string_view name, uint64_t ino) EXCLUDES(mu_);
  // A file made by CreateFile is kept with nothing committed (its creator's close, an fsync or
  // its last release): its new-file mark goes and it is published.
  Status KeepCreated(uint64_t ino) EXCLUDES(mu_);
  Result<InodeRecord> Symlink(uint64_t parent, std::string_view name, std::string_view target,
                              const Caller& who) EXCLUDES(mu_);
  // Store::Link (shown through Hooks::show).
  Result<InodeRecord> Link(uint64_t ino, uint64_t new_parent, std::string_view new_name)
      EXCLUDES(mu_);
  Status Unlink(uint64_t parent, std::string_view name) EXCLUDES(mu_);
  Status Rmdir(uint64_t parent, std::string_view name) EXCLUDES(mu_);
  // Store::Rename. With `seal_first`, a regular file the rename would replace whose newest
  // durable bytes (fsync'd in passthrough mode) are only staged is not replaced: nothing
  // changes, *seal_first is set to it, and the caller seals it and calls again. Without
  // `seal_first` but with `durable_first`, the same when the renamed file's newest version may
  // not be durable (Fallbacks::AtRisk): *durable_first is set to the renamed file, which the
  // caller makes durable before it calls again. With neither (or both left 0) the rename is
  // done.
  Status Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                std::string_view new_name, unsigned flags, uint64_t* seal_first,
                uint64_t* durable_first) EXCLUDES(mu_);
  Status SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags)
      EXCLUDES(mu_);
  Status RemoveXattr(uint64_t ino, std::string_view name) EXCLUDES(mu_);
  // Deletes an orphan whose last open went away (nothing when ino is open or still linked).
  Status ReapIfOrphan(uint64_t ino) EXCLUDES(mu_);
  // A commit of a file's bytes: CommitManifestTxn in a transaction of its own. The chunks it
  // left unreferenced go into *freed for the caller to reclaim (with its own after-effects);
  // none on an error.
  Status CommitManifest(uint64_t ino, const Manifest& m, int64_t mtime, bool durable,
                        std::vector<ChunkId>* freed) EXCLUDES(mu_);

  // --- inside a caller's write transaction: REQUIRES mu_ held ---
  // At open: makes the root if there is none, backfills the parent records, and removes the
  // files unlinked while open at the last stop and the new files no commit kept (unborn).
  struct Recovered {
    size_t orphans = 0;  // inodes found orphaned or new (both kinds)
    size_t unborn = 0;   // of them, new files removed
  };
  Result<Recovered> Recover(MetaStore::Txn& txn, std::vector<ChunkId>* freed) REQUIRES(mu_);
  // The commit's metadata: m replaces ino's manifest (mtime, a new generation), its staged
  // record and new-file mark go, and the backend is told. `durable`: m's chunks are synced
  // (fsync), so the file needs no fallback (its own goes).
  Status CommitManifestTxn(MetaStore::Txn& txn, uint64_t ino, const Manifest& m, int64_t mtime,
                           bool durable, std::vector<ChunkId>* freed) REQUIRES(mu_);
  // Drops rec's last link: keeps it as an orphan while open, otherwise deletes it; chunks left
  // unreferenced go into *freed.
  Status DropLink(MetaStore::Txn& txn, InodeRecord& rec, std::vector<ChunkId>* freed)
      REQUIRES(mu_);
  // At recovery. Removes a new file's entry and inode.
  Status RemoveUnborn(MetaStore::Txn& txn, InodeRecord rec, std::vector<ChunkId>* freed)
      REQUIRES(mu_);
  // Queues what the backend must learn of a change (nothing without a backend); the txn's
  // commit makes it durable with the change. Publisher::Queue, with the lock its contract names.
  Status QueueRemote(MetaStore::Txn& txn, const std::string& op) REQUIRES(mu_);

 private:
  // What a change leaves to do once its transaction committed and mu_ is released.
  struct Change {
    std::vector<ChunkId> freed;  // chunks it left unreferenced: reclaimed
    bool publish = false;        // it queued remote ops: the uploaders are woken
    bool commit = true;          // false: nothing to change; the transaction is aborted
  };
  using ChangeFn = std::function<Status(MetaStore::Txn& txn, Change& c)>;
  // Runs fn inside one write transaction under mu_ and commits it (unless fn returns an error
  // or clears c.commit); then, with mu_ still held, shows *shown (Hooks::show) when given. The
  // change's after-effects are left in *c.
  Status Apply(const ChangeFn& fn, Change* c, InodeRecord* shown = nullptr) EXCLUDES(mu_);
  // Apply, then the after-effects with no lock held: the uploaders woken, the chunks reclaimed.
  // Nothing after an error or an aborted change.
  Status Mutate(const ChangeFn& fn, InodeRecord* shown = nullptr) EXCLUDES(mu_);
  // Queues, for ino and everything under it, the unpublishing of its old paths (publish=false,
  // `path` its path now) or the publishing under its new ones (publish=true):
  // Publisher::QueueTree.
  Status QueueTree(MetaStore::Txn& txn, uint64_t ino, const std::string& path, bool publish)
      REQUIRES(mu_);
  // Deletes rec's inode, manifest, fallback, staged bytes, symlink and xattrs.
  Status DeleteInode(MetaStore::Txn& txn, const InodeRecord& rec, std::vector<ChunkId>* freed)
      REQUIRES(mu_);

  const std::string cache_dir_;
  MetaStore* const meta_;
  LocalChunks* const chunks_;
  Publisher* const publisher_;
  OpenTable* const files_;
  const Logger log_;
  const Hooks hooks_;
  Mutex mu_;
  // Last: its settle thread (which takes mu_) is joined before mu_ goes.
  std::unique_ptr<Fallbacks> fallbacks_;
};

}  // namespace ckptfs
