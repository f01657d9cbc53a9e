// Internal to fs/: the state every handler sees (passed as the session's userdata) and the
// handler families, one file each. Handlers are thin: they call the Store and reply.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "fs/backing.h"
#include "fs/fuse_version.h"
#include "fs/privs.h"

#include "common/config.h"
#include "common/log.h"
#include "fs/views.h"
#include "store/store.h"

namespace ckptfs::fs {

class FileInfoCache;

struct Context {
  Store* store;
  Config cfg;
  Logger log;
  std::shared_ptr<FileInfoCache> info;  // descriptions of checkpoint files (file_info.cc)
  std::shared_ptr<ViewTree> views;      // the virtual .views directories (views.h)
  fuse_session* session = nullptr;      // for notifications to the kernel; set before mounting
  // Whether files are opened in FUSE passthrough mode (decided at init: the kernel, libfuse and
  // the options must all allow it), and the backing files registered for it.
  std::atomic<bool> passthrough{false};
  BackingFiles backing;
  CapsRemovals caps_removed;  // fs/privs.h
  std::chrono::system_clock::time_point started = std::chrono::system_clock::now();
  std::chrono::steady_clock::time_point started_steady = std::chrono::steady_clock::now();
  std::string passthrough_mode;  // what Init decided, and why (the mount log's words)
  // Tests only ($CKPTFS_TEST_RELEASE_DELAY_MS): how long a release waits before it reaches the
  // store, so that a test can open a file between a writer's close(2) and its release.
  std::chrono::milliseconds release_delay{0};
};

// user.ckptfs.status on the mount's root: the daemon's state as JSON (`ckptfs status`).
inline constexpr std::string_view kStatusXattr = "user.ckptfs.status";
std::string StatusJson(Context& ctx);

inline Context& Ctx(fuse_req_t req) { return *static_cast<Context*>(fuse_req_userdata(req)); }
inline Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* c = fuse_req_ctx(req);
  return Caller{c->uid, c->gid};
}

// A view file's first open reads its gathered records once for their CRCs (ViewTree::Open);
// this hands those bytes to the kernel's page cache (fuse_lowlevel_notify_store), so the reads
// that follow are served from there instead of reading the sources a second time.
reshard::ViewBytesFn PageCacheStore(Context& ctx, fuse_ino_t ino);

// Replies with the errno of `st`, logging it once unless it is an expected answer (ENOENT, ...).
void ReplyError(fuse_req_t req, const Status& st, const char* op, fuse_ino_t ino);
void FillStat(const InodeRecord& rec, struct stat* st);
fuse_entry_param EntryOf(fuse_req_t req, const InodeRecord& rec);
void ReplyEntry(fuse_req_t req, const InodeRecord& rec);
// Views are read-only: replies EROFS and returns true when ino is a view inode.
inline bool RefuseView(fuse_req_t req, fuse_ino_t ino) {
  if (!IsViewIno(ino)) return false;
  fuse_reply_err(req, EROFS);
  return true;
}
// The readdir offset of the `.views` entry a checkpoint directory's listing ends with; the
// store's offsets stay far below it.
inline constexpr uint64_t kViewsDirOffset = uint64_t{1} << 62;

// The attributes ckptfs computes (user.ckptfs.format, .tensors, .tensors.pages, .tensors.N,
// .chunks, .state, .cached, .prefetch); kNoData for any other name, which the caller then looks
// up as stored. Read-only, except the hints that ops_xattr.cc handles before this check.
Result<std::string> ComputedXattr(Context& ctx, fuse_ino_t ino, std::string_view name);
bool IsComputedXattr(std::string_view name);
// The hints: "1" queues a prefetch of a file or tree, "0" cancels it; reads "1" while pending.
// user.ckptfs.pin (Store::kPinXattr) is stored, "1" or absent.
inline constexpr std::string_view kPrefetchXattr = "user.ckptfs.prefetch";
// Set to "1": seal every staged file now (Store::SealAll); to "durable": also make every version
// durable (Store::Settle). Never stored, never read.
inline constexpr std::string_view kSealXattr = "user.ckptfs.seal";
// Predictive prefetch (warm.cc): `ino` was opened for reading; when it belongs to a recognized
// checkpoint whose chunks are not all local, warm the rest of that checkpoint in the background.
void WarmOnOpen(Context& ctx, fuse_ino_t ino);
std::shared_ptr<FileInfoCache> NewFileInfoCache();

// A handler timed into the store's metrics, by kind: `ops->read = Timed<FuseOp::kRead, Read>;`.
// The context is taken before the call: a request is gone once replied to.
template <FuseOp K, auto Fn>
struct TimedOp;
template <FuseOp K, typename... A, void (*Fn)(fuse_req_t, A...)>
struct TimedOp<K, Fn> {
  static void Call(fuse_req_t req, A... a) {
    ScopedLatency timed(Ctx(req).store->metrics().fuse(K));
    Fn(req, a...);
  }
};
template <FuseOp K, auto Fn>
inline constexpr auto Timed = &TimedOp<K, Fn>::Call;

void AddEntryOps(fuse_lowlevel_ops* ops);  // lookup, getattr, setattr, links, renames, nodes
void AddFileOps(fuse_lowlevel_ops* ops);   // open, create, read, write, flush, fsync, release
void AddDirOps(fuse_lowlevel_ops* ops);    // readdir, fsyncdir, statfs
void AddXattrOps(fuse_lowlevel_ops* ops);

}  // namespace ckptfs::fs
