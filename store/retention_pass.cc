// RetentionPass (store/retention_pass.h): the daemon's passes of user.ckptfs.retain.
#include "store/retention_pass.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <string>
#include <utility>
#include <vector>

#include "store/retention.h"
#include "store/tree_walk.h"

namespace ckptfs {
namespace {

constexpr std::string_view kTrackers[] = {"latest_checkpointed_iteration.txt", "latest",
                                          "latest_universal"};
constexpr size_t kMaxTracker = 4096;

bool IsTracker(std::string_view name) {
  for (std::string_view t : kTrackers) {
    if (name == t) return true;
  }
  return false;
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

}  // namespace

RetentionPass::RetentionPass(MetaStore* meta, LocalChunks* chunks, Logger log, Ops ops)
    : meta_(meta),
      chunks_(chunks),
      log_(std::move(log)),
      ops_(std::move(ops)),
      pool_(std::make_unique<ThreadPool>(1)) {}

RetentionPass::~RetentionPass() { Stop(); }

void RetentionPass::Stop() {
  // Reset outside the lock: a task takes it as it begins.
  std::unique_ptr<ThreadPool> pool;
  {
    MutexLock lock(&mu_);
    stopped_ = true;
    pool = std::move(pool_);
  }
  pool.reset();
}

void RetentionPass::NoteCommitted(uint64_t ino) {
  uint64_t root = 0;
  {
    auto txn = meta_->Begin(false);
    if (!txn.ok()) return;
    auto p = txn->GetParent(ino);
    if (!p.ok()) return;
    if (IsTracker(p->second)) {
      root = p->first;
    } else if (p->second == ".metadata") {
      auto up = txn->GetParent(p->first);
      if (!up.ok()) return;
      root = up->first;
    } else {
      return;
    }
    if (!txn->GetXattr(root, kRetainXattr).ok()) return;
  }
  MutexLock lock(&mu_);
  if (!pool_) return;  // stopped
  if (!pending_.insert(root).second) return;  // a pass for it is queued already
  pool_->Submit([this, root] {
    {
      MutexLock begun(&mu_);
      pending_.erase(root);
    }
    if (stopped_.load()) return;  // stopping: queued passes are dropped
    Status st = Apply(root);
    if (!st.ok()) log_->warn("applying user.ckptfs.retain of inode {}: {}", root, st.ToString());
  });
}

Result<std::string> RetentionPass::ReadSmallFile(uint64_t ino) {
  RETURN_IF_ERROR(ops_.ensure_sealed(ino));
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  ASSIGN_OR_RETURN(auto m, txn.GetManifest(ino));
  std::string out;
  if (!m) return out;
  if (m->size() > kMaxTracker) return Invalid("a tracker file of " + std::to_string(m->size()) + " bytes");
  for (const Extent& e : m->extents()) {
    if (e.hole()) {
      out.append(e.len, '\0');
      continue;
    }
    ASSIGN_OR_RETURN(ChunkRef c, chunks_->GetChunk(e.id, e.len));
    out.append(reinterpret_cast<const char*>(c->bytes.get()), c->size);
  }
  return out;
}

Result<bool> RetentionPass::Pinned(uint64_t ino) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  if (txn.GetXattr(ino, Prefetcher::kPinXattr).ok()) return true;
  bool pinned = false;
  RETURN_IF_ERROR(txn.WalkTree(ino, true, [&](const DirEntry& e) -> Status {
    if (txn.GetXattr(e.ino, Prefetcher::kPinXattr).ok()) pinned = true;
    return Status::Ok();
  }));
  return pinned;
}

Status RetentionPass::RemoveTree(uint64_t parent, const std::string& name) {
  ASSIGN_OR_RETURN(InodeRecord rec, ops_.lookup(parent, name));
  if (S_ISDIR(rec.mode)) {
    std::vector<std::string> children;
    {
      ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
      RETURN_IF_ERROR(txn.ListDir(rec.ino, 0, [&](std::string_view n, const DirEntry&) {
        children.emplace_back(n);
        return true;
      }));
    }
    for (const std::string& c : children) RETURN_IF_ERROR(RemoveTree(rec.ino, c));
    RETURN_IF_ERROR(ops_.rmdir(parent, name));
  } else {
    RETURN_IF_ERROR(ops_.unlink(parent, name));
  }
  // The kernel forgets the entry; not once stopping (the FUSE session is gone).
  if (!stopped_.load()) ops_.forget(parent, name);
  return Status::Ok();
}

Status RetentionPass::Apply(uint64_t root) {
  std::string value;
  std::vector<CheckpointDir> dirs;
  uint64_t trackers[3] = {};
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    auto v = txn.GetXattr(root, kRetainXattr);
    if (!v.ok()) return v.status().code() == Code::kNoData ? Status::Ok() : v.status();
    value = *v;
    ASSIGN_OR_RETURN(dirs, CheckpointDirsOf(txn, root));
    for (int i = 0; i < 3; ++i) {
      auto e = txn.GetEntry(root, kTrackers[i]);
      if (e.ok() && S_ISREG(e->mode)) trackers[i] = e->ino;
    }
  }
  ASSIGN_OR_RETURN(RetentionPolicy policy, ParseRetainXattr(value));
  // Unattended, only checkpoints of a recognized layout go: a run directory without any
  // (custom tags, or logs and configs beside them) is left to `ckptfs retain`, asked by a user.
  std::vector<CheckpointDir> checkpoints;
  for (const CheckpointDir& d : dirs) {
    if (IsRecognizedCheckpoint(d)) checkpoints.push_back(d);
  }
  std::string named[3];
  for (int i = 0; i < 3; ++i) {
    if (!trackers[i]) continue;
    // A tracker that cannot be read keeps everything this pass: what it names is unknown.
    ASSIGN_OR_RETURN(std::string text, ReadSmallFile(trackers[i]));
    named[i] = Trim(std::move(text));
  }
  size_t deleted = 0;
  for (const RetentionDecision& d :
       DecideRetention(checkpoints, Trackers{named[0], named[1], named[2]}, policy)) {
    if (!d.keep.empty()) continue;
    ASSIGN_OR_RETURN(bool busy, ops_.busy(d.ino));
    if (busy) continue;  // a file in it is open: the next pass
    ASSIGN_OR_RETURN(bool pinned, Pinned(d.ino));
    if (pinned) continue;
    RETURN_IF_ERROR(RemoveTree(root, d.name));
    ++deleted;
  }
  if (deleted) {
    log_->info("user.ckptfs.retain ({}) of inode {}: deleted {} checkpoints", value, root, deleted);
  }
  return Status::Ok();
}

}  // namespace ckptfs
