// StoreSource: the views' sources in a mounted daemon, the store's committed files.
#include <utility>

#include "fs/checkpoint_source.h"

namespace ckptfs::fs {
namespace {

class StoreFile final : public SourceFile {
 public:
  StoreFile(Store* store, std::shared_ptr<const Manifest> m) : store_(store), m_(std::move(m)) {}
  uint64_t size() const override { return m_->size(); }
  Status Read(uint64_t offset, uint64_t len, std::vector<ReadSlice>* out) const override {
    return store_->ReadCommitted(*m_, offset, len, out);
  }
  void Warm(uint64_t offset, uint64_t len) const override {
    store_->WarmCommitted(m_, offset, len);
  }
  bool SameVersion(const SourceFile& now) const override {
    const auto* other = dynamic_cast<const StoreFile*>(&now);
    return other && *other->m_ == *m_;
  }

 private:
  Store* const store_;
  const std::shared_ptr<const Manifest> m_;
};

class StoreSource final : public CheckpointSource {
 public:
  explicit StoreSource(Store* store) : store_(store) {}
  Result<InodeRecord> Lookup(uint64_t dir, std::string_view name) override {
    return store_->Lookup(dir, name);
  }
  Result<InodeRecord> GetAttr(uint64_t id) override { return store_->GetAttr(id); }
  Status ReadDir(uint64_t dir, uint64_t offset,
                 const std::function<bool(const DirItem&)>& fn) override {
    return store_->ReadDir(dir, offset, fn);
  }
  Result<std::shared_ptr<const SourceFile>> Open(uint64_t file) override {
    // Seals a staged file first: a view reads committed bytes only.
    ASSIGN_OR_RETURN(auto m, store_->CommittedManifest(file));
    return std::shared_ptr<const SourceFile>(std::make_shared<StoreFile>(store_, std::move(m)));
  }
  std::string Describe(uint64_t dir) override {
    auto path = store_->ParentOf(dir);
    return path.ok() ? path->second : "";
  }
  void CountPlan() override { store_->metrics().view_plans.Add(1); }

 private:
  Store* const store_;
};

}  // namespace

std::unique_ptr<CheckpointSource> NewStoreSource(Store* store) {
  return std::make_unique<StoreSource>(store);
}

}  // namespace ckptfs::fs
