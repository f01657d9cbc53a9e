// Handlers for names and attributes.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>

#include "fs/fs_ops.h"
#include "fs/privs.h"

namespace ckptfs::fs {
namespace {

timespec ToTimespec(int64_t ns) {
  return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

// View entries change when their checkpoint does: the kernel keeps them only briefly.
void ReplyViewEntry(fuse_req_t req, const InodeRecord& rec) {
  fuse_entry_param e = EntryOf(req, rec);
  e.attr_timeout = e.entry_timeout = 1.0;
  fuse_reply_entry(req, &e);
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Context& ctx = Ctx(req);
  if (IsViewIno(parent)) {
    auto rec = ctx.views->Lookup(parent, name);
    if (rec.status().code() == Code::kInvalid) {  // an impossible view: logged by the ViewTree
      return static_cast<void>(fuse_reply_err(req, EINVAL));
    }
    if (!rec.ok()) return ReplyError(req, rec.status(), "lookup", parent);
    return ReplyViewEntry(req, *rec);
  }
  auto rec = ctx.store->Lookup(parent, name);
  if (rec.status().code() == Code::kNotFound && name == kViewsName) {
    auto views = ctx.views->LookupViews(parent);
    if (views.ok()) return ReplyViewEntry(req, *views);
    fuse_entry_param e{};  // not cached: the directory may become a checkpoint
    fuse_reply_entry(req, &e);
    return;
  }
  if (rec.status().code() == Code::kNotFound) {
    // A negative entry, cached like a positive one: every create passes through this mount.
    fuse_entry_param e{};
    e.entry_timeout = Ctx(req).cfg.entry_timeout_s;
    fuse_reply_entry(req, &e);
    return;
  }
  if (!rec.ok()) return ReplyError(req, rec.status(), "lookup", parent);
  ReplyEntry(req, *rec);
}

void Forget(fuse_req_t req, fuse_ino_t, uint64_t) { fuse_reply_none(req); }
void ForgetMulti(fuse_req_t req, size_t, fuse_forget_data*) { fuse_reply_none(req); }

void GetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (IsViewIno(ino)) {
    auto rec = Ctx(req).views->GetAttr(ino);
    if (!rec.ok()) return ReplyError(req, rec.status(), "getattr", ino);
    struct stat st;
    FillStat(*rec, &st);
    return static_cast<void>(fuse_reply_attr(req, &st, 1.0));
  }
  auto rec = Ctx(req).store->GetAttr(ino);
  if (!rec.ok()) return ReplyError(req, rec.status(), "getattr", ino);
  struct stat st;
  FillStat(*rec, &st);
  fuse_reply_attr(req, &st, Ctx(req).cfg.attr_timeout_s);
}

// The mode a SETATTR leaves once the set-id bits it must clear are gone (fs/privs.h), or nullopt
// when it clears none. A chown clears them; so does the SETATTR that changes nothing (ctime at
// most, with writeback_cache), the kernel's word that a write, an fallocate or chown(-1, -1)
// must, unless it only follows the removal of file capabilities; and a truncation by a caller
// the kernel found without CAP_FSETID.
Result<std::optional<uint32_t>> SetidToClear(fuse_req_t req, fuse_ino_t ino, int to_set) {
  constexpr int kIds = FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID;
#if defined(FUSE_SET_ATTR_KILL_SUID)
  const bool kernel_kill = to_set & FUSE_SET_ATTR_KILL_SUID;  // FATTR_KILL_SUIDGID
#else
  const bool kernel_kill = false;
#endif
  const bool empty = (to_set & ~FUSE_SET_ATTR_CTIME) == 0;
  if (!(to_set & kIds) && !empty && !kernel_kill) return std::optional<uint32_t>();
  Context& ctx = Ctx(req);
  const pid_t pid = fuse_req_ctx(req)->pid;
  const bool caps_only = empty && ctx.caps_removed.Take(ino, pid);
  ASSIGN_OR_RETURN(InodeRecord rec, ctx.store->GetAttr(ino));
  if (!(rec.mode & (S_ISUID | S_ISGID))) return std::optional<uint32_t>();
  CallerPrivs who = PrivsOf(pid);
  if (kernel_kill) who.fsetid = false;  // the kernel checked, in its own namespace
  const bool as_write = caps_only || (kernel_kill && !(to_set & kIds));
  const uint32_t clear = as_write ? SetidClearedByWrite(rec.mode, rec.gid, who)
                                  : SetidClearedByChown(rec.mode, rec.gid, who);
  if (!clear) return std::optional<uint32_t>();
  return std::optional<uint32_t>(rec.mode & 07777 & ~clear);
}

void SetAttr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  if (RefuseView(req, ino)) return;
  SetAttrRequest r;
  if (to_set & FUSE_SET_ATTR_MODE) r.mode = attr->st_mode;
  if (to_set & FUSE_SET_ATTR_UID) r.uid = attr->st_uid;
  if (to_set & FUSE_SET_ATTR_GID) r.gid = attr->st_gid;
  if (to_set & FUSE_SET_ATTR_SIZE) r.size = static_cast<uint64_t>(attr->st_size);
  auto ns = [](const timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; };
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
    r.atime_ns = SetAttrRequest::kNow;
  } else if (to_set & FUSE_SET_ATTR_ATIME) {
    r.atime_ns = ns(attr->st_atim);
  }
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
    r.mtime_ns = SetAttrRequest::kNow;
  } else if (to_set & FUSE_SET_ATTR_MTIME) {
    r.mtime_ns = ns(attr->st_mtim);
  }
  if (!r.mode) {
    auto cleared = SetidToClear(req, ino, to_set);
    if (!cleared.ok()) return ReplyError(req, cleared.status(), "setattr", ino);
    if (*cleared) r.mode = *cleared;
  }
  auto rec = Ctx(req).store->SetAttr(ino, r, fi ? fi->fh : 0);
  if (!rec.ok()) return ReplyError(req, rec.status(), "setattr", ino);
  struct stat st;
  FillStat(*rec, &st);
  fuse_reply_attr(req, &st, Ctx(req).cfg.attr_timeout_s);
}

