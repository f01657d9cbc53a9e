// The listing tree, the torch.distributed.checkpoint and sharded-safetensors layouts, Detect() and
// Describe(). Megatron-LM and DeepSpeed are in layout_frameworks.cc.
#include "formats/layout.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "formats/json.h"
#include "formats/layout_internal.h"

namespace ckptfs::layout {
namespace internal {

Result<Tree> Tree::Build(const std::vector<Entry>& listing) {
  Tree t;
  t.dirs_[""];
  std::set<std::string, std::less<>> explicit_dirs;
  for (const Entry& e : listing) {
    const std::string& p = e.path;
    if (p.empty() || p.front() == '/' || p.back() == '/') {
      return Invalid("layout: bad path in listing: '" + p + "'");
    }
    // Register every component's directory; reject empty, "." and ".." components.
    size_t start = 0;
    for (;;) {
      const size_t slash = p.find('/', start);
      const std::string_view comp =
          std::string_view(p).substr(start, slash == std::string::npos ? p.npos : slash - start);
      if (comp.empty() || comp == "." || comp == "..") {
        return Invalid("layout: path not normalized in listing: '" + p + "'");
      }
      if (slash == std::string::npos) break;
      const std::string parent = p.substr(0, start == 0 ? 0 : start - 1);
      const std::string dir = p.substr(0, slash);
      if (t.dirs_.try_emplace(dir).second) {
        t.dirs_[parent].subdirs.emplace_back(comp);
      }
      start = slash + 1;
    }
    const size_t last = p.rfind('/');
    const std::string parent = last == std::string::npos ? "" : p.substr(0, last);
    const std::string name = last == std::string::npos ? p : p.substr(last + 1);
    if (e.is_dir) {
      if (!explicit_dirs.insert(p).second) return Invalid("layout: listed twice: '" + p + "'");
      if (t.dirs_.try_emplace(p).second) t.dirs_[parent].subdirs.push_back(name);
    } else {
      if (!t.files_.emplace(p, &e).second) return Invalid("layout: listed twice: '" + p + "'");
      t.dirs_[parent].files.push_back(name);
    }
  }
  for (auto& [path, dir] : t.dirs_) {
    if (t.files_.count(path)) {
      return Invalid("layout: '" + path + "' is listed as a file and used as a directory");
    }
    std::sort(dir.files.begin(), dir.files.end());
    std::sort(dir.subdirs.begin(), dir.subdirs.end());
  }
  return t;
}

const Tree::Dir* Tree::FindDir(std::string_view path) const {
  auto it = dirs_.find(path);
  return it == dirs_.end() ? nullptr : &it->second;
}

const Entry* Tree::FindFile(std::string_view path) const {
  auto it = files_.find(path);
  return it == files_.end() ? nullptr : it->second;
}

std::string Join(std::string_view dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  std::string out(dir);
  out.push_back('/');
  out.append(name);
  return out;
}

bool MatchName(std::string_view name, std::string_view pattern, uint64_t* nums, size_t max) {
  size_t n = 0, i = 0, j = 0;
  while (j < pattern.size()) {
    if (pattern[j] != '{') {
      if (i == name.size() || name[i] != pattern[j]) return false;
      ++i, ++j;
      continue;
    }
    // "{W}" with a single-digit width: the patterns are this file's constants.
    const size_t width = static_cast<size_t>(pattern[j + 1] - '0');
    j += 3;
    size_t k = i;
    while (k < name.size() && name[k] >= '0' && name[k] <= '9') ++k;
    const size_t digits = k - i;
    if (digits == 0 || digits < width || digits > 18) return false;
    if (digits > width && digits > 1 && name[i] == '0') return false;  // not how Python pads
    uint64_t v = 0;
    for (size_t d = i; d < k; ++d) v = v * 10 + static_cast<uint64_t>(name[d] - '0');
    if (n < max) nums[n] = v;
    ++n;
    i = k;
  }
  return i == name.size();
}

std::string Pad(uint64_t n, int width) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%0*llu", width, static_cast<unsigned long long>(n));
  return buf;
}

void AddProblem(Layout* out, std::string path, std::string message) {
  out->problems.push_back({std::move(path), std::move(message)});
}

}  // namespace internal

