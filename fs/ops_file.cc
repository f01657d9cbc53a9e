// Handlers for file bytes.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/uio.h>
#include <unistd.h>

#include <optional>
#include <thread>
#include <vector>

#include "fs/fs_ops.h"
#include "fs/privs.h"

namespace ckptfs::fs {
namespace {

// On one node every change reaches the kernel's page cache through this mount, so a file's
// cached pages stay valid across opens and warm reads never reach the daemon; the exception is
// a file whose uncommitted bytes were dropped (the store says so).
void SetOpenFlags(fuse_file_info* fi, uint64_t fh, bool keep_cache) {
  fi->fh = fh;
  fi->keep_cache = keep_cache;
  fi->direct_io = 0;
}

// A handle the store serves from a staging file (passthrough_fd >= 0) gets the inode's backing
// id: the kernel then reads and writes that file itself. False when the kernel refuses: the
// handle is released and the open fails with EIO (the inode may have other passthrough handles,
// so it cannot fall back to the daemon).
bool SetPassthrough(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi, int passthrough_fd) {
  if (passthrough_fd < 0) return true;
#if defined(FUSE_CAP_PASSTHROUGH)
  Context& ctx = Ctx(req);
  const int id = ctx.backing.Acquire(req, ino, fi->fh, passthrough_fd);
  if (id > 0) {
    fi->backing_id = id;
    fi->keep_cache = 0;
    return true;
  }
  ctx.log->error("inode {}: the kernel refused its staging file as a passthrough backing file",
                 ino);
#else
  (void)req;
  (void)ino;
  (void)fi;
#endif
  return false;
}

// Where this mount serves files in passthrough mode, the out-parameter the store fills.
int* PassthroughOut(fuse_req_t req, int* fd) { return Ctx(req).passthrough ? fd : nullptr; }

// An O_TRUNC open truncates: by a caller without CAP_FSETID it clears set-id bits, as a
// truncate(2) does (the kernel's FUSE_OPEN_KILL_SUIDGID does not reach this handler).
Status ClearSetidOnTruncation(fuse_req_t req, fuse_ino_t ino) {
  Context& ctx = Ctx(req);
  ASSIGN_OR_RETURN(InodeRecord rec, ctx.store->GetAttr(ino));
  if (!(rec.mode & (S_ISUID | S_ISGID))) return Status::Ok();
  const uint32_t clear =
      SetidClearedByWrite(rec.mode, rec.gid, PrivsOf(fuse_req_ctx(req)->pid));
  if (!clear) return Status::Ok();
  // Cleared in the store's own transaction: a chmod meanwhile (the kernel does not hold the
  // inode's lock around an open) is neither undone nor lost.
  RETURN_IF_ERROR(ctx.store->ClearModeBits(ino, clear).status());
  // The kernel keeps the mode it cached; attributes only (offset -1): safe inside a request.
  fuse_lowlevel_notify_inval_inode(ctx.session, ino, -1, 0);
  return Status::Ok();
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (IsViewIno(ino)) {
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
      return static_cast<void>(fuse_reply_err(req, EROFS));
    }
    Context& ctx = Ctx(req);
    Status st = ctx.views->Open(ino, PageCacheStore(ctx, ino));
    if (!st.ok()) return ReplyError(req, st, "open", ino);
    // A view inode's bytes never change (a changed checkpoint gets new inodes), so its cached
    // pages stay valid across opens.
    SetOpenFlags(fi, 0, true);
    return static_cast<void>(fuse_reply_open(req, fi));
  }
  // The kernel hands O_TRUNC to open (FUSE_CAP_ATOMIC_O_TRUNC, on by default) instead of
  // truncating first: the store must drop the old bytes.
  uint64_t fh = 0;
  bool keep = true;
  int pt_fd = -1;
  Context& ctx = Ctx(req);
  const bool reader = (fi->flags & O_ACCMODE) == O_RDONLY;
  Status st = ctx.store->Open(ino, (fi->flags & O_TRUNC) != 0, &fh, &keep, !reader,
                              PassthroughOut(req, &pt_fd));
  if (st.ok() && (fi->flags & O_TRUNC)) st = ClearSetidOnTruncation(req, ino);  // O_RDONLY too
  if (!st.ok()) {
    if (fh) (void)ctx.store->Release(ino, fh);
    return ReplyError(req, st, "open", ino);
  }
  SetOpenFlags(fi, fh, keep);
  if (!SetPassthrough(req, ino, fi, pt_fd)) {
    (void)ctx.store->Release(ino, fh);
    return static_cast<void>(fuse_reply_err(req, EIO));
  }
  if (fuse_reply_open(req, fi) != 0) {
    ctx.backing.Release(req, fh);
    (void)ctx.store->Release(ino, fh);  // opener is gone
  } else if (reader) {
    WarmOnOpen(ctx, ino);  // after the reply: the opener does not wait for it
  }
}

void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  if (RefuseView(req, parent)) return;
  Context& ctx = Ctx(req);
  uint64_t fh = 0;
  bool keep = true;
  int pt_fd = -1;
  auto rec = ctx.store->CreateFile(parent, name, mode, CallerOf(req), &fh, &keep,
                                   PassthroughOut(req, &pt_fd));
  if (!rec.ok()) return ReplyError(req, rec.status(), "create", parent);
  SetOpenFlags(fi, fh, keep);
  if (!SetPassthrough(req, rec->ino, fi, pt_fd)) {
    (void)ctx.store->Release(rec->ino, fh);
    return static_cast<void>(fuse_reply_err(req, EIO));
  }
  fuse_entry_param e = EntryOf(req, *rec);
  if (fuse_reply_create(req, &e, fi) != 0) {
    ctx.backing.Release(req, fh);
    (void)ctx.store->Release(rec->ino, fh);
  }
}

