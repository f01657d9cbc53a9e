#include "store/tree_walk.h"

#include <sys/stat.h>

#include <unordered_set>

namespace ckptfs {
namespace {

constexpr int kMaxRunDepth = 16;

}  // namespace

Status ForEachFile(MetaStore::Txn& txn, uint64_t ino, bool recursive,
                   const std::function<void(uint64_t, const Manifest&)>& fn) {
  ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(ino));
  if (S_ISREG(rec.mode)) {
    ASSIGN_OR_RETURN(auto m, txn.GetManifest(ino));
    fn(ino, m ? *m : Manifest());
    return Status::Ok();
  }
  if (!S_ISDIR(rec.mode)) return Status::Ok();
  std::unordered_set<uint64_t> seen;  // hard links
  return txn.WalkTree(ino, recursive, [&](const DirEntry& e) -> Status {
    if (!S_ISREG(e.mode) || !seen.insert(e.ino).second) return Status::Ok();
    ASSIGN_OR_RETURN(auto m, txn.GetManifest(e.ino));
    fn(e.ino, m ? *m : Manifest());
    return Status::Ok();
  });
}

Result<std::vector<CheckpointDir>> CheckpointDirsOf(MetaStore::Txn& txn, uint64_t dir) {
  std::vector<CheckpointDir> out;
  RETURN_IF_ERROR(txn.ListDir(dir, 0, [&](std::string_view name, const DirEntry& e) {
    if (S_ISDIR(e.mode)) out.push_back(CheckpointDir{std::string(name), false, 0, e.ino});
    return true;
  }));
  for (CheckpointDir& d : out) {
    ASSIGN_OR_RETURN(InodeRecord rec, txn.GetInode(d.ino));
    d.mtime_ns = rec.mtime_ns;
    d.dcp_metadata = txn.GetEntry(d.ino, ".metadata").ok();
  }
  return out;
}

Status FindDropped(MetaStore::Txn& txn, uint64_t dir, const RetentionPolicy& policy, int depth,
                   bool* found_run, std::vector<uint64_t>* out) {
  ASSIGN_OR_RETURN(std::vector<CheckpointDir> dirs, CheckpointDirsOf(txn, dir));
  bool run = false;
  for (const CheckpointDir& d : dirs) run = run || IsRecognizedCheckpoint(d);
  if (run) {
    *found_run = true;
    for (const RetentionDecision& d : DecideRetention(dirs, Trackers{}, policy)) {
      if (d.keep.empty()) out->push_back(d.ino);
    }
  }
  if (depth >= kMaxRunDepth) return Status::Ok();
  for (size_t i = 0; i < dirs.size(); ++i) {
    if (run && IsRecognizedCheckpoint(dirs[i])) continue;  // a checkpoint holds no runs
    RETURN_IF_ERROR(FindDropped(txn, dirs[i].ino, policy, depth + 1, found_run, out));
  }
  return Status::Ok();
}

std::string ChildPath(MetaStore::Txn& txn, uint64_t parent, std::string_view name) {
  auto p = txn.PathOf(parent);
  if (!p.ok()) return {};
  return p->empty() ? std::string(name) : *p + "/" + std::string(name);
}

}  // namespace ckptfs
