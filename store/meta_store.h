// MetaStore: every piece of ckptfs metadata, in one LMDB environment under <cache_dir>/meta.
//
// Tables (keys big-endian so that LMDB's byte order is numeric order):
//   inodes     ino                  -> InodeRecord
//   dentries   parent ino + name    -> DirEntry (child ino, readdir cookie)
//   dircookies parent ino + cookie  -> name          (stable readdir order and offsets)
//   manifests  ino                  -> Manifest
//   symlinks   ino                  -> target
//   xattrs     ino + name           -> value
//   chunks     chunk id (16 bytes)  -> ChunkRecord (references, length)
//   orphans    ino                  -> ""            (unlinked while open; reclaimed at mount)
//                                      or "new"      (made by create(2) and not yet committed
//                                      or closed: removed with its entry at mount)
//   meta       name                 -> value         (next inode number, format version)
//   parents    ino                  -> parent ino + name   (the entry that last linked ino: a
//                                      file's path for the remote tier)
//   remote_ops seq                  -> op            (namespace changes still to publish to the
//                                      first remote tier, in order; see store/remote_tier.h)
//   published  ino                  -> generation    (the version of a file that tier holds under
//                                      the file's path; dropped when the file moves)
//   remote_ops.T, published.T       the same for remote tier T (1..kMaxTiers-1) of the chain
//   staged     ino                  -> StagedRecord  (bytes closed in a passthrough staging
//                                      file and not yet cut into chunks; see store/staged.cc)
//   fallbacks  ino                  -> FallbackRecord (the version a file goes back to after a
//                                      machine crash if its newest did not reach the disk)
// The meta table's "format" names the store's format (kStoreFormat): a binary refuses a store
// of a newer format with that reason and raises an older one when it opens it for writing.
//
// A Txn is used by one thread from Begin to Commit/Abort. Write transactions are serialized by
// LMDB itself; read transactions run concurrently with them and see a consistent snapshot.
#pragma once

#include <lmdb.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/chunk_id.h"
#include "common/status.h"
#include "store/manifest.h"

namespace ckptfs {

constexpr uint64_t kRootIno = 1;

struct InodeRecord {
  uint64_t ino = 0;
  uint32_t mode = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t nlink = 0;
  uint64_t size = 0;
  uint64_t rdev = 0;
  int64_t atime_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t next_cookie = 1;  // directories: the cookie the next entry gets
  uint64_t generation = 0;   // bumped whenever the file's bytes change
  // Regular files: the bytes of the manifest's chunk extents (holes take none), which st_blocks
  // reports. Records written before it existed read as `size`.
  uint64_t data_bytes = 0;
  // Regular files: bumped whenever the file moves (a rename of it or of a directory above it),
  // so that a publish queued or begun under an earlier path is told from the one the move
  // queued, even when the path is the same again (A -> B -> A; store/remote_tier.h). Records
  // written before it existed read as 0.
  uint64_t path_epoch = 0;
};

struct DirEntry {
  uint64_t ino = 0;
  uint64_t cookie = 0;
  uint32_t mode = 0;  // the child's file type bits, for readdir
};

// A file whose newest bytes are a staging file of the local tier (written by the kernel in FUSE
// passthrough mode), committed at close and not yet cut into chunks. Its inode record and
// manifest still describe the previous version until the seal replaces them.
struct StagedRecord {
  std::string name;  // the staging file, under <cache_dir>/passthrough/
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t data_bytes = 0;  // allocated in the staging file (st_blocks: holes take none)
  bool durable = false;  // written by fsync: the staging file's bytes were synced first
  // What a staging file looked like when recorded (size, mtime, ctime): unchanged, it needs no
  // new record.
  struct Stamp {
    uint64_t size = 0;
    int64_t mtime_ns = 0, ctime_ns = 0;
    bool operator==(const Stamp&) const = default;
  };
  std::string boot_id;   // the boot the bytes were written in (a non-durable record outlives
                         // a daemon crash, not a machine crash)
};

// The store format this binary writes. 1: stores made before the format was recorded; 2: inode
// records of version 2, the fallbacks table; 3: inode records of version 3 (path_epoch) and
// publish ops that carry it (a binary of format 2 would drop them as damaged).
constexpr uint64_t kStoreFormat = 3;

// A file whose newest version may not be on the disk yet (committed without fsync, or renamed
// over another file while its bytes are only staged), with the last version of it that is: after
// a machine crash, recovery serves this one when a chunk of the newest is lost or damaged
// (Store::Recover). The record holds a reference on each chunk of its manifest. It goes once
// the newest version's chunks are synced (Store::Settle), by fsync, or with the file.
struct FallbackRecord {
  Manifest manifest;     // the durable version's bytes (empty when `absent`)
  int64_t mtime_ns = 0;  // and its modification time
  bool absent = false;   // the file had no durable version: recovery removes it
  // The newest version is a staged record (a rename put it in place of the durable one): when
  // recovery drops that record, the file falls back whatever its manifest holds.
  bool staged = false;
  uint64_t touch = 0;    // a new value whenever the record or what it covers changes
  std::string boot_id;   // the boot that made the newest version (page cache lost with it)
};

// Remote tiers a store writes back to, nearest first (`--backend` given more than once).
constexpr int kMaxTiers = 4;
// A published version meaning "dropped from this tier by its keep= policy": the record there is
// deleted and the file is not published there again (unless it moves).
constexpr uint64_t kDroppedFromTier = UINT64_MAX;

struct ChunkRecord {
  uint64_t refs = 0;
  uint64_t len = 0;
  // Bit T: remote tier T holds it. Any bit: the local copy may be evicted.
  uint8_t tiers = 0;
  bool remote() const { return tiers != 0; }
};

class MetaStore {
 public:
  // Opens (creating if needed) the environment in `dir`. `map_bytes` bounds the database size.
  static Result<std::unique_ptr<MetaStore>> Open(const std::string& dir, uint64_t map_bytes,
                                                 bool read_only = false);
  ~MetaStore();

