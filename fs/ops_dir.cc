// Handlers for directory listings and filesystem-wide calls.
#include <vector>

#include "fs/fs_ops.h"

namespace ckptfs::fs {
namespace {

void ReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  std::vector<char> buf(size);
  size_t used = 0;
  bool full = false;
  auto add = [&](const DirItem& item) {
    struct stat st {};
    st.st_ino = item.ino;
    st.st_mode = item.mode;
    std::string name(item.name);
    size_t need = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st,
                                    static_cast<off_t>(item.next_offset));
    if (need > size - used) return !(full = true);  // the kernel asks again from this offset
    used += need;
    return true;
  };
  Context& ctx = Ctx(req);
  const auto offset = static_cast<uint64_t>(off);
  Status st;
  if (IsViewIno(ino)) {
    st = ctx.views->ReadDir(ino, offset, add);
  } else if (offset < kViewsDirOffset) {
    st = ctx.store->ReadDir(ino, offset, add);
    // With -o views=visible a checkpoint directory ends its listing with `.views`; hidden (the
    // default), it resolves on lookup only, so tree walkers do not read every view.
    if (st.ok() && !full && ctx.cfg.views_visible && ctx.views->HasViews(ino)) {
      add(DirItem{kViewsName, kViewInoBit, S_IFDIR, kViewsDirOffset});
    }
  }
  if (!st.ok()) return ReplyError(req, st, "readdir", ino);
  fuse_reply_buf(req, buf.data(), used);
}

void FsyncDir(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) {
  if (IsViewIno(ino)) return static_cast<void>(fuse_reply_err(req, 0));
  // Namespace changes commit as they happen; fsync of any file makes them durable.
  Status st = Ctx(req).store->Fsync(ino);
  if (!st.ok()) return ReplyError(req, st, "fsyncdir", ino);
  fuse_reply_err(req, 0);
}

void StatFs(fuse_req_t req, fuse_ino_t ino) {
  auto st = Ctx(req).store->StatFs();
  if (!st.ok()) return ReplyError(req, st.status(), "statfs", ino);
  fuse_reply_statfs(req, &*st);
}

}  // namespace

void AddDirOps(fuse_lowlevel_ops* ops) {
  ops->readdir = Timed<FuseOp::kReaddir, ReadDir>;
  ops->fsyncdir = Timed<FuseOp::kOther, FsyncDir>;
  ops->statfs = Timed<FuseOp::kOther, StatFs>;
}

}  // namespace ckptfs::fs
