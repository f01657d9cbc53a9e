// Handlers for extended attributes.
#include <string>
#include <string_view>

#include "fs/fs_ops.h"

namespace ckptfs::fs {
namespace {

// The xattr protocol: size 0 asks for the length; a buffer too small is ERANGE.
void ReplySized(fuse_req_t req, const std::string& value, size_t size) {
  if (size == 0) return static_cast<void>(fuse_reply_xattr(req, value.size()));
  if (size < value.size()) return static_cast<void>(fuse_reply_err(req, ERANGE));
  fuse_reply_buf(req, value.data(), value.size());
}

// user.ckptfs.prefetch and user.ckptfs.pin: "1" or "0".
void SetHint(fuse_req_t req, fuse_ino_t ino, std::string_view name, std::string_view value) {
  if (value != "1" && value != "0") return static_cast<void>(fuse_reply_err(req, EINVAL));
  const bool on = value == "1";
  Store* store = Ctx(req).store;
  Status st;
  if (name == kPrefetchXattr) {
    if (on) {
      st = store->Prefetch(ino);
    } else {
      store->CancelPrefetch(ino);
    }
  } else {
    st = store->SetPin(ino, on);
    if (!on && st.code() == Code::kNoData) st = Status::Ok();  // "0" on what is not pinned
  }
  if (!st.ok()) return ReplyError(req, st, "setxattr", ino);
  fuse_reply_err(req, 0);
}

void SetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
              int flags) {
  if (RefuseView(req, ino)) return;
  if (name == kPrefetchXattr || name == Store::kPinXattr) {
    return SetHint(req, ino, name, std::string_view(value, size));
  }
  if (name == kSealXattr) {
    // "1" on any inode: every file closed after a passthrough write is cut into chunks now.
    // "durable": and every version closed without fsync is made durable, which frees the
    // versions kept as their fallbacks (ckptfs stats asks for it, so that it counts what is
    // stored).
    const std::string_view v(value, size);
    if (v != "1" && v != "durable") return static_cast<void>(fuse_reply_err(req, EINVAL));
    Status st = Ctx(req).store->SealAll();
    if (st.ok() && v == "durable") st = Ctx(req).store->Settle();
    if (!st.ok()) return ReplyError(req, st, "setxattr", ino);
    return static_cast<void>(fuse_reply_err(req, 0));
  }
  if (IsComputedXattr(name) || name == kStatusXattr) {
    return static_cast<void>(fuse_reply_err(req, EPERM));
  }
  Status st = Ctx(req).store->SetXattr(ino, name, std::string_view(value, size), flags);
  if (!st.ok()) return ReplyError(req, st, "setxattr", ino);
  fuse_reply_err(req, 0);
}

void GetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  if (IsViewIno(ino)) {
    // A view file's format and tensor index, as a stored file's (the GPU loader reads views too).
    if (IsComputedXattr(name)) {
      auto v = ComputedXattr(Ctx(req), ino, name);
      if (!v.ok()) return ReplyError(req, v.status(), "getxattr", ino);
      return ReplySized(req, *v, size);
    }
    // user.ckptfs.view_errors on a .views directory: why the specs looked up there failed.
    if (std::string_view(name) != "user.ckptfs.view_errors") {
      return static_cast<void>(fuse_reply_err(req, ENODATA));
    }
    auto v = Ctx(req).views->ViewErrors(ino);
    if (!v.ok()) return ReplyError(req, v.status(), "getxattr", ino);
    return ReplySized(req, *v, size);
  }
  if (name == kStatusXattr && ino == FUSE_ROOT_ID) return ReplySized(req, StatusJson(Ctx(req)), size);
  if (IsComputedXattr(name)) {
    auto v = ComputedXattr(Ctx(req), ino, name);
    if (!v.ok()) return ReplyError(req, v.status(), "getxattr", ino);
    return ReplySized(req, *v, size);
  }
  auto v = Ctx(req).store->GetXattr(ino, name);
  if (!v.ok()) return ReplyError(req, v.status(), "getxattr", ino);
  ReplySized(req, *v, size);
}

void ListXattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  if (IsViewIno(ino)) return ReplySized(req, "", size);
  auto names = Ctx(req).store->ListXattrs(ino);
  if (!names.ok()) return ReplyError(req, names.status(), "listxattr", ino);
  std::string all;
  for (const std::string& n : *names) {
    all += n;
    all.push_back('\0');
  }
  ReplySized(req, all, size);
}

void RemoveXattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  if (RefuseView(req, ino)) return;
  if (std::string_view(name) == "security.capability") {
    Ctx(req).caps_removed.Note(ino, fuse_req_ctx(req)->pid);  // fs/privs.h
  }
  if (name == kPrefetchXattr) {
    Ctx(req).store->CancelPrefetch(ino);
    return static_cast<void>(fuse_reply_err(req, 0));
  }
  if (IsComputedXattr(name) || name == kStatusXattr) {
    return static_cast<void>(fuse_reply_err(req, EPERM));
  }
  Status st = name == Store::kPinXattr ? Ctx(req).store->SetPin(ino, false)
                                       : Ctx(req).store->RemoveXattr(ino, name);
  if (!st.ok()) return ReplyError(req, st, "removexattr", ino);
  fuse_reply_err(req, 0);
}

}  // namespace

void AddXattrOps(fuse_lowlevel_ops* ops) {
  ops->setxattr = Timed<FuseOp::kSetxattr, SetXattr>;
  ops->getxattr = Timed<FuseOp::kGetxattr, GetXattr>;
  ops->listxattr = Timed<FuseOp::kOther, ListXattr>;
  ops->removexattr = Timed<FuseOp::kOther, RemoveXattr>;
}

}  // namespace ckptfs::fs