// fuse_reply_iov hands its vector to one writev(2), which takes at most IOV_MAX (1024) entries,
// the reply's header included.
constexpr size_t kMaxReplyIov = 1000;

void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  std::vector<ReadSlice> slices;
  Status st = IsViewIno(ino)
                  ? Ctx(req).views->Read(ino, static_cast<uint64_t>(off), size, &slices)
                  : Ctx(req).store->Read(ino, static_cast<uint64_t>(off), size, &slices);
  if (!st.ok()) return ReplyError(req, st, "read", ino);
  if (slices.size() > kMaxReplyIov) {
    // A view read of many small pieces (rows of a row-parallel tensor): more than one writev
    // takes, so the reply is gathered into one buffer.
    std::string buf;
    buf.reserve(size);
    for (const ReadSlice& s : slices) buf.append(reinterpret_cast<const char*>(s.data), s.len);
    return static_cast<void>(fuse_reply_buf(req, buf.data(), buf.size()));
  }
  // The reply is gathered straight from the chunks' buffers: no copy in the daemon.
  std::vector<iovec> iov(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    iov[i] = iovec{const_cast<uint8_t*>(slices[i].data), slices[i].len};
  }
  fuse_reply_iov(req, iov.data(), static_cast<int>(iov.size()));
}

void Write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
           fuse_file_info* fi) {
  if (RefuseView(req, ino)) return;
  Status st = Ctx(req).store->Write(ino, static_cast<uint64_t>(off),
                                    reinterpret_cast<const uint8_t*>(buf), size, fi->fh);
  if (!st.ok()) return ReplyError(req, st, "write", ino);
  fuse_reply_write(req, size);
}

void Flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (IsViewIno(ino)) return static_cast<void>(fuse_reply_err(req, 0));
  Context& ctx = Ctx(req);
  Status st = ctx.store->Flush(ino, fi->fh);
  if (!st.ok()) return ReplyError(req, st, "flush", ino);
  if (ctx.backing.Has(fi->fh)) {
    // The kernel keeps times it set itself on a passthrough file (an O_TRUNC open stamps the
    // inode, not the staging file): it asks again, and sees what was committed. Attributes
    // only (offset -1): no page lock is taken, so this is safe inside a request.
    fuse_lowlevel_notify_inval_inode(ctx.session, ino, -1, 0);
  }
  fuse_reply_err(req, 0);
}

void Release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (IsViewIno(ino)) return static_cast<void>(fuse_reply_err(req, 0));
  if (Ctx(req).release_delay.count() > 0) std::this_thread::sleep_for(Ctx(req).release_delay);
  Ctx(req).backing.Release(req, fi->fh);  // before the store may close the staging file
  Status st = Ctx(req).store->Release(ino, fi->fh);
  if (!st.ok()) return ReplyError(req, st, "release", ino);
  fuse_reply_err(req, 0);
}