namespace {

using internal::AddProblem;
using internal::Join;
using internal::MatchName;
using internal::Tree;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// torch.distributed.checkpoint, torch/distributed/checkpoint/filesystem.py: _FileSystemWriter.
// prepare_global_plan gives plan i the prefix "__{i}_", write_data's gen_file appends a per-rank
// counter and DEFAULT_SUFFIX ".distcp" ("__0_0.distcp"); finish() pickles the Metadata to
// ".metadata.tmp" and renames it to _metadata_fn ".metadata", so .metadata appears last.
void ScanDcp(const Tree& tree, Layout* out) {
  for (const auto& [path, dir] : tree.dirs()) {
    DcpCheckpoint c;
    c.dir = path;
    bool tmp = false;
    std::map<uint64_t, uint64_t> files_per_rank;  // rank -> largest N + 1
    std::map<uint64_t, uint32_t> count_per_rank;
    for (const std::string& f : dir.files) {
      uint64_t n[2];
      if (f == ".metadata") {
        c.has_metadata = true;
      } else if (f == ".metadata.tmp") {
        tmp = true;
      } else if (MatchName(f, "__{1}_{1}.distcp", n, 2) && n[0] < internal::kMaxRank) {
        ++c.files;
        files_per_rank[n[0]] = std::max(files_per_rank[n[0]], n[1] + 1);
        ++count_per_rank[n[0]];
      }
    }
    if (!c.has_metadata && !tmp && c.files == 0) continue;
    c.ranks = static_cast<uint32_t>(files_per_rank.size());
    c.complete = c.has_metadata && !tmp;
    if (!c.has_metadata) {
      AddProblem(out, path, "no .metadata: the save did not finish (it is written last)");
    }
    if (tmp) AddProblem(out, Join(path, ".metadata.tmp"), "a save is in flight or was interrupted");
    if (!files_per_rank.empty() && files_per_rank.rbegin()->first + 1 != files_per_rank.size()) {
      // Legitimate only when a rank saved nothing with single_file_per_rank=False.
      AddProblem(out, path, "__R_N.distcp ranks are not 0.." + std::to_string(c.ranks - 1));
    }
    for (const auto& [rank, end] : files_per_rank) {
      if (count_per_rank[rank] != end) {
        AddProblem(
            out, path,
            "__" + std::to_string(rank) + "_N.distcp files are not 0.." + std::to_string(end - 1));
      }
    }
    out->dcp.push_back(std::move(c));
  }
}

// Splits "<prefix>-00001-of-00003" as huggingface_hub's split_state_dict_into_shards_factory names
// shards (serialization/_base.py: FILENAME_PATTERN "model{suffix}.safetensors" with suffix
// f"-{idx+1:05d}-of-{nb_shards:05d}").
bool SplitShardStem(std::string_view stem, std::string_view* prefix, uint64_t* i, uint64_t* n) {
  const size_t of = stem.rfind("-of-");
  if (of == std::string_view::npos) return false;
  const size_t dash = stem.substr(0, of).rfind('-');
  if (dash == std::string_view::npos || dash == 0) return false;
  uint64_t nums[2];
  if (!MatchName(stem.substr(dash), "-{5}-of-{5}", nums, 2)) return false;
  *prefix = stem.substr(0, dash);
  *i = nums[0];
  *n = nums[1];
  return true;
}

// The index transformers writes beside sharded weights (SAFE_WEIGHTS_INDEX_NAME
// "model.safetensors.index.json"): {"metadata": {"total_size": N}, "weight_map": {tensor: file}}.
void ReadIndex(const Tree& tree, const std::string& path, const std::string& text, HfModel* m,
               Layout* out) {
  auto doc = json::Parse(text);
  if (!doc.ok()) {
    AddProblem(out, path, "index does not parse: " + doc.status().message());
    return;
  }
  const json::Value* map = doc->Find("weight_map");
  if (!map || !map->is_object()) {
    AddProblem(out, path, "index has no weight_map object");
    return;
  }
  if (const json::Value* md = doc->Find("metadata")) {
    const json::Value* total = md->Find("total_size");
    if (total && total->is_int() && total->as_int() >= 0) m->index_total_size = total->as_int();
  }
  m->index_tensors = map->as_object().size();
  std::set<std::string, std::less<>> referenced;
  for (const json::Member& entry : map->as_object()) {
    if (!entry.second.is_string()) {
      AddProblem(out, path, "weight_map value of '" + entry.first + "' is not a file name");
      continue;
    }
    referenced.insert(entry.second.as_string());
  }
  for (const std::string& file : referenced) {
    if (!tree.FindFile(file)) {
      AddProblem(out, file, "named by " + path + " but missing");
      m->complete = false;
    }
  }
  for (const std::string& shard : m->shards) {
    if (!referenced.count(shard)) AddProblem(out, shard, "not named by " + path);
  }
}

void ScanHf(const Tree& tree, Layout* out) {
  std::map<std::string, HfModel, std::less<>> models;
  std::map<std::string, std::set<uint64_t>> totals;  // prefix -> the n's seen
  std::map<std::string, std::map<uint64_t, std::string>> shard_files;
  constexpr std::string_view kIndexSuffix = ".safetensors.index.json";
  constexpr std::string_view kSuffix = ".safetensors";
  for (const std::string& f : tree.FindDir("")->files) {
    if (EndsWith(f, kIndexSuffix) && f.size() > kIndexSuffix.size()) {
      models[f.substr(0, f.size() - kIndexSuffix.size())].has_index = true;
      continue;
    }
    if (!EndsWith(f, kSuffix) || f.size() == kSuffix.size()) continue;
    const std::string_view stem = std::string_view(f).substr(0, f.size() - kSuffix.size());
    std::string_view prefix;
    uint64_t i, n;
    if (SplitShardStem(stem, &prefix, &i, &n)) {
      totals[std::string(prefix)].insert(n);
      shard_files[std::string(prefix)][i] = f;
      models[std::string(prefix)];
      if (i == 0 || i > n) AddProblem(out, f, "shard number outside 1.." + std::to_string(n));
    } else {
      models[std::string(stem)].single_file = true;
    }
  }
  for (auto& [prefix, m] : models) {
    m.prefix = prefix;
    for (const auto& [i, f] : shard_files[prefix]) m.shards.push_back(f);
    const std::set<uint64_t>& ns = totals[prefix];
    if (ns.size() > 1) AddProblem(out, prefix, "shards disagree on their count");
    if (!ns.empty()) m.shard_count = static_cast<uint32_t>(std::min<uint64_t>(*ns.rbegin(), ~0u));
    if (m.shard_count > 0) {
      m.complete = ns.size() == 1 && m.shards.size() == m.shard_count && m.has_index;
      if (m.shards.size() < m.shard_count) {
        AddProblem(out, prefix,
                   std::to_string(m.shard_count - m.shards.size()) + " of " +
                       std::to_string(m.shard_count) + " shards missing");
      }
      if (!m.has_index) AddProblem(out, prefix, "sharded without " + prefix + kIndexSuffix.data());
      if (m.single_file) AddProblem(out, prefix, "both a single file and shards");
    } else {
      m.complete = m.single_file;
    }
    const std::string index_path = prefix + std::string(kIndexSuffix);
    const Entry* index = tree.FindFile(index_path);
    if (index && index->content) ReadIndex(tree, index_path, *index->content, &m, out);
    out->hf.push_back(std::move(m));
  }
}

// Bytes of a name from the listing, printable: control and non-ASCII bytes as \xNN.
std::string Printable(std::string_view s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(ch);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out.append(buf);
    }
  }
  return out;
}

