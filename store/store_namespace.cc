// Store: the namespace — inodes, directory entries, links, attributes and xattrs.
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include "store/retention.h"
#include "store/store.h"
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

Result<InodeRecord> Store::Lookup(uint64_t parent, std::string_view name) {
  if (name.size() > kMaxName) return Status(Code::kNameTooLong, "lookup");
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, parent));
  (void)dir;
  ASSIGN_OR_RETURN(DirEntry e, txn.GetEntry(parent, name));
  txn.Abort();
  return GetAttr(e.ino);
}

Result<InodeRecord> Store::GetAttr(uint64_t ino) {
  const OverlayState o = TakeOverlay(ino);  // before the read: see ApplyOverlay
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  RETURN_IF_ERROR(OverlayStaged(txn, &rec));
  ApplyOverlay(o, &rec);
  return rec;
}

Result<InodeRecord> Store::ClearModeBits(uint64_t ino, uint32_t bits) {
  MutexLock lock(&ns_mu_);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  if (!(rec.mode & bits)) return rec;
  rec.mode &= ~(bits & 07777);
  rec.ctime_ns = NowNs();
  RETURN_IF_ERROR(txn.PutInode(rec));
  RETURN_IF_ERROR(OverlayStaged(txn, &rec));  // what is shown, not stored
  RETURN_IF_ERROR(txn.Commit());
  ApplyOverlay(TakeOverlay(ino), &rec);
  return rec;
}

Result<InodeRecord> Store::SetAttr(uint64_t ino, const SetAttrRequest& req, uint64_t fh) {
  const int64_t now = NowNs();
  bool staged_live = false;  // the size changed in a staging file the kernel uses now
  if (req.size) {
    {
      ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
      ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
      if (S_ISDIR(rec.mode)) return Status(Code::kIsDir, "truncate of a directory");
      if (!S_ISREG(rec.mode)) return Invalid("truncate of a special file");
    }
    ASSIGN_OR_RETURN(staged_live, ChangeStaged(ino, [&](int fd) {
                       return ::ftruncate(fd, static_cast<off_t>(*req.size)) == 0 ? 0 : errno;
                     }, true));
    if (!staged_live) RETURN_IF_ERROR(EnsureSealed(ino));
  }
  if (req.size && !staged_live) {
    auto f = files_.Pin(ino);
    WaitDrained(*f);
    Status st = [&]() -> Status {
      std::lock_guard lock(f->mu);
      RETURN_IF_ERROR(EnsureWriter(ino, *f));
      RETURN_IF_ERROR(f->writer->Truncate(*req.size));
      bool alone;
      {
        std::lock_guard q(f->qmu);
        if (!f->dirty) f->data_bytes = f->committed_data;
        f->size = f->writer->size();
        f->data_bytes = std::min(f->data_bytes.load(), f->size.load());
        f->mtime_ns = now;
        f->dirty = true;
        if (fh) f->session.insert(fh);
      }
      // No handle has it open (a seal's pin is none).
      alone = f->cached_opens == 0 && (!f->stage || f->stage->handles.empty());
      // ftruncate is part of its handle's session, committed at its close; truncate(2) by path
      // commits at once unless the file is open, then with its session or last release.
      if (fh || !alone) return Status::Ok();
      return CommitOrDrop(ino, *f, false);
    }();
    RunAfterCommit(ino, *f);
    if (files_.Unpin(ino)) RETURN_IF_ERROR(ReapIfOrphan(ino));
    RETURN_IF_ERROR(st);
  }
  if (req.mtime_ns) {
    // ... and a live staging file's, which its next commit reads.
    const int64_t t = *req.mtime_ns == SetAttrRequest::kNow ? now : *req.mtime_ns;
    const timespec ts[2] = {{0, UTIME_OMIT}, {t / 1'000'000'000, t % 1'000'000'000}};
    RETURN_IF_ERROR(
        ChangeStaged(ino, [&](int fd) { return ::futimens(fd, ts) == 0 ? 0 : errno; }, false)
            .status());
  }
  MutexLock lock(&ns_mu_);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  if (req.mode) rec.mode = (rec.mode & S_IFMT) | (*req.mode & 07777);
  if (req.uid) rec.uid = *req.uid;
  if (req.gid) rec.gid = *req.gid;
  if (req.atime_ns) rec.atime_ns = *req.atime_ns == SetAttrRequest::kNow ? now : *req.atime_ns;
  if (req.mtime_ns) {
    rec.mtime_ns = *req.mtime_ns == SetAttrRequest::kNow ? now : *req.mtime_ns;
    if (auto f = files_.Find(ino)) f->mtime_ns = rec.mtime_ns;
    // A staged file's time is its record's (what a seal commits).
    ASSIGN_OR_RETURN(auto staged, txn.GetStaged(ino));
    if (staged) {
      staged->mtime_ns = rec.mtime_ns;
      RETURN_IF_ERROR(txn.PutStaged(ino, *staged));
    }
  }
  rec.ctime_ns = now;
  RETURN_IF_ERROR(txn.PutInode(rec));
  RETURN_IF_ERROR(OverlayStaged(txn, &rec));  // what is shown, not stored
  RETURN_IF_ERROR(txn.Commit());
  ApplyOverlay(TakeOverlay(ino), &rec);
  return rec;
}

