// The .views tree's DCP and DeepSpeed planning: the source files each reads, and their plans
// (Megatron's are in views_megatron.cc).
#include <sys/stat.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "formats/dcp.h"
#include "reshard/dcp_view.h"
#include "reshard/deepspeed.h"
#include "fs/views_internal.h"

namespace ckptfs::fs {

Result<std::string> ViewTree::DeepSpeedTag(uint64_t root, std::string* latest) {
  ASSIGN_OR_RETURN(InodeRecord rec, source_->Lookup(root, kDsLatest));
  if (!S_ISREG(rec.mode)) return NotFound("latest is not a file");
  ASSIGN_OR_RETURN(std::string bytes, ReadReal(rec.ino, 4096));
  std::string tag = bytes;
  while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
  if (tag.empty() || tag.find('/') != std::string::npos || tag == "." || tag == "..") {
    return NotFound("latest names no tag");
  }
  ASSIGN_OR_RETURN(InodeRecord dir, source_->Lookup(root, tag));
  if (!S_ISDIR(dir.mode)) return NotFound("the tag is not a directory");
  if (!source_->Lookup(dir.ino, kDsModelStates).ok()) {  // ZeRO stages 1/2, else stage 3
    RETURN_IF_ERROR(source_->Lookup(dir.ino, kDsZero3ModelStates).status());
  }
  if (latest) *latest = std::move(bytes);
  return tag;
}

Status ViewTree::PlanDcp(Node* spec) {
  if (spec->planned) return Status::Ok();
  ASSIGN_OR_RETURN(InodeRecord meta_rec, source_->Lookup(spec->root, kDcpMetadata));
  ASSIGN_OR_RETURN(std::string meta_bytes, ReadReal(meta_rec.ino, kMaxSmallFile));
  ASSIGN_OR_RETURN(dcp::Metadata md, dcp::ParseMetadata(meta_bytes));
  auto sources = std::make_shared<Sources>();
  std::vector<reshard::DcpDataFile> files;
  std::map<std::string, uint32_t> index_of;
  for (const std::string& rel : md.Files()) {
    // Data files sit beside .metadata (FileSystemWriter writes no subdirectories).
    auto rec = source_->Lookup(spec->root, rel);
    if (!rec.ok()) return Invalid("data file " + rel + " named by .metadata is missing");
    ASSIGN_OR_RETURN(auto m, source_->Open(rec->ino));
    const uint32_t index = sources->Add(rec->ino, m);
    index_of[rel] = index;
    const zip::ReadAtFn read_at = ReadAtOf(m);
    ASSIGN_OR_RETURN(FileDescription desc, dcp::DescribeDataFile(md, rel, m->size(), read_at));
    files.push_back(reshard::DcpDataFile{rel, index, std::move(desc)});
  }
  std::map<std::string, std::string> items;
  for (const dcp::BytesEntry& b : md.bytes) {
    if (b.storage.length > kMaxSmallFile) return Invalid("item " + b.fqn + " is too large");
    const uint32_t index = index_of.at(b.storage.relative_path);
    std::vector<ReadSlice> slices;
    RETURN_IF_ERROR(sources->files[index]->Read(b.storage.offset, b.storage.length, &slices));
    std::string bytes;
    for (const ReadSlice& s : slices) bytes.append(reinterpret_cast<const char*>(s.data), s.len);
    items[b.fqn] = std::move(bytes);
  }
  ASSIGN_OR_RETURN(reshard::DcpView v, reshard::PlanDcpConsolidated(md, files, items));
  for (auto [name, file] : {std::pair{"model.pt", &v.model_pt},
                            std::pair{"model.safetensors", &v.model_safetensors}}) {
    Node* f = AddChild(spec, name, kFile);
    f->body = std::make_shared<Body>();
    f->body->file = std::move(*file);
    f->body->sources = sources;
  }
  spec->planned = true;
  source_->CountPlan();
  return Status::Ok();
}

Result<reshard::DeepSpeedSource> ViewTree::ReadDeepSpeed(uint64_t root, Sources* sources,
                                                         std::string* latest, bool parse_layers) {
  reshard::DeepSpeedSource src;
  ASSIGN_OR_RETURN(src.tag, DeepSpeedTag(root, latest));
  ASSIGN_OR_RETURN(InodeRecord dir, source_->Lookup(root, src.tag));
  std::vector<std::string> names, layers, moe_files;
  RETURN_IF_ERROR(source_->ReadDir(dir.ino, 0, [&](const DirItem& item) {
    if (reshard::IsDeepSpeedSourceName(item.name)) names.emplace_back(item.name);
    if (reshard::IsDeepSpeedLayerName(item.name)) layers.emplace_back(item.name);
    if (reshard::IsDeepSpeedMoeName(item.name)) moe_files.emplace_back(item.name);
    return true;
  }));
  for (const std::string& name : moe_files) {  // carried as they are: not parsed
    ASSIGN_OR_RETURN(InodeRecord f, source_->Lookup(dir.ino, name));
    ASSIGN_OR_RETURN(auto m, source_->Open(f.ino));
    src.moe_files.push_back({name, sources->Add(f.ino, m), m->size(), nullptr, {}});
  }
  for (const std::string& name : layers) {
    ASSIGN_OR_RETURN(InodeRecord f, source_->Lookup(dir.ino, name));
    ASSIGN_OR_RETURN(auto m, source_->Open(f.ino));
    reshard::DsLayerFile lf{name, sources->Add(f.ino, m), m->size(), nullptr, {}};
    if (parse_layers) {
      ASSIGN_OR_RETURN(lf.file, ReadSourceTorch(sources, lf.source, src.tag + "/" + name,
                                                &lf.extra_records));
    }
    src.layers.push_back(std::move(lf));
  }
  for (std::string_view name : reshard::kDsRootFiles) {
    auto f = source_->Lookup(root, name);
    if (!f.ok() || !S_ISREG(f->mode)) continue;
    ASSIGN_OR_RETURN(auto m, source_->Open(f->ino));
    src.root_files.push_back({std::string(name), sources->Add(f->ino, m), m->size()});
  }
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(InodeRecord f, source_->Lookup(dir.ino, name));
    ASSIGN_OR_RETURN(auto m, source_->Open(f.ino));
    reshard::DsSourceFile sf;
    sf.name = name;
    sf.source = sources->Add(f.ino, m);
    sf.size = m->size();
    ASSIGN_OR_RETURN(sf.file, ReadSourceTorch(sources, sf.source, src.tag + "/" + name,
                                              &sf.extra_records));
    src.files.push_back(std::move(sf));
  }
  return src;
}

Status ViewTree::PlanDeepSpeed(Node* spec) {
  if (spec->planned) return Status::Ok();
  reshard::DsSpec ds;
  if (!reshard::ParseDsSpec(spec->spec, &ds)) return NotFound(spec->spec);
  auto sources = std::make_shared<Sources>();
  ASSIGN_OR_RETURN(reshard::DeepSpeedSource src,
                   ReadDeepSpeed(spec->root, sources.get(), &spec->tracker,
                                 ds.kind == reshard::DsSpec::kTpDp));
  ASSIGN_OR_RETURN(std::vector<reshard::ViewEntry> entries, reshard::PlanDeepSpeed(src, ds));
  PlanTree(spec, std::move(entries), std::move(sources));
  return Status::Ok();
}

}  // namespace ckptfs::fs
