// AppendPacks: the packs the daemon writes itself (Config::packs; cache/packs.h). Every chunk
// the local tier stores from the daemon's own bytes (ChunkCache::Put and its prepared form: the
// daemon's write path, a seal that copies) or from a remote tier (a fetch) is appended to the
// open *append pack* instead of getting a chunk file of its own: on ext4 each chunk file costs
// an inode, a directory entry and their journal traffic (over a quarter of a seal's CPU).
//
// A put reserves the room of its chunk at the pack's end under a short lock, writes its bytes
// there with no lock held (concurrent puts write side by side), and only then appends the '+'
// record of its extent (Packs::Record). Each extent starts on a kDirectAlign (4 KiB) boundary
// and its room is whole blocks: large chunks (and fetched ones) are written with O_DIRECT from
// their aligned, zero-padded buffers, small ones through the page cache; an extent's room is
// returned whole when it is punched; a chunk file took whole blocks too.
//
// At kBound bytes the next put starts a new pack. The bound keeps what one pack holds hostage
// small (a pack goes only with its last extent; its dead ranges are punched, but partial blocks
// stay), keeps the work of rewriting a sparse pack bounded, and keeps a pack's fdatasync (which
// SyncChunks runs for any extent in it) from sweeping up a whole save's unsynced bytes at once;
// a few hundred packs per TiB cost nothing to list or open.
//
// Crash safety (on top of cache/packs.h):
//   - A chunk is recorded only after its bytes are written: a crash never leaves a record of
//     bytes that were never written (before the page cache lost them: the machine's crash is
//     SyncChunks' to cover, which syncs the pack before its index, as before).
//   - A range reserved and not recorded (a put cut short by a crash, or one that failed) is no
//     extent: nothing reads it, and Packs::Open may punch it. A failed put punches it itself.
//   - While the daemon runs nothing punches a reserved range: a drop punches whole blocks inside
//     its own extent only, and the pack, registered as appended to (Packs::StartAppend), stays
//     even with no extent until the last put into it ends (Packs::EndAppend).
//   - Pack names ("append.<ns>") never meet a staging file's ("<ino>.<ns>"): an append pack
//     has a single name, so its dropped extents are always punched (Packs::Alone).
//
// Thread-safe: mu_ guards the open pack and its end; it is held only to reserve room or to
// start a pack, never over I/O but a new pack's creation. Lock order: mu_ before Packs' lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "cache/io_engine.h"
#include "cache/packs.h"
#include "common/chunk_id.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"

namespace ckptfs {

class AppendPacks {
 public:
  static constexpr uint64_t kBound = uint64_t{1} << 30;

  // packs, engine and metrics outlive this; `dir` is the packs' directory. bound: 0 is kBound.
  AppendPacks(Packs* packs, IoEngine* engine, Metrics* metrics, std::string dir, uint64_t bound,
              Logger log)
      : packs_(packs),
        engine_(engine),
        metrics_(metrics),
        dir_(std::move(dir)),
        bound_(bound ? bound : kBound),
        log_(std::move(log)) {}
  // Ends the open pack (Packs::EndAppend). REQUIRES: no put in flight.
  ~AppendPacks();
  AppendPacks(const AppendPacks&) = delete;
  AppendPacks& operator=(const AppendPacks&) = delete;

  // Stores data[0..len) as chunk `id` in the open pack and records its extent. `aligned`: data
  // starts on a kDirectAlign boundary and its DirectBlocks(len) bytes may be read, the padding
  // zero (then written with O_DIRECT where the filesystem allows). True when stored now, false
  // when the chunk got an extent meanwhile (the room taken is punched). ENOSPC is kNoSpace, the
  // room punched. REQUIRES: id == ChunkId::Of(data, len).
  Result<bool> Put(const ChunkId& id, const uint8_t* data, size_t len, bool aligned);

 private:
  struct Open;  // a pack open for appends, ended when its last put is done
  // Room for `room` bytes: its pack and offset (a new pack when the open one is full).
  Result<std::shared_ptr<Open>> Reserve(uint64_t room, uint64_t* offset);
  Result<std::shared_ptr<Open>> Start() REQUIRES(mu_);
  // Writes the bytes at `offset` of `pack`; *direct: O_DIRECT carried them.
  Status Write(const Open& pack, const uint8_t* data, size_t len, bool aligned, uint64_t offset,
               bool* direct);

  Packs* const packs_;
  IoEngine* const engine_;
  Metrics* const metrics_;
  const std::string dir_;
  const uint64_t bound_;
  const Logger log_;
  std::atomic<bool> direct_refused_{false};
  Mutex mu_;
  std::shared_ptr<Open> open_ GUARDED_BY(mu_);
  uint64_t end_ GUARDED_BY(mu_) = 0;  // the open pack's room reserved so far
};

}  // namespace ckptfs
