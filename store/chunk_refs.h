// The chunk references that manifests hold, counted in LMDB's chunk records. A free function over
// MetaStore::Txn: it takes no store lock and holds no state; callers run it inside their write
// transaction (under the namespace lock, as every change of the references is).
#pragma once

#include <vector>

#include "common/chunk_id.h"
#include "common/status.h"
#include "store/manifest.h"
#include "store/meta_store.h"

namespace ckptfs {

// Adds `sign` (+1 or -1) references to each distinct chunk of m (holes have none). With -1, the
// chunks left with no reference go into *freed (when given): the caller reclaims them once txn is
// committed.
Status AddManifestRefs(MetaStore::Txn& txn, const Manifest& m, int sign,
                       std::vector<ChunkId>* freed);

}  // namespace ckptfs
