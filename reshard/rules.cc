#include "reshard/rules.h"

// GCC 12 with -fsanitize=address reports libstdc++'s own std::regex internals as
// maybe-uninitialized (a false positive in <regex>, not in this file's code).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <regex>

namespace ckptfs::reshard {

struct Rules::User {
  std::regex re;
  std::string pattern;
  Rule rule;
};

Rules::~Rules() = default;

std::string_view RuleName(Rule r) {
  switch (r) {
    case Rule::kColumn: return "column";
    case Rule::kSwiglu: return "swiglu";
    case Rule::kRow: return "row";
    case Rule::kVocab: return "vocab";
    case Rule::kReplicated: return "replicated";
    case Rule::kExtraState: return "extra_state";
  }
  return "?";
}

Result<std::shared_ptr<const Rules>> Rules::Parse(std::string_view text) {
  auto rules = std::make_shared<Rules>();
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string line(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    const size_t e = line.find_last_not_of(" \t\r");
    line = line.substr(b, e - b + 1);
    const size_t sp = line.find_last_of(" \t");
    const std::string where = "rules line " + std::to_string(line_no) + ": ";
    if (sp == std::string::npos) return Invalid(where + "expected 'REGEX RULE'");
    std::string pattern = line.substr(0, sp);
    pattern.erase(pattern.find_last_not_of(" \t") + 1);
    const std::string name = line.substr(sp + 1);
    Rule r;
    if (name == "column") r = Rule::kColumn;
    else if (name == "swiglu") r = Rule::kSwiglu;
    else if (name == "row") r = Rule::kRow;
    else if (name == "vocab") r = Rule::kVocab;
    else if (name == "replicated") r = Rule::kReplicated;
    else if (name == "extra_state") r = Rule::kExtraState;
    else return Invalid(where + "unknown rule '" + name + "'");
    try {
      rules->user_.push_back(User{std::regex(pattern, std::regex::ECMAScript), pattern, r});
    } catch (const std::regex_error& err) {
      return Invalid(where + "bad regex '" + pattern + "': " + err.what());
    }
  }
  return std::shared_ptr<const Rules>(std::move(rules));
}

std::shared_ptr<const Rules> Rules::BuiltIn() {
  static const auto kBuiltIn = std::make_shared<const Rules>();
  return kBuiltIn;
}

namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool EndsWithAny(std::string_view s, std::initializer_list<std::string_view> suffixes) {
  for (auto x : suffixes) {
    if (EndsWith(s, x)) return true;
  }
  return false;
}

}  // namespace

Result<Rule> Rules::Classify(const std::string& name, bool swiglu) const {
  for (const User& u : user_) {
    if (std::regex_search(name, u.re)) return u.rule;
  }
  if (EndsWith(name, "._extra_state")) return Rule::kExtraState;
  // The MoE router's expert_bias is a buffer, not a parameter (no optimizer state): passed
  // through like extra state. The router and the shared experts' gate are replicated.
  if (EndsWith(name, ".router.expert_bias")) return Rule::kExtraState;
  if (EndsWithAny(name, {".router.weight", ".router.bias", ".shared_experts.gate_weight"})) {
    return Rule::kReplicated;
  }
  if (EndsWithAny(name, {"word_embeddings.weight", "output_layer.weight",
                         "word_embeddings_for_head.weight"})) {
    return Rule::kVocab;
  }
  if (EndsWithAny(name, {".query_key_value.weight", ".query_key_value.bias",
                         ".linear_qkv.weight", ".linear_qkv.bias"})) {
    return Rule::kColumn;
  }
  if (EndsWithAny(name, {".dense_h_to_4h.weight", ".dense_h_to_4h.bias", ".linear_fc1.weight",
                         ".linear_fc1.bias"})) {
    return swiglu ? Rule::kSwiglu : Rule::kColumn;
  }
  if (EndsWithAny(name, {".self_attention.dense.weight", ".linear_proj.weight",
                         ".dense_4h_to_h.weight", ".linear_fc2.weight"})) {
    return Rule::kRow;
  }
  if (EndsWithAny(name, {".self_attention.dense.bias", ".linear_proj.bias", ".dense_4h_to_h.bias",
                         ".linear_fc2.bias", "position_embeddings.weight", ".layer_norm_weight",
                         ".layer_norm_bias"})) {
    return Rule::kReplicated;
  }
  // Norms: the module's own name says so (input_layernorm, post_attention_norm, final_norm, ...).
  const size_t dot = name.rfind('.');
  if (dot != std::string::npos && EndsWithAny(name, {".weight", ".bias"})) {
    const std::string_view module = std::string_view(name).substr(0, dot);
    const size_t prev = module.rfind('.');
    const std::string_view last = prev == std::string_view::npos ? module : module.substr(prev + 1);
    if (last.find("norm") != std::string_view::npos) return Rule::kReplicated;
  }
  return Invalid("no rule covers parameter '" + name + "' (add one with a rules file)");
}

