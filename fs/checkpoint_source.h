// Where the views read their checkpoints from: one interface, so that a view is planned and read
// the same way in a mounted daemon (StoreSource: the store's committed files) and without a mount
// (DirSource: a plain directory of checkpoint files; OpenCacheDirSource: an unmounted cache
// directory; for `ckptfs convert` and `ckptfs inspect --view`).
//
// A source names its files and directories by 64-bit ids (the store's inode numbers; DirSource
// hands out its own). Open gives one immutable version of a file: its reads return that
// version's bytes, or kNotFound once the version is gone; SameVersion tells whether the file
// still holds it (a view planned against it is then still valid).
//
// Thread-safe: every method may be called from several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "common/status.h"
#include "store/store.h"

namespace ckptfs::fs {

class SourceFile {
 public:
  virtual ~SourceFile() = default;
  virtual uint64_t size() const = 0;
  // Appends slices of bytes [offset, offset + len), clipped at size(), to *out, in order.
  // kNotFound: this version of the file is gone.
  virtual Status Read(uint64_t offset, uint64_t len, std::vector<ReadSlice>* out) const = 0;
  // A hint that bytes [offset, offset + len) will be read soon.
  virtual void Warm(uint64_t offset, uint64_t len) const {
    (void)offset;
    (void)len;
  }
  // Whether `now` (the same file opened again) is this version.
  virtual bool SameVersion(const SourceFile& now) const = 0;
};

class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  // The entry `name` of directory `dir` (ino, mode, size, owner, times). kNotFound when absent.
  virtual Result<InodeRecord> Lookup(uint64_t dir, std::string_view name) = 0;
  virtual Result<InodeRecord> GetAttr(uint64_t id) = 0;
  // Directory `dir`'s entries from readdir offset `offset` as the store numbers them: "." (0),
  // ".." (1), then the entries; fn returns false to stop.
  virtual Status ReadDir(uint64_t dir, uint64_t offset,
                         const std::function<bool(const DirItem&)>& fn) = 0;
  // The current version of regular file `file`. kIsDir for a directory.
  virtual Result<std::shared_ptr<const SourceFile>> Open(uint64_t file) = 0;
  // Directory `dir`'s path, for log lines; "" when unknown.
  virtual std::string Describe(uint64_t dir) = 0;
  // Counts one plan made (the store's view_plans metric).
  virtual void CountPlan() {}
};

// Bytes [offset, offset + len) of open file `fd` (`path` names it in errors) read into a buffer
// of their own and appended to *out; fewer where the file ends.
Status PreadSlice(int fd, uint64_t offset, uint64_t len, const std::string& path,
                  std::vector<ReadSlice>* out);

// The mounted store's committed files. `store` outlives it.
std::unique_ptr<CheckpointSource> NewStoreSource(Store* store);

// The unmounted cache directory `cache_dir` (its metadata read-only, the local tier's chunks
// verified on read, staged files from their staging files), checkpoint directory `path` of its
// namespace ("" or "/" for the root) the tree's root: its id goes to *root. A chunk not on the
// local tier (evicted to a remote tier) is fetched from `tiers`, nearest first, and verified
// against its name; kept in memory only for the read. Without tiers, or where none holds it,
// the read fails (kNotFound, saying so). Errors: no such cache directory or directory in it.
Result<std::unique_ptr<CheckpointSource>> OpenCacheDirSource(
    const std::string& cache_dir, const std::string& path, uint64_t* root,
    std::vector<std::unique_ptr<Backend>> tiers);

// The plain directory `root` (and everything below it) of a local filesystem, read with pread;
// its id is RootId. A file's version is its (device, inode, size, mtime, ctime): a file changed
// in place after Open is read as it is now (as cp would), and SameVersion tells the change.
class DirSource : public CheckpointSource {
 public:
  static constexpr uint64_t kRootId = 1;
  // Errors: `root` is not a directory that can be read.
  static Result<std::unique_ptr<DirSource>> Make(const std::string& root);
  ~DirSource() override;

  Result<InodeRecord> Lookup(uint64_t dir, std::string_view name) override;
  Result<InodeRecord> GetAttr(uint64_t id) override;
  Status ReadDir(uint64_t dir, uint64_t offset,
                 const std::function<bool(const DirItem&)>& fn) override;
  Result<std::shared_ptr<const SourceFile>> Open(uint64_t file) override;
  std::string Describe(uint64_t dir) override;

 private:
  struct Ids;
  explicit DirSource(std::unique_ptr<Ids> ids);
  std::unique_ptr<Ids> ids_;
};

}  // namespace ckptfs::fs
