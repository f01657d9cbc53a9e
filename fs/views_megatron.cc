// The Megatron-LM side of the view tree: an iteration's rank files read and planned for a
// tpT-ppP view, and the hf view.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include "formats/dcp.h"
#include "fs/views_internal.h"
#include "reshard/megatron.h"
#include "reshard/megatron_dist.h"
#include "reshard/megatron_hf.h"

namespace ckptfs::fs {

bool ParseRankDir(std::string_view n, std::vector<uint32_t>* numbers) {
  numbers->clear();
  if (!n.starts_with("mp_rank_") || n.size() < 10) return false;
  // Two digits, then up to two groups of "_" and three digits.
  auto digits = [&](size_t at, size_t len) -> std::optional<uint32_t> {
    uint32_t v = 0;
    for (size_t i = at; i < at + len; ++i) {
      if (i >= n.size() || !std::isdigit(static_cast<unsigned char>(n[i]))) return std::nullopt;
      v = v * 10 + static_cast<uint32_t>(n[i] - '0');
    }
    return v;
  };
  auto tp = digits(8, 2);
  if (!tp) return false;
  numbers->push_back(*tp);
  size_t at = 10;
  while (at < n.size()) {
    if (numbers->size() == 3 || n[at] != '_' || n.size() < at + 4) return false;
    auto x = digits(at + 1, 3);
    if (!x) return false;
    numbers->push_back(*x);
    at += 4;
  }
  return true;
}

Result<reshard::MegatronSource> ViewTree::ReadMegatronIter(uint64_t root,
                                                           const std::string& iter_name,
                                                           Sources* sources,
                                                           bool with_distrib) {
  ASSIGN_OR_RETURN(InodeRecord dir, source_->Lookup(root, iter_name));
  // The rank files, as the directory names them.
  std::vector<std::pair<std::string, std::vector<uint32_t>>> ranks;
  RETURN_IF_ERROR(source_->ReadDir(dir.ino, 0, [&](const DirItem& item) {
    std::vector<uint32_t> numbers;
    if (ParseRankDir(item.name, &numbers)) ranks.push_back({std::string(item.name), numbers});
    return true;
  }));
  if (ranks.empty()) {
    if (source_->Lookup(dir.ino, kTorchDistConfig).ok()) {
      return Invalid(iter_name + " is a torch_dist checkpoint, which Megatron reshards itself "
                     "when it loads it: its views are hf and " + iter_name +
                     "/.views/consolidated");
    }
    return Invalid(iter_name + " holds no mp_rank_* directories");
  }
  std::sort(ranks.begin(), ranks.end());
  reshard::MegatronSource src;
  for (const auto& [name, numbers] : ranks) {
    ASSIGN_OR_RETURN(InodeRecord rd, source_->Lookup(dir.ino, name));
    auto f = source_->Lookup(rd.ino, kRankFile);
    if (!f.ok()) return Invalid(iter_name + "/" + name + " has no " + std::string(kRankFile));
    ASSIGN_OR_RETURN(auto m, source_->Open(f->ino));
    reshard::MegatronRankFile rf;
    rf.source = sources->Add(f->ino, m);
    ASSIGN_OR_RETURN(rf.file, ReadSourceTorch(sources, rf.source,
                                              iter_name + "/" + name + "/" +
                                                  std::string(kRankFile),
                                              &rf.extra_records));
    if (auto df = source_->Lookup(rd.ino, kDistribFile); with_distrib && df.ok()) {
      ASSIGN_OR_RETURN(auto dm, source_->Open(df->ino));
      rf.distrib_source = sources->Add(df->ino, dm);
      ASSIGN_OR_RETURN(rf.distrib, ReadSourceTorch(sources, rf.distrib_source,
                                                   iter_name + "/" + name + "/" +
                                                       std::string(kDistribFile),
                                                   &rf.distrib_extra_records));
    }
    src.ranks.push_back(std::move(rf));
  }
  // Which number is which: mp_rank_TT_NNN is a pipeline rank, or with expert parallelism and no
  // pipeline parallelism an expert-parallel rank (Megatron's get_checkpoint_name). The args of
  // the first file say which.
  ASSIGN_OR_RETURN(reshard::MegatronModel model, reshard::ReadMegatronModel(*src.ranks[0].file));
  const bool ep_second = model.num_experts > 0 && model.source_ep > 1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::vector<uint32_t>& n = ranks[i].second;
    reshard::MegatronRankFile& rf = src.ranks[i];
    if (n.size() != ranks[0].second.size()) {
      return Invalid(iter_name + " mixes rank directory forms (" + ranks[0].first + ", " +
                     ranks[i].first + ")");
    }
    rf.tp = n[0];
    if (n.size() == 2) (ep_second ? rf.ep : rf.pp) = n[1];
    if (n.size() == 3) {
      rf.pp = n[1];
      rf.ep = n[2];
    }
    src.tp = std::max(src.tp, rf.tp + 1);
    src.pp = std::max(src.pp, rf.pp + 1);
    src.ep = std::max(src.ep, rf.ep + 1);
  }
  if (ranks.size() != size_t{src.tp} * src.pp * src.ep) {
    return Invalid(iter_name + " does not hold a complete " + std::to_string(src.tp) + "x" +
                   std::to_string(src.pp) + "x" + std::to_string(src.ep) +
                   " (TP x PP x EP) grid of rank directories");
  }
  return src;
}

