// FileWriter: the bytes of one file while it is being changed, until they are committed as a new
// manifest.
//
// The common case (torch.save, safetensors, DCP: a new file written front to back) streams: bytes
// go through the content-defined chunker as they arrive, each chunk is hashed and put on the local
// tier at once, and only the bytes after the last cut (at most one maximum chunk) stay in memory.
// Writes that arrive ahead of the stream end (the kernel's writeback may reorder them) wait in a
// bounded reorder window. A write into the not-yet-cut tail patches it in place. Anything else
// (rewriting bytes already cut into chunks) moves the file to a staging file on the local tier,
// which is chunked as a whole when the file is committed.
//
// Not thread-safe: the store serializes calls per inode.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/chunk_cache.h"
#include "common/config.h"
#include "common/metrics.h"
#include "common/payload_scanner.h"
#include "store/chunker.h"
#include "store/manifest.h"
#include "store/memory_budget.h"

namespace ckptfs {

class ThreadPool;

// A piece of a read's reply: `len` bytes at `data`, alive as long as `keep` is.
struct ReadSlice {
  std::shared_ptr<const void> keep;
  const uint8_t* data = nullptr;
  size_t len = 0;
};

// Appends to `out` the bytes [offset, offset+len) of manifest m (clipped to its size): holes as
// zeros, chunks through `get` (no copy: the slices keep the chunks alive).
Status ReadManifest(const Manifest& m, uint64_t offset, uint64_t len,
                    const std::function<Result<ChunkRef>(const ChunkId&, size_t)>& get,
                    std::vector<ReadSlice>* out);

// Where a FileWriter puts and gets chunks. The store implements it; tests may too.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  // Stores the chunk (a dedup hit when it is already stored) and holds it against reclamation
  // until the writer's holds are released.
  virtual Status PutChunk(const ChunkId& id, const uint8_t* data, size_t len) = 0;
  // PutChunk, which may finish after this returns: `data` may be reused at once, and `done` gets
  // what PutChunk would have returned, on another thread or before this returns (the default).
  // Once *cancelled is set (it stays valid until `done` runs), a put not yet begun may be skipped
  // and fail (kIo).
  virtual void PutChunkAsync(const ChunkId& id, const uint8_t* data, size_t len,
                             const std::atomic<bool>* cancelled, std::function<void(Status)> done) {
    (void)cancelled;
    done(PutChunk(id, data, len));
  }
  virtual Result<ChunkRef> GetChunk(const ChunkId& id, size_t len) = 0;
  // Whether the chunks cut from a file given to AdoptFile stay where they lie in it (PutInPlace)
  // instead of being put: that file becomes their home.
  virtual bool PutsInPlace() const { return false; }
  // Chunk `id` is bytes [offset, offset + len) of the adopted file. Holds the chunk as PutChunk
  // does; a sink whose PutsInPlace is false never gets this call.
  virtual Status PutInPlace(const ChunkId& id, uint64_t offset, size_t len) {
    (void)id;
    (void)offset;
    (void)len;
    return Status(Code::kInternal, "this chunk sink stores no chunk in place");
  }
  // A fresh path for a staging file on the local tier.
  virtual std::string NewStagingPath() = 0;
};

// The bytes after the last cut. Cutting consumes from the front without moving the rest; the
// remainder moves down only when an append would otherwise reallocate.
class TailBuffer {
 public:
  const uint8_t* data() const { return v_.data() + start_; }
  uint8_t* data() { return v_.data() + start_; }
  size_t size() const { return v_.size() - start_; }
  bool empty() const { return size() == 0; }
  void clear() {
    v_.clear();
    start_ = 0;
  }
  void Assign(const uint8_t* p, size_t n) {
    v_.assign(p, p + n);
    start_ = 0;
  }
  void Append(const uint8_t* p, size_t n) {
    MakeRoom(n);
    v_.insert(v_.end(), p, p + n);
  }
  // Grows with zeros or shrinks to n bytes.
  void Resize(size_t n) {
    const size_t had = size();
    Grow(n);
    if (n > had) std::memset(data() + had, 0, n - had);
  }
  // Resize, leaving grown bytes unset: for bytes about to be read into them.
  void Grow(size_t n) {
    if (n > size()) MakeRoom(n - size());
    v_.resize(start_ + n);
  }
  void Consume(size_t n) {
    start_ += n;
    if (start_ == v_.size()) clear();
  }
  void Release() {
    v_ = {};
    start_ = 0;
  }