// SEEK_DATA and SEEK_HOLE (the kernel answers the other whences itself): the manifest's holes,
// so that cp --sparse and tar -S skip them. A view file holds no holes.
void Lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, fuse_file_info*) {
  if ((whence != SEEK_DATA && whence != SEEK_HOLE) || off < 0) {
    return static_cast<void>(fuse_reply_err(req, EINVAL));
  }
  const bool data = whence == SEEK_DATA;
  const uint64_t offset = static_cast<uint64_t>(off);
  Result<std::optional<uint64_t>> at = std::optional<uint64_t>();
  if (IsViewIno(ino)) {
    auto rec = Ctx(req).views->GetAttr(ino);
    if (!rec.ok()) return ReplyError(req, rec.status(), "lseek", ino);
    if (offset < rec->size) at = std::optional<uint64_t>(data ? offset : rec->size);
  } else {
    at = Ctx(req).store->Seek(ino, offset, data);
  }
  if (!at.ok()) return ReplyError(req, at.status(), "lseek", ino);
  if (!*at) return static_cast<void>(fuse_reply_err(req, ENXIO));
  fuse_reply_lseek(req, static_cast<off_t>(**at));
}

void Fsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info* fi) {
  if (IsViewIno(ino)) return static_cast<void>(fuse_reply_err(req, 0));
  Status st = Ctx(req).store->Fsync(ino, fi->fh);
  if (!st.ok()) return ReplyError(req, st, "fsync", ino);
  fuse_reply_err(req, 0);
}

// Mode 0 (posix_fallocate) grows the file like truncate, and KEEP_SIZE alone does nothing: bytes
// are not reserved, since chunks are allocated when written. PUNCH_HOLE (with KEEP_SIZE) and
// ZERO_RANGE make the range a hole; ZERO_RANGE without KEEP_SIZE also grows the file.
void Fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
               fuse_file_info* fi) {
  if (RefuseView(req, ino)) return;
  constexpr int kKnown = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
  if ((mode & ~kKnown) != 0) return static_cast<void>(fuse_reply_err(req, EOPNOTSUPP));
  const bool punch = (mode & FALLOC_FL_PUNCH_HOLE) != 0, zero = (mode & FALLOC_FL_ZERO_RANGE) != 0;
  const bool keep = (mode & FALLOC_FL_KEEP_SIZE) != 0;
  if ((punch && !keep) || (punch && zero) || off < 0 || len <= 0) {
    return static_cast<void>(fuse_reply_err(req, EINVAL));  // as fallocate(2) answers
  }
  Store* store = Ctx(req).store;
  if (punch || zero) {
    Status st = store->PunchHole(ino, static_cast<uint64_t>(off), static_cast<uint64_t>(len),
                                 fi->fh);
    if (!st.ok()) return ReplyError(req, st, "fallocate", ino);
  }
  auto rec = store->GetAttr(ino);
  if (!rec.ok()) return ReplyError(req, rec.status(), "fallocate", ino);
  const uint64_t end = static_cast<uint64_t>(off) + static_cast<uint64_t>(len);
  if (!keep && end > rec->size) {
    SetAttrRequest r;
    r.size = end;
    auto done = store->SetAttr(ino, r, fi->fh);
    if (!done.ok()) return ReplyError(req, done.status(), "fallocate", ino);
  }
  fuse_reply_err(req, 0);
}

}  // namespace

reshard::ViewBytesFn PageCacheStore(Context& ctx, fuse_ino_t ino) {
  return [&ctx, ino](uint64_t off, const uint8_t* data, size_t len) {
    fuse_bufvec buf = FUSE_BUFVEC_INIT(len);
    buf.buf[0].mem = const_cast<uint8_t*>(data);
    const int rc = fuse_lowlevel_notify_store(ctx.session, ino, static_cast<off_t>(off), &buf,
                                              FUSE_BUF_NO_SPLICE);
    if (rc != 0) ctx.log->debug("view inode {}: page cache store at {}: {}", ino, off, rc);
  };
}

void AddFileOps(fuse_lowlevel_ops* ops) {
  ops->open = Timed<FuseOp::kOpen, Open>;
  ops->create = Timed<FuseOp::kCreate, Create>;
  ops->read = Timed<FuseOp::kRead, Read>;
  ops->write = Timed<FuseOp::kWrite, Write>;
  ops->flush = Timed<FuseOp::kFlush, Flush>;
  ops->release = Timed<FuseOp::kRelease, Release>;
  ops->fsync = Timed<FuseOp::kFsync, Fsync>;
  ops->fallocate = Timed<FuseOp::kOther, Fallocate>;
  ops->lseek = Timed<FuseOp::kOther, Lseek>;
}

}  // namespace ckptfs::fs
