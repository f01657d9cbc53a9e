// ChunkCache: the local tier. Chunk bytes live as one file per chunk under <dir>/chunks/, named by
// their id, or as extents of pack files under <dir>/chunks/packs/ (cache/packs.h: a sealed staging
// file adopted whole, AdoptPack); recently read chunks also live in a RAM LRU. Every byte read
// from disk is verified against its id before anyone sees it (invariant 1). Every call below
// treats a chunk the same in either home. Put and fetches write chunk files, or, once
// AppendToPacks was called (Config::packs), extents appended to packs (cache/append_pack.h).
//
// With remote tiers (AttachRemote: backends, nearest first), a chunk missing on disk is fetched
// from the nearest tier that has it, verified, and kept on disk; one fetch serves every
// concurrent reader. Chunks some tier holds (MarkRemote) may be evicted, least recently used
// first, to keep the disk tier under its limit; chunks no tier holds yet are never evicted.
//
// Thread-safe. One ChunkCache owns its directory; the store's lock file keeps a second daemon out.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/io_engine.h"
#include "cache/packs.h"
#include "common/chunk_id.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"

namespace ckptfs {

class AppendPacks;
class Backend;
class DirectBuffer;

// Frees a ChunkData buffer. Large buffers go back to a small process-wide pool: a fresh buffer
// costs a page fault and a page clearing per 4 KiB on first touch, more than the copy into it.
struct ChunkBufferFree {
  size_t capacity = 0;
  void operator()(uint8_t* p) const;
};

// An immutable, verified chunk. Shared by every reader that asked for it while it is cached.
struct ChunkData {
  // The buffer starts on a kAlign boundary and has room up to the next one (zeroed), so that a
  // file opened with O_DIRECT can be read into it, and its whole blocks written from it.
  static constexpr size_t kAlign = kDirectAlign;
  // A chunk of `size` bytes, contents unset (the padding zeroed).
  static std::shared_ptr<ChunkData> Allocate(size_t size);
  std::unique_ptr<uint8_t[], ChunkBufferFree> bytes;
  size_t size = 0;
  // The memory the buffer holds: size rounded up to whole blocks, to 64 KiB steps from 1 MiB,
  // and to a whole huge page (2 MiB) from 1 MiB to 2 MiB (chunk_buffer.h).
  size_t capacity() const { return bytes.get_deleter().capacity; }
};
using ChunkRef = std::shared_ptr<const ChunkData>;

class ChunkCache {
 public:
  // `dir` must exist. The engine and metrics outlive the cache.
  static Result<std::unique_ptr<ChunkCache>> Open(const std::string& dir, IoEngine* engine,
                                                  uint64_t ram_bytes, Metrics* metrics);
  ~ChunkCache();

  // Makes sure the chunk named `id` (whose bytes are data[0..len)) is on disk. Returns true when
  // it was written now, false when it was already there. Large chunks are written with
  // O_DIRECT (not kept in the page cache; their last partial block buffered), small ones
  // buffered. The chunk appears under its final name only once written (to a temporary name,
  // then renamed), so a daemon crash never leaves a torn chunk under a real name; bytes not yet
  // written back when the machine fails are Sync's to guarantee (a short or damaged file is
  // caught by size and hash, and written anew). ENOSPC comes back as kNoSpace with nothing left
  // behind.
  // REQUIRES: id == ChunkId::Of(data, len).
  Result<bool> Put(const ChunkId& id, const void* data, size_t len);
  // Put in two steps, so that the caller may reuse `data` while the disk write runs elsewhere.
  // PutCopies: whether Put would write chunk `id` from an aligned copy (not on disk yet, at least
  // kDirectPutMin bytes, O_DIRECT not refused); when it would not, Put it. PreparePut makes that
  // copy (null: no buffer could be had; Put it), and PutPrepared writes it as Put does.
  struct PreparedPut {
    ~PreparedPut();
    const uint8_t* bytes = nullptr;
    size_t len = 0;
    std::unique_ptr<DirectBuffer> lent;  // the bytes' buffer: one of these two
    std::shared_ptr<ChunkData> own;
  };
  bool PutCopies(const ChunkId& id, size_t len);
  std::unique_ptr<PreparedPut> PreparePut(const void* data, size_t len);
  // The most memory PreparePut's copy of a `len`-byte chunk holds.
  static size_t CopyFootprint(size_t len);
  Result<bool> PutPrepared(const ChunkId& id, const PreparedPut& prepared);

  // The verified bytes of chunk `id`, which is `len` bytes long. One disk read serves all
  // concurrent callers for the same id. When the bytes on disk are not the chunk's, the file is
  // moved aside to <dir>/chunks/corrupt/ (so that the next Put writes it anew) and the result is
  // kCorrupt, or, with tiers attached, a tier's copy. kNotFound when absent here (and from every
  // tier); a copy that fails verification on every try is kCorrupt.
  Result<ChunkRef> Get(const ChunkId& id, size_t len);

