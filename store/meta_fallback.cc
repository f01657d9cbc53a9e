// MetaStore's fallbacks table (see FallbackRecord).
#include <utility>

#include "store/meta_codec.h"
#include "store/meta_store.h"

namespace ckptfs {
namespace {

using meta_codec::GetU64;
using meta_codec::InoKey;
using meta_codec::PutU64;

constexpr uint8_t kFallbackVersion = 1;
constexpr uint8_t kAbsent = 1, kStaged = 2;

// version, flags, touch, mtime, boot id length, boot id, manifest.
std::string EncodeFallback(const FallbackRecord& r) {
  std::string out;
  out.push_back(static_cast<char>(kFallbackVersion));
  out.push_back(static_cast<char>((r.absent ? kAbsent : 0) | (r.staged ? kStaged : 0)));
  PutU64(out, r.touch);
  PutU64(out, static_cast<uint64_t>(r.mtime_ns));
  PutU64(out, r.boot_id.size());
  out += r.boot_id;
  out += r.manifest.Encode();
  return out;
}

Result<FallbackRecord> DecodeFallback(uint64_t ino, std::string_view v) {
  constexpr size_t kHead = 26;
  auto damaged = [&] {
    return Corrupt("fallback record of inode " + std::to_string(ino) + " is damaged");
  };
  if (v.size() < kHead || static_cast<uint8_t>(v[0]) != kFallbackVersion) return damaged();
  FallbackRecord r;
  const auto flags = static_cast<uint8_t>(v[1]);
  r.absent = flags & kAbsent;
  r.staged = flags & kStaged;
  r.touch = GetU64(v.data() + 2);
  r.mtime_ns = static_cast<int64_t>(GetU64(v.data() + 10));
  const uint64_t n = GetU64(v.data() + 18);
  if (n > v.size() - kHead) return damaged();
  r.boot_id = std::string(v.substr(kHead, n));
  auto m = Manifest::Decode(v.substr(kHead + n));
  if (!m.ok()) return damaged();
  r.manifest = std::move(*m);
  return r;
}

}  // namespace

Result<std::optional<FallbackRecord>> MetaStore::Txn::GetFallback(uint64_t ino) {
  if (!store_->has_fallbacks_) return std::optional<FallbackRecord>();
  ASSIGN_OR_RETURN(auto v, Get(store_->fallbacks_, InoKey(ino)));
  if (!v) return std::optional<FallbackRecord>();
  ASSIGN_OR_RETURN(FallbackRecord r, DecodeFallback(ino, *v));
  return std::optional<FallbackRecord>(std::move(r));
}

Status MetaStore::Txn::PutFallback(uint64_t ino, const FallbackRecord& r) {
  return Put(store_->fallbacks_, InoKey(ino), EncodeFallback(r));
}

Status MetaStore::Txn::DelFallback(uint64_t ino) {
  if (!store_->has_fallbacks_) return Status::Ok();
  return Del(store_->fallbacks_, InoKey(ino), true);
}

Status MetaStore::Txn::ForEachFallback(
    const std::function<void(uint64_t, const FallbackRecord&)>& fn) {
  if (!store_->has_fallbacks_) return Status::Ok();
  Status bad;
  RETURN_IF_ERROR(Scan(store_->fallbacks_, {}, {}, [&](std::string_view k, std::string_view v) {
    if (k.size() != 8) {
      bad = Corrupt("a fallback record's key is damaged");
      return false;
    }
    auto r = DecodeFallback(GetU64(k.data()), v);
    if (!r.ok()) {
      bad = r.status();
      return false;
    }
    fn(GetU64(k.data()), *r);
    return true;
  }));
  return bad;
}

}  // namespace ckptfs