namespace {

// A run of consecutive local indices of one source shard along the split dimension; `repeat`
// runs take the same index `count` times.
struct Run {
  uint32_t shard;
  int64_t local;
  int64_t count;
  bool repeat;
};

void Append(std::vector<Run>* runs, uint32_t shard, int64_t local, bool repeat_ok) {
  if (!runs->empty()) {
    Run& r = runs->back();
    if (r.shard == shard && !r.repeat && r.local + r.count == local) {
      ++r.count;
      return;
    }
    if (repeat_ok && r.shard == shard && (r.repeat ? r.local : r.local + r.count - 1) == local) {
      if (r.count == 1 || r.repeat) {
        r.repeat = true;
        ++r.count;
        return;
      }
      --r.count;  // split the last index off into a repeat run
      runs->push_back(Run{shard, local, 2, true});
      return;
    }
  }
  runs->push_back(Run{shard, local, 1, false});
}

}  // namespace

namespace {

// PlanShard's cut along `dim`; `glu`: two halves (gate, up), each cut in T chunks.
Status PlanCut(const std::string& name, Rule rule, size_t dim, bool glu,
               const std::vector<Shard>& src, uint32_t itemsize, uint32_t t, uint32_t T,
               const VocabSizes& vocab, std::vector<Gather>* out, std::vector<int64_t>* shape) {
  out->clear();
  if (src.empty()) return Invalid("parameter '" + name + "' has no source shard");
  const auto& s0 = src[0].shape;
  auto bytes_of = [&](const std::vector<int64_t>& sh, size_t from) {
    uint64_t n = itemsize;
    for (size_t i = from; i < sh.size(); ++i) n *= static_cast<uint64_t>(sh[i]);
    return n;
  };
  if (rule == Rule::kReplicated || rule == Rule::kExtraState) {
    *shape = s0;
    out->push_back(Gather{1, {Part{src[0].source, src[0].offset, bytes_of(s0, 0), 0}}});
    return Status::Ok();
  }
  for (const Shard& s : src) {
    if (s.shape != s0) return Invalid("parameter '" + name + "' has shards of different shapes");
  }
  if (s0.size() <= dim) {
    return Invalid("parameter '" + name + "' (rule " + std::string(RuleName(rule)) +
                   ") has too few dimensions");
  }
  const int64_t ts = static_cast<int64_t>(src.size());
  const int64_t local_s = s0[dim];
  const int64_t full_s = local_s * ts;
  int64_t full_t = full_s;
  if (rule == Rule::kVocab) {
    if (vocab.source_rows != full_s) {
      return Invalid("parameter '" + name + "' has " + std::to_string(full_s) +
                     " vocabulary rows, the checkpoint's args say " +
                     std::to_string(vocab.source_rows));
    }
    full_t = vocab.target_rows;
  }
  const int64_t Tn = T;
  if (glu) {
    if (local_s % 2 != 0 || (full_s / 2) % Tn != 0) {
      return Invalid("parameter '" + name + "': SwiGLU size " + std::to_string(full_s / 2) +
                     " is not divisible by TP " + std::to_string(T));
    }
  } else if (full_t % Tn != 0) {
    return Invalid("parameter '" + name + "': size " + std::to_string(full_t) + " along dim " +
                   std::to_string(dim) + " is not divisible by TP " + std::to_string(T));
  }
  // The target shard's full indices, in output order, and each one's source (shard, local).
  std::vector<Run> runs;
  auto add_range = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) {
      int64_t shard = 0, local = 0;
      if (glu) {
        const int64_t F = full_s / 2, fl = F / ts;
        const int64_t half = i / F, j = i % F;
        shard = j / fl;
        local = half * fl + j % fl;
      } else {
        const int64_t k = std::min(i, full_s - 1);  // vocab: rows past the source repeat its last
        shard = k / local_s;
        local = k % local_s;
      }
      Append(&runs, static_cast<uint32_t>(shard), local, rule == Rule::kVocab);
    }
  };
  if (glu) {
    const int64_t F = full_s / 2, ft = F / Tn;
    add_range(t * ft, (t + 1) * ft);
    add_range(F + t * ft, F + (t + 1) * ft);
  } else {
    const int64_t n = full_t / Tn;
    add_range(t * n, (t + 1) * n);
  }
  *shape = s0;
  (*shape)[dim] = 0;
  for (const Run& r : runs) (*shape)[dim] += r.count;
  if (dim == 0) {
    const uint64_t row = bytes_of(s0, 1);
    for (const Run& r : runs) {
      const Shard& s = src[r.shard];
      const uint64_t off = s.offset + static_cast<uint64_t>(r.local) * row;
      if (r.repeat) {
        out->push_back(Gather{static_cast<uint64_t>(r.count), {Part{s.source, off, row, 0}}});
      } else {
        const uint64_t len = static_cast<uint64_t>(r.count) * row;
        out->push_back(Gather{1, {Part{s.source, off, len, len}}});
      }
    }
  } else {
    const uint64_t inner = bytes_of(s0, 2);
    const uint64_t pitch = static_cast<uint64_t>(local_s) * inner;
    Gather g;
    g.rows = static_cast<uint64_t>(s0[0]);
    for (const Run& r : runs) {
      const Shard& s = src[r.shard];
      g.parts.push_back(Part{s.source, s.offset + static_cast<uint64_t>(r.local) * inner,
                             static_cast<uint64_t>(r.count) * inner, pitch});
    }
    out->push_back(std::move(g));
  }
  return Status::Ok();
}

}  // namespace

