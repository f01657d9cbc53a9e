// `ckptfs inspect DIR` for megatron.core's torch_dist iterations: the backend, the parallel sizes
// and the model from the common state's args (with experts: their expert parallelism and axis),
// and every sharded tensor at its global shape.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "formats/dcp.h"
#include "reshard/megatron_args.h"
#include "reshard/megatron_dist.h"
#include "reshard/torch_out.h"
#include "tools/commands.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMaxRead = 64 << 20;  // .metadata, common state: small files

// The file's bytes [offset, offset + len), or all of it; at most kMaxRead either way.
Result<std::string> ReadAll(const std::filesystem::path& p, uint64_t offset = 0,
                            uint64_t len = UINT64_MAX) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(p, ec);
  if (ec) return NotFound(p.string() + ": " + ec.message());
  if (len == UINT64_MAX ? size > kMaxRead : (len > kMaxRead || offset > size || len > size - offset)) {
    return Invalid(p.string() + ": the range to read lies past its end or is too large");
  }
  std::ifstream f(p, std::ios::binary);
  if (!f) return NotFound(p.string() + ": cannot be read");
  f.seekg(static_cast<std::streamoff>(offset));
  std::ostringstream s;
  if (len == UINT64_MAX) {
    s << f.rdbuf();
    return s.str();
  }
  std::string out(len, '\0');
  if (!f.read(out.data(), static_cast<std::streamsize>(len))) return Corrupt(p.string() + ": short");
  return out;
}

