// The keep= policies of the nearer remote tiers (-o keep=N[+N...], keep_every=K[+K...]). A file
// of a checkpoint past its tier's policy is dropped from that tier only: its record there is
// deleted (a gc round of that tier then frees its chunks) and it is marked so that it is not
// published there again. It stays readable through the farther tiers; the farthest tier keeps
// everything (`ckptfs retain` deletes from the namespace itself).
//
// The checkpoints are found the way `ckptfs retain` finds them (store/retention.h): every
// directory with subdirectories of a recognized layout (iter_*, global_step*, DCP step
// directories) is a run; where the namespace has none, the top-level directories are the
// checkpoints, by modification time.
//
// Holds no state and takes no store lock: it reads one LMDB snapshot, then deletes each record
// and marks it dropped in a write transaction of its own (as RemoteTier's writes, without the
// store's namespace lock). Runs on tier `tier`'s worker when its queue is empty
// (RemoteTier::SetIdleWork).
#pragma once

#include <cstddef>

#include "backends/backend.h"
#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status.h"
#include "store/meta_store.h"

namespace ckptfs {

// Drops from nearer tier `tier` (whose backend is `backend`; `tiers` in the chain) the files of
// checkpoints past its keep= policy in cfg, once every farther tier holds their version.
Status ApplyTierPolicy(const Config& cfg, MetaStore& meta, Backend& backend, int tier,
                       size_t tiers, Metrics& metrics, const Logger& log);

}  // namespace ckptfs
