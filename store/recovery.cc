#include "store/recovery.h"

#include <spdlog/spdlog.h>

#include <unordered_map>
#include <vector>

#include "cache/chunk_cache.h"
#include "store/cache_dir.h"
#include "store/meta_store.h"
#include "store/namespace.h"
#include "store/staged_meta.h"
#include "store/staging.h"

namespace ckptfs {

Status RecoverAtOpen(const RecoveryParts& p, bool clean) {
  p.dir.ClearSpills();
  Namespace& ns = p.ns;
  MutexLock lock(&ns.mu());
  ASSIGN_OR_RETURN(auto txn, p.meta.Begin(true));
  // The root, then the files unlinked while open or created and never kept (the namespace's).
  std::vector<ChunkId> freed;
  ASSIGN_OR_RETURN(const Namespace::Recovered orphans, ns.Recover(txn, &freed));
  // Files whose newest version a machine crash may have lost (store/fallbacks.h), then staged
  // files (store/staging.h), sealed once the store is open.
  Fallbacks::RecoverHooks hooks;
  hooks.staged_survives = [&p](const StagedRecord& r, bool c) {
    return p.staging.StagedSurvives(r, c);
  };
  hooks.stage_path = [&p](const std::string& name) { return StagePath(p.cache_dir, name); };
  hooks.remove_unborn = [&ns](MetaStore::Txn& t, const InodeRecord& rec,
                              std::vector<ChunkId>* f) REQUIRES(ns.mu()) {
    return ns.RemoveUnborn(t, rec, f);
  };
  hooks.queue_remote = [&ns](MetaStore::Txn& t, const std::string& op) REQUIRES(ns.mu()) {
    return ns.QueueRemote(t, op);
  };
  RETURN_IF_ERROR(ns.fallbacks().Recover(txn, clean, hooks, &freed));
  RETURN_IF_ERROR(p.staging.RecoverStaged(txn, clean, &freed));
  std::unordered_map<ChunkId, uint64_t, ChunkIdHash> referenced;
  if (!clean) {
    RETURN_IF_ERROR(txn.ForEachChunk(
        [&](const ChunkId& id, const ChunkRecord& r) { referenced.emplace(id, r.len); }));
  }
  RETURN_IF_ERROR(txn.Commit());
  if (!freed.empty()) RETURN_IF_ERROR(p.meta.Sync());
  for (const Status& st : p.cache.RemoveMany(freed)) RETURN_IF_ERROR(st);
  if (!clean) {
    // Chunks written for files whose commit never happened.
    std::vector<ChunkId> unreferenced;
    RETURN_IF_ERROR(p.cache.ForEach([&](const ChunkId& id, uint64_t) {
      if (!referenced.count(id)) unreferenced.push_back(id);
    }));
    uint64_t removed = 0;
    for (const Status& st : p.cache.RemoveMany(unreferenced)) removed += st.ok();
    p.log->warn("recovered from an unclean stop: {} files unlinked while open, {} new files "
                "never closed, and {} unreferenced chunks removed",
                orphans.orphans - orphans.unborn, orphans.unborn, removed);
  }
  return Status::Ok();
}

}  // namespace ckptfs
