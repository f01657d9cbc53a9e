#include "store/tier_policy.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <string>
#include <utility>
#include <vector>

#include "store/retention.h"
#include "store/tree_walk.h"

namespace ckptfs {

Status ApplyTierPolicy(const Config& cfg, MetaStore& meta, Backend& backend, int tier,
                       size_t tiers, Metrics& metrics, const Logger& log) {
  const size_t t = static_cast<size_t>(tier);
  RetentionPolicy policy;
  policy.keep_last = t < cfg.tier_keep.size() ? cfg.tier_keep[t] : 0;
  policy.keep_every = t < cfg.tier_keep_every.size() ? cfg.tier_keep_every[t] : 0;
  if (policy.keep_last == 0) return Status::Ok();  // keeps everything
  // The files to drop, with their paths, from one snapshot.
  std::vector<std::pair<uint64_t, std::string>> drop;
  {
    ASSIGN_OR_RETURN(auto txn, meta.Begin(false));
    std::vector<uint64_t> dirs;
    bool found_run = false;
    RETURN_IF_ERROR(FindDropped(txn, kRootIno, policy, 0, &found_run, &dirs));
    if (!found_run) {
      // No recognized layout anywhere: the top-level directories, oldest first by time.
      ASSIGN_OR_RETURN(std::vector<CheckpointDir> top, CheckpointDirsOf(txn, kRootIno));
      for (const RetentionDecision& d : DecideRetention(top, Trackers{}, policy)) {
        if (d.keep.empty()) dirs.push_back(d.ino);
      }
    }
    for (uint64_t dir : dirs) {
      RETURN_IF_ERROR(ForEachFile(txn, dir, true, [&](uint64_t ino, const Manifest&) {
        auto published = txn.GetPublished(tier, ino);
        if (!published.ok() || *published == 0 || *published == kDroppedFromTier) return;
        // Only once every farther tier holds this version: a far tier that is down must not
        // leave the local tier as the file's only copy.
        for (size_t far = t + 1; far < tiers; ++far) {
          auto there = txn.GetPublished(static_cast<int>(far), ino);
          if (!there.ok() || *there == 0 || *there < *published) return;
        }
        if (auto path = txn.PathOf(ino); path.ok()) drop.emplace_back(ino, *path);
      }));
    }
  }
  size_t dropped = 0;
  for (const auto& [ino, path] : drop) {
    RETURN_IF_ERROR(backend.Delete("files/" + path));
    ASSIGN_OR_RETURN(auto txn, meta.Begin(true));
    auto now = txn.PathOf(ino);
    // Moved since (a rename publishes it again under its new name): not this path's to mark.
    if (!now.ok() || *now != path) continue;
    RETURN_IF_ERROR(txn.PutPublished(tier, ino, kDroppedFromTier));
    RETURN_IF_ERROR(txn.Commit());
    ++dropped;
    metrics.tier_files_dropped.Add(1);
  }
  if (dropped) {
    log->info("dropped {} files of checkpoints past keep={} from {} (tier {}); they stay in the "
              "farther tiers", dropped, policy.keep_last, backend.Describe(), tier + 1);
  }
  return Status::Ok();
}

}  // namespace ckptfs
