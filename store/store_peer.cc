// Store: chunks served to peer nodes (peers/peer_server.h).
#include "cache/chunk_cache.h"
#include "store/store.h"

namespace ckptfs {

Result<ChunkRef> Store::PeerChunk(const ChunkId& id, uint64_t len, bool fetch) {
  {
    // Only chunks a file here names, at their length: a request for other bytes never reaches
    // the disk (a wrong length would read a good chunk file as corrupt and move it aside).
    ASSIGN_OR_RETURN(MetaStore::Txn txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(ChunkRecord rec, txn.GetChunk(id));
    if (rec.refs == 0 || rec.len != len) {
      return NotFound("chunk " + id.Hex() + " is not referenced here at that length");
    }
  }
  if (!fetch && !cache_->OnDisk(id)) return NotFound("chunk " + id.Hex() + " is not local");
  return cache_->Get(id, len);
}

}  // namespace ckptfs