Result<InodeRecord> Store::MakeNode(uint64_t parent, std::string_view name, uint32_t mode,
                                    uint64_t rdev, const Caller& who) {
  return MakeNode(parent, name, mode, rdev, who, false);
}

Status Store::PunchHole(uint64_t ino, uint64_t offset, uint64_t len, uint64_t fh) {
  ASSIGN_OR_RETURN(bool staged, ChangeStaged(ino, [&](int fd) {
                     return ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                        static_cast<off_t>(offset), static_cast<off_t>(len)) == 0
                                ? 0
                                : errno;
                   }, true));
  if (staged) return Status::Ok();
  RETURN_IF_ERROR(EnsureSealed(ino));
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    if (!S_ISREG(rec.mode)) return Invalid("a hole in a file that is not regular");
    // The file moves to a staging file of its size on the cache disk: room for it first.
    RETURN_IF_ERROR(AdmitWrite(rec.size));
  }
  auto f = files_.Pin(ino);
  WaitDrained(*f);  // after the writes queued before it
  Status st = [&]() -> Status {
    std::lock_guard lock(f->mu);
    RETURN_IF_ERROR(EnsureWriter(ino, *f));
    RETURN_IF_ERROR(f->writer->PunchHole(offset, len));
    std::lock_guard q(f->qmu);
    // The punched bytes still count until the commit.
    if (!f->dirty) f->data_bytes = f->committed_data;
    f->mtime_ns = NowNs();
    f->dirty = true;
    if (fh) f->session.insert(fh);
    return Status::Ok();
  }();
  if (files_.Unpin(ino)) RETURN_IF_ERROR(ReapIfOrphan(ino));
  return st;
}

Result<InodeRecord> Store::CreateFile(uint64_t parent, std::string_view name, uint32_t mode,
                                      const Caller& who, uint64_t* fh, bool* keep_cache,
                                      int* passthrough_fd) {
  ASSIGN_OR_RETURN(InodeRecord rec, MakeNode(parent, name, S_IFREG | (mode & 07777), 0, who, true));
  // In passthrough mode the new file's bytes start in a staging file (an empty one: "truncate").
  if (Status st = Open(rec.ino, passthrough_fd != nullptr, fh, keep_cache, true, passthrough_fd);
      !st.ok()) {
    // A create that fails leaves no file behind: the entry goes with the error.
    if (Status undo = UndoCreate(parent, name, rec.ino); !undo.ok()) {
      log_->warn("{}: removing the entry of a create that failed: {}",
                 std::string(name), undo.ToString());
    }
    return st;
  }
  if (auto f = files_.Find(rec.ino)) {
    std::lock_guard lock(f->mu);
    f->unborn = true;
    f->creator_fh = fh ? *fh : 0;
  }
  return rec;
}

Status Store::UndoCreate(uint64_t parent, std::string_view name, uint64_t ino) {
  std::vector<ChunkId> freed;
  {
    MutexLock lock(&ns_mu_);
    // Only the entry this create made, of a file nobody has opened since.
    if (files_.IsOpen(ino)) return Status::Ok();
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    auto e = txn.GetEntry(parent, name);
    if (!e.ok() || e->ino != ino) return Status::Ok();
    ASSIGN_OR_RETURN(bool unborn, txn.IsUnborn(ino));
    if (!unborn) return Status::Ok();
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
    ASSIGN_OR_RETURN(InodeRecord dir, txn.GetInode(parent));
    RETURN_IF_ERROR(txn.DelEntry(parent, name));
    dir.mtime_ns = dir.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutInode(dir));
    RETURN_IF_ERROR(DropLink(txn, rec, &freed));
    RETURN_IF_ERROR(txn.DelOrphan(ino));
    RETURN_IF_ERROR(txn.Commit());
  }
  chunks_->Reclaim(freed);
  return Status::Ok();
}