Status ViewTree::PlanMegatronIter(Node* iter) {
  if (iter->planned) return Status::Ok();
  auto sources = std::make_shared<Sources>();
  ASSIGN_OR_RETURN(reshard::MegatronSource src,
                   ReadMegatronIter(iter->root, iter->name, sources.get(), true));
  std::vector<reshard::ViewFile> distrib;
  const uint32_t asked = iter->E;
  iter->E = asked ? asked : src.ep;  // tpT-ppP keeps the source's expert parallelism
  ASSIGN_OR_RETURN(auto files,
                   reshard::PlanMegatron(src, iter->T, iter->P, *rules_, &distrib, asked));
  // plan[(p * E + e) * T + t]: model_optim_rng.pt; plan[T * P * E + that]: distrib_optim.pt, if
  // any.
  for (auto& f : distrib) files.push_back(std::move(f));
  for (auto& f : files) {
    auto b = std::make_shared<Body>();
    b->file = std::move(f);
    b->sources = sources;
    iter->plan.push_back(std::move(b));
  }
  iter->planned = true;
  source_->CountPlan();
  return Status::Ok();
}

Status ViewTree::PlanMegatronHf(Node* spec) {
  if (spec->planned) return Status::Ok();
  ASSIGN_OR_RETURN(spec->tracker, ReadTracker(spec->root));
  ASSIGN_OR_RETURN(std::string iter_name, TrackedIteration(spec->tracker));
  auto sources = std::make_shared<Sources>();
  ASSIGN_OR_RETURN(InodeRecord iter, source_->Lookup(spec->root, iter_name));
  std::vector<reshard::ViewEntry> entries;
  if (source_->Lookup(iter.ino, kTorchDistConfig).ok()) {  // torch_dist: DCP, no rank files
    ASSIGN_OR_RETURN(reshard::MegatronTensors tensors,
                     ReadTorchDist(spec->root, iter_name, sources.get()));
    ASSIGN_OR_RETURN(entries, reshard::PlanMegatronHf(std::move(tensors), hf_options_));
  } else {
    ASSIGN_OR_RETURN(reshard::MegatronSource src,
                     ReadMegatronIter(spec->root, iter_name, sources.get()));
    ASSIGN_OR_RETURN(entries, reshard::PlanMegatronHf(src, *rules_, hf_options_));
  }
  PlanTree(spec, std::move(entries), std::move(sources));
  return Status::Ok();
}

