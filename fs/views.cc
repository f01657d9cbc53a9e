#include "fs/views.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <sstream>

#include "formats/torch_file.h"
#include "reshard/deepspeed.h"
#include "reshard/megatron.h"
#include "fs/views_internal.h"

namespace ckptfs::fs {

// Random access to one version of a source file.
zip::ReadAtFn ReadAtOf(std::shared_ptr<const SourceFile> f) {
  return [f](uint64_t off, size_t len) -> Result<std::string> {
    std::vector<ReadSlice> slices;
    RETURN_IF_ERROR(f->Read(off, len, &slices));
    std::string out;
    for (const ReadSlice& s : slices) out.append(reinterpret_cast<const char*>(s.data), s.len);
    if (out.size() != len) return Corrupt("short read");
    return out;
  };
}

// The iteration directory a tracker file's bytes name ("iter_0000100" or "release").
Result<std::string> TrackedIteration(std::string tracker) {
  while (!tracker.empty() && std::isspace(static_cast<unsigned char>(tracker.back()))) {
    tracker.pop_back();
  }
  if (tracker == "release") return tracker;
  try {
    char buf[32];
    std::snprintf(buf, sizeof buf, "iter_%07lld", std::stoll(tracker));
    return std::string(buf);
  } catch (const std::exception&) {
    return Invalid("the tracker file holds '" + tracker + "', not an iteration");
  }
}

// Reads stored torch file `index` of `sources` (`where` names it in errors): its parse, the CRCs
// of its records (for KnownCrcFn), and its records other than data.pkl and data/*, which view
// files copy.
Result<std::shared_ptr<const TorchFile>> ReadSourceTorch(
    Sources* sources, uint32_t index, const std::string& where,
    std::vector<std::pair<std::string, std::string>>* extra_records) {
  const auto& m = sources->files[index];
  const zip::ReadAtFn read_at = ReadAtOf(m);
  auto tf = ReadTorchFile(m->size(), read_at);
  if (!tf.ok()) return Invalid(where + ": " + tf.status().message());
  const std::string prefix = tf->prefix + "/";
  for (const zip::Entry& e : tf->dir.entries) {
    sources->records[index][e.data_offset] = {e.size, e.crc32};
    const std::string rel = e.name.substr(std::min(prefix.size(), e.name.size()));
    if (rel == "data.pkl" || rel.starts_with("data/")) continue;
    if (e.size > kMaxSmallFile) return Invalid("record " + e.name + " is too large to copy");
    ASSIGN_OR_RETURN(std::string bytes, read_at(e.data_offset, e.size));
    extra_records->emplace_back(rel, std::move(bytes));
  }
  return std::make_shared<const TorchFile>(std::move(*tf));
}

Result<std::shared_ptr<ViewTree>> ViewTree::Make(CheckpointSource* source, Logger log,
                                                 const std::string& rules_file,
                                                 const reshard::HfOptions& hf) {
  std::shared_ptr<const reshard::Rules> rules = reshard::Rules::BuiltIn();
  if (!rules_file.empty()) {
    std::ifstream in(rules_file);
    if (!in) return Invalid("cannot read the view rules file " + rules_file);
    std::stringstream ss;
    ss << in.rdbuf();
    ASSIGN_OR_RETURN(rules, reshard::Rules::Parse(ss.str()));
  }
  if (hf.max_shard_bytes == 0) return Invalid("hf_shard_size must be at least 1 byte");
  return std::shared_ptr<ViewTree>(new ViewTree(source, std::move(log), std::move(rules), hf));
}

ViewTree::ViewTree(CheckpointSource* source, Logger log, std::shared_ptr<const reshard::Rules> rules,
                   const reshard::HfOptions& hf)
    : source_(source), log_(std::move(log)), rules_(std::move(rules)), hf_options_(hf) {}
ViewTree::~ViewTree() = default;

ViewTree::Node* ViewTree::Get(uint64_t ino) {
  const uint64_t i = ino & ~kViewInoBit;
  if (!IsViewIno(ino) || i >= nodes_.size()) return nullptr;
  return nodes_[i].get();
}

ViewTree::Node* ViewTree::AddChild(Node* parent, std::string name, int type) {
  auto n = std::make_unique<Node>();
  n->ino = kViewInoBit | nodes_.size();
  n->type = type;
  n->name = name;
  if (parent) {
    n->parent = parent->ino;
    n->kind = parent->kind;
    n->root = parent->root;
    n->spec = parent->spec;
    n->T = parent->T;
    n->P = parent->P;
    n->E = parent->E;
    parent->children[name] = n->ino;
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().get();
}

Result<std::string> ViewTree::ReadTracker(uint64_t root) {
  ASSIGN_OR_RETURN(InodeRecord tr, source_->Lookup(root, kTracker));
  return ReadReal(tr.ino, 4096);
}

Result<std::string> ViewTree::ReadReal(uint64_t ino, uint64_t max_len) {
  ASSIGN_OR_RETURN(auto m, source_->Open(ino));
  if (m->size() > max_len) return Invalid("file too large to read whole");
  std::vector<ReadSlice> slices;
  RETURN_IF_ERROR(m->Read(0, m->size(), &slices));
  std::string out;
  for (const ReadSlice& s : slices) out.append(reinterpret_cast<const char*>(s.data), s.len);
  return out;
}

bool ViewTree::HasViews(uint64_t dir) {
  return source_->Lookup(dir, kTracker).ok() || source_->Lookup(dir, kDcpMetadata).ok() ||
         DeepSpeedTag(dir, nullptr).ok();
}

Result<InodeRecord> ViewTree::LookupViews(uint64_t root) {
  Kind kind;
  if (source_->Lookup(root, kTracker).ok()) {
    kind = Kind::kMegatron;
  } else if (source_->Lookup(root, kDcpMetadata).ok()) {
    kind = Kind::kDcp;
  } else if (DeepSpeedTag(root, nullptr).ok()) {
    kind = Kind::kDeepSpeed;
  } else {
    return NotFound(".views");
  }
  std::lock_guard lock(mu_);
  auto it = views_of_.find(root);
  Node* n;
  if (it != views_of_.end()) {
    n = Get(it->second);
  } else {
    n = AddChild(nullptr, std::string(kViewsName), kViewsDir);
    n->parent = root;
    n->root = root;
    n->kind = kind;
    views_of_[root] = n->ino;
  }
  return Attr(*n);
}

Result<InodeRecord> ViewTree::Attr(const Node& n) {
  ASSIGN_OR_RETURN(InodeRecord root, source_->GetAttr(n.root));
  InodeRecord r;
  r.ino = n.ino;
  r.uid = root.uid;
  r.gid = root.gid;
  r.atime_ns = r.mtime_ns = r.ctime_ns = root.mtime_ns;
  if (n.type == kFile) {
    r.mode = S_IFREG | 0444;
    r.nlink = 1;
    r.size = n.body->file.recipe.size();
    r.data_bytes = r.size;  // no holes: st_blocks counts every byte (du, sparse-aware copies)
  } else {
    r.mode = S_IFDIR | 0555;
    r.nlink = 2;
  }
  return r;
}

namespace {

// "tpT-ppP" -> (T, P, 0), "tpT-ppP-epE" -> (T, P, E).
bool ParseMegatronSpec(std::string_view s, uint32_t* T, uint32_t* P, uint32_t* E) {
  unsigned t = 0, p = 0, e = 0;
  char tail = 0;
  const std::string str(s);
  const int n = std::sscanf(str.c_str(), "tp%u-pp%u-ep%u%c", &t, &p, &e, &tail);
  if (n != 2 && n != 3) return false;
  if (t == 0 || p == 0 || t > 4096 || p > 4096 || (n == 3 && (e == 0 || e > 4096))) return false;
  std::string canon = "tp" + std::to_string(t) + "-pp" + std::to_string(p);
  if (n == 3) canon += "-ep" + std::to_string(e);
  if (str != canon) return false;
  *T = t;
  *P = p;
  *E = n == 3 ? e : 0;
  return true;
}

}  // namespace

bool IsIterationName(std::string_view n) {
  if (n == "release") return true;
  if (n.size() != 12 || !n.starts_with("iter_")) return false;
  return n.substr(5).find_first_not_of("0123456789") == std::string_view::npos;
}

void ViewTree::PlanTree(Node* spec, std::vector<reshard::ViewEntry> entries,
                        std::shared_ptr<Sources> sources) {
  // The tree, directories made as the paths name them.
  for (reshard::ViewEntry& e : entries) {
    Node* at = spec;
    size_t from = 0;
    for (size_t slash; (slash = e.path.find('/', from)) != std::string::npos; from = slash + 1) {
      const std::string part = e.path.substr(from, slash - from);
      auto it = at->children.find(part);
      at = it != at->children.end() ? Get(it->second) : AddChild(at, part, kTreeDir);
    }
    Node* f = AddChild(at, e.path.substr(from), kFile);
    f->body = std::make_shared<Body>();
    f->body->file = std::move(e.file);
    f->body->sources = sources;
  }
  spec->sources = std::move(sources);
  spec->planned = true;
  source_->CountPlan();
}

Status ViewTree::MakeSpec(Node* views, const std::string& spec, Node** out) {
  if (views->kind == Kind::kDcp) {
    if (spec != "consolidated") {
      return NotFound("no view of a DCP checkpoint: its one view is consolidated");
    }
    Node* n = AddChild(views, spec, kSpecDir);
    n->spec = spec;
    Status st = PlanDcp(n);
    if (!st.ok()) {
      views->children.erase(spec);  // the node stays unreachable; the next lookup tries again
      return st;
    }
    *out = n;
    return Status::Ok();
  }
  if (views->kind == Kind::kDeepSpeed) {
    reshard::DsSpec ds;
    if (!reshard::ParseDsSpec(spec, &ds)) {
      return NotFound("no view of a DeepSpeed checkpoint: its views are dpD, tpT-dpD (D and T "
                      "from 1, without leading zeros) and universal");
    }
    Node* n = AddChild(views, spec, kSpecDir);
    n->spec = spec;
    Status st = PlanDeepSpeed(n);
    if (!st.ok()) {
      views->children.erase(spec);
      return st;
    }
    *out = n;
    return Status::Ok();
  }
  if (spec == "hf") {
    Node* n = AddChild(views, spec, kSpecDir);
    n->spec = spec;
    n->kind = Kind::kMegatronHf;
    Status st = PlanMegatronHf(n);
    if (!st.ok()) {
      views->children.erase(spec);
      return st;
    }
    *out = n;
    return Status::Ok();
  }
  uint32_t T, P, E;
  if (!ParseMegatronSpec(spec, &T, &P, &E)) {
    return NotFound(
        "no view of a Megatron-LM checkpoint: its views are tpT-ppP and, with "
        "experts, tpT-ppP-epE (T, P and E from 1, without leading zeros) and hf");
  }
  // Plan the iteration the tracker names now, so that an impossible spec fails here.
  ASSIGN_OR_RETURN(std::string tracker, ReadTracker(views->root));
  ASSIGN_OR_RETURN(std::string iter_name, TrackedIteration(tracker));
  Node* n = AddChild(views, spec, kSpecDir);
  n->spec = spec;
  n->T = T;
  n->P = P;
  n->E = E;
  Node* iter = AddChild(n, iter_name, kIterDir);
  Status st = PlanMegatronIter(iter);
  if (!st.ok()) {
    views->children.erase(spec);
    return st;
  }
  *out = n;
  return Status::Ok();
}

bool ViewTree::Fresh(const Node& n) {
  auto same = [&](const std::shared_ptr<Sources>& src) {
    if (!src) return true;
    for (size_t i = 0; i < src->inos.size(); ++i) {
      auto now = source_->Open(src->inos[i]);
      if (!now.ok() || !src->files[i]->SameVersion(**now)) return false;
    }
    return true;
  };
  auto same_tracker = [&] {
    auto bytes = ReadTracker(n.root);
    return bytes.ok() && *bytes == n.tracker;
  };
  if (n.type == kFile && !n.tracker.empty()) return same_tracker();
  if (n.type == kIterDir) return n.plan.empty() || same(n.plan[0]->sources);
  if (n.type == kSpecDir && n.kind == Kind::kDeepSpeed) {
    std::string latest;
    return DeepSpeedTag(n.root, &latest).ok() && latest == n.tracker && same(n.sources);
  }
  if (n.type == kSpecDir && n.kind == Kind::kMegatronHf) return same_tracker() && same(n.sources);
  if (n.type == kSpecDir && n.kind == Kind::kDcp) {
    for (const auto& [name, ino] : n.children) {
      const Node* f = nodes_[ino & ~kViewInoBit].get();
      if (f->body && !same(f->body->sources)) return false;
    }
  }
  return true;
}

Result<InodeRecord> ViewTree::Lookup(uint64_t parent, std::string_view name_view) {
  std::lock_guard lock(mu_);
  Node* dir = Get(parent);
  if (!dir) return NotFound("no such view inode");
  if (dir->type == kFile) return Status(Code::kNotDir, "a view file");
  const std::string name(name_view);
  if (auto it = dir->children.find(name); it != dir->children.end()) {
    Node* have = Get(it->second);
    if (Fresh(*have)) return Attr(*have);
    // The checkpoint changed under the view: plan anew (the old inode serves those who hold it).
    dir->children.erase(it);
  }
  Node* made = nullptr;
  switch (dir->type) {
    case kViewsDir: {
      Status st = MakeSpec(dir, name, &made);
      if (!st.ok()) {
        // Every refusal is kept with its reason (user.ckptfs.view_errors) and logged, whatever
        // its errno: a loader that finds no view starts from scratch without saying why.
        const bool invalid = st.code() != Code::kNotFound;
        const std::string path = source_->Describe(dir->root);
        log_->log(invalid ? spdlog::level::warn : spdlog::level::info,
                  "view {} of directory inode {}{}: {}", name, dir->root,
                  path.empty() ? "" : " (" + path + ")", st.message());
        if (dir->errors.size() >= kMaxViewErrors && !dir->errors.count(name)) {
          dir->errors.erase(dir->errors.begin());  // bounded: a name may be anything
        }
        dir->errors[name] = st.message();
        return invalid ? Status(Code::kInvalid, st.message()) : st;
      }
      dir->errors.erase(name);
      break;
    }
    case kSpecDir: {
      if (dir->kind != Kind::kMegatron) return NotFound(name);
      if (name == kTracker) {
        ASSIGN_OR_RETURN(std::string bytes, ReadTracker(dir->root));
        made = AddChild(dir, name, kFile);
        made->tracker = bytes;
        made->body = std::make_shared<Body>();
        made->body->file.recipe.AddLiteral(std::move(bytes));
        break;
      }
      if (!IsIterationName(name)) return NotFound(name);
      auto real = source_->Lookup(dir->root, name);
      if (!real.ok() || !S_ISDIR(real->mode)) return NotFound(name);
      made = AddChild(dir, name, kIterDir);
      Status st = PlanMegatronIter(made);
      if (!st.ok()) {
        dir->children.erase(name);
        log_->warn("view {}/{}: {}", dir->spec, name, st.message());
        return Status(Code::kInvalid, st.message());
      }
      break;
    }
    case kIterDir: {
      for (uint32_t p = 0; p < dir->P && !made; ++p) {
        for (uint32_t e = 0; e < dir->E && !made; ++e) {
          for (uint32_t t = 0; t < dir->T; ++t) {
            if (reshard::MegatronRankDir(t, p, dir->P, e, dir->E) == name) {
              made = AddChild(dir, name, kRankDir);
              made->t = t;
              made->p = p;
              made->e = e;
              break;
            }
          }
        }
      }
      if (!made) return NotFound(name);
      break;
    }
    case kRankDir: {
      Node* iter = Get(dir->parent);
      const size_t ranks = size_t{dir->T} * dir->P * dir->E;
      size_t at = (size_t{dir->p} * dir->E + dir->e) * dir->T + dir->t;
      if (name == kDistribFile && iter->plan.size() == 2 * ranks) {
        at += ranks;
      } else if (name != kRankFile) {
        return NotFound(name);
      }
      made = AddChild(dir, name, kFile);
      made->body = iter->plan[at];
      break;
    }
    default:
      return NotFound(name);
  }
  return Attr(*made);
}

Result<InodeRecord> ViewTree::GetAttr(uint64_t ino) {
  std::lock_guard lock(mu_);
  Node* n = Get(ino);
  if (!n) return NotFound("no such view inode");
  return Attr(*n);
}

Status ViewTree::ReadDir(uint64_t ino, uint64_t offset,
                         const std::function<bool(const DirItem&)>& fn) {
  std::vector<std::pair<std::string, uint32_t>> names;  // (name, type bits)
  uint64_t parent_ino;
  {
    std::lock_guard lock(mu_);
    Node* n = Get(ino);
    if (!n) return NotFound("no such view inode");
    if (n->type == kFile) return Status(Code::kNotDir, "a view file");
    parent_ino = n->parent;
    switch (n->type) {
      case kViewsDir:
        if (n->kind == Kind::kDcp) {
          names.push_back({"consolidated", S_IFDIR});
        } else if (n->kind == Kind::kDeepSpeed) {
          // Offered when the checkpoint decodes (so that `ls -R` and `cp -r` meet no EINVAL).
          Sources scratch;
          auto src = ReadDeepSpeed(n->root, &scratch, nullptr);
          auto specs = src.ok() ? reshard::DeepSpeedSpecs(*src)
                                : Result<std::vector<std::string>>(src.status());
          if (specs.ok()) {
            for (const std::string& s : *specs) names.push_back({s, S_IFDIR});
          }
        } else {
          // Every valid shape up to 8 x 8 (and, with experts, EP up to 8 too).
          auto model = ReadModel(n->root);
          const bool moe = model.ok() && model->num_experts > 0;
          for (uint32_t t : {1u, 2u, 4u, 8u}) {
            for (uint32_t p : {1u, 2u, 4u, 8u}) {
              const std::string tp_pp = "tp" + std::to_string(t) + "-pp" + std::to_string(p);
              names.push_back({tp_pp, S_IFDIR});
              for (uint32_t e : {1u, 2u, 4u, 8u}) {
                if (moe) names.push_back({tp_pp + "-ep" + std::to_string(e), S_IFDIR});
              }
            }
          }
          std::vector<std::pair<std::string, uint32_t>> valid;
          for (auto& [name, type] : names) {
            uint32_t T, P, E;
            ParseMegatronSpec(name, &T, &P, &E);
            if (model.ok() && !model->torch_dist &&
                reshard::CheckMegatronTarget(*model, T, P, E).ok()) {
              valid.push_back({name, type});
            }
          }
          if (model.ok() && reshard::CheckMegatronHf(*model).ok()) valid.push_back({"hf", S_IFDIR});
          names = std::move(valid);
        }
        break;
      case kTreeDir:
        for (const auto& [name, child] : n->children) {
          names.push_back({name, Get(child)->type == kFile ? S_IFREG : S_IFDIR});
        }
        break;
      case kSpecDir:
        if (n->kind == Kind::kDeepSpeed || n->kind == Kind::kMegatronHf) {
          for (const auto& [name, child] : n->children) {
            names.push_back({name, Get(child)->type == kFile ? S_IFREG : S_IFDIR});
          }
        } else if (n->kind == Kind::kDcp) {
          names = {{"model.pt", S_IFREG}, {"model.safetensors", S_IFREG}};
        } else {
          names.push_back({std::string(kTracker), S_IFREG});
          (void)source_->ReadDir(n->root, 2, [&](const DirItem& item) {
            if (IsIterationName(item.name) && S_ISDIR(item.mode)) {
              names.push_back({std::string(item.name), S_IFDIR});
            }
            return true;
          });
        }
        break;
      case kIterDir:
        for (uint32_t p = 0; p < n->P; ++p) {
          for (uint32_t e = 0; e < n->E; ++e) {
            for (uint32_t t = 0; t < n->T; ++t) {
              names.push_back({reshard::MegatronRankDir(t, p, n->P, e, n->E), S_IFDIR});
            }
          }
        }
        break;
      case kRankDir:
        names.push_back({std::string(kRankFile), S_IFREG});
        if (const Node* iter = Get(n->parent);
            iter && iter->plan.size() == 2 * size_t{n->T} * n->P * n->E) {
          names.push_back({std::string(kDistribFile), S_IFREG});
        }
        break;
    }
  }
  if (offset < 1 && !fn(DirItem{".", ino, S_IFDIR, 1})) return Status::Ok();
  if (offset < 2 && !fn(DirItem{"..", parent_ino, S_IFDIR, 2})) return Status::Ok();
  for (size_t i = offset > 2 ? offset - 2 : 0; i < names.size(); ++i) {
    // The inode number of a name not looked up yet is not known; readdir's d_ino is a hint.
    if (!fn(DirItem{names[i].first, kViewInoBit, names[i].second, i + 3})) break;
  }
  return Status::Ok();
}

Result<std::shared_ptr<ViewTree::Body>> ViewTree::BodyOf(uint64_t ino) {
  std::lock_guard lock(mu_);
  Node* n = Get(ino);
  if (!n) return NotFound("no such view inode");
  if (n->type != kFile) return Status(Code::kIsDir, "a view directory");
  return n->body;
}

Result<std::string> ViewTree::ViewErrors(uint64_t ino) {
  std::lock_guard lock(mu_);
  Node* n = Get(ino);
  if (!n) return NotFound("no such view inode");
  if (n->type != kViewsDir || n->errors.empty()) return Status(Code::kNoData, "no view errors");
  std::string s;
  for (const auto& [spec, why] : n->errors) s += spec + ": " + why + "\n";
  return s;
}

}  // namespace ckptfs::fs