Result<InodeRecord> Store::MakeNode(uint64_t parent, std::string_view name, uint32_t mode,
                                    uint64_t rdev, const Caller& who, bool unborn) {
  RETURN_IF_ERROR(CheckName(name));
  MutexLock lock(&ns_mu_);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, parent));
  auto existing = txn.GetEntry(parent, name);
  if (existing.ok()) return Status(Code::kExists, std::string(name));
  if (existing.status().code() != Code::kNotFound) return existing.status();
  InodeRecord rec;
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
  if (unborn) {
    RETURN_IF_ERROR(txn.AddUnborn(rec.ino));  // published at its first commit or close
  } else {
    RETURN_IF_ERROR(QueueTree(txn, rec.ino, ChildPath(txn, parent, name), true));
  }
  RETURN_IF_ERROR(txn.Commit());
  publisher_->Kick();
  return rec;
}

Result<InodeRecord> Store::Symlink(uint64_t parent, std::string_view name,
                                   std::string_view target, const Caller& who) {
  RETURN_IF_ERROR(CheckName(name));
  if (target.empty()) return Invalid("empty symlink target");
  if (target.size() > 4095) return Status(Code::kNameTooLong, "symlink target");
  MutexLock lock(&ns_mu_);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, parent));
  if (txn.GetEntry(parent, name).ok()) return Status(Code::kExists, std::string(name));
  InodeRecord rec;
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
  RETURN_IF_ERROR(txn.PutSymlink(rec.ino, target));
  RETURN_IF_ERROR(txn.Commit());
  return rec;
}

Result<InodeRecord> Store::Link(uint64_t ino, uint64_t new_parent, std::string_view new_name) {
  RETURN_IF_ERROR(CheckName(new_name));
  MutexLock lock(&ns_mu_);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  if (S_ISDIR(rec.mode)) return Status(Code::kPermission, "hard link to a directory");
  ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, new_parent));
  if (txn.GetEntry(new_parent, new_name).ok()) return Status(Code::kExists, std::string(new_name));
  const int64_t now = NowNs();
  RETURN_IF_ERROR(txn.PutEntry(dir, new_name, ino, rec.mode));
  dir.mtime_ns = dir.ctime_ns = now;
  RETURN_IF_ERROR(txn.PutInode(dir));
  ++rec.nlink;
  rec.ctime_ns = now;
  RETURN_IF_ERROR(txn.PutInode(rec));
  RETURN_IF_ERROR(txn.Commit());
  ApplyOverlay(TakeOverlay(ino), &rec);
  return rec;
}

Result<std::string> Store::ReadLink(uint64_t ino) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  if (!S_ISLNK(rec.mode)) return Invalid("not a symlink");
  return txn.GetSymlink(ino);
}

Status Store::Unlink(uint64_t parent, std::string_view name) {
  std::vector<ChunkId> freed;
  {
    MutexLock lock(&ns_mu_);
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    ASSIGN_OR_RETURN(InodeRecord dir, GetDir(txn, parent));
    ASSIGN_OR_RETURN(DirEntry e, txn.GetEntry(parent, name));
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(e.ino));
    if (S_ISDIR(rec.mode)) return Status(Code::kIsDir, std::string(name));
    RETURN_IF_ERROR(QueueTree(txn, rec.ino, ChildPath(txn, parent, name), false));
    RETURN_IF_ERROR(txn.DelEntry(parent, name));
    dir.mtime_ns = dir.ctime_ns = NowNs();
    RETURN_IF_ERROR(txn.PutInode(dir));
    RETURN_IF_ERROR(DropLink(txn, rec, &freed));
    RETURN_IF_ERROR(txn.Commit());
  }
  publisher_->Kick();
  chunks_->Reclaim(freed);
  return Status::Ok();
}