  // Serves misses from `tiers` (nearest first; they outlive the cache; at most kMaxTiers) and
  // bounds the disk tier to `disk_limit` bytes of chunk files (0: no bound). Call once, before
  // any other call.
  void AttachRemote(std::vector<Backend*> tiers, uint64_t disk_limit);
  // Told after a chunk was fetched from tier K > 0 while nearer tiers answered "not here" (bit T
  // of `missing`: tier T did), with the verified bytes: the store may put it back where it
  // belongs. Runs on the fetching thread: it must not block. Call once, before any other call.
  using FetchedFromFar =
      std::function<void(const ChunkId& id, uint8_t missing, const ChunkRef& data)>;
  void SetFetchedFromFar(FetchedFromFar fn) { fetched_from_far_ = std::move(fn); }
  // Whether a chunk fetched from the backend is kept on disk (the store: "is it referenced?").
  // Unset: always. Call once, before any other call.
  void SetKeepFetched(std::function<bool(const ChunkId&)> keep);
  // Remote tier `tier` holds chunk `id`: its local copy may be evicted from now on.
  void MarkRemote(const ChunkId& id, int tier);
  // Tier `tier` may no longer hold chunk `id` (a gc round condemned it): unless another tier
  // holds it, its local copy stays.
  void UnmarkRemote(const ChunkId& id, int tier);
  // Chunks whose mark for `tier` counts for nothing (a gc round of that tier condemned them and
  // local files name them: another thread may mark one again meanwhile); replaces that tier's
  // last set.
  void SetProtected(int tier, const std::unordered_set<ChunkId, ChunkIdHash>& ids);
  // Chunks that a file committed here and not yet in the backend names: never evicted until
  // Unhold (counted: several files may name one chunk). The backend may hold them for another
  // file, which a gc round can delete while this node cannot see it.
  void Hold(const std::vector<ChunkId>& ids);
  void Unhold(const std::vector<ChunkId>& ids);
  // Chunks that must stay on disk whatever the limit (user.ckptfs.pin); replaces the last set.
  void SetPinned(std::unordered_map<ChunkId, uint64_t, ChunkIdHash> pinned);
  // Evicts remote-held, unpinned chunks, least recently used first, until the disk tier is
  // under its limit. Returns the bytes removed.
  uint64_t Evict();
  struct Usage {
    uint64_t disk_bytes = 0;    // chunk files on disk
    uint64_t local_only = 0;    // of those, bytes the backend does not hold yet
    uint64_t disk_limit = 0;    // 0: none
    uint64_t ram_bytes = 0;     // memory the RAM tier's chunk buffers hold (capacity())
    uint64_t ram_limit = 0;
  };
  Usage usage() const;
  // The object key of a chunk in a backend: "chunks/<2 hex>/<32 hex>".
  static std::string ObjectKey(const ChunkId& id);

