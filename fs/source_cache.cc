// CacheDirSource: the views' sources in an unmounted cache directory (ckptfs convert
// --cache-dir): its LMDB metadata opened read-only, as `ckptfs stats` opens it, and its files'
// bytes from the local tier's chunk files, each verified against its name; a file still staged
// (written through passthrough, not yet cut into chunks) from its staging file; a chunk kept in a
// pack (cache/packs.h) from its extent, also verified; a chunk evicted to a remote tier from the
// tiers given (--backend).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "cache/chunk_cache.h"
#include "fs/checkpoint_source.h"
#include "store/meta_store.h"

namespace ckptfs::fs {
namespace {

constexpr uint64_t kMetaMapBytes = 64ull << 30;  // the map LMDB reserves; as the daemon's

// The bytes of `path`, [0, len): short when the file is.
Result<std::shared_ptr<ChunkData>> ReadWhole(const std::string& path, size_t len) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  auto data = ChunkData::Allocate(len);
  size_t got = 0;
  while (got < len) {
    const ssize_t n = ::pread(fd, data->bytes.get() + got, len - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  const int err = errno;
  ::close(fd);
  if (got != len) {
    return got < len && err ? Status::FromErrno(err, "read " + path)
                            : Corrupt(path + " is shorter than its record");
  }
  return data;
}

// The remote tiers a chunk missing from the local tier is fetched from, nearest first.
using Tiers = std::vector<std::unique_ptr<Backend>>;
// The extents of the local tier's packs, as their indexes list them (Packs::Scan).
using PackExtents = std::unordered_map<ChunkId, std::pair<std::string, Packs::Entry>, ChunkIdHash>;

// The bytes of chunk `id`'s extent, [0, len): short when the pack is; kNotFound when none.
Result<std::shared_ptr<ChunkData>> ReadExtent(const PackExtents& packs, const ChunkId& id,
                                              size_t len) {
  auto it = packs.find(id);
  if (it == packs.end() || it->second.second.len != len) return NotFound("no extent");
  const std::string& path = it->second.first;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  auto data = ChunkData::Allocate(len);
  size_t got = 0;
  while (got < len) {
    const ssize_t n = ::pread(fd, data->bytes.get() + got, len - got,
                              static_cast<off_t>(it->second.second.offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != len) return Corrupt(path + " is shorter than its index says");
  return data;
}

class CachedFile final : public SourceFile {
 public:
  CachedFile(std::string chunks, std::shared_ptr<const Tiers> tiers,
             std::shared_ptr<const PackExtents> packs, Manifest m, uint64_t generation)
      : chunks_(std::move(chunks)),
        tiers_(std::move(tiers)),
        packs_(std::move(packs)),
        m_(std::move(m)),
        generation_(generation) {}
  uint64_t size() const override { return m_.size(); }
  Status Read(uint64_t offset, uint64_t len, std::vector<ReadSlice>* out) const override {
    return ReadManifest(m_, offset, len, [this](const ChunkId& id, size_t n) {
      return Chunk(id, n);
    }, out);
  }
  bool SameVersion(const SourceFile& now) const override {
    const auto* o = dynamic_cast<const CachedFile*>(&now);
    return o && o->generation_ == generation_ && o->m_ == m_;
  }

 private:
  // A chunk from the local tier, else from the remote tiers, verified against its name (no RAM
  // tier: each byte is read once).
  Result<ChunkRef> Chunk(const ChunkId& id, size_t len) const {
    const std::string hex = id.Hex();
    const std::string path = chunks_ + "/" + hex.substr(0, 2) + "/" + hex;
    auto data = ReadWhole(path, len);
    if (!data.ok() && data.status().code() == Code::kNotFound) data = ReadExtent(*packs_, id, len);
    if (!data.ok() && data.status().code() == Code::kNotFound) return Fetch(id, len);
    RETURN_IF_ERROR(data.status());
    if (!(ChunkId::Of((*data)->bytes.get(), len) == id)) {
      return Corrupt("chunk " + hex + " does not hash to its name (ckptfs fsck --deep --repair "
                     "on a mount of this cache directory)");
    }
    return ChunkRef(std::move(*data));
  }

  Result<ChunkRef> Fetch(const ChunkId& id, size_t len) const {
    const std::string hex = id.Hex();
    if (tiers_->empty()) {
      return NotFound("chunk " + hex + " is not on the local tier (evicted to a remote tier: "
                      "give that tier with --backend, or convert from a mount of this cache "
                      "directory)");
    }
    for (const auto& tier : *tiers_) {
      auto data = ChunkData::Allocate(len);
      auto got = tier->GetExact(ChunkCache::ObjectKey(id), data->bytes.get(), len);
      if (!got.ok() && got.status().code() == Code::kNotFound) continue;
      if (!got.ok()) {
        return IoError("chunk " + hex + " from " + tier->Describe() + ": " +
                       got.status().message());
      }
      if (*got != len || !(ChunkId::Of(data->bytes.get(), len) == id)) {
        return Corrupt("chunk " + hex + " in " + tier->Describe() + " does not hash to its "
                       "name (ckptfs fsck --repair on a mount)");
      }
      return ChunkRef(std::move(data));
    }
    return NotFound("chunk " + hex + " is neither on the local tier nor in the tiers given");
  }

  const std::string chunks_;
  const std::shared_ptr<const Tiers> tiers_;
  const std::shared_ptr<const PackExtents> packs_;
  const Manifest m_;
  const uint64_t generation_;
};

class StagedFile final : public SourceFile {
 public:
  StagedFile(int fd, StagedRecord rec, std::string path)
      : fd_(fd), rec_(std::move(rec)), path_(std::move(path)) {}
  ~StagedFile() override { ::close(fd_); }
  uint64_t size() const override { return rec_.size; }
  Status Read(uint64_t offset, uint64_t len, std::vector<ReadSlice>* out) const override {
    if (offset >= size()) return Status::Ok();
    return PreadSlice(fd_, offset, std::min(len, size() - offset), path_, out);
  }
  bool SameVersion(const SourceFile& now) const override {
    const auto* o = dynamic_cast<const StagedFile*>(&now);
    return o && o->rec_.name == rec_.name && o->rec_.size == rec_.size &&
           o->rec_.mtime_ns == rec_.mtime_ns;
  }

 private:
  const int fd_;
  const StagedRecord rec_;
  const std::string path_;
};

class CacheDirSource final : public CheckpointSource {
 public:
  CacheDirSource(std::string dir, std::unique_ptr<MetaStore> meta, Tiers tiers)
      : dir_(std::move(dir)),
        meta_(std::move(meta)),
        tiers_(std::make_shared<const Tiers>(std::move(tiers))),
        packs_(std::make_shared<const PackExtents>(Packs::Scan(dir_ + "/chunks/packs"))) {}

  Result<InodeRecord> Lookup(uint64_t dir, std::string_view name) override {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(DirEntry e, txn.GetEntry(dir, name));
    return Attr(txn, e.ino);
  }
  Result<InodeRecord> GetAttr(uint64_t id) override {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    return Attr(txn, id);
  }
  Status ReadDir(uint64_t dir, uint64_t offset,
                 const std::function<bool(const DirItem&)>& fn) override {
    // The store's numbering (Store::ReadDir): 1 after ".", 2 after "..", cookie + 2 after an
    // entry.
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(dir));
    if (!S_ISDIR(rec.mode)) return Status(Code::kNotDir, "not a directory");
    if (offset < 1 && !fn(DirItem{".", dir, S_IFDIR, 1})) return Status::Ok();
    if (offset < 2 && !fn(DirItem{"..", dir, S_IFDIR, 2})) return Status::Ok();
    return txn.ListDir(dir, offset > 2 ? offset - 2 : 0,
                       [&](std::string_view name, const DirEntry& e) {
                         return fn(DirItem{name, e.ino, e.mode, e.cookie + 2});
                       });
  }
  Result<std::shared_ptr<const SourceFile>> Open(uint64_t file) override {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(file));
    if (S_ISDIR(rec.mode)) return Status(Code::kIsDir, "a directory");
    if (!S_ISREG(rec.mode)) return Invalid("not a regular file");
    ASSIGN_OR_RETURN(auto staged, txn.GetStaged(file));
    if (staged) {  // not cut into chunks yet: its bytes are the staging file's
      const std::string path = dir_ + "/passthrough/" + staged->name;
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return Status::FromErrno(errno, "open staging file " + path);
      struct stat st;
      if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < staged->size) {
        ::close(fd);
        return Corrupt("staging file " + path + " is shorter than its record");
      }
      return std::shared_ptr<const SourceFile>(
          std::make_shared<StagedFile>(fd, std::move(*staged), path));
    }
    ASSIGN_OR_RETURN(auto m, txn.GetManifest(file));
    return std::shared_ptr<const SourceFile>(std::make_shared<CachedFile>(
        dir_ + "/chunks", tiers_, packs_, m ? std::move(*m) : Manifest(), rec.generation));
  }
  std::string Describe(uint64_t dir) override {
    auto txn = meta_->Begin(false);
    if (!txn.ok()) return "";
    auto path = txn->PathOf(dir);
    return path.ok() ? "/" + *path : "";
  }

 private:
  // A file's attributes as the mount shows them: a staged file's size is its staging record's.
  static Result<InodeRecord> Attr(MetaStore::Txn& txn, uint64_t ino) {
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    if (S_ISREG(rec.mode)) {
      ASSIGN_OR_RETURN(auto staged, txn.GetStaged(ino));
      if (staged) rec.size = staged->size;
    }
    return rec;
  }

  const std::string dir_;
  const std::unique_ptr<MetaStore> meta_;
  const std::shared_ptr<const Tiers> tiers_;  // shared with the files opened
  const std::shared_ptr<const PackExtents> packs_;  // the same
};

}  // namespace

Result<std::unique_ptr<CheckpointSource>> OpenCacheDirSource(
    const std::string& cache_dir, const std::string& path, uint64_t* root,
    std::vector<std::unique_ptr<Backend>> tiers) {
  struct stat st;
  if (::stat((cache_dir + "/meta").c_str(), &st) != 0) {
    return NotFound(cache_dir + " is no ckptfs cache directory (no meta/)");
  }
  ASSIGN_OR_RETURN(auto meta, MetaStore::Open(cache_dir + "/meta", kMetaMapBytes, true));
  uint64_t ino = kRootIno;
  {
    ASSIGN_OR_RETURN(auto txn, meta->Begin(false));
    size_t at = 0;
    while (at < path.size()) {
      const size_t slash = path.find('/', at);
      const std::string name = path.substr(at, slash == std::string::npos ? slash : slash - at);
      at = slash == std::string::npos ? path.size() : slash + 1;
      if (name.empty() || name == ".") continue;
      auto e = txn.GetEntry(ino, name);
      if (!e.ok()) return Status(e.status().code(), path + " in " + cache_dir + ": " +
                                                        e.status().message());
      ino = e->ino;
    }
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    if (!S_ISDIR(rec.mode)) return Invalid(path + " in " + cache_dir + " is not a directory");
  }
  *root = ino;
  return std::unique_ptr<CheckpointSource>(
      std::make_unique<CacheDirSource>(cache_dir, std::move(meta), std::move(tiers)));
}

}  // namespace ckptfs::fs
