// Namespace: inodes, directory entries, links, attributes and xattrs (store/namespace.h).
#include "store/namespace.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <utility>

#include "store/chunk_refs.h"
#include "store/remote_tier.h"
#include "store/retention.h"
#include "store/retention_pass.h"
#include "store/staged_meta.h"
#include "store/tree_walk.h"

namespace ckptfs {
namespace {

constexpr size_t kMaxName = 255;
constexpr size_t kMaxXattrValue = 64 * 1024;

Status CheckName(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return Invalid("bad name");
  if (name.size() > kMaxName) return Status(Code::kNameTooLong, std::string(name.substr(0, 32)));
  return Status::Ok();
}

Result<InodeRecord> GetDir(MetaStore::Txn& txn, uint64_t ino) {
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  if (!S_ISDIR(rec.mode)) return Status(Code::kNotDir, "inode " + std::to_string(ino));
  return rec;
}

}  // namespace

Namespace::Namespace(std::string cache_dir, MetaStore* meta, ChunkCache* cache,
                     LocalChunks* chunks, Publisher* publisher, OpenTable* files, Logger log,
                     std::string boot_id, double settle_interval_s, Hooks hooks)
    : cache_dir_(std::move(cache_dir)),
      meta_(meta),
      chunks_(chunks),
      publisher_(publisher),
      files_(files),
      log_(std::move(log)),
      hooks_(std::move(hooks)),
      fallbacks_(std::make_unique<Fallbacks>(meta, cache, chunks, mu_, log_, std::move(boot_id),
                                             settle_interval_s)) {}

// --- the one path of every change ---

Status Namespace::Apply(const ChangeFn& fn, Change* c, InodeRecord* shown) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  RETURN_IF_ERROR(fn(txn, *c));
  if (!c->commit) return Status::Ok();  // the transaction aborts
  RETURN_IF_ERROR(txn.Commit());
  if (shown && hooks_.show) hooks_.show(shown->ino, shown);
  return Status::Ok();
}

Status Namespace::Mutate(const ChangeFn& fn, InodeRecord* shown) {
  Change c;
  RETURN_IF_ERROR(Apply(fn, &c, shown));
  if (!c.commit) return Status::Ok();
  if (c.publish) publisher_->Kick();
  chunks_->Reclaim(c.freed);
  return Status::Ok();
}

// --- reads ---

Result<uint64_t> Namespace::Lookup(uint64_t parent, std::string_view name) {
  if (name.size() > kMaxName) return Status(Code::kNameTooLong, "lookup");
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, parent));
  (void)dir;
  ASSIGN_OR_RETURN(DirEntry e, txn.GetEntry(parent, name));
  return e.ino;
}

Result<InodeRecord> Namespace::GetAttr(uint64_t ino) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  RETURN_IF_ERROR(OverlayStaged(txn, &rec));
  return rec;
}

Result<std::string> Namespace::ReadLink(uint64_t ino) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  if (!S_ISLNK(rec.mode)) return Invalid("not a symlink");
  return txn.GetSymlink(ino);
}

Status Namespace::ReadDir(uint64_t dir, uint64_t offset,
                          const std::function<bool(const DirItem&)>& fn) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, GetDir(txn, dir));
  // Offsets: 1 after ".", 2 after "..", cookie + 2 after an entry.
  if (offset < 1 && !fn(DirItem{".", rec.ino, S_IFDIR, 1})) return Status::Ok();
  if (offset < 2 && !fn(DirItem{"..", rec.ino, S_IFDIR, 2})) return Status::Ok();
  const uint64_t after = offset > 2 ? offset - 2 : 0;
  return txn.ListDir(dir, after, [&](std::string_view name, const DirEntry& e) {
    return fn(DirItem{name, e.ino, e.mode, e.cookie + 2});
  });
}

Result<std::string> Namespace::GetXattr(uint64_t ino, std::string_view name) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  (void)rec;
  return txn.GetXattr(ino, name);
}