std::string Shape(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// The experts: how many in how many layers, the expert parallelism they were saved at, and
// where the expert axis is in the stored tensors (after the layer axis of stacked keys, first
// in per-layer ones).
std::string DescribeExperts(const reshard::MegatronModel& m, const pickle::ValuePtr& args,
                            const dcp::Metadata& md) {
  int64_t moe_layers = 0;
  bool stacked = false, per_layer = false;
  for (const dcp::TensorEntry& t : md.tensors) {
    if (!t.fqn.starts_with("decoder.layers.")) continue;
    const bool in_stack = t.fqn.starts_with("decoder.layers.mlp.");
    if (t.fqn.ends_with(".mlp.router.weight")) moe_layers += in_stack ? m.num_layers : 1;
    if (t.fqn.find(".mlp.experts.experts.") != std::string::npos) {
      (in_stack ? stacked : per_layer) = true;
    }
  }
  const int64_t tp = reshard::IntArg(args, "tensor_model_parallel_size").value_or(1);
  const int64_t etp = reshard::IntArg(args, "expert_tensor_parallel_size").value_or(tp);
  std::string out = "  experts: " + std::to_string(m.num_experts) + " per MoE layer (" +
                    std::to_string(moe_layers) + " of " + std::to_string(m.num_layers) +
                    " layers), ffn " + std::to_string(m.moe_ffn_hidden_size) + " each, top " +
                    std::to_string(m.moe_topk);
  if (m.shared_expert_size > 0) {
    out += "; shared experts ffn " + std::to_string(m.shared_expert_size) +
           (m.shared_expert_gate ? " (gated)" : "");
  }
  out += "\n  expert parallelism: EP " + std::to_string(m.source_ep) + " x expert TP " +
         std::to_string(etp) + ", " + std::to_string(m.num_experts / m.source_ep) +
         " experts per EP rank; expert axis:";
  if (stacked) out += " dim 1 of decoder.layers.mlp.experts.experts.* [layers, experts, ...]";
  if (per_layer) {
    out += std::string(stacked ? "," : "") +
           " dim 0 of decoder.layers.N.mlp.experts.experts.* [experts, ...]";
  }
  if (!stacked && !per_layer) out += " none (no expert tensor in .metadata)";
  return out + "\n";
}

Result<std::string> Describe(const std::filesystem::path& dir) {
  ASSIGN_OR_RETURN(std::string config, ReadAll(dir / "metadata.json"));
  ASSIGN_OR_RETURN(std::string meta, ReadAll(dir / ".metadata"));
  ASSIGN_OR_RETURN(dcp::Metadata md, dcp::ParseMetadata(meta));
  std::string common;
  if (std::filesystem::exists(dir / "common.pt")) {
    ASSIGN_OR_RETURN(common, ReadAll(dir / "common.pt"));
  } else if (const dcp::BytesEntry* item = reshard::CommonStateItem(md)) {
    const std::filesystem::path rel(item->storage.relative_path);
    if (rel.is_absolute() || rel.filename() != rel || !item->storage.transforms.empty()) {
      return Invalid("the common state item's storage is not a plain file beside .metadata");
    }
    ASSIGN_OR_RETURN(common, ReadAll(dir / rel, item->storage.offset, item->storage.length));
  } else {
    return Invalid("neither common.pt nor a common_state item");
  }
  ASSIGN_OR_RETURN(TorchFile tf, reshard::ParseTorchDistCommon(common));
  ASSIGN_OR_RETURN(reshard::MegatronModel m, reshard::ReadMegatronModel(tf, /*torch_dist=*/true));
  const pickle::ValuePtr args = reshard::ArgsDict(reshard::Get(tf.root, "args"));
  auto size = [&](const char* key) {
    auto v = reshard::IntArg(args, key);
    return v ? std::to_string(*v) : std::string("?");
  };
  while (!config.empty() && (config.back() == '\n' || config.back() == ' ')) config.pop_back();
  std::string out = "torch_dist " + dir.filename().string() + ": " + config + "\n";
  out += "  saved at TP " + size("tensor_model_parallel_size") + " x PP " +
         size("pipeline_model_parallel_size") + " x DP " + size("data_parallel_size") + ", " +
         std::to_string(md.Files().size()) + " data files\n";
  out += "  model: " + std::to_string(m.num_layers) + " layers, hidden " +
         std::to_string(m.hidden_size) + ", " + std::to_string(m.heads) + " heads in " +
         std::to_string(m.query_groups) + " query groups, ffn " + std::to_string(m.ffn_hidden_size) +
         (m.swiglu ? " (SwiGLU)" : "") + ", vocabulary " +
         (m.args_vocab_size ? std::to_string(m.args_vocab_size) : std::string("?")) +
         " padded to " + std::to_string(m.padded_vocab_size) + "\n";
  if (m.num_experts > 0) out += DescribeExperts(m, args, md);
  char line[512];
  std::snprintf(line, sizeof line, "  %-9s %-22s %6s  %s\n", "dtype", "global shape", "chunks",
                "key");
  out += line;
  for (const dcp::TensorEntry& t : md.tensors) {
    std::snprintf(line, sizeof line, "  %-9s %-22s %6zu  %s\n", t.dtype.c_str(),
                  Shape(t.size).c_str(), t.chunks.size(), t.fqn.c_str());
    out += line;
  }
  out += "  " + std::to_string(md.bytes.size()) + " sharded objects (extra state, RNG, ...)\n";
  return out;
}

}  // namespace

std::string DescribeTorchDist(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> dirs;
  std::error_code ec;
  if (fs::exists(fs::path(path) / "metadata.json", ec)) dirs.push_back(path);
  for (auto it = fs::directory_iterator(path, ec); !ec && it != fs::end(it); it.increment(ec)) {
    if (it->is_directory(ec) && fs::exists(it->path() / "metadata.json", ec) &&
        fs::exists(it->path() / ".metadata", ec)) {
      dirs.push_back(it->path());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  std::string out;
  for (const fs::path& d : dirs) {
    auto text = Describe(d);
    out += text.ok() ? "\n" + *text
                     : "\ntorch_dist " + d.filename().string() + ": " + text.status().message() +
                           "\n";
  }
  return out;
}

}  // namespace ckptfs