std::string Opt(const std::optional<std::string>& s) {
  return s ? "'" + Printable(*s) + "'" : std::string("-");
}

const char* YesNo(bool b) { return b ? "yes" : "no"; }

std::string_view NamingName(RankNaming n) {
  switch (n) {
    case RankNaming::kNone:
      return "none";
    case RankNaming::kTp:
      return "tp";
    case RankNaming::kTpX:
      return "tp_x";
    case RankNaming::kTpPpEp:
      return "tp_pp_ep";
    case RankNaming::kMixed:
      return "mixed";
  }
  return "?";
}

}  // namespace

bool WantsContent(std::string_view path) {
  return path == "latest" || path == "latest_universal" ||
         path == "latest_checkpointed_iteration.txt" ||
         (path.find('/') == std::string_view::npos && EndsWith(path, ".safetensors.index.json"));
}

std::string_view KindName(Kind k) {
  switch (k) {
    case Kind::kUnknown:
      return "unknown";
    case Kind::kMegatron:
      return "megatron";
    case Kind::kDeepSpeed:
      return "deepspeed";
    case Kind::kDcp:
      return "dcp";
    case Kind::kHfSafetensors:
      return "hf-safetensors";
  }
  return "unknown";
}

std::string_view ZeroStageName(ZeroStage z) {
  switch (z) {
    case ZeroStage::kNone:
      return "none";
    case ZeroStage::kOneOrTwo:
      return "1or2";
    case ZeroStage::kThree:
      return "3";
  }
  return "?";
}