Status PlanShard(const std::string& name, Rule rule, const std::vector<Shard>& src,
                 uint32_t itemsize, uint32_t t, uint32_t T, const VocabSizes& vocab,
                 std::vector<Gather>* out, std::vector<int64_t>* shape) {
  return PlanCut(name, rule, rule == Rule::kRow ? 1 : 0, rule == Rule::kSwiglu, src, itemsize, t, T,
                 vocab, out, shape);
}

Status PlanSplit(const std::string& name, size_t dim, bool glu, const std::vector<Shard>& src,
                 uint32_t itemsize, uint32_t t, uint32_t T, std::vector<Gather>* out,
                 std::vector<int64_t>* shape) {
  const Rule rule = glu ? Rule::kSwiglu : dim == 1 ? Rule::kRow : Rule::kColumn;
  return PlanCut(name, rule, dim, glu, src, itemsize, t, T, VocabSizes{}, out, shape);
}

uint32_t FirstSourceRank(Rule rule, uint32_t source_tp, uint32_t t, uint32_t T,
                         const VocabSizes& vocab) {
  if (rule == Rule::kReplicated || rule == Rule::kExtraState) return 0;
  if (rule == Rule::kVocab && vocab.source_rows > 0 && vocab.target_rows > 0) {
    // The target's first row, or the source's last row it repeats.
    const int64_t row = std::min(int64_t{t} * (vocab.target_rows / T), vocab.source_rows - 1);
    return static_cast<uint32_t>(row / (vocab.source_rows / source_tp));
  }
  // Column, row and SwiGLU splits keep the axis's size: target shard t's first element lies in
  // the source shard at the same fraction of it.
  const uint64_t r = static_cast<uint64_t>(t) * source_tp / T;
  return static_cast<uint32_t>(std::min<uint64_t>(r, source_tp - 1));
}

}  // namespace ckptfs::reshard
