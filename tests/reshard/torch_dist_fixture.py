"""Writes a megatron.core checkpoint in the `torch_dist` format (dist_checkpointing on PyTorch
DCP) from tests/reshard/megatron_fixture.py's full model, laid out as Megatron-LM core_r0.13
writes it; every fact below was read in its source:

- [ITER] training/checkpointing.py: `iter_{:07d}/` beside `latest_checkpointed_iteration.txt`.
- [CONFIG] dist_checkpointing/core.py save_config: rank 0 writes metadata.json,
  asdict(CheckpointingConfig): sharded_backend torch_dist version 1, common_backend torch version 1.
- [COMMON] strategies/common.py TorchCommonSaveStrategy.save_common: rank 0 torch.save()s
  common.pt (since 2026-07: the DCP item common_state/shard_0_1 instead, --common-in-dcp), the state dict with every ShardedTensor/ShardedObject taken out: args (the
  argparse.Namespace), checkpoint_version 3.0, iteration, num_floating_point_operations_so_far,
  content_metadata. (No optimizer here: the fixture saves the model only, as --no-save-optim.)
- [FILES] strategies/torch.py: each global rank writes `__{rank}_{k}.distcp`, k counting its
  non-empty write buckets (thread_count 2: up to two files a rank, items spread by size; here one
  file a rank, in state-dict order, which readers do not depend on); a file holds its bytes items first, then its
  tensors, each a whole torch.save archive of the chunk; `.metadata` is the pickled DCP Metadata
  with planner_data None (flatten_state_dict False) and two attributes megatron.core adds:
  mcore_data ({key: {}}) and all_local_plans (the ranks' MCoreSavePlan objects).
- [KEYS] the ShardedTensor keys, no `model.` prefix: embedding.word_embeddings.weight [V, H]
  (V the padded vocabulary, TP along dim 0); per layer, stacked on a leading layer axis
  (TransformerBlock.sharded_state_dict: prepend_axis_num 1, offset the global layer number):
  decoder.layers.self_attention.linear_qkv.layer_norm_weight [L, H] (the local spec's
  input_layernorm maps to it), .linear_qkv.weight [L, (heads + 2 groups) * kv, H] (TP dim 1),
  .linear_proj.weight [L, H, heads * kv] (TP dim 2), decoder.layers.mlp.linear_fc1.layer_norm_weight,
  .linear_fc1.weight [L, F or 2F, H] (SwiGLU: apply_swiglu_sharded_factory gives rank r two
  chunks, its gate rows at r * F/TP and its up rows at (r + TP) * F/TP), .linear_fc2.weight
  [L, H, F] (TP dim 2); decoder.final_layernorm.weight [H]; output_layer.weight [V, H] when untied
  (tied: not saved). Chunks carry the leading 1 of the layer axis.
- [REPLICA] only main replicas are saved (replica_id all zero): a replicated tensor by TP rank 0.
- [OBJECTS] ShardedObjects are BytesStorage items named `{key}/shard_{offset}_{shape}` holding
  torch.save([data]): each linear's `_extra_state` ({key}/shard_{l}_{L}, TP rank 0; None for the
  local spec, an empty uint8 tensor for Transformer Engine) and `rng_state/shard_{pp}.{tp}_{PP}.{TP}`.
- [DTYPE] no conversion: bf16 parameters are saved as bf16.

    /usr/bin/python3 tests/reshard/torch_dist_fixture.py ROOT --tp 2 --pp 2 [--era-kw JSON]

Runs in its own process: it registers stand-ins for torch's DCP classes under their module names.
"""
import argparse
import dataclasses
import enum
import io
import json
import os
import pathlib
import pickle
import sys
import types
from typing import Any

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "formats" / "data"))
import megatron_fixture as mf  # noqa: E402
from make_dcp_fixtures import dcp_classes, metadata_class, module, place, torch_save_bytes  # noqa: E402,E501


def planner_classes(md):
    """torch.distributed.checkpoint.planner's WriteItem and megatron.core's MCoreSavePlan."""
    pl = module("torch.distributed.checkpoint.planner")
    WriteItemType = place(pl, enum.Enum("WriteItemType", {"TENSOR": 0, "SHARD": 1, "BYTE_IO": 2}))

    @dataclasses.dataclass(frozen=True)
    class TensorWriteData:
        chunk: Any
        properties: Any
        size: Any

    @dataclasses.dataclass(frozen=True)
    class WriteItem:
        index: Any
        type: Any
        tensor_data: Any = None

    @dataclasses.dataclass(frozen=True)
    class MCoreSavePlan:  # torch's SavePlan and megatron.core's mcore_data
        items: list
        storage_data: Any = None
        planner_data: Any = None
        usable: bool = True
        mcore_data: Any = None

    place(pl, TensorWriteData)
    place(pl, WriteItem)
    name = "megatron.core.dist_checkpointing.strategies.torch"
    for i in range(1, name.count(".") + 1):  # pickle imports the packages above it
        module(name.rsplit(".", i)[0])
    place(module(name), MCoreSavePlan)
    return WriteItemType, TensorWriteData, WriteItem, MCoreSavePlan


