// MetaStore's remote tier tables: each tier's queue of namespace changes (remote_ops[.T]), its
// published versions (published[.T]), its backend's name and gc epoch, and the move of all of it
// when the chain of tiers changes.
#include <lmdb.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/meta_codec.h"
#include "store/meta_store.h"

namespace ckptfs {
namespace {

using meta_codec::GetU64;
using meta_codec::InoKey;
using meta_codec::LmdbError;
using meta_codec::PutU64;
using meta_codec::TierKey;

constexpr std::string_view kNextRemoteOpKey = "next_remote_op";
constexpr std::string_view kGcEpochKey = "gc_epoch";
constexpr std::string_view kTierNameKey = "tier_name";

}  // namespace

Result<uint64_t> MetaStore::Txn::QueueRemoteOp(std::string_view op) {
  ASSIGN_OR_RETURN(auto v, Get(store_->meta_, kNextRemoteOpKey));
  const uint64_t seq = (v && v->size() == 8) ? GetU64(v->data()) : 1;
  std::string nv;
  PutU64(nv, seq + 1);
  RETURN_IF_ERROR(Put(store_->meta_, kNextRemoteOpKey, nv));
  // One sequence for every tier: each tier's queue keeps the order the changes were made in.
  for (int tier = 0; tier < store_->tiers_; ++tier) {
    RETURN_IF_ERROR(Put(store_->remote_ops_[tier], InoKey(seq), op));
  }
  return seq;
}

Result<uint64_t> MetaStore::Txn::QueueRemoteOpFor(int tier, std::string_view op) {
  if (tier < 0 || tier >= kMaxTiers) return Invalid("no remote tier " + std::to_string(tier));
  ASSIGN_OR_RETURN(auto v, Get(store_->meta_, kNextRemoteOpKey));
  const uint64_t seq = (v && v->size() == 8) ? GetU64(v->data()) : 1;
  std::string nv;
  PutU64(nv, seq + 1);
  RETURN_IF_ERROR(Put(store_->meta_, kNextRemoteOpKey, nv));
  RETURN_IF_ERROR(Put(store_->remote_ops_[tier], InoKey(seq), op));
  return seq;
}

Status MetaStore::Txn::ForEachRemoteOp(
    int tier, uint64_t after, const std::function<bool(uint64_t, std::string_view)>& fn) {
  if (tier < 0 || tier >= kMaxTiers || !store_->has_tier_tables_[tier]) return Status::Ok();
  return Scan(store_->remote_ops_[tier], {}, InoKey(after + 1),
              [&](std::string_view k, std::string_view v) {
                return k.size() != 8 || fn(GetU64(k.data()), v);
              });
}

Result<uint64_t> MetaStore::Txn::CountRemoteOps(int tier) {
  if (tier < 0 || tier >= kMaxTiers || !store_->has_tier_tables_[tier]) return uint64_t{0};
  MDB_stat st;
  if (int rc = mdb_stat(txn_, store_->remote_ops_[tier], &st); rc != 0) {
    return LmdbError(rc, "mdb_stat");
  }
  return uint64_t{st.ms_entries};
}

Status MetaStore::Txn::DelRemoteOp(int tier, uint64_t seq) {
  return Del(store_->remote_ops_[tier], InoKey(seq), true);
}

Result<uint64_t> MetaStore::Txn::GetPublished(int tier, uint64_t ino) {
  if (tier < 0 || tier >= kMaxTiers || !store_->has_tier_tables_[tier]) return uint64_t{0};
  ASSIGN_OR_RETURN(auto v, Get(store_->published_[tier], InoKey(ino)));
  return (v && v->size() == 8) ? GetU64(v->data()) : uint64_t{0};
}

Status MetaStore::Txn::PutPublished(int tier, uint64_t ino, uint64_t generation) {
  std::string v;
  PutU64(v, generation);
  return Put(store_->published_[tier], InoKey(ino), v);
}

Status MetaStore::Txn::DelPublished(uint64_t ino) {
  for (int tier = 0; tier < kMaxTiers; ++tier) {
    if (store_->has_tier_tables_[tier]) RETURN_IF_ERROR(Del(store_->published_[tier], InoKey(ino), true));
  }
  return Status::Ok();
}

Result<std::string> MetaStore::Txn::GetTierName(int tier) {
  ASSIGN_OR_RETURN(auto v, Get(store_->meta_, TierKey(kTierNameKey, tier)));
  return v ? std::string(*v) : std::string();
}

Status MetaStore::Txn::PutTierName(int tier, std::string_view name) {
  return Put(store_->meta_, TierKey(kTierNameKey, tier), name);
}

Status MetaStore::Txn::RemapTiers(const std::vector<int>& from) {
  if (from.size() > static_cast<size_t>(kMaxTiers)) return Invalid("too many remote tiers");
  struct Saved {
    std::vector<std::pair<std::string, std::string>> ops, published;
    std::optional<std::string> epoch, name;
  };
  std::vector<Saved> old(kMaxTiers);
  for (int o = 0; o < kMaxTiers; ++o) {
    auto keep = [&](std::vector<std::pair<std::string, std::string>>* out) {
      return [out](std::string_view k, std::string_view v) {
        out->emplace_back(std::string(k), std::string(v));
        return true;
      };
    };
    RETURN_IF_ERROR(Scan(store_->remote_ops_[o], {}, {}, keep(&old[o].ops)));
    RETURN_IF_ERROR(Scan(store_->published_[o], {}, {}, keep(&old[o].published)));
    ASSIGN_OR_RETURN(auto e, Get(store_->meta_, TierKey(kGcEpochKey, o)));
    if (e) old[o].epoch = std::string(*e);
    ASSIGN_OR_RETURN(auto n, Get(store_->meta_, TierKey(kTierNameKey, o)));
    if (n) old[o].name = std::string(*n);
  }
  for (int t = 0; t < kMaxTiers; ++t) {
    for (MDB_dbi dbi : {store_->remote_ops_[t], store_->published_[t]}) {
      const int rc = mdb_drop(txn_, dbi, 0);
      if (rc) return LmdbError(rc, "emptying the tables of remote tier " + std::to_string(t));
    }
    RETURN_IF_ERROR(Del(store_->meta_, TierKey(kGcEpochKey, t), true));
    RETURN_IF_ERROR(Del(store_->meta_, TierKey(kTierNameKey, t), true));
    const int o = t < static_cast<int>(from.size()) ? from[t] : -1;
    if (o < 0 || o >= kMaxTiers) continue;
    for (const auto& [k, v] : old[o].ops) RETURN_IF_ERROR(Put(store_->remote_ops_[t], k, v));
    for (const auto& [k, v] : old[o].published) RETURN_IF_ERROR(Put(store_->published_[t], k, v));
    if (old[o].epoch) RETURN_IF_ERROR(Put(store_->meta_, TierKey(kGcEpochKey, t), *old[o].epoch));
    if (old[o].name) RETURN_IF_ERROR(Put(store_->meta_, TierKey(kTierNameKey, t), *old[o].name));
  }
  // Chunk marks: new bit T is old bit from[T].
  std::vector<std::pair<ChunkId, ChunkRecord>> changed;
  RETURN_IF_ERROR(ForEachChunk([&](const ChunkId& id, const ChunkRecord& r) {
    uint8_t bits = 0;
    for (size_t t = 0; t < from.size(); ++t) {
      if (from[t] >= 0 && (r.tiers & (1u << from[t]))) bits = static_cast<uint8_t>(bits | (1u << t));
    }
    if (bits != r.tiers) {
      ChunkRecord n = r;
      n.tiers = bits;
      changed.emplace_back(id, n);
    }
  }));
  for (const auto& [id, r] : changed) RETURN_IF_ERROR(PutChunkRecord(id, r));
  return Status::Ok();
}

Result<bool> MetaStore::Txn::TierHasState(int tier) {
  bool any = false;
  auto found = [&](std::string_view, std::string_view) { return !(any = true); };
  RETURN_IF_ERROR(Scan(store_->published_[tier], {}, {}, found));
  if (!any) RETURN_IF_ERROR(Scan(store_->remote_ops_[tier], {}, {}, found));
  return any;
}

Status MetaStore::Txn::ForgetDropped(int tier) {
  std::vector<std::string> keys;
  RETURN_IF_ERROR(Scan(store_->published_[tier], {}, {}, [&](std::string_view k, std::string_view v) {
    if (v.size() == 8 && GetU64(v.data()) == kDroppedFromTier) keys.emplace_back(k);
    return true;
  }));
  for (const std::string& k : keys) RETURN_IF_ERROR(Del(store_->published_[tier], k, true));
  return Status::Ok();
}

Result<uint64_t> MetaStore::Txn::GetGcEpoch(int tier) {
  ASSIGN_OR_RETURN(auto v, Get(store_->meta_, TierKey(kGcEpochKey, tier)));
  if (!v) return uint64_t{0};
  if (v->size() != 8) return Corrupt("gc epoch record is damaged");
  return GetU64(v->data());
}

Status MetaStore::Txn::PutGcEpoch(int tier, uint64_t epoch) {
  std::string v;
  PutU64(v, epoch);
  return Put(store_->meta_, TierKey(kGcEpochKey, tier), v);
}

}  // namespace ckptfs
