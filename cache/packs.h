// Packs: the local tier's chunks that live as extents of pack files, beside the chunk files of
// ChunkCache (one file per chunk, the older layout, still read and written).
//
// A pack is a file that holds chunks at known offsets, of one of two kinds:
//   - a passthrough staging file whose seal adopted it (hard-linked as <dir>/<name>.pack, named
//     "<ino>.<ns>"), never written again;
//   - an append pack (<dir>/append.<ns>.pack, cache/append_pack.h): the daemon appends the
//     chunks it stores itself (its write path, fetches), each written before its record. While
//     appended to (StartAppend .. EndAppend) it stays even with no extent, and its ranges not
//     recorded may be puts on their way: only recovery may treat them as free. It has one name
//     only, so its dropped extents are always punched.
// Its index <dir>/<name>.idx is an append-only log of fixed-size records, each with its own
// checksum: '+' adds an extent (chunk id, offset, length), '-' drops one.
//
// Why an index file per pack and not LMDB: this layer lies below the store and its LMDB, and
// chunk files already carry their own "index" (their names). A pack's index is made durable
// exactly as a chunk file is: ChunkCache::SyncChunks syncs the pack, its index and the packs
// directory before the manifest commit that names its chunks (the seal does so for fsync'd bytes,
// as it synced chunk files); recovery needs nothing but this directory. The cost is one small
// append per seal, and one per dropped extent (DropMany: one append and one sync per pack for
// all the extents that eviction or a removal drops at once).
//
// Crash safety:
//   - Adopt links the pack, appends its '+' records and registers them before the manifest
//     commit (Record, an append pack's, likewise, after the chunk's bytes are written). A crash before that commit leaves extents no manifest names: the store's sweep of
//     unreferenced chunks at an unclean start drops them, as it removes chunk files.
//   - A pack that still has another name (st_nlink > 1: its staging file, which the seal removes
//     only after its commit) is never punched: its bytes may be a staged version's.
//   - Drop (DropMany, DropMoved) appends the '-' records and syncs the index before any range is
//     punched, so that after any crash no extent names bytes that are gone.
//   - Open: a torn or damaged record ends an index (it is cut there); extents of a missing pack,
//     or past the end of a short one, are dropped (a manifest naming them reads as one naming a
//     lost chunk file); a pack left with no extent, or without an index, is unlinked. A pack
//     named by its pack link alone has every range that no live extent covers punched (whole
//     blocks inside the gaps between extents, data only, found with SEEK_DATA/SEEK_HOLE): what a
//     seal stopped between its commit and its Punch, or a Drop before its punch, left there.
//     Nothing appends to a pack during Open, so bytes that no extent names are nobody's.
//   - Compaction (ChunkCache::CompactPacks) moves the extents of sparse packs (SparsePacks) into
//     chunk files, made durable before DropMoved records their drops: a chunk is always in its
//     pack, its chunk file, or both.
//   - A power loss may keep a record whose bytes were not written back, inside the pack (a hole:
//     zeros), which no size check sees: reads verify every extent, and after an unclean start
//     (Distrust) a put counts on an extent listed then only once a read verified it.
//
// Thread-safe: one lock (mu_) over the maps and every index append and punch; a leaf (it calls
// nothing that takes another lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/chunk_id.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"

namespace ckptfs {

class Packs {
 public:
  // A chunk at bytes [offset, offset + len) of a pack.
  struct Entry {
    ChunkId id;
    uint64_t offset = 0;
    uint64_t len = 0;
  };
  // A byte range of a pack that holds no chunk of it (punched out).
  struct Range {
    uint64_t offset = 0;
    uint64_t len = 0;
  };

  // Loads (and recovers, see above) the packs under `dir`, made when missing.
  static Result<std::unique_ptr<Packs>> Open(const std::string& dir, Logger log);
  // The extents listed in the indexes under `dir`, read only (nothing recovered or changed): for
  // tools reading an unmounted cache directory. Absent: none.
  static std::unordered_map<ChunkId, std::pair<std::string, Entry>, ChunkIdHash> Scan(
      const std::string& dir);

  // Makes the file at `src` pack `name` (a hard link; an existing link to the same file is
  // reused) holding `entries`, and records them. Entries whose chunk is an extent already (of
  // any pack) are not recorded: their indexes in `entries` are returned, for the caller to punch
  // once the pack has no other name. Nothing recorded: no link is made.
  Result<std::vector<size_t>> Adopt(const std::string& src, const std::string& name,
                                    const std::vector<Entry>& entries);
  // Punches `ranges` (their whole blocks) out of pack `name`, unless it has another name, after
  // syncing its index. A pack that is not there is fine.
  Status Punch(const std::string& name, const std::vector<Range>& ranges);

  bool Contains(const ChunkId& id) const;
  // Whether pack `name` still holds extent `e` (same chunk, same offset).
  bool Holds(const std::string& name, const Entry& e) const;
  // The extent of chunk `id`, if one.
  std::optional<uint64_t> Len(const ChunkId& id) const;
  // Where chunk `id` lies: its pack's path and its extent; none when no extent of it.
  std::optional<std::pair<std::string, Entry>> Locate(const ChunkId& id) const;
  // Drops chunk `id`'s extent (a '-' record), punching its range (after syncing the index) when
  // the pack has no other name; a pack left without extents is unlinked. Absent: Ok. With `at`
  // (what Locate said), only that extent: a read that found bad bytes there must not drop the
  // chunk's new extent elsewhere, stored after the one it read was dropped.
  Status Drop(const ChunkId& id, const std::optional<std::pair<std::string, Entry>>& at = {});
  // Drop of many chunks at once (eviction, reclaim): per pack, one append of all their '-'
  // records, synced once when the pack is alone, before any of their ranges is punched.
  Status DropMany(const std::vector<ChunkId>& ids);

