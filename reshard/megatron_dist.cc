#include "reshard/megatron_dist.h"

#include <algorithm>
#include <map>
#include <string>

namespace ckptfs::reshard {
namespace {

constexpr std::string_view kLayers = "decoder.layers.";

std::string ShapeText(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

bool IsModelKey(const std::string& fqn) {
  return fqn.starts_with("embedding.") || fqn.starts_with("decoder.") ||
         fqn.starts_with("output_layer.");
}

// A chunk found in its data file: where its bytes are, and its place in the tensor.
struct Found {
  std::vector<int64_t> offsets, sizes;
  uint32_t source = 0;
  uint64_t offset = 0;
};

// The shards of one tensor (or one layer's slice of a stacked one) from its chunks: one chunk is
// the whole (replicated); several must differ along one dimension only and tile it.
Result<MegatronTensor> Join(std::string name, int64_t layer, const std::string& dtype,
                            const std::vector<int64_t>& shape, std::vector<Found> chunks,
                            bool vocab, bool gate_up) {
  MegatronTensor t;
  t.name = std::move(name);
  t.layer = layer;
  t.dtype = dtype;
  std::sort(chunks.begin(), chunks.end(),
            [](const Found& a, const Found& b) { return a.offsets < b.offsets; });
  int split = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    for (const Found& c : chunks) {
      if (c.offsets[d] != chunks[0].offsets[d]) {
        if (split >= 0 && split != static_cast<int>(d)) {
          return Invalid("'" + t.name + "' is split along two dimensions");
        }
        split = static_cast<int>(d);
      }
    }
  }
  int64_t at = 0;
  for (const Found& c : chunks) {
    for (size_t d = 0; d < shape.size(); ++d) {
      const bool along = static_cast<int>(d) == split;
      if ((along && c.offsets[d] != at) || (!along && (c.offsets[d] != 0 || c.sizes[d] != shape[d]))) {
        return Invalid("the chunks of '" + t.name + "' do not tile it");
      }
    }
    if (split >= 0) at += c.sizes[static_cast<size_t>(split)];
    t.shards.push_back(Shard{c.source, c.offset, c.sizes});
  }
  if (split >= 0 && at != shape[static_cast<size_t>(split)]) {
    return Invalid("the chunks of '" + t.name + "' do not tile it");
  }
  if (split < 0) {
    if (chunks.size() != 1) return Invalid("'" + t.name + "' is saved twice");
    // One chunk: TP 1 (a vocabulary still padded, to make_vocab_size_divisible_by), or replicated.
    t.rule = vocab ? Rule::kVocab : Rule::kReplicated;
  } else if (split == 0) {
    t.rule = vocab ? Rule::kVocab : Rule::kColumn;
  } else if (split == 1) {
    t.rule = Rule::kRow;
  } else {
    return Invalid("'" + t.name + "' is split along dimension " + std::to_string(split));
  }
  t.gate_up_whole = gate_up;
  return t;
}

}  // namespace

const dcp::BytesEntry* CommonStateItem(const dcp::Metadata& md) {
  for (const dcp::BytesEntry& b : md.bytes) {
    if (b.fqn == "common_state/shard_0_1") return &b;
  }
  return nullptr;
}

Result<TorchFile> ParseTorchDistCommon(const std::string& bytes) {
  auto read = [&bytes](uint64_t off, size_t len) -> Result<std::string> {
    if (off > bytes.size() || len > bytes.size() - off) return Corrupt("read past the end");
    return bytes.substr(off, len);
  };
  auto tf = ReadTorchFile(bytes.size(), read);
  if (!tf.ok()) return Invalid("the common state: " + tf.status().message());
  if (tf->root && tf->root->kind == pickle::Kind::kList && tf->root->items.size() == 1) {
    tf->root = tf->root->items[0];  // torch.save([state])
  }
  return std::move(*tf);
}

Result<MegatronTensors> ListTorchDistTensors(const TorchFile& common, const dcp::Metadata& md,
                                             const std::vector<DcpDataFile>& files) {
  MegatronTensors out;
  ASSIGN_OR_RETURN(out.model, ReadMegatronModel(common));
  if (out.model.num_experts > 0) {
    return Invalid("torch_dist checkpoints with experts (args.num_experts) are not supported");
  }
  out.legacy = false;
  const DcpChunkIndex chunks(files);
  for (const dcp::TensorEntry& t : md.tensors) {
    if (!IsModelKey(t.fqn)) continue;
    // Homogeneous layers are stacked on a leading layer axis (decoder.layers.X [L, ...]); other
    // blocks save each layer under its own key (decoder.layers.N.X).
    int64_t own_layer = -1;
    if (t.fqn.starts_with(kLayers)) {
      const std::string rest = t.fqn.substr(kLayers.size());
      const size_t dot = rest.find('.');
      if (dot != std::string::npos && dot > 0 &&
          rest.find_first_not_of("0123456789") == dot) {
        own_layer = std::stoll(rest.substr(0, dot));
      }
    }
    const bool stacked = t.fqn.starts_with(kLayers) && own_layer < 0;
    if (stacked && (t.size.size() < 2 || t.size[0] != out.model.num_layers)) {
      return Invalid("'" + t.fqn + "' is not stacked over the model's " +
                     std::to_string(out.model.num_layers) + " layers (shape " +
                     ShapeText(t.size) + ")");
    }
    if (own_layer >= out.model.num_layers) {
      return Invalid("'" + t.fqn + "' is past the model's " +
                     std::to_string(out.model.num_layers) + " layers");
    }
    std::map<int64_t, std::vector<Found>> by_layer;  // -1: not stacked
    for (const dcp::Chunk& c : t.chunks) {
      const std::string where = "the chunk at " + ShapeText(c.offsets) + " of '" + t.fqn + "'";
      uint32_t source = 0;
      const TensorInfo* info = chunks.Find(t, c, &source);
      if (!info) return Invalid(where + " is not in the description of " + c.storage.relative_path);
      if (!info->stride.empty() && info->stride != ContiguousStride(c.sizes)) {
        return Invalid(where + " is not contiguous");
      }
      if (info->dtype != t.dtype) return Invalid(where + " is " + info->dtype);
      Found f{c.offsets, c.sizes, source, info->offset};
      int64_t layer = -1;
      if (stacked) {
        if (c.sizes.empty() || c.sizes[0] != 1) return Invalid(where + " spans several layers");
        layer = c.offsets[0];
        f.offsets.erase(f.offsets.begin());
        f.sizes.erase(f.sizes.begin());
      }
      by_layer[layer].push_back(std::move(f));
    }
    const bool vocab = t.fqn.ends_with("word_embeddings.weight") ||
                       t.fqn.ends_with("output_layer.weight");
    const bool gate_up = out.model.swiglu && t.fqn.ends_with("mlp.linear_fc1.weight");
    if (vocab && !t.size.empty()) out.source_vocab_rows = t.size[0];
    if (!stacked) {
      ASSIGN_OR_RETURN(MegatronTensor mt, Join(t.fqn, own_layer, t.dtype, t.size, by_layer[-1],
                                               vocab, gate_up));
      out.tensors.push_back(std::move(mt));
      continue;
    }
    const std::vector<int64_t> slice(t.size.begin() + 1, t.size.end());
    for (int64_t l = 0; l < out.model.num_layers; ++l) {
      auto it = by_layer.find(l);
      if (it == by_layer.end()) {
        return Invalid("'" + t.fqn + "' has no chunk of layer " + std::to_string(l));
      }
      const std::string name =
          std::string(kLayers) + std::to_string(l) + "." + t.fqn.substr(kLayers.size());
      ASSIGN_OR_RETURN(MegatronTensor mt, Join(name, l, t.dtype, slice, std::move(it->second),
                                               false, gate_up));
      out.tensors.push_back(std::move(mt));
    }
  }
  // Layer by layer, as the model runs (the metadata has each stacked key's layers together):
  // the embeddings, each layer's tensors, then the final norm and the output layer.
  auto place = [&](const MegatronTensor& t) {
    if (t.layer >= 0) return t.layer;
    return t.name.starts_with("embedding.") ? int64_t{-1} : out.model.num_layers;
  };
  std::stable_sort(out.tensors.begin(), out.tensors.end(),
                   [&](const MegatronTensor& a, const MegatronTensor& b) {
                     return place(a) < place(b);
                   });
  return out;
}

}  // namespace ckptfs::reshard