Result<std::vector<std::string>> Namespace::ListXattrs(uint64_t ino) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  (void)rec;
  std::vector<std::string> names;
  RETURN_IF_ERROR(txn.ListXattrs(ino, [&](std::string_view n) { names.emplace_back(n); }));
  return names;
}

// --- changes ---

Result<InodeRecord> Namespace::ClearModeBits(uint64_t ino, uint32_t bits) {
  InodeRecord rec;
  RETURN_IF_ERROR(Mutate([&](MetaStore::Txn& txn, Change& c) REQUIRES(mu_) -> Status {
    ASSIGN_OR_RETURN(rec, txn.GetInode(ino));
    if (!(rec.mode & bits)) {
      c.commit = false;
      return Status::Ok();
    }
    rec.mode &= ~(bits & 07777);
    rec.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutInode(rec));
    return OverlayStaged(txn, &rec);  // what is shown, not stored
  }, &rec));
  return rec;
}

Result<InodeRecord> Namespace::SetAttr(uint64_t ino, const SetAttrRequest& req, int64_t now) {
  InodeRecord rec;
  RETURN_IF_ERROR(Mutate([&](MetaStore::Txn& txn, Change&) REQUIRES(mu_) -> Status {
    ASSIGN_OR_RETURN(rec, txn.GetInode(ino));
    if (req.mode) rec.mode = (rec.mode & S_IFMT) | (*req.mode & 07777);
    if (req.uid) rec.uid = *req.uid;
    if (req.gid) rec.gid = *req.gid;
    if (req.atime_ns) rec.atime_ns = *req.atime_ns == SetAttrRequest::kNow ? now : *req.atime_ns;
    if (req.mtime_ns) {
      rec.mtime_ns = *req.mtime_ns == SetAttrRequest::kNow ? now : *req.mtime_ns;
      if (auto f = files_->Find(ino)) f->mtime_ns = rec.mtime_ns;
      // A staged file's time is its record's (what a seal commits).
      ASSIGN_OR_RETURN(auto staged, txn.GetStaged(ino));
      if (staged) {
        staged->mtime_ns = rec.mtime_ns;
        RETURN_IF_ERROR(txn.PutStaged(ino, *staged));
      }
    }
    rec.ctime_ns = now;
    RETURN_IF_ERROR(txn.PutInode(rec));
    return OverlayStaged(txn, &rec);  // what is shown, not stored
  }, &rec));
  return rec;
}

Result<InodeRecord> Namespace::MakeNode(uint64_t parent, std::string_view name, uint32_t mode,
                                        uint64_t rdev, const Caller& who, bool unborn) {
  RETURN_IF_ERROR(CheckName(name));
  InodeRecord rec;
  RETURN_IF_ERROR(Mutate([&](MetaStore::Txn& txn, Change& c) REQUIRES(mu_) -> Status {
    ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, parent));
    auto existing = txn.GetEntry(parent, name);
    if (existing.ok()) return Status(Code::kExists, std::string(name));
    if (existing.status().code() != Code::kNotFound) return existing.status();
    ASSIGN_OR_RETURN(rec.ino, txn.AllocIno());
    rec.mode = mode;
    rec.uid = who.uid;
    rec.gid = who.gid;
    if (dir.mode & S_ISGID) {  // BSD group semantics for setgid directories
      rec.gid = dir.gid;
      if (S_ISDIR(mode)) rec.mode |= S_ISGID;
    }
    rec.rdev = rdev;
    rec.nlink = S_ISDIR(mode) ? 2 : 1;
    rec.atime_ns = rec.mtime_ns = rec.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutEntry(dir, name, rec.ino, rec.mode));
    if (S_ISDIR(mode)) ++dir.nlink;
    dir.mtime_ns = dir.ctime_ns = rec.ctime_ns;
    RETURN_IF_ERROR(txn.PutInode(dir));
    RETURN_IF_ERROR(txn.PutInode(rec));
    c.publish = true;
    if (unborn) return txn.AddUnborn(rec.ino);  // published at its first commit or close
    return QueueTree(txn, rec.ino, ChildPath(txn, parent, name), true);
  }));
  return rec;
}