  // Compaction. A pack whose live extents hold under a quarter of its size, named by its pack
  // link alone, with the extents it still holds.
  struct Sparse {
    std::string name;
    std::vector<Entry> extents;
  };
  // Up to `max` sparse packs (checked among those that lost an extent since they were last
  // found dense, or since Open).
  std::vector<Sparse> SparsePacks(size_t max);
  // Drops those of `moved` (extents of pack `name`, their chunks now in durable chunk files) that
  // are still where they were, as DropMany does.
  Status DropMoved(const std::string& name, const std::vector<Entry>& moved);
  // fsck: chunk `id`'s extent is there on disk: its pack exists and is long enough to hold it.
  // kNotFound (saying what is wrong) otherwise.
  Status Check(const ChunkId& id) const;
  // fdatasyncs of indexes so far (Drop, DropMany, Punch).
  uint64_t index_syncs() const { return index_syncs_.load(std::memory_order_relaxed); }
  // Makes the extents of `ids` durable: each pack holding one, its index and the directory.
  Status Sync(const std::vector<ChunkId>& ids);
  void ForEach(const std::function<void(const ChunkId&, uint64_t len)>& fn) const;
  size_t packs() const;

  // Append packs (cache/append_pack.h; defined in append_pack.cc): packs the daemon writes
  // itself, one chunk at a time. StartAppend registers pack `name`, whose pack file and (empty)
  // index exist: it stays, even with no extent, until EndAppend (a range reserved in it may be
  // on its way). Record adds the extent `e` of pack `name` (a '+' record, not synced), once its
  // bytes are written: false when chunk e.id has an extent already (the range is the caller's
  // again), kNotFound when the pack is not appended to. EndAppend: nothing more comes; the pack
  // goes now when it has no extent, else with its last.
  Status StartAppend(const std::string& name);
  Result<bool> Record(const std::string& name, const Entry& e);
  void EndAppend(const std::string& name);
  // Whether pack `name` is appended to now (its unrecorded ranges may be on their way).
  bool Appending(const std::string& name) const;
  // After an unclean start, before any put: every extent listed now may name bytes a power loss
  // took (its record written back, the pack's bytes not: a hole reads as zeros, which no size
  // check catches as it catches a short chunk file). Sure: chunk `id`'s extent is not one of
  // those, or was read and verified since (Trust), so a put may count on it.
  void Distrust();
  bool Sure(const ChunkId& id) const;
  void Trust(const ChunkId& id);

 private:
  struct Pack {
    std::string name;
    uint64_t live = 0;    // extents recorded and not dropped
    uint64_t bytes = 0;   // their bytes
    bool shrunk = false;  // lost an extent since SparsePacks last found it dense
    // Some of its extents overlap (its staging file sealed again, cut otherwise, while an
    // extent of the first seal stayed): a dropped one's range is not punched, as it may hold
    // another's bytes.
    bool overlapping = false;
    bool appending = false;  // an append pack not ended: stays with no extent
  };
  struct Loc {
    uint32_t pack = 0;
    uint64_t offset = 0, len = 0;
  };
  Packs(std::string dir, Logger log) : dir_(std::move(dir)), log_(std::move(log)) {}
  std::string PackPath(const std::string& name) const { return dir_ + "/" + name + ".pack"; }
  std::string IndexPath(const std::string& name) const { return dir_ + "/" + name + ".idx"; }
  Status Load();
  // Appends records to pack `name`'s index (and fdatasyncs it with `sync`).
  Status Append(const std::string& name, const std::string& records, bool sync) REQUIRES(mu_);
  // Whether pack `name` is named by its pack link alone (may be punched).
  bool Alone(const std::string& name) const;
  // One extent of `pack` fewer; the pack goes with its last.
  void Release(uint32_t pack) REQUIRES(mu_);
  Status PunchRanges(const std::string& name, const std::vector<Range>& ranges) REQUIRES(mu_);
  // Drops `extents` (chunk ids and where they are now), pack by pack: one append of their '-'
  // records, synced once when the pack is alone, then their ranges (joined) punched.
  Status DropExtents(const std::vector<std::pair<ChunkId, Loc>>& extents) REQUIRES(mu_);
  // Open: punches out of pack `name`, when it is alone, every range with data that none of
  // `live` (its extents) covers: what a seal stopped before its Punch left stored twice.
  Status PunchUnused(const std::string& name, std::vector<Range> live) REQUIRES(mu_);

  const std::string dir_;
  const Logger log_;
  mutable Mutex mu_;
  std::unordered_map<ChunkId, Loc, ChunkIdHash> extents_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, Pack> packs_ GUARDED_BY(mu_);
  std::unordered_map<std::string, uint32_t> by_name_ GUARDED_BY(mu_);
  uint32_t next_pack_ GUARDED_BY(mu_) = 1;
  std::atomic<uint64_t> index_syncs_{0};
  std::unordered_set<ChunkId, ChunkIdHash> unsure_ GUARDED_BY(mu_);  // Distrust
};

}  // namespace ckptfs