Result<reshard::MegatronModel> ViewTree::ReadModel(uint64_t root) {
  ASSIGN_OR_RETURN(std::string tracker, ReadTracker(root));
  ASSIGN_OR_RETURN(std::string iter_name, TrackedIteration(tracker));
  ASSIGN_OR_RETURN(InodeRecord iter, source_->Lookup(root, iter_name));
  if (source_->Lookup(iter.ino, kTorchDistConfig).ok()) {
    ASSIGN_OR_RETURN(TorchFile common, ReadTorchDistCommon(iter.ino, iter_name, nullptr));
    return reshard::ReadMegatronModel(common, /*torch_dist=*/true);
  }
  std::string first;
  RETURN_IF_ERROR(source_->ReadDir(iter.ino, 2, [&](const DirItem& item) {
    std::vector<uint32_t> numbers;
    if (ParseRankDir(item.name, &numbers)) first = item.name;
    return first.empty();
  }));
  if (first.empty()) return NotFound("no rank directory");
  ASSIGN_OR_RETURN(InodeRecord rd, source_->Lookup(iter.ino, first));
  ASSIGN_OR_RETURN(InodeRecord f, source_->Lookup(rd.ino, kRankFile));
  ASSIGN_OR_RETURN(auto m, source_->Open(f.ino));
  ASSIGN_OR_RETURN(TorchFile tf, ReadTorchFile(m->size(), ReadAtOf(m)));
  return reshard::ReadMegatronModel(tf);
}

Result<TorchFile> ViewTree::ReadTorchDistCommon(uint64_t iter, const std::string& iter_name,
                                                const dcp::Metadata* md) {
  // Megatron before 2026-07 wrote the common state (args, iteration, ...) to common.pt; since,
  // it is the DCP item common_state/shard_0_1, torch.save([state]).
  std::string bytes;
  if (auto c = source_->Lookup(iter, kTorchDistCommon); c.ok()) {
    ASSIGN_OR_RETURN(bytes, ReadReal(c->ino, kMaxSmallFile));
  } else {
    dcp::Metadata parsed;
    if (!md) {
      ASSIGN_OR_RETURN(InodeRecord rec, source_->Lookup(iter, kDcpMetadata));
      ASSIGN_OR_RETURN(std::string meta, ReadReal(rec.ino, kMaxSmallFile));
      ASSIGN_OR_RETURN(parsed, dcp::ParseMetadata(meta));
      md = &parsed;
    }
    const dcp::BytesEntry* item = reshard::CommonStateItem(*md);
    if (!item) return Invalid(iter_name + " has neither common.pt nor a common_state item");
    if (!item->storage.transforms.empty()) {
      return Invalid(iter_name + ": the common state is stored transformed (" +
                     item->storage.transforms[0] + ")");
    }
    if (item->storage.length > kMaxSmallFile) return Invalid("the common state is too large");
    ASSIGN_OR_RETURN(InodeRecord f, source_->Lookup(iter, item->storage.relative_path));
    ASSIGN_OR_RETURN(auto m, source_->Open(f.ino));
    ASSIGN_OR_RETURN(bytes, ReadAtOf(m)(item->storage.offset, item->storage.length));
  }
  auto tf = reshard::ParseTorchDistCommon(bytes);
  if (!tf.ok()) return Invalid(iter_name + ": " + tf.status().message());
  return tf;
}

Result<reshard::MegatronTensors> ViewTree::ReadTorchDist(uint64_t root, const std::string& iter_name,
                                                         Sources* sources) {
  ASSIGN_OR_RETURN(InodeRecord iter, source_->Lookup(root, iter_name));
  ASSIGN_OR_RETURN(InodeRecord meta_rec, source_->Lookup(iter.ino, kDcpMetadata));
  ASSIGN_OR_RETURN(std::string meta_bytes, ReadReal(meta_rec.ino, kMaxSmallFile));
  ASSIGN_OR_RETURN(dcp::Metadata md, dcp::ParseMetadata(meta_bytes));
  std::vector<reshard::DcpDataFile> files;
  for (const std::string& rel : md.Files()) {
    auto rec = source_->Lookup(iter.ino, rel);
    if (!rec.ok()) return Invalid(iter_name + ": data file " + rel + " named by .metadata is missing");
    ASSIGN_OR_RETURN(auto m, source_->Open(rec->ino));
    const uint32_t index = sources->Add(rec->ino, m);
    ASSIGN_OR_RETURN(FileDescription desc,
                     dcp::DescribeDataFile(md, rel, m->size(), ReadAtOf(m)));
    files.push_back(reshard::DcpDataFile{rel, index, std::move(desc)});
  }
  ASSIGN_OR_RETURN(TorchFile common, ReadTorchDistCommon(iter.ino, iter_name, &md));
  return reshard::ListTorchDistTensors(common, md, files);
}

}  // namespace ckptfs::fs
