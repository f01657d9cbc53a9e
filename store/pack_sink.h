// PackSink: the ChunkSink of a seal that keeps its staging file as the home of its chunks (a
// pack, cache/packs.h) instead of writing them again (Config::packs; store/staging.cc, Seal).
//
// While the file is cut, each chunk is held (LocalChunks::Hold, released with the writer's other
// holds after the commit) and noted: new ones as extents to record, ones stored already (a chunk
// file, another pack's extent, or an earlier chunk of this file) as ranges to punch. Before the
// commit the seal either adopts the file as a pack (Adopt) or, when a passthrough reader still
// holds the staging file (which the kernel may let a new writer change), copies the new chunks
// into chunk files (Copy), as seals did before packs; so it does when a process it does not see
// may still write the file (NoOtherOpens). After the commit, once the staging file's
// own name is gone, Punch returns the room of the chunks stored twice.
//
// Not thread-safe: one seal's cutting thread calls it (FileWriter::EmitChunk).
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include "cache/chunk_cache.h"
#include "common/metrics.h"
#include "store/file_writer.h"
#include "store/local_chunks.h"

namespace ckptfs {

class PackSink final : public ChunkSink {
 public:
  // chunks, cache and metrics outlive this.
  PackSink(LocalChunks* chunks, ChunkCache* cache, Metrics* metrics)
      : chunks_(chunks), cache_(cache), metrics_(metrics) {}

  Status PutChunk(const ChunkId& id, const uint8_t* data, size_t len) override {
    return chunks_->PutChunk(id, data, len);
  }
  void PutChunkAsync(const ChunkId& id, const uint8_t* data, size_t len,
                     const std::atomic<bool>* cancelled,
                     std::function<void(Status)> done) override {
    chunks_->PutChunkAsync(id, data, len, cancelled, std::move(done));
  }
  Result<ChunkRef> GetChunk(const ChunkId& id, size_t len) override {
    return chunks_->GetChunk(id, len);
  }
  std::string NewStagingPath() override { return chunks_->NewStagingPath(); }
  bool PutsInPlace() const override { return true; }
  Status PutInPlace(const ChunkId& id, uint64_t offset, size_t len) override;

  // Makes the staging file at `path` pack `name`, the home of the new chunks; those stored
  // meanwhile by someone else join the ranges to punch.
  Status Adopt(const std::string& path, const std::string& name);
  // Whether nobody but the daemon's own open file `fd` has the staging file open, so that no one
  // can write it once it is a pack: the kernel grants a write lease (F_SETLEASE) only then. A
  // writer the daemon does not count (a writable shared mapping kept after its close, which
  // FUSE passthrough hands to the staging file itself; a descriptor left from a daemon that
  // died) keeps it open. The seal asks before the cut and again before Adopt; when either
  // answer is no, it copies (Copy).
  static bool NoOtherOpens(int fd);
  // Instead of Adopt: writes the new chunks, read from `fd` (the staging file), as chunk files.
  Status Copy(int fd);
  // After the commit, once the staging file's own name is gone: punches the ranges of the chunks
  // stored elsewhere out of pack `name` (nothing when Adopt made none). Errors are logged.
  void Punch(const std::string& name, const Logger& log);

 private:
  LocalChunks* const chunks_;
  ChunkCache* const cache_;
  Metrics* const metrics_;
  std::vector<Packs::Entry> fresh_;  // chunks first stored by this file
  std::vector<Packs::Range> punch_;  // chunks stored elsewhere
  std::unordered_set<ChunkId, ChunkIdHash> seen_;
  bool adopted_ = false;
};

}  // namespace ckptfs