void ReadLink(fuse_req_t req, fuse_ino_t ino) {
  if (IsViewIno(ino)) return static_cast<void>(fuse_reply_err(req, EINVAL));
  auto target = Ctx(req).store->ReadLink(ino);
  if (!target.ok()) return ReplyError(req, target.status(), "readlink", ino);
  fuse_reply_readlink(req, target->c_str());
}

void MakeNode(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  if (RefuseView(req, parent)) return;
  auto rec = Ctx(req).store->MakeNode(parent, name, mode, rdev, CallerOf(req));
  if (!rec.ok()) return ReplyError(req, rec.status(), "mknod", parent);
  ReplyEntry(req, *rec);
}

void MakeDir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  if (RefuseView(req, parent)) return;
  auto rec = Ctx(req).store->MakeNode(parent, name, S_IFDIR | (mode & 07777), 0, CallerOf(req));
  if (!rec.ok()) return ReplyError(req, rec.status(), "mkdir", parent);
  ReplyEntry(req, *rec);
}

void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (RefuseView(req, parent)) return;
  Status st = Ctx(req).store->Unlink(parent, name);
  if (!st.ok()) return ReplyError(req, st, "unlink", parent);
  fuse_reply_err(req, 0);
}

void RemoveDir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (RefuseView(req, parent)) return;
  Status st = Ctx(req).store->Rmdir(parent, name);
  if (!st.ok()) return ReplyError(req, st, "rmdir", parent);
  fuse_reply_err(req, 0);
}

void Symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  if (RefuseView(req, parent)) return;
  auto rec = Ctx(req).store->Symlink(parent, name, target, CallerOf(req));
  if (!rec.ok()) return ReplyError(req, rec.status(), "symlink", parent);
  ReplyEntry(req, *rec);
}

void Rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
            const char* new_name, unsigned flags) {
  if (RefuseView(req, parent) || RefuseView(req, new_parent)) return;
  Status st = Ctx(req).store->Rename(parent, name, new_parent, new_name, flags);
  if (!st.ok()) return ReplyError(req, st, "rename", parent);
  fuse_reply_err(req, 0);
}

void Link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t new_parent, const char* new_name) {
  if (RefuseView(req, ino) || RefuseView(req, new_parent)) return;
  auto rec = Ctx(req).store->Link(ino, new_parent, new_name);
  if (!rec.ok()) return ReplyError(req, rec.status(), "link", ino);
  ReplyEntry(req, *rec);
}

}  // namespace

void FillStat(const InodeRecord& rec, struct stat* st) {
  *st = {};
  st->st_ino = rec.ino;
  st->st_mode = rec.mode;
  st->st_nlink = rec.nlink;
  st->st_uid = rec.uid;
  st->st_gid = rec.gid;
  st->st_rdev = rec.rdev;
  st->st_size = static_cast<off_t>(rec.size);
  st->st_blksize = 1 << 20;  // invites large I/O: one FUSE request carries up to 1 MiB
  // The blocks the file's chunks take (holes take none), so that du and sparse-aware tools see
  // holes; symlinks and directories count their size.
  const uint64_t used = S_ISREG(rec.mode) ? std::min(rec.data_bytes, rec.size) : rec.size;
  st->st_blocks = static_cast<blkcnt_t>((used + 511) / 512);
  st->st_atim = ToTimespec(rec.atime_ns);
  st->st_mtim = ToTimespec(rec.mtime_ns);
  st->st_ctim = ToTimespec(rec.ctime_ns);
}

fuse_entry_param EntryOf(fuse_req_t req, const InodeRecord& rec) {
  fuse_entry_param e{};
  e.ino = rec.ino;
  e.generation = 1;  // inode numbers are never reused
  FillStat(rec, &e.attr);
  e.attr_timeout = Ctx(req).cfg.attr_timeout_s;
  e.entry_timeout = Ctx(req).cfg.entry_timeout_s;
  return e;
}

void ReplyEntry(fuse_req_t req, const InodeRecord& rec) {
  fuse_entry_param e = EntryOf(req, rec);
  fuse_reply_entry(req, &e);
}

void ReplyError(fuse_req_t req, const Status& st, const char* op, fuse_ino_t ino) {
  switch (st.code()) {
    case Code::kNotFound:
    case Code::kExists:
    case Code::kNotEmpty:
    case Code::kNoData:
    case Code::kRange:
    case Code::kIsDir:
    case Code::kNotDir:
    case Code::kNameTooLong:
    case Code::kUnsupported:
    case Code::kValueTooLarge:
      break;  // answers, not failures
    case Code::kCorrupt:
    case Code::kNoSpace:
      Ctx(req).log->debug("{} on inode {}: {}", op, ino, st.ToString());  // logged where found
      break;
    default:
      Ctx(req).log->error("{} on inode {}: {}", op, ino, st.ToString());
  }
  fuse_reply_err(req, ToErrno(st));
}

void AddEntryOps(fuse_lowlevel_ops* ops) {
  ops->lookup = Timed<FuseOp::kLookup, Lookup>;
  ops->forget = Forget;
  ops->forget_multi = ForgetMulti;
  ops->getattr = Timed<FuseOp::kGetattr, GetAttr>;
  ops->setattr = Timed<FuseOp::kSetattr, SetAttr>;
  ops->readlink = Timed<FuseOp::kOther, ReadLink>;
  ops->mknod = Timed<FuseOp::kOther, MakeNode>;
  ops->mkdir = Timed<FuseOp::kOther, MakeDir>;
  ops->unlink = Timed<FuseOp::kOther, Unlink>;
  ops->rmdir = Timed<FuseOp::kOther, RemoveDir>;
  ops->symlink = Timed<FuseOp::kOther, Symlink>;
  ops->rename = Timed<FuseOp::kOther, Rename>;
  ops->link = Timed<FuseOp::kOther, Link>;
}

}  // namespace ckptfs::fs