  bool Contains(const ChunkId& id) const;
  // Whether chunk `id` is here whole: a chunk file or an extent of `len` bytes (a short chunk
  // file left by a machine crash is no copy to rely on).
  bool HasWhole(const ChunkId& id, size_t len) { return AlreadyOnDisk(id, len); }
  // Contains, answered from the disk tier's map (no system call) once a backend is attached.
  bool OnDisk(const ChunkId& id) const;
  // Prefetch: makes sure chunk `id` (of `len` bytes) is on the disk tier, fetching it from the
  // backend when missing, without keeping its bytes in the RAM tier, so that memory stays bounded
  // by the warms in flight. Shares Get's single flight. Ok when already on disk; kNotFound when
  // neither here nor in the backend (always, without a backend, for a chunk not on disk).
  Status Warm(const ChunkId& id, size_t len);
  // Reads chunk `id` from its file and verifies it (fsck): Ok, kNotFound when there is no file,
  // kCorrupt when its bytes are not the chunk's (the file is moved aside, as by Get).
  Status Verify(const ChunkId& id, size_t len);
  // Removes the chunk from disk and RAM. A missing chunk is not an error.
  Status Remove(const ChunkId& id);
  // Remove of many chunks (eviction, reclaim): the extents of one pack cost one sync of its
  // index. One status per id, in order.
  std::vector<Status> RemoveMany(const std::vector<ChunkId>& ids);
  // Compaction: moves the extents of sparse packs (Packs::SparsePacks: live bytes under a
  // quarter of the pack's size) into chunk files, then drops them from their pack, which goes
  // with its last; at most kCompactPassBytes per call. Each chunk is read and verified from its
  // extent, written as a chunk file and made durable (file and name) before its '-' record, so a
  // crash at any moment leaves it in its pack, in its chunk file, or in both. Never under a
  // lock; one pass at a time (a call while another runs returns 0 at once: that pass takes the
  // packs this one would). Returns the bytes moved.
  static constexpr uint64_t kCompactPassBytes = 64 << 20;
  static constexpr size_t kCompactPassPacks = 8;
  uint64_t CompactPacks();
  // Compaction's move of extent `e` of pack `pack` (its verified bytes in `data`) into a chunk
  // file: written, then renamed into place only while the pack still holds the extent, under
  // remove_mu_, so that a removal of the chunk meanwhile (eviction, reclaim) is never undone by
  // a chunk file it did not see. A move, not a new chunk: the disk map and the written counters
  // are left as they are. False (nothing left behind) when the extent went meanwhile.
  Result<bool> MoveIntoChunkFile(const std::string& pack, const Packs::Entry& e,
                                 const uint8_t* data);
  // Asks for compaction behind the caller: eviction (which a cold read's fetch or a waiting
  // writer may run) and reclaim call it, and a thread of the cache's own, started at the first
  // ask, runs passes until one moves nothing. Returns at once.
  void CompactSoon();
  // fsck without --deep: chunk `id` has its chunk file, or its extent's pack is there and long
  // enough to hold it; kNotFound saying what is missing otherwise.
  Status Present(const ChunkId& id) const;
  // Makes every chunk written so far durable (one syncfs over the tier's filesystem).
  Status Sync();
  // Makes the files of chunks `ids` durable, and their names (an fsync of each file and of each
  // directory holding one), leaving the rest of the filesystem's dirty pages alone. A chunk with
  // no file here (evicted, or a hole's zero id) is skipped.
  Status SyncChunks(const std::vector<ChunkId>& ids);
  // Calls fn for every chunk on disk, in a chunk file or a pack (recovery and garbage
  // collection). A chunk in both is listed twice.
  Status ForEach(const std::function<void(const ChunkId&, uint64_t size)>& fn) const;

  // Makes the file at `src` (a sealed staging file, never written again) pack `name`, the home of
  // the chunks `entries` (Packs::Adopt). Chunks stored already (a chunk file or another pack's
  // extent) are not recorded: their indexes in `entries` are returned, for PunchPack once the
  // staging file's own name is gone. The extents count on the disk tier from now on; they are
  // durable once SyncChunks synced them.
  Result<std::vector<size_t>> AdoptPack(const std::string& src, const std::string& name,
                                        const std::vector<Packs::Entry>& entries);
  // From now on Put, PutPrepared and fetches append chunks to packs (cache/append_pack.h), a new
  // one every `bound` bytes (0: AppendPacks::kBound), instead of writing chunk files. Call once,
  // before any other call.
  void AppendToPacks(uint64_t bound = 0);
  // After an unclean start, before any put (Packs::Distrust): a put counts on a chunk's extent
  // listed now only once a read verified it; a bad one is dropped and the chunk stored anew.
  void DistrustPacks() { packs_->Distrust(); }
  // Punches ranges holding no chunk out of pack `name`, unless the pack still has another name.
  Status PunchPack(const std::string& name, const std::vector<Packs::Range>& ranges);
  size_t pack_count() const { return packs_->packs(); }

  std::string PathOf(const ChunkId& id) const;
  const std::string& dir() const { return dir_; }