  class Txn {
   public:
    Txn(Txn&& o) noexcept : txn_(o.txn_), store_(o.store_) { o.txn_ = nullptr; }
    Txn& operator=(Txn&&) = delete;
    ~Txn() { Abort(); }

    Status Commit();
    void Abort();

    Result<InodeRecord> GetInode(uint64_t ino);
    Status PutInode(const InodeRecord& rec);
    Status DelInode(uint64_t ino);
    Result<uint64_t> AllocIno();

    Result<DirEntry> GetEntry(uint64_t parent, std::string_view name);
    // Adds or replaces parent/name. A new name gets the directory's next cookie; a replaced one
    // keeps its own. Updates parent's next_cookie in `parent_rec` (the caller writes it back).
    Status PutEntry(InodeRecord& parent_rec, std::string_view name, uint64_t ino, uint32_t mode);
    Status DelEntry(uint64_t parent, std::string_view name);
    bool DirEmpty(uint64_t dir);
    // Calls fn(name, entry) for the entries of `dir` with cookie > after, in cookie order, until
    // fn returns false.
    Status ListDir(uint64_t dir, uint64_t after,
                   const std::function<bool(std::string_view, const DirEntry&)>& fn);
    // Calls fn for every entry below `dir`, breadth first, each directory's entries in cookie
    // order; descends into subdirectories when `recursive`. Stops at fn's first error.
    Status WalkTree(uint64_t dir, bool recursive, const std::function<Status(const DirEntry&)>& fn);

    Result<std::optional<Manifest>> GetManifest(uint64_t ino);
    Status PutManifest(uint64_t ino, const Manifest& m);
    Status ForEachManifest(const std::function<void(uint64_t ino, const Manifest&)>& fn);
    Status DelManifest(uint64_t ino);

    Result<std::string> GetSymlink(uint64_t ino);
    Status PutSymlink(uint64_t ino, std::string_view target);
    Status DelSymlink(uint64_t ino);

    Result<std::string> GetXattr(uint64_t ino, std::string_view name);  // kNoData if absent
    Status PutXattr(uint64_t ino, std::string_view name, std::string_view value);
    Status DelXattr(uint64_t ino, std::string_view name);  // kNoData if absent
    Status ListXattrs(uint64_t ino, const std::function<void(std::string_view)>& fn);
    Status DelAllXattrs(uint64_t ino);

    // The entry that last linked ino (kNotFound for the root and for records older than the
    // table). Kept by PutEntry and DelEntry.
    Result<std::pair<uint64_t, std::string>> GetParent(uint64_t ino);
    // Fills the parents table from the directory entries once, for a store made before it.
    Status BackfillParents();
    // The path of ino from the root, without a leading '/' ("" for the root). kNotFound when an
    // ancestor is gone (unlinked).
    Result<std::string> PathOf(uint64_t ino);

    // The remote tiers' queues of namespace changes to publish, in the order they were made:
    // QueueRemoteOp queues op for every tier (SetRemoteTiers), QueueRemoteOpFor for one.
    Result<uint64_t> QueueRemoteOp(std::string_view op);
    Result<uint64_t> QueueRemoteOpFor(int tier, std::string_view op);
    // How many ops wait in tier `tier`'s queue (0 for a tier this store never had).
    Result<uint64_t> CountRemoteOps(int tier);
    // Calls fn(seq, op) in order for tier's queued ops with seq > after, until fn returns false.
    Status ForEachRemoteOp(int tier, uint64_t after,
                           const std::function<bool(uint64_t, std::string_view)>& fn);
    Status DelRemoteOp(int tier, uint64_t seq);
    // The generation of ino that remote tier `tier` holds (0: none).
    Result<uint64_t> GetPublished(int tier, uint64_t ino);
    Status PutPublished(int tier, uint64_t ino, uint64_t generation);
    // On every tier (the file moved, or is gone).
    Status DelPublished(uint64_t ino);
    // Records that remote tier `tier` holds chunk id (no-op for a chunk nothing references).
    Status MarkChunkRemote(const ChunkId& id, int tier);
    // Forgets that tier holds chunk id (a gc round may delete it); no-op when unknown.
    Status ClearChunkRemote(const ChunkId& id, int tier);
    // The last gc round (store/gc.h) of tier's backend whose deletions this node has taken into
    // account (0: none).
    Result<uint64_t> GetGcEpoch(int tier);
    Status PutGcEpoch(int tier, uint64_t epoch);
    // Which backend remote tier `tier` is (Backend::Identity; "": none recorded). A tier's state
    // follows its backend when the chain changes (RemapTiers).
    Result<std::string> GetTierName(int tier);
    Status PutTierName(int tier, std::string_view name);
    // Moves the remote tiers' state (queue, published versions, chunk marks, gc epoch, name) so
    // that tier T gets what tier from[T] had (-1: nothing); tiers past from.size() are emptied.
    Status RemapTiers(const std::vector<int>& from);
    // Whether remote tier `tier` has published versions or queued ops.
    Result<bool> TierHasState(int tier);
    // Drops tier's "dropped by keep=" marks (it became the farthest tier: it must hold all).
    Status ForgetDropped(int tier);

