// OpenFile: the state of one file the store has in use, shared by its code for file bytes
// (store/file_sessions.h), staged files (store/staging.h) and the namespace: the writer of the session
// not yet committed, its write queue, the staging file of passthrough handles, and what GetAttr
// shows meanwhile. An entry lives in the OpenTable (store/open_table.h) while the file is open or
// pinned (a seal, a change through a handle); users hold it by shared_ptr.
//
// Lock order within one file: seal_mu -> mu -> qmu. qmu is never held while taking mu; which lock
// guards each field is said beside it. Against the store's locks, mu is taken before the
// namespace lock (store/store.h).
#pragma once

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/chunk_id.h"
#include "common/status.h"
#include "store/file_writer.h"
#include "store/manifest.h"
#include "store/meta_store.h"

namespace ckptfs {

// A write acknowledged to the kernel and not yet applied to the file's writer.
struct QueuedWrite {
  uint64_t offset;
  std::unique_ptr<uint8_t[]> data;
  size_t len;
};

struct OpenFile {
  std::mutex mu;  // guards writer and manifest; held while a write is applied
  int opens = 0;  // guarded by the OpenTable's lock (store/open_table.h)
  std::unique_ptr<FileWriter> writer;
  std::shared_ptr<const Manifest> manifest;  // committed bytes, loaded on first read

  // The write queue. Write() appends and returns; one pool task at a time drains it into the
  // writer. Taken after mu, never before it.
  std::mutex qmu;
  std::condition_variable qcv;                   // signalled when the queue shrinks
  std::condition_variable released;  // with mu: a staging file's writer count went down
  std::deque<QueuedWrite> queue;                 // guarded by qmu
  uint64_t queued_bytes = 0;                     // guarded by qmu
  bool draining = false;                         // guarded by qmu: a drain task is scheduled
  Status async_error;                            // guarded by qmu: sticky until reported
  std::unordered_set<uint64_t> session;          // guarded by qmu: handles that wrote
  bool unborn = false;  // guarded by mu: made by CreateFile, not yet committed or closed
  uint64_t creator_fh = 0;  // guarded by mu: the handle CreateFile opened
  uint64_t committed_size = 0;                   // guarded by qmu: the size in LMDB
  uint64_t committed_data = 0;                   // guarded by qmu: its bytes in chunks (no holes)

  // What GetAttr shows while the file has uncommitted bytes; read without locks.
  std::atomic<bool> dirty{false};
  std::atomic<uint64_t> size{0};
  // The bytes st_blocks counts: the committed ones, plus every byte written since, at most the
  // size (an overwrite counts twice until the commit; a hole made by extending counts none).
  std::atomic<uint64_t> data_bytes{0};
  std::atomic<int64_t> mtime_ns{0};
  // REQUIRES: qmu held. GetAttr's size and st_blocks bytes become the committed ones.
  void ShowCommitted() {
    size = committed_size;
    data_bytes = committed_data;
  }
  // REQUIRES: qmu held. After a commit or a dropped session: the file stays dirty while writes
  // acknowledged since wait in the queue, else shows its committed bytes again.
  void EndSession() {
    dirty = queued_bytes > 0;
    if (!dirty) ShowCommitted();
  }

  // Passthrough (store/staging.h), guarded by mu: the staging file that holds the newest bytes
  // while the kernel reads and writes it directly, and the handles served from it.
  struct Stage {
    ~Stage() {
      if (fd >= 0) ::close(fd);
    }
    int fd = -1;
    std::string name;  // under <cache_dir>/passthrough/
    std::unordered_map<uint64_t, bool> handles;  // fh -> may write
    int writers = 0;
    // Writer handles whose close (FLUSH) committed the bytes; the kernel sends their RELEASE
    // after close(2) has returned, so a reader may come first (see Seal's wait_release).
    std::unordered_set<uint64_t> closed;
    bool dirty = false;     // its bytes are not (yet) the committed manifest's
    bool recorded = false;  // a staged record names it (the file's committed bytes)
    bool durable = false;   // fsync recorded it: its later records are made durable too
    std::string replaces;   // the staging file of the version it replaces, removed at its commit
    StagedRecord::Stamp stamp;  // the file as last recorded
    // A close refused this session's bytes (no room, or their commit failed): later commits
    // fail too, and no reader is served them.
    Status failed;
    uint64_t epoch = 0;     // bumped by every writable open and truncate: a seal started
                            // before it is stale
  };
  std::unique_ptr<Stage> stage;
  // A descriptor of the staging file while a writer has it (GetAttr's size and time come from
  // it), guarded by qmu: read without taking mu.
  std::shared_ptr<const int> writing_fd;
  int cached_opens = 0;  // guarded by mu: handles served through the daemon (page cache)
  std::mutex seal_mu;    // one seal of this file at a time; taken before mu
  // What commits left to do once mu is released (RunAfterCommit), guarded by mu.
  std::vector<ChunkId> after_freed;
  bool after_committed = false;

  // Readahead of committed bytes (guarded by mu): the extent index the last read ended in,
  // and the highest index already prefetched for this manifest.
  size_t last_extent = SIZE_MAX;
  size_t prefetched_upto = 0;
  const Manifest* prefetched_for = nullptr;
};

}  // namespace ckptfs