Status Namespace::UndoCreate(uint64_t parent, std::string_view name, uint64_t ino) {
  return Mutate([&](MetaStore::Txn& txn, Change& c) REQUIRES(mu_) -> Status {
    // Only the entry this create made, of a file nobody has opened since.
    c.commit = false;
    if (files_->IsOpen(ino)) return Status::Ok();
    auto e = txn.GetEntry(parent, name);
    if (!e.ok() || e->ino != ino) return Status::Ok();
    ASSIGN_OR_RETURN(bool unborn, txn.IsUnborn(ino));
    if (!unborn) return Status::Ok();
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    ASSIGN_OR_RETURN(InodeRecord dir, txn.GetInode(parent));
    RETURN_IF_ERROR(txn.DelEntry(parent, name));
    dir.mtime_ns = dir.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutInode(dir));
    RETURN_IF_ERROR(DropLink(txn, rec, &c.freed));
    c.commit = true;
    return txn.DelOrphan(ino);
  });
}

Status Namespace::KeepCreated(uint64_t ino) {
  return Mutate([&](MetaStore::Txn& txn, Change& c) REQUIRES(mu_) -> Status {
    RETURN_IF_ERROR(txn.ClearUnborn(ino));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    c.publish = true;
    return QueueRemote(txn, remote_op::PublishFile(ino, rec.path_epoch));
  });
}

Result<InodeRecord> Namespace::Symlink(uint64_t parent, std::string_view name,
                                       std::string_view target, const Caller& who) {
  RETURN_IF_ERROR(CheckName(name));
  if (target.empty()) return Invalid("empty symlink target");
  if (target.size() > 4095) return Status(Code::kNameTooLong, "symlink target");
  InodeRecord rec;
  RETURN_IF_ERROR(Mutate([&](MetaStore::Txn& txn, Change&) REQUIRES(mu_) -> Status {
    ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, parent));
    if (txn.GetEntry(parent, name).ok()) return Status(Code::kExists, std::string(name));
    ASSIGN_OR_RETURN(rec.ino, txn.AllocIno());
    rec.mode = S_IFLNK | 0777;
    rec.uid = who.uid;
    rec.gid = (dir.mode & S_ISGID) ? dir.gid : who.gid;
    rec.nlink = 1;
    rec.size = target.size();
    rec.atime_ns = rec.mtime_ns = rec.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutEntry(dir, name, rec.ino, rec.mode));
    dir.mtime_ns = dir.ctime_ns = rec.ctime_ns;
    RETURN_IF_ERROR(txn.PutInode(dir));
    RETURN_IF_ERROR(txn.PutInode(rec));
    return txn.PutSymlink(rec.ino, target);
  }));
  return rec;
}

Result<InodeRecord> Namespace::Link(uint64_t ino, uint64_t new_parent,
                                    std::string_view new_name) {
  RETURN_IF_ERROR(CheckName(new_name));
  InodeRecord rec;
  RETURN_IF_ERROR(Mutate([&](MetaStore::Txn& txn, Change&) REQUIRES(mu_) -> Status {
    ASSIGN_OR_RETURN(rec, txn.GetInode(ino));
    if (S_ISDIR(rec.mode)) return Status(Code::kPermission, "hard link to a directory");
    ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, new_parent));
    if (txn.GetEntry(new_parent, new_name).ok()) {
      return Status(Code::kExists, std::string(new_name));
    }
    const int64_t now = NowNs();
    RETURN_IF_ERROR(txn.PutEntry(dir, new_name, ino, rec.mode));
    dir.mtime_ns = dir.ctime_ns = now;
    RETURN_IF_ERROR(txn.PutInode(dir));
    ++rec.nlink;
    rec.ctime_ns = now;
    return txn.PutInode(rec);
  }, &rec));
  return rec;
}