    Result<ChunkRecord> GetChunk(const ChunkId& id);  // refs 0 when unknown
    // Adds `delta` references to chunk `id` of `len` bytes and returns the new count; the record
    // is removed when the count reaches zero.
    Result<uint64_t> AddChunkRefs(const ChunkId& id, uint64_t len, int64_t delta);
    Status ForEachChunk(const std::function<void(const ChunkId&, const ChunkRecord&)>& fn);

    Result<std::optional<StagedRecord>> GetStaged(uint64_t ino);
    Status PutStaged(uint64_t ino, const StagedRecord& r);
    Status DelStaged(uint64_t ino);
    Status ForEachStaged(const std::function<void(uint64_t, const StagedRecord&)>& fn);

    Result<std::optional<FallbackRecord>> GetFallback(uint64_t ino);
    Status PutFallback(uint64_t ino, const FallbackRecord& r);
    Status DelFallback(uint64_t ino);  // Ok when none
    // fn(ino, record) for every fallback, in inode order. Stops at the first damaged record.
    Status ForEachFallback(const std::function<void(uint64_t, const FallbackRecord&)>& fn);

    Status AddOrphan(uint64_t ino);
    Status DelOrphan(uint64_t ino);
    // A file made by create(2): until ClearUnborn (its first commit or close), a restart removes
    // it with its directory entry, like the bytes its session never committed.
    Status AddUnborn(uint64_t ino);
    // Forgets ino's "new" mark; an orphan mark ("" : unlinked while open) stays.
    Status ClearUnborn(uint64_t ino);
    Result<bool> IsUnborn(uint64_t ino);
    // fn(ino, unborn): every mark, orphans and new files.
    Status ForEachOrphan(const std::function<void(uint64_t, bool)>& fn);

   private:
    friend class MetaStore;
    Status PutChunkRecord(const ChunkId& id, const ChunkRecord& r);
    // Removes ino's parent record if it names parent/name (another link may have replaced it).
    Status DropParent(uint64_t ino, uint64_t parent, std::string_view name);
    Txn(MDB_txn* txn, MetaStore* store) : txn_(txn), store_(store) {}
    Result<std::optional<std::string_view>> Get(MDB_dbi dbi, std::string_view key);
    Status Put(MDB_dbi dbi, std::string_view key, std::string_view value);
    Status Del(MDB_dbi dbi, std::string_view key, bool missing_ok);
    // Calls fn(key, value) for keys starting with prefix (from `start`, default prefix) until
    // fn returns false.
    Status Scan(MDB_dbi dbi, std::string_view prefix, std::string_view start,
                const std::function<bool(std::string_view, std::string_view)>& fn);

    MDB_txn* txn_;
    MetaStore* store_;
  };

  Result<Txn> Begin(bool write);
  // How many remote tiers QueueRemoteOp queues for (0..kMaxTiers). Set before the first op.
  void SetRemoteTiers(int n) { tiers_ = n; }
  int remote_tiers() const { return tiers_; }
  // Makes every committed transaction durable (the meta page included).
  Status Sync();
  // The format of the store as opened (kStoreFormat once opened for writing).
  uint64_t format() const { return format_; }

 private:
  MetaStore() = default;
  MDB_env* env_ = nullptr;
  MDB_dbi inodes_ = 0, dentries_ = 0, dircookies_ = 0, manifests_ = 0, symlinks_ = 0,
          xattrs_ = 0, chunks_ = 0, orphans_ = 0, meta_ = 0, parents_ = 0, staged_ = 0;
  MDB_dbi fallbacks_ = 0;
  bool has_fallbacks_ = false;  // false: a read-only open of a store made before format 2
  uint64_t format_ = kStoreFormat;
  MDB_dbi remote_ops_[kMaxTiers] = {}, published_[kMaxTiers] = {};
  bool has_tier_tables_[kMaxTiers] = {};  // false: a read-only open of an older store
  int tiers_ = 0;
  // Tables added after the first release: a read-only open of an older store has none of them.
  bool has_remote_tables_ = false;
};

}  // namespace ckptfs
