#include "reshard/megatron_dist.h"

#include <algorithm>
#include <map>
#include <string>

namespace ckptfs::reshard {
namespace {

constexpr std::string_view kLayers = "decoder.layers.";
constexpr std::string_view kExperts = "mlp.experts.experts.";

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

// Where a model key sits: under decoder.layers., per layer (decoder.layers.N.X, as blocks whose
// layers differ save them) or stacked on the layer axis (decoder.layers.X); an expert's weight
// (mlp.experts.experts.X, its experts on an axis of their own).
struct LayerKey {
  bool in_layers = false;
  int64_t layer = -1;  // per layer: N; else -1
  std::string rest;    // after the layer: "mlp.linear_fc1.weight", ...
  bool expert = false;
  std::string tail;  // an expert's: after mlp.experts.experts. ("linear_fc1.weight")
};

Result<LayerKey> ParseLayerKey(const std::string& fqn, bool experts) {
  LayerKey k;
  if (!fqn.starts_with(kLayers)) return k;
  k.in_layers = true;
  k.rest = fqn.substr(kLayers.size());
  const size_t dot = k.rest.find('.');
  if (dot != std::string::npos && dot > 0 && k.rest.find_first_not_of("0123456789") == dot) {
    k.layer = std::stoll(k.rest.substr(0, dot));
    k.rest = k.rest.substr(dot + 1);
  }
  // dist_checkpointing's singleton_local_shards (False in Megatron-LM's saves; NVIDIA ModelOpt's
  // use it) gives each expert keys of its own and splits SwiGLU's fc1 into _w and _v tensors.
  if (fqn.ends_with(".weight_w") || fqn.ends_with(".weight_v") || fqn.ends_with(".bias_w") ||
      fqn.ends_with(".bias_v")) {
    return Invalid("'" + fqn + "': SwiGLU's fc1 saved as separate _w and _v tensors "
                   "(dist_checkpointing's singleton_local_shards) is not read");
  }
  if (!k.rest.starts_with(kExperts)) return k;
  if (!experts) return Invalid("'" + fqn + "' is an expert's weight, but args.num_experts is 0");
  k.expert = true;
  k.tail = k.rest.substr(kExperts.size());
  if (!k.tail.empty() && k.tail[0] >= '0' && k.tail[0] <= '9') {
    return Invalid("'" + fqn + "': experts saved under keys of their own "
                   "(dist_checkpointing's singleton_local_shards) are not read; Megatron-LM's "
                   "saves stack them on an expert axis");
  }
  return k;
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
  ASSIGN_OR_RETURN(out.model, ReadMegatronModel(common, /*torch_dist=*/true));
  out.legacy = false;
  const int64_t L = out.model.num_layers, E = out.model.num_experts;
  const DcpChunkIndex chunks(files);
  for (const dcp::TensorEntry& t : md.tensors) {
    if (!IsModelKey(t.fqn)) continue;
    ASSIGN_OR_RETURN(const LayerKey key, ParseLayerKey(t.fqn, E > 0));
    const bool stacked = key.in_layers && key.layer < 0;
    if (key.layer >= L) {
      return Invalid("'" + t.fqn + "' is past the model's " + std::to_string(L) + " layers");
    }
    // The index axes in front of the weight's own: the layer axis of a stacked tensor, then the
    // experts' (SequentialMLP's and TEGroupedMLP's sharded state dicts add it after the layer's).
    std::vector<int64_t> index_dims;
    if (stacked) index_dims.push_back(L);
    if (key.expert) index_dims.push_back(E);
    const size_t n = index_dims.size();
    if (t.size.size() <= n || !std::equal(index_dims.begin(), index_dims.end(), t.size.begin())) {
      return Invalid("'" + t.fqn + "' is not stacked over the model's " +
                     (stacked ? std::to_string(L) + " layers" + (key.expert ? " and " : "") : "") +
                     (key.expert ? std::to_string(E) + " experts" : "") + " (shape " +
                     ShapeText(t.size) + ")");
    }
    const uint32_t itemsize = DtypeSize(t.dtype);
    if (itemsize == 0) return Invalid("'" + t.fqn + "' has an unknown dtype " + t.dtype);
    // Each (layer, expert) index's pieces (-1: no such axis). A chunk may span several indices
    // (the legacy GroupedMLP saved an EP rank's experts as one chunk): it is contiguous and
    // row-major, so each index's block in it is too.
    std::map<std::pair<int64_t, int64_t>, std::vector<Found>> pieces;
    for (const dcp::Chunk& c : t.chunks) {
      const std::string where = "the chunk at " + ShapeText(c.offsets) + " of '" + t.fqn + "'";
      uint32_t source = 0;
      const TensorInfo* info = chunks.Find(t, c, &source);
      if (!info) return Invalid(where + " is not in the description of " + c.storage.relative_path);
      if (!info->stride.empty() && info->stride != ContiguousStride(c.sizes)) {
        return Invalid(where + " is not contiguous");
      }
      if (info->dtype != t.dtype) return Invalid(where + " is " + info->dtype);
      const std::vector<int64_t> offsets(c.offsets.begin() + static_cast<ptrdiff_t>(n),
                                         c.offsets.end());
      const std::vector<int64_t> sizes(c.sizes.begin() + static_cast<ptrdiff_t>(n), c.sizes.end());
      uint64_t block = itemsize;
      for (int64_t x : sizes) block *= static_cast<uint64_t>(x);
      int64_t count = 1;
      for (size_t d = 0; d < n; ++d) count *= c.sizes[d];
      for (int64_t k = 0; k < count; ++k) {
        std::vector<int64_t> at(n);
        for (int64_t d = static_cast<int64_t>(n) - 1, rem = k; d >= 0; --d) {
          at[static_cast<size_t>(d)] = c.offsets[static_cast<size_t>(d)] +
                                       rem % c.sizes[static_cast<size_t>(d)];
          rem /= c.sizes[static_cast<size_t>(d)];
        }
        const int64_t layer = stacked ? at[0] : key.layer;
        const int64_t expert = key.expert ? at[n - 1] : -1;
        pieces[{layer, expert}].push_back(
            Found{offsets, sizes, source, info->offset + static_cast<uint64_t>(k) * block});
      }
    }
    const bool vocab = t.fqn.ends_with("word_embeddings.weight") ||
                       t.fqn.ends_with("output_layer.weight");
    // SwiGLU's fc1 (a dense layer's, the shared experts', each expert's): all gate rows, then
    // all up rows (apply_swiglu_sharded_factory).
    const bool gate_up = out.model.swiglu && (key.rest == "mlp.linear_fc1.weight" ||
                                              key.rest == "mlp.shared_experts.linear_fc1.weight" ||
                                              (key.expert && key.tail == "linear_fc1.weight"));
    if (vocab && !t.size.empty()) out.source_vocab_rows = t.size[0];
    const std::vector<int64_t> slice(t.size.begin() + static_cast<ptrdiff_t>(n), t.size.end());
    for (int64_t l = stacked ? 0 : key.layer; l < (stacked ? L : key.layer + 1); ++l) {
      for (int64_t x = key.expert ? 0 : -1; x < (key.expert ? E : 0); ++x) {
        auto it = pieces.find({l, x});
        if (it == pieces.end()) {
          return Invalid("'" + t.fqn + "' has no chunk of " +
                         (x >= 0 ? "expert " + std::to_string(x) + " in " : std::string()) +
                         "layer " + std::to_string(l));
        }
        std::string name = t.fqn;
        if (key.in_layers) {
          name = std::string(kLayers) + std::to_string(l) + "." +
                 (x >= 0 ? "mlp.experts.local_experts." + std::to_string(x) + "." + key.tail
                         : key.rest);
        }
        ASSIGN_OR_RETURN(MegatronTensor mt, Join(std::move(name), key.in_layers ? l : -1, t.dtype,
                                                 slice, std::move(it->second), vocab, gate_up));
        mt.expert = x;
        out.tensors.push_back(std::move(mt));
      }
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