 private:
  void MakeRoom(size_t more) {
    if (start_ > 0 && v_.size() + more > v_.capacity()) {
      v_.erase(v_.begin(), v_.begin() + static_cast<ptrdiff_t>(start_));
      start_ = 0;
    }
  }
  // An allocator whose resize leaves bytes unset (Resize sets them), so that a read into a grown
  // buffer does not write it twice.
  template <class T>
  struct Unset : std::allocator<T> {
    template <class U>
    struct rebind {
      using other = Unset<U>;
    };
    template <class U, class... Args>
    void construct(U* p, Args&&... args) {
      if constexpr (sizeof...(Args) == 0) {
        ::new (static_cast<void*>(p)) U;
      } else {
        ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
      }
    }
  };
  std::vector<uint8_t, Unset<uint8_t>> v_;
  size_t start_ = 0;
};

class FileWriter {
 public:
  // Starts from the committed bytes `base` (the file's manifest; empty for a new file). `scanners`
  // (may be empty) makes the payload scanner of a file written from its first byte, so chunks are
  // cut at tensor boundaries; other files are chunked by content alone.
  // `reorder_budget` (may be null): the daemon-wide memory out-of-order writes may hold; a write
  // that finds it spent moves the file to its staging file, as one past reorder_limit does.
  FileWriter(Manifest base, ChunkSink* sink, const ChunkingOptions& chunking,
             uint64_t reorder_limit, Metrics* metrics, PayloadScannerFactory scanners = {},
             MemoryBudget* reorder_budget = nullptr);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  Status Write(uint64_t offset, const uint8_t* data, size_t len);
  Status Truncate(uint64_t size);
  // Bytes [offset, offset + len) (clipped to the size) read as zeros and become a hole in the
  // manifest: the file moves to its staging file (holes there stay holes at Finish) and the range
  // is punched out of it. The size does not change.
  Status PunchHole(uint64_t offset, uint64_t len);
  // Appends to `out` the bytes [offset, offset+len) clipped to size().
  Status Read(uint64_t offset, size_t len, std::vector<ReadSlice>* out);
  uint64_t size() const { return size_; }

  // A staging file (AdoptFile, or a writer moved to one) is cut with help: its content-defined
  // cut candidates are found ahead of the cutting thread in `parts` pieces at once, all but one on
  // `pool` (which must not wait on this writer). The chunks are the same either way.
  void CutAhead(ThreadPool* pool, unsigned parts) {
    ahead_pool_ = parts > 1 ? pool : nullptr;
    ahead_parts_ = parts;
  }
  // Chunks whose cut was read off candidates found ahead.
  uint64_t cuts_from_candidates() const { return ahead_cuts_; }
  // Chunks whatever is left and returns the manifest of the file's new bytes. The writer is spent
  // afterwards. An error here or earlier is sticky: the new bytes cannot be committed.
  Result<Manifest> Finish();
  // Chunks this writer put (some possibly no longer in its manifest). The store releases them.
  const std::vector<ChunkId>& held() const { return held_; }
  bool staging() const { return mode_ == Mode::kStaging; }
  // Takes a file of `size` bytes that someone else wrote (a passthrough staging file, which the
  // caller keeps: a dup of fd is used and the file is not removed) as this writer's staging
  // file, so that Finish cuts it into chunks (holes stay holes). REQUIRES: nothing written yet.
  Status AdoptFile(int fd, uint64_t size);
  // While a staging file is cut, its chunks are put asynchronously (PutChunkAsync), up to
  // kPutWindow bytes of their copies' memory at a time (ChunkCache::CopyFootprint; one chunk
  // always), so that their disk writes overlap reading and hashing the next ones.
  static constexpr uint64_t kPutWindow = 16 << 20;