 private:
  struct Inflight;
  ChunkCache(std::string dir, int dirfd, IoEngine* engine, uint64_t ram_bytes, Metrics* metrics,
             std::unique_ptr<Packs> packs);
  Result<ChunkRef> Load(const ChunkId& id, size_t len);
  // Load of a chunk that has no file: its extent in a pack, verified (a bad one is dropped).
  // `moved`: the extent was dropped meanwhile (NotFound): its chunk file may be there now.
  Result<ChunkRef> LoadExtent(const ChunkId& id, size_t len, bool* moved);
  Result<ChunkRef> Fetch(const ChunkId& id, size_t len);
  // Put of bytes starting on a kDirectAlign boundary (a chunk fetched from the backend, or Put's
  // copy of a large one), written with O_DIRECT where the filesystem allows, else buffered: the
  // page cache gets no copy of bytes the daemon already holds. Put through the page cache. For
  // both, REQUIRES: not on disk already (AlreadyOnDisk was asked).
  Result<bool> PutDirect(const ChunkId& id, const uint8_t* data, size_t len);
  Result<bool> PutBuffered(const ChunkId& id, const void* data, size_t len);
  // PutBuffered's chunk file, also with AppendToPacks.
  Result<bool> PutChunkFile(const ChunkId& id, const void* data, size_t len);
  // Writes data[0..len) to `tmp` (fd open on it) and closes it; on failure `tmp` is gone.
  Status WriteTmp(const ChunkId& id, int fd, const std::string& tmp, const void* data, size_t len,
                  bool direct);
  // Either of those with AppendToPacks: the chunk appended to a pack.
  Result<bool> PutAppended(const ChunkId& id, const void* data, size_t len, bool aligned);
  // Whether chunk `id` already has its file or extent of `len` bytes (then entered in the disk
  // map).
  bool AlreadyOnDisk(const ChunkId& id, size_t len);
  // Whether chunk `id`'s extent of `len` bytes may be counted on (DistrustPacks): read and
  // verified first when not known to be sound.
  bool ExtentSure(const ChunkId& id, size_t len);
  // A fresh name under <dir>/tmp/ for a chunk file being written.
  std::string TmpPath(const ChunkId& id);
  // Writes data[0..len) as chunk `id` through a temporary file (fd open on `tmp`), then renames it.
  Result<bool> WriteChunkFile(const ChunkId& id, int fd, const std::string& tmp, const void* data,
                              size_t len, bool direct);
  // Disk accounting.
  void DiskAdd(const ChunkId& id, uint64_t size) REQUIRES(mu_);
  void DiskTouch(const ChunkId& id) REQUIRES(mu_);
  void DiskDrop(const ChunkId& id) REQUIRES(mu_);
  ChunkRef RamGet(const ChunkId& id) REQUIRES(mu_);
  void RamPut(const ChunkId& id, const ChunkRef& data) REQUIRES(mu_);

  std::atomic<bool> direct_refused_{false};  // the filesystem refused an O_DIRECT open
  const std::string dir_;  // <cache_dir>/chunks
  const int dirfd_;
  IoEngine* const engine_;
  const uint64_t ram_budget_;
  Metrics* const metrics_;
  Logger log_;
  const std::unique_ptr<Packs> packs_;  // its own lock, a leaf; never called under mu_
  // Set once by AppendToPacks; never called under mu_; goes before packs_ (ends its pack there).
  std::unique_ptr<AppendPacks> append_;

  std::atomic<bool> compacting_{false};  // a CompactPacks pass runs
  // Held by RemoveMany from its first unlink to its extents' drop, and by MoveIntoChunkFile from
  // its look at the extent to its rename. Taken before Packs' lock, never under mu_.
  Mutex remove_mu_;
  // CompactSoon's thread; compact_mu_ is a leaf.
  Mutex compact_mu_;
  std::condition_variable compact_cv_;
  bool compact_asked_ GUARDED_BY(compact_mu_) = false;
  bool compact_stop_ GUARDED_BY(compact_mu_) = false;
  std::thread compactor_ GUARDED_BY(compact_mu_);
  void CompactLoop();

  mutable Mutex mu_;  // guards everything below but what is set once
  using Lru = std::list<std::pair<ChunkId, ChunkRef>>;
  Lru lru_ GUARDED_BY(mu_);  // most recent first
  std::unordered_map<ChunkId, Lru::iterator, ChunkIdHash> ram_ GUARDED_BY(mu_);
  uint64_t ram_used_ GUARDED_BY(mu_) = 0;
  // A flight's result and done flag are guarded by mu_ too.
  std::unordered_map<ChunkId, std::shared_ptr<Inflight>, ChunkIdHash> inflight_ GUARDED_BY(mu_);
  uint64_t tmp_seq_ GUARDED_BY(mu_) = 0;

  // The disk tier's chunks in recency order (most recent first), with what eviction needs.
  std::vector<Backend*> tiers_;  // set once by AttachRemote
  std::function<bool(const ChunkId&)> keep_;  // set once by SetKeepFetched
  FetchedFromFar fetched_from_far_;           // set once by SetFetchedFromFar
  uint64_t disk_limit_ GUARDED_BY(mu_) = 0;
  struct DiskEntry {
    uint64_t size = 0;
    uint8_t tiers = 0;  // bit T: remote tier T holds it
    std::list<ChunkId>::iterator pos;
  };
  std::list<ChunkId> disk_lru_ GUARDED_BY(mu_);
  std::unordered_map<ChunkId, DiskEntry, ChunkIdHash> disk_ GUARDED_BY(mu_);
  bool Evictable(const ChunkId& id, const DiskEntry& d) const REQUIRES(mu_);
  uint64_t disk_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t local_only_bytes_ GUARDED_BY(mu_) = 0;
  std::unordered_map<ChunkId, uint64_t, ChunkIdHash> pinned_ GUARDED_BY(mu_);
  std::unordered_map<ChunkId, uint8_t, ChunkIdHash> protected_ GUARDED_BY(mu_);  // bit T: SetProtected(T)
  std::unordered_map<ChunkId, uint32_t, ChunkIdHash> held_ GUARDED_BY(mu_);
};

}  // namespace ckptfs