def rank_items(full, T, P, t, p, per_layer_keys=False):
    """Rank (t, p)'s (bytes items, tensor items): (key, value) and (key, global shape, offsets,
    chunk), main replicas only, in the order the model's state dict has them. per_layer_keys: each
    layer under its own key without the layer axis (decoder.layers.N.X), as megatron.core saves
    blocks whose layers differ (TransformerBlock.sharded_state_dict, non-homogeneous layers)."""
    cfg = full.cfg
    if cfg.bias or cfg.normalization != "RMSNorm" or cfg.position_embedding_type != "rope":
        raise ValueError("the torch_dist fixture writes Llama-family models (RMSNorm, rope, "
                         "no biases)")
    L, H, F = cfg.num_layers, cfg.hidden_size, cfg.ffn_hidden_size
    V = cfg.padded_vocab(T)
    rows = (cfg.num_attention_heads + 2 * cfg.groups) * cfg.head_dim
    cols = cfg.num_attention_heads * cfg.head_dim
    per = L // P
    bf = lambda x: x.to(torch.bfloat16).contiguous()  # noqa: E731
    shard = lambda canon, kind: bf(mf.local_shard(full, canon, "master", kind, T, t))  # noqa: E731
    extra = (lambda: None) if cfg.extra_state == "none" else (
        lambda: torch.empty(0, dtype=torch.uint8))
    objs, tensors = [], []
    if p == 0:
        tensors.append(("embedding.word_embeddings.weight", [V, H], [t * V // T, 0],
                        shard("word", "vocab")))
    for i in range(per):
        l = p * per + i
        lay = "decoder.layers."
        if t == 0:
            tensors.append((lay + "self_attention.linear_qkv.layer_norm_weight", [L, H], [l, 0],
                            shard(f"{l}.in_norm.w", "norm")[None]))
        tensors.append((lay + "self_attention.linear_qkv.weight", [L, rows, H],
                        [l, t * rows // T, 0], shard(f"{l}.qkv.w", "qkv")[None]))
        if cfg.qkv_bias:  # Qwen2's: the fused QKV's bias, cut as its rows
            tensors.append((lay + "self_attention.linear_qkv.bias", [L, rows],
                            [l, t * rows // T], shard(f"{l}.qkv.b", "qkv")[None]))
        if cfg.qk_layernorm and t == 0:  # Qwen3's per-head norms, replicated
            for n in ("q", "k"):
                tensors.append((lay + f"self_attention.{n}_layernorm.weight", [L, cfg.head_dim],
                                [l, 0], shard(f"{l}.{n}_norm.w", "norm")[None]))
        tensors.append((lay + "self_attention.linear_proj.weight", [L, H, cols],
                        [l, 0, t * cols // T], shard(f"{l}.proj.w", "row")[None]))
        if t == 0:
            tensors.append((lay + "mlp.linear_fc1.layer_norm_weight", [L, H], [l, 0],
                            shard(f"{l}.mlp_norm.w", "norm")[None]))
        fc1 = shard(f"{l}.fc1.w", "fc1")
        if cfg.swiglu:
            f = F // T
            tensors.append((lay + "mlp.linear_fc1.weight", [L, 2 * F, H], [l, t * f, 0],
                            fc1[:f].clone()[None]))
            tensors.append((lay + "mlp.linear_fc1.weight", [L, 2 * F, H], [l, (t + T) * f, 0],
                            fc1[f:].clone()[None]))
        else:
            tensors.append((lay + "mlp.linear_fc1.weight", [L, F, H], [l, t * F // T, 0],
                            fc1[None]))
        tensors.append((lay + "mlp.linear_fc2.weight", [L, H, F], [l, 0, t * F // T],
                        shard(f"{l}.fc2.w", "row")[None]))
        if t == 0:
            te = ("self_attention.core_attention",) if cfg.extra_state != "none" else ()
            for m in ("self_attention.linear_qkv", "self_attention.linear_proj",
                      "mlp.linear_fc1", "mlp.linear_fc2") + te:
                objs.append((f"{lay}{m}._extra_state/shard_{l}_{L}", [extra()]))
    if per_layer_keys:
        def unstack(item):
            key, shape, offsets, chunk = item
            if not key.startswith("decoder.layers.") or len(shape) < 2 or shape[0] != L:
                return item
            return ("decoder.layers." + f"{offsets[0]}." + key[len("decoder.layers."):],
                    shape[1:], offsets[1:], chunk[0].clone())
        tensors = [unstack(x) for x in tensors]
    if p == P - 1:
        if t == 0:
            tensors.append(("decoder.final_layernorm.weight", [H], [0],
                            shard("final_norm.w", "norm")))
        if cfg.untie:
            tensors.append(("output_layer.weight", [V, H], [t * V // T, 0], shard("out", "vocab")))
    objs.append((f"rng_state/shard_{p}.{t}_{P}.{T}", [mf._rng_state(cfg.seed + t + T * p)]))
    return objs, tensors


def common_state(cfg, T, P, iteration):
    args = mf.make_args(cfg, T, P, iteration)
    args.ckpt_format = "torch_dist"
    return {"args": args, "checkpoint_version": 3.0, "iteration": iteration,
            "num_floating_point_operations_so_far": 0, "content_metadata": {}}


def write_checkpoint(root, cfg, T, P, iteration=100, common_in_dcp=False, per_layer_keys=False):
    """Writes ROOT/iter_NNNNNNN in the torch_dist format and the tracker; returns the FullModel.
    common_in_dcp: as Megatron since 2026-07 (commit 40b1fd37c1) writes it: no common.pt, the
    common state the DCP item common_state/shard_0_1 (torch.save([state]), rank 0), and
    metadata.json without the common backend."""
    cfg.check(T, P)
    full = mf.FullModel(cfg)
    # DP 1: rank = tp + TP * pp, Megatron's order tp, (cp, ep, dp), pp.
    ranks = [(t + T * p, *rank_items(full, T, P, t, p, per_layer_keys))
             for p in range(P) for t in range(T)]
    write_iteration(root, iteration, ranks, common_state(cfg, T, P, iteration), common_in_dcp)
    return full


def write_iteration(root, iteration, ranks, common, common_in_dcp=False):
    """Writes ROOT/iter_NNNNNNN from each rank's items, ranks [(global rank, bytes items, tensor
    items)] as rank_items returns them, `common` the common state, and the tracker. A rank
    without items writes no file."""
    C = dcp_classes("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING")
    Metadata = metadata_class(C.md, ["planner_data", "storage_data", "storage_meta"])
    WriteItemType, TensorWriteData, WriteItem, MCoreSavePlan = planner_classes(C.md)
    d = pathlib.Path(root) / f"iter_{iteration:07d}"
    d.mkdir(parents=True, exist_ok=True)
    sdm, storage, plans, keys = {}, {}, [], []
    for rank, objs, tensors in sorted(ranks, key=lambda r: r[0]):
        rel = f"__{rank}_0.distcp"
        if common_in_dcp and rank == 0:
            objs = [("common_state/shard_0_1", [common])] + list(objs)
        data, items = bytearray(), []
        for key, value in objs:
            blob = torch_save_bytes(value)
            sdm[key] = C.BytesStorageMetadata()
            storage[C.MetadataIndex(key)] = C._StorageInfo(rel, len(data), len(blob))
            items.append(WriteItem(C.MetadataIndex(key), WriteItemType.BYTE_IO))
            data += blob
            keys.append(key)
        for key, shape, offsets, chunk in tensors:
            if key not in sdm:
                props = C.TensorProperties(dtype=chunk.dtype)
                sdm[key] = C.TensorStorageMetadata(props, torch.Size(shape), [])
                keys.append(key)
            meta = C.ChunkStorageMetadata(torch.Size(offsets), chunk.size())
            sdm[key].chunks.append(meta)
            blob = torch_save_bytes(chunk)
            index = C.MetadataIndex(key, offsets, len(sdm[key].chunks) - 1)
            storage[index] = C._StorageInfo(rel, len(data), len(blob))
            items.append(WriteItem(C.MetadataIndex(key, offsets), WriteItemType.SHARD,
                                   TensorWriteData(meta, sdm[key].properties,
                                                   torch.Size(shape))))
            data += blob
        if data:
            (d / rel).write_bytes(data)
        plans.append(MCoreSavePlan(items, mcore_data={}))
    metadata = Metadata(sdm, planner_data=None, storage_data=storage,
                        storage_meta=C.StorageMeta(str(d), "save-uuid"))
    metadata.mcore_data = {k: {} for k in dict.fromkeys(keys) if "/shard_" not in k}
    metadata.all_local_plans = plans
    with open(d / ".metadata", "wb") as f:
        pickle.dump(metadata, f, protocol=4)
    config = {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
    if not common_in_dcp:
        config.update(common_backend="torch", common_backend_version=1)
        buf = io.BytesIO()
        torch.save(common, buf)
        (d / "common.pt").write_bytes(buf.getvalue())
    (d / "metadata.json").write_text(json.dumps(config))
    (pathlib.Path(root) / mf.TRACKER).write_text(str(iteration))


def global_tensors(full, T):
    """{key: tensor} of every ShardedTensor at its global shape, built from the model's own
    pieces (not from the chunks written): what a consolidated view must hold."""
    cfg = full.cfg
    L, H = cfg.num_layers, cfg.hidden_size
    V = cfg.padded_vocab(T)
    bf = lambda x: x.to(torch.bfloat16)  # noqa: E731
    comp = lambda canon, c: full.tensor(canon, c, "master", mf.param_shape(cfg, canon)[c])  # noqa
    hd, qh = cfg.head_dim, cfg.num_attention_heads // cfg.groups
    out = {"embedding.word_embeddings.weight":
           bf(full.tensor("word", "w", "master", (full.vocab_rows, H))[:V])}
    stack = lambda f: torch.stack([bf(f(l)) for l in range(L)])  # noqa: E731

    def qkv(l):
        parts = []
        for g in range(cfg.groups):
            parts += [comp(f"{l}.qkv.w", "q")[g * qh * hd:(g + 1) * qh * hd],
                      comp(f"{l}.qkv.w", "k")[g * hd:(g + 1) * hd],
                      comp(f"{l}.qkv.w", "v")[g * hd:(g + 1) * hd]]
        return torch.cat(parts)

    pre = "decoder.layers."
    out[pre + "self_attention.linear_qkv.layer_norm_weight"] = stack(
        lambda l: comp(f"{l}.in_norm.w", "w"))
    out[pre + "self_attention.linear_qkv.weight"] = stack(qkv)
    if cfg.qkv_bias:
        out[pre + "self_attention.linear_qkv.bias"] = stack(lambda l: torch.cat(
            [c for g in range(cfg.groups) for c in (
                comp(f"{l}.qkv.b", "q")[g * qh * hd:(g + 1) * qh * hd],
                comp(f"{l}.qkv.b", "k")[g * hd:(g + 1) * hd],
                comp(f"{l}.qkv.b", "v")[g * hd:(g + 1) * hd])]))
    if cfg.qk_layernorm:
        for n in ("q", "k"):
            out[pre + f"self_attention.{n}_layernorm.weight"] = stack(
                lambda l, n=n: comp(f"{l}.{n}_norm.w", "w"))
    out[pre + "self_attention.linear_proj.weight"] = stack(lambda l: comp(f"{l}.proj.w", "w"))
    out[pre + "mlp.linear_fc1.layer_norm_weight"] = stack(lambda l: comp(f"{l}.mlp_norm.w", "w"))
    out[pre + "mlp.linear_fc1.weight"] = stack(
        lambda l: torch.cat([comp(f"{l}.fc1.w", "gate"), comp(f"{l}.fc1.w", "up")])
        if cfg.swiglu else comp(f"{l}.fc1.w", "w"))
    out[pre + "mlp.linear_fc2.weight"] = stack(lambda l: comp(f"{l}.fc2.w", "w"))
    out["decoder.final_layernorm.weight"] = bf(full.tensor("final_norm.w", "w", "master", (H,)))
    if cfg.untie:
        out["output_layer.weight"] = bf(full.tensor("out", "w", "master", (full.vocab_rows, H))[:V])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--iteration", type=int, default=100)
    ap.add_argument("--config", default="{}", help="ModelConfig fields as JSON")
    ap.add_argument("--per-layer-keys", action="store_true",
                    help="each layer under its own key (non-homogeneous blocks)")
    ap.add_argument("--common-in-dcp", action="store_true",
                    help="the common state as a DCP item, as Megatron writes it since 2026-07")
    a = ap.parse_args(argv)
    # DP 1: the files are written as one data-parallel replica writes them (rank = tp + TP * pp).
    kw = dict(era="mcore", swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
              bias=False, data_parallel_size=1)
    kw.update(json.loads(a.config))
    write_checkpoint(a.root, mf.ModelConfig(**kw), a.tp, a.pp, a.iteration, a.common_in_dcp,
                     a.per_layer_keys)


if __name__ == "__main__":
    main()