Status Namespace::Unlink(uint64_t parent, std::string_view name) {
  return Mutate([&](MetaStore::Txn& txn, Change& c) REQUIRES(mu_) -> Status {
    ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, parent));
    ASSIGN_OR_RETURN(DirEntry e, txn.GetEntry(parent, name));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(e.ino));
    if (S_ISDIR(rec.mode)) return Status(Code::kIsDir, std::string(name));
    RETURN_IF_ERROR(QueueTree(txn, rec.ino, ChildPath(txn, parent, name), false));
    RETURN_IF_ERROR(txn.DelEntry(parent, name));
    dir.mtime_ns = dir.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutInode(dir));
    c.publish = true;
    return DropLink(txn, rec, &c.freed);
  });
}

Status Namespace::Rmdir(uint64_t parent, std::string_view name) {
  if (name == ".") return Invalid("rmdir .");
  if (name == "..") return Status(Code::kNotEmpty, "rmdir ..");
  return Mutate([&](MetaStore::Txn& txn, Change& c) REQUIRES(mu_) -> Status {
    ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, parent));
    ASSIGN_OR_RETURN(DirEntry e, txn.GetEntry(parent, name));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(e.ino));
    if (!S_ISDIR(rec.mode)) return Status(Code::kNotDir, std::string(name));
    if (!txn.DirEmpty(rec.ino)) return Status(Code::kNotEmpty, std::string(name));
    RETURN_IF_ERROR(QueueTree(txn, rec.ino, ChildPath(txn, parent, name), false));
    RETURN_IF_ERROR(txn.DelEntry(parent, name));
    --dir.nlink;
    dir.mtime_ns = dir.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutInode(dir));
    c.publish = true;
    return DropLink(txn, rec, nullptr);
  });
}