Status Store::Rmdir(uint64_t parent, std::string_view name) {
  if (name == ".") return Invalid("rmdir .");
  if (name == "..") return Status(Code::kNotEmpty, "rmdir ..");
  MutexLock lock(&ns_mu_);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
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
  RETURN_IF_ERROR(DropLink(txn, rec, nullptr));
  RETURN_IF_ERROR(txn.Commit());
  publisher_->Kick();
  return Status::Ok();
}

Status Store::Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                     std::string_view new_name, unsigned flags) {
  RETURN_IF_ERROR(CheckName(new_name));
  if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) return Invalid("unknown rename flags");
  std::vector<ChunkId> freed;
  // A file replaced while its newest durable bytes (fsync'd in passthrough mode) are only in
  // its staging file is sealed first, so that the fallback a not yet durable src keeps is that
  // version and not an older one, or none (which would remove the name after a machine crash).
  // A file a writer still has open is not sealed: after kSealTries the rename goes ahead, and
  // its fallback is the replaced file's last sealed version.
  constexpr int kSealTries = 8;
  for (int attempt = 0;; ++attempt) {
    uint64_t seal_first = 0;
    Status done = [&]() -> Status {
      MutexLock lock(&ns_mu_);
      ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
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
          if (de->ino == src.ino) return Status::Ok();  // two names of one inode: nothing to do
          ASSIGN_OR_RETURN(InodeRecord dst, txn.GetInode(de->ino));
          if (S_ISDIR(dst.mode)) {
            if (!src_is_dir) return Status(Code::kIsDir, std::string(new_name));
            if (!txn.DirEmpty(dst.ino)) return Status(Code::kNotEmpty, std::string(new_name));
            --dst_dir.nlink;
          } else if (src_is_dir) {
            return Status(Code::kNotDir, std::string(new_name));
          }
          if (S_ISREG(dst.mode) && attempt < kSealTries) {
            ASSIGN_OR_RETURN(auto dst_staged, txn.GetStaged(dst.ino));
            if (dst_staged && dst_staged->durable) {
              seal_first = dst.ino;
              return Status::Ok();  // the transaction aborts; sealed, the rename runs again
            }
          }
          // A replace by rename keeps the replaced bytes until src's are durable.
          RETURN_IF_ERROR(fallbacks_->FallBackToReplaced(txn, src, dst, &freed));
          RETURN_IF_ERROR(DropLink(txn, dst, &freed));
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
      return txn.Commit();
    }();
    RETURN_IF_ERROR(done);
    if (!seal_first) break;
    RETURN_IF_ERROR(EnsureSealed(seal_first));
  }
  publisher_->Kick();
  chunks_->Reclaim(freed);
  return Status::Ok();
}

Status Store::ReadDir(uint64_t dir, uint64_t offset,
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

Status Store::SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags) {
  if (name.empty() || name.size() > kMaxName) return Status(Code::kRange, "xattr name length");
  if (value.size() > kMaxXattrValue) return Status(Code::kTooBig, "xattr value too large");
  if (name.substr(0, 7) == "system.") return Status(Code::kUnsupported, std::string(name));
  if (name == kRetainXattr) RETURN_IF_ERROR(ParseRetainXattr(value).status());
  MutexLock lock(&ns_mu_);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  auto old = txn.GetXattr(ino, name);
  if (!old.ok() && old.status().code() != Code::kNoData) return old.status();
  if ((flags & XATTR_CREATE) && old.ok()) return Status(Code::kExists, std::string(name));
  if ((flags & XATTR_REPLACE) && !old.ok()) return old.status();
  RETURN_IF_ERROR(txn.PutXattr(ino, name, value));
  rec.ctime_ns = NowNs();
  RETURN_IF_ERROR(txn.PutInode(rec));
  return txn.Commit();
}

Result<std::string> Store::GetXattr(uint64_t ino, std::string_view name) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  (void)rec;
  return txn.GetXattr(ino, name);
}

Result<std::vector<std::string>> Store::ListXattrs(uint64_t ino) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  (void)rec;
  std::vector<std::string> names;
  RETURN_IF_ERROR(txn.ListXattrs(ino, [&](std::string_view n) { names.emplace_back(n); }));
  return names;
}

Status Store::RemoveXattr(uint64_t ino, std::string_view name) {
  MutexLock lock(&ns_mu_);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  RETURN_IF_ERROR(txn.DelXattr(ino, name));
  rec.ctime_ns = NowNs();
  RETURN_IF_ERROR(txn.PutInode(rec));
  return txn.Commit();
}

}  // namespace ckptfs
