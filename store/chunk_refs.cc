#include "store/chunk_refs.h"

#include <cstdint>
#include <map>
#include <utility>

namespace ckptfs {

Status AddManifestRefs(MetaStore::Txn& txn, const Manifest& m, int sign,
                       std::vector<ChunkId>* freed) {
  std::map<ChunkId, std::pair<uint64_t, int64_t>> counts;  // id -> (len, references)
  for (const Extent& e : m.extents()) {
    if (e.hole()) continue;
    auto& c = counts[e.id];
    c.first = e.len;
    c.second += sign;
  }
  for (const auto& [id, c] : counts) {
    ASSIGN_OR_RETURN(uint64_t left, txn.AddChunkRefs(id, c.first, c.second));
    if (left == 0 && freed) freed->push_back(id);
  }
  return Status::Ok();
}

}  // namespace ckptfs