Status Namespace::Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                         std::string_view new_name, unsigned flags, uint64_t* seal_first,
                         uint64_t* durable_first) {
  RETURN_IF_ERROR(CheckName(new_name));
  if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) return Invalid("unknown rename flags");
  return Mutate([&](MetaStore::Txn& txn, Change& c) REQUIRES(mu_) -> Status {
    ASSIGN_OR_RETURN(InodeRecord src_dir, GetDir(txn, parent));
    InodeRecord dst_dir_storage;
    if (new_parent != parent) {
      ASSIGN_OR_RETURN(dst_dir_storage, GetDir(txn, new_parent));
    }
    InodeRecord& dst_dir = new_parent != parent ? dst_dir_storage : src_dir;
    ASSIGN_OR_RETURN(DirEntry se, txn.GetEntry(parent, name));
    ASSIGN_OR_RETURN(InodeRecord src, txn.GetInode(se.ino));
    auto de = txn.GetEntry(new_parent, new_name);
    if (!de.ok() && de.status().code() != Code::kNotFound) return de.status();
    const int64_t now = NowNs();
    const bool src_is_dir = S_ISDIR(src.mode);
    // The backend learns the move as: the old paths gone, then everything under its new path.
    // A file that replaces another is simply published over it (no gap for other nodes).
    RETURN_IF_ERROR(QueueTree(txn, src.ino, ChildPath(txn, parent, name), false));
    if (de.ok() && (flags & RENAME_EXCHANGE || S_ISDIR(src.mode))) {
      RETURN_IF_ERROR(QueueTree(txn, de->ino, ChildPath(txn, new_parent, new_name), false));
    }

    if (flags & RENAME_EXCHANGE) {
      if (!de.ok()) return de.status();
      ASSIGN_OR_RETURN(InodeRecord dst, txn.GetInode(de->ino));
      const bool dst_is_dir = S_ISDIR(dst.mode);
      RETURN_IF_ERROR(txn.PutEntry(src_dir, name, dst.ino, dst.mode));
      RETURN_IF_ERROR(txn.PutEntry(dst_dir, new_name, src.ino, src.mode));
      if (new_parent != parent && src_is_dir != dst_is_dir) {
        src_dir.nlink += src_is_dir ? -1 : 1;
        dst_dir.nlink += src_is_dir ? 1 : -1;
      }
      src.ctime_ns = dst.ctime_ns = now;
      RETURN_IF_ERROR(txn.PutInode(src));
      RETURN_IF_ERROR(txn.PutInode(dst));
    } else {
      if (de.ok()) {
        if (flags & RENAME_NOREPLACE) return Status(Code::kExists, std::string(new_name));
        if (de->ino == src.ino) {  // two names of one inode: nothing to do
          c.commit = false;
          return Status::Ok();
        }
        ASSIGN_OR_RETURN(InodeRecord dst, txn.GetInode(de->ino));
        if (S_ISDIR(dst.mode)) {
          if (!src_is_dir) return Status(Code::kIsDir, std::string(new_name));
          if (!txn.DirEmpty(dst.ino)) return Status(Code::kNotEmpty, std::string(new_name));
          --dst_dir.nlink;
        } else if (src_is_dir) {
          return Status(Code::kNotDir, std::string(new_name));
        }
        if (S_ISREG(dst.mode) && (seal_first || durable_first)) {
          ASSIGN_OR_RETURN(auto dst_staged, txn.GetStaged(dst.ino));
          if (dst_staged && dst_staged->durable) {
            // dst sealed, or src made durable, the rename runs again.
            if (seal_first) {
              *seal_first = dst.ino;
              c.commit = false;
              return Status::Ok();
            }
            ASSIGN_OR_RETURN(const bool at_risk, Fallbacks::AtRisk(txn, src.ino));
            if (at_risk) {
              *durable_first = src.ino;
              c.commit = false;
              return Status::Ok();
            }
          }
        }
        // A replace by rename keeps the replaced bytes until src's are durable.
        RETURN_IF_ERROR(fallbacks_->FallBackToReplaced(txn, src, dst, &c.freed));
        RETURN_IF_ERROR(DropLink(txn, dst, &c.freed));
      }
      RETURN_IF_ERROR(txn.DelEntry(parent, name));
      RETURN_IF_ERROR(txn.PutEntry(dst_dir, new_name, src.ino, src.mode));
      if (src_is_dir && new_parent != parent) {
        --src_dir.nlink;
        ++dst_dir.nlink;
      }
      src.ctime_ns = now;
      RETURN_IF_ERROR(txn.PutInode(src));
    }
    src_dir.mtime_ns = src_dir.ctime_ns = now;
    dst_dir.mtime_ns = dst_dir.ctime_ns = now;
    RETURN_IF_ERROR(txn.PutInode(src_dir));
    if (new_parent != parent) RETURN_IF_ERROR(txn.PutInode(dst_dir));
    RETURN_IF_ERROR(QueueTree(txn, src.ino, ChildPath(txn, new_parent, new_name), true));
    if (de.ok() && (flags & RENAME_EXCHANGE)) {
      RETURN_IF_ERROR(QueueTree(txn, de->ino, ChildPath(txn, parent, name), true));
    }
    c.publish = true;
    return Status::Ok();
  });
}

Status Namespace::SetXattr(uint64_t ino, std::string_view name, std::string_view value,
                           int flags) {
  if (name.empty() || name.size() > kMaxName) return Status(Code::kRange, "xattr name length");
  if (value.size() > kMaxXattrValue) return Status(Code::kTooBig, "xattr value too large");
  if (name.substr(0, 7) == "system.") return Status(Code::kUnsupported, std::string(name));
  if (name == RetentionPass::kRetainXattr) RETURN_IF_ERROR(ParseRetainXattr(value).status());
  return Mutate([&](MetaStore::Txn& txn, Change&) REQUIRES(mu_) -> Status {
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    auto old = txn.GetXattr(ino, name);
    if (!old.ok() && old.status().code() != Code::kNoData) return old.status();
    if ((flags & XATTR_CREATE) && old.ok()) return Status(Code::kExists, std::string(name));
    if ((flags & XATTR_REPLACE) && !old.ok()) return old.status();
    RETURN_IF_ERROR(txn.PutXattr(ino, name, value));
    rec.ctime_ns = NowNs();
    return txn.PutInode(rec);
  });
}