Result<Layout> Detect(const std::vector<Entry>& listing) {
  ASSIGN_OR_RETURN(const Tree tree, Tree::Build(listing));
  Layout out;
  internal::ScanDeepSpeed(tree, &out);
  internal::ScanMegatron(tree, out.deepspeed.has_value(), &out);
  ScanHf(tree, &out);
  ScanDcp(tree, &out);
  if (out.deepspeed) {
    out.kind = Kind::kDeepSpeed;
  } else if (out.megatron) {
    out.kind = Kind::kMegatron;
  } else if (!out.hf.empty()) {
    out.kind = Kind::kHfSafetensors;
  } else if (!out.dcp.empty()) {
    out.kind = Kind::kDcp;
  }
  std::sort(out.problems.begin(), out.problems.end(), [](const Problem& a, const Problem& b) {
    return a.path != b.path ? a.path < b.path : a.message < b.message;
  });
  return out;
}

std::string Describe(const Layout& l) {
  std::string s = "kind: " + std::string(KindName(l.kind)) + "\n";
  if (const auto& d = l.deepspeed) {
    s += "deepspeed: latest=" + (d->has_latest ? Opt(d->latest) : "none") +
         " latest_universal=" + (d->has_latest_universal ? Opt(d->latest_universal) : "none") +
         " megatron_tracker=" + (d->has_megatron_tracker ? Opt(d->megatron_tracker) : "none") +
         "\n";
    for (const DeepSpeedTag& t : d->tags) {
      s += "  tag '" + Printable(t.tag) +
           "': step=" + (t.global_step ? std::to_string(*t.global_step) : "-") +
           " mp=" + std::to_string(t.mp_size) + " dp=" + std::to_string(t.dp_size) +
           " zero=" + std::string(ZeroStageName(t.zero)) + " bf16=" + YesNo(t.bf16) +
           " layers=" + std::to_string(t.pipeline_layers) +
           " layer_tp=" + std::to_string(t.layer_tp_size) +
           " experts=" + std::to_string(t.expert_files) + "/" +
           std::to_string(t.expert_optim_files) + " universal=" + YesNo(t.universal) +
           " complete=" + YesNo(t.complete) + "\n";
    }
  }
  if (const auto& m = l.megatron) {
    s += "megatron: tracker=" + (m->has_tracker ? Opt(m->tracker) : "none");
    if (m->tracker_iteration) s += " iteration=" + std::to_string(*m->tracker_iteration);
    if (m->tracker_release) s += " release";
    s += "\n";
    for (const MegatronIteration& it : m->iterations) {
      s += "  " + it.dir + ": tp=" + std::to_string(it.tp) + " pp=" + std::to_string(it.pp) +
           " ep=" + std::to_string(it.ep) + " naming=" + std::string(NamingName(it.naming)) +
           " distrib_optim=" + YesNo(it.distrib_optim) +
           " dist_checkpoint=" + YesNo(it.dist_checkpoint) + " complete=" + YesNo(it.complete) +
           "\n";
    }
  }
  for (const HfModel& m : l.hf) {
    s += "hf '" + Printable(m.prefix) + "': single=" + YesNo(m.single_file) +
         " shards=" + std::to_string(m.shards.size()) + "/" + std::to_string(m.shard_count) +
         " index=" + YesNo(m.has_index) +
         " total_size=" + (m.index_total_size ? std::to_string(*m.index_total_size) : "-") +
         " tensors=" + (m.index_tensors ? std::to_string(*m.index_tensors) : "-") +
         " complete=" + YesNo(m.complete) + "\n";
  }
  for (const DcpCheckpoint& c : l.dcp) {
    s += "dcp '" + Printable(c.dir) + "': metadata=" + YesNo(c.has_metadata) +
         " ranks=" + std::to_string(c.ranks) + " files=" + std::to_string(c.files) +
         " complete=" + YesNo(c.complete) + "\n";
  }
  for (const Problem& p : l.problems) {
    s += "problem '" + Printable(p.path) + "': " + Printable(p.message) + "\n";
  }
  return s;
}

}  // namespace ckptfs::layout
