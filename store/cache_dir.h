// CacheDir: a cache directory's layout and its ownership. Open makes the directories a store
// needs (staging/ for the daemon's spills, passthrough/ for staging files), takes the lock that
// keeps a second daemon out (an flock on <dir>/lock, which names the holder's pid once the
// store is open), and says whether the last daemon stopped cleanly: a clean stop leaves
// <dir>/clean, which Open removes, so that a crash from here on is seen by the next Open.
//
// Not thread-safe; the Store calls it from Open and Close only.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace ckptfs {

class CacheDir {
 public:
  // kBusy when another daemon holds the directory.
  static Result<std::unique_ptr<CacheDir>> Open(const std::string& dir);
  ~CacheDir();  // releases the lock
  CacheDir(const CacheDir&) = delete;
  CacheDir& operator=(const CacheDir&) = delete;

  // Whether the last daemon stopped cleanly (true for a new directory).
  bool clean() const { return clean_; }
  // Empties <dir>/staging (the spills of a daemon that died; nothing names them).
  void ClearSpills() const;
  // Writes this process's pid into the lock file (tools read it to find the daemon).
  void NoteOwner() const;
  // Leaves the marker of a clean stop. REQUIRES: everything is durable.
  void MarkClean() const;

 private:
  CacheDir(std::string dir, int lock_fd, bool clean)
      : dir_(std::move(dir)), lock_fd_(lock_fd), clean_(clean) {}
  const std::string dir_;
  const int lock_fd_;
  const bool clean_;
};

}  // namespace ckptfs