Status Namespace::RemoveXattr(uint64_t ino, std::string_view name) {
  return Mutate([&](MetaStore::Txn& txn, Change&) REQUIRES(mu_) -> Status {
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    RETURN_IF_ERROR(txn.DelXattr(ino, name));
    rec.ctime_ns = NowNs();
    return txn.PutInode(rec);
  });
}

Status Namespace::ReapIfOrphan(uint64_t ino) {
  return Mutate([&](MetaStore::Txn& txn, Change& c) REQUIRES(mu_) -> Status {
    c.commit = false;
    if (files_->IsOpen(ino)) return Status::Ok();
    auto rec = txn.GetInode(ino);
    if (!rec.ok()) return rec.status().code() == Code::kNotFound ? Status::Ok() : rec.status();
    if (rec->nlink > 0) return Status::Ok();
    RETURN_IF_ERROR(DeleteInode(txn, *rec, &c.freed));
    c.commit = true;
    return txn.DelOrphan(ino);
  });
}

Status Namespace::CommitManifest(uint64_t ino, const Manifest& m, int64_t mtime, bool durable,
                                 std::vector<ChunkId>* freed) {
  Change c;
  RETURN_IF_ERROR(Apply([&](MetaStore::Txn& txn, Change& ch) REQUIRES(mu_) {
    return CommitManifestTxn(txn, ino, m, mtime, durable, &ch.freed);
  }, &c));
  freed->insert(freed->end(), c.freed.begin(), c.freed.end());
  return Status::Ok();
}

// --- inside a caller's transaction ---

Result<Namespace::Recovered> Namespace::Recover(MetaStore::Txn& txn, std::vector<ChunkId>* freed) {
  auto root = txn.GetInode(kRootIno);
  if (!root.ok()) {
    if (root.status().code() != Code::kNotFound) return root.status();
    InodeRecord r;
    r.ino = kRootIno;
    r.mode = S_IFDIR | 0755;
    r.uid = ::geteuid();
    r.gid = ::getegid();
    r.nlink = 2;
    r.atime_ns = r.mtime_ns = r.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutInode(r));
    log_->info("created a new store in {}", cache_dir_);
  }
  RETURN_IF_ERROR(txn.BackfillParents());
  // Files unlinked while open when the last daemon stopped: nobody can open them any more.
  // Files made by create(2) whose writer never committed or closed them: gone with their entry,
  // as a new file being written at a crash is absent (a loader must not meet an empty one).
  std::vector<std::pair<uint64_t, bool>> orphans;
  RETURN_IF_ERROR(
      txn.ForEachOrphan([&](uint64_t ino, bool unborn) { orphans.emplace_back(ino, unborn); }));
  Recovered done;
  done.orphans = orphans.size();
  for (const auto& [ino, unborn] : orphans) {
    auto rec = txn.GetInode(ino);
    if (rec.ok() && unborn) {
      // Only a file never committed (generation 0) is removed; one with committed bytes keeps
      // them, whatever mark is left (a commit clears it, so none should be).
      if (rec->generation == 0) {
        ++done.unborn;
        RETURN_IF_ERROR(RemoveUnborn(txn, *rec, freed));
      }
    } else if (rec.ok()) {
      RETURN_IF_ERROR(DeleteInode(txn, *rec, freed));
    }
    RETURN_IF_ERROR(txn.DelOrphan(ino));
  }
  return done;
}