 private:
  enum class Mode { kStream, kStaging };

  uint64_t stream_end() const { return manifest_.size() + buf_.size(); }
  Status StreamWrite(uint64_t offset, const uint8_t* data, size_t len);
  Status CutChunks(bool final);
  // Cuts chunks off the front of buf into `into` (buf starts at file offset into->size()); final:
  // the rest becomes the last chunk.
  Status CutInto(TailBuffer& buf, bool final, Manifest* into);
  // Where the next chunk ends: at a tensor boundary or piece, else where content-defined chunking
  // says. p[0..avail) are the bytes from file offset pos; 0: more bytes are needed.
  size_t NextCut(uint64_t pos, const uint8_t* p, size_t avail, bool final);
  // Whether the cut of the chunk at pos (p[0..limit) its CDC bytes) can be read off ahead_,
  // finding the candidates of the bytes not covered yet first when that is worth it.
  bool UseAhead(uint64_t pos, const uint8_t* p, size_t limit);
  void PlanAhead(uint64_t pos, const uint8_t* p, size_t avail);
  // Bytes appended at the stream end, in order: the scanner sees them.
  void Scan(const uint8_t* data, size_t len) {
    if (scanner_) scanner_->Feed(data, len);
  }
  Status EmitChunk(const uint8_t* data, size_t len, Manifest* into);
  Status DrainPending();
  bool OverlapsPending(uint64_t begin, uint64_t end) const;
  Status ResumeTail();
  Status Rewind(uint64_t size);
  Status ToStaging();
  Result<Manifest> ChunkStagingFile();
  Result<Manifest> CutStagingFile();
  Status Fail(Status st);
  struct PutWindow;
  std::shared_ptr<PutWindow> window_;  // while a staging file is cut

  ChunkSink* const sink_;
  Metrics* const metrics_;
  const uint64_t reorder_limit_;
  MemoryBudget* const reorder_budget_;
  // pending_bytes_ less n, and n back to the budget.
  void ReleasePending(uint64_t n) {
    pending_bytes_ -= n;
    if (reorder_budget_) reorder_budget_->Release(n);
  }
  Chunker chunker_;
  ThreadPool* ahead_pool_ = nullptr;  // CutAhead
  unsigned ahead_parts_ = 1;
  bool cutting_staged_ = false;       // within CutStagingFile: ahead_ may be used
  CutCandidates ahead_;
  uint64_t ahead_dense_until_ = 0;    // candidates were too many up to here: scanned in line
  uint64_t ahead_cuts_ = 0;
  const uint32_t piece_bytes_;
  const PayloadScannerFactory scanners_;
  // Null when the bytes are not seen front to back (a rewrite, a hole): no hints from then on.
  std::unique_ptr<PayloadScanner> scanner_;
  Mode mode_ = Mode::kStream;
  Status error_;  // sticky

  // Stream mode: manifest_ holds the bytes cut so far, buf_ the bytes after the last cut, and
  // pending_ out-of-order writes beyond stream_end(), none overlapping another.
  Manifest manifest_;
  TailBuffer buf_;
  std::map<uint64_t, std::vector<uint8_t>> pending_;
  uint64_t pending_bytes_ = 0;
  bool tail_resumed_ = false;

  int staging_fd_ = -1;
  std::string staging_path_;
  bool adopted_ = false;  // staging_fd_ is a file given to AdoptFile

  uint64_t size_ = 0;
  std::vector<ChunkId> held_;
};

}  // namespace ckptfs