Status Namespace::CommitManifestTxn(MetaStore::Txn& txn, uint64_t ino, const Manifest& m,
                                    int64_t mtime, bool durable, std::vector<ChunkId>* freed) {
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  ASSIGN_OR_RETURN(auto old, txn.GetManifest(ino));
  RETURN_IF_ERROR(AddManifestRefs(txn, m, +1, nullptr));
  // The version replaced becomes the file's fallback when it is the last durable one; its
  // references then move to the fallback record.
  ASSIGN_OR_RETURN(bool kept, fallbacks_->Cover(txn, rec, old, durable, freed));
  if (old && !kept) RETURN_IF_ERROR(AddManifestRefs(txn, *old, -1, freed));
  RETURN_IF_ERROR(txn.PutManifest(ino, m));
  rec.size = m.size();
  rec.data_bytes = m.DataBytes();
  rec.mtime_ns = rec.ctime_ns = mtime;
  ++rec.generation;
  RETURN_IF_ERROR(txn.PutInode(rec));
  // Always (one lookup each): a mark whose in-memory flag was lost must not outlive the commit.
  RETURN_IF_ERROR(txn.ClearUnborn(ino));
  RETURN_IF_ERROR(txn.DelStaged(ino));
  if (publisher_->tiers() > 0) publisher_->HoldUnpublished(ino, rec.generation, m);
  return QueueRemote(txn, remote_op::PublishFile(ino, rec.path_epoch));
}

Status Namespace::DropLink(MetaStore::Txn& txn, InodeRecord& rec, std::vector<ChunkId>* freed) {
  const bool dir = S_ISDIR(rec.mode);
  rec.nlink = dir ? 0 : rec.nlink - 1;
  rec.ctime_ns = NowNs();
  if (rec.nlink > 0) return txn.PutInode(rec);
  if (!dir && files_->IsOpen(rec.ino)) {
    RETURN_IF_ERROR(txn.AddOrphan(rec.ino));
    return txn.PutInode(rec);
  }
  return DeleteInode(txn, rec, freed);
}

Status Namespace::RemoveUnborn(MetaStore::Txn& txn, InodeRecord rec,
                               std::vector<ChunkId>* freed) {
  auto where = txn.GetParent(rec.ino);
  if (where.ok()) {
    const auto& [parent, name] = *where;
    auto e = txn.GetEntry(parent, name);
    auto dir = txn.GetInode(parent);
    if (e.ok() && e->ino == rec.ino && dir.ok()) {
      RETURN_IF_ERROR(txn.DelEntry(parent, name));
      dir->mtime_ns = dir->ctime_ns = NowNs();
      RETURN_IF_ERROR(txn.PutInode(*dir));
      log_->info("removed {}: created, never closed before the stop", ChildPath(txn, parent, name));
      return DropLink(txn, rec, freed);
    }
  }
  if (rec.nlink == 0) return DeleteInode(txn, rec, freed);
  return Status::Ok();  // linked elsewhere since: it stays, as its last link made it
}

Status Namespace::QueueRemote(MetaStore::Txn& txn, const std::string& op) {
  return publisher_->Queue(txn, op);
}

Status Namespace::QueueTree(MetaStore::Txn& txn, uint64_t ino, const std::string& path,
                            bool publish) {
  return publisher_->QueueTree(txn, ino, path, publish);
}

Status Namespace::DeleteInode(MetaStore::Txn& txn, const InodeRecord& rec,
                              std::vector<ChunkId>* freed) {
  ASSIGN_OR_RETURN(auto m, txn.GetManifest(rec.ino));
  if (m) RETURN_IF_ERROR(AddManifestRefs(txn, *m, -1, freed));
  RETURN_IF_ERROR(txn.DelManifest(rec.ino));
  RETURN_IF_ERROR(fallbacks_->Drop(txn, rec.ino, freed));
  // Bytes staged and not sealed go with it (nothing has the file open: no handle uses them).
  ASSIGN_OR_RETURN(auto staged, txn.GetStaged(rec.ino));
  if (staged) {
    RETURN_IF_ERROR(txn.DelStaged(rec.ino));
    ::unlink(StagePath(cache_dir_, staged->name).c_str());
  }
  RETURN_IF_ERROR(txn.DelSymlink(rec.ino));
  RETURN_IF_ERROR(txn.DelAllXattrs(rec.ino));
  return txn.DelInode(rec.ino);
}

}  // namespace ckptfs
