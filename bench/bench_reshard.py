#!/usr/bin/python3
"""Resharded views against the offline route, both measured in this run.

A Megatron-LM checkpoint (mcore names, GQA, SwiGLU, bf16 weights with the fp16 optimizer's fp32
masters and Adam state; tests/reshard/megatron_fixture.py) is saved at TP=4, PP=2 into a ckptfs
mount. For each target shape:

  view     torch.load of every target rank file under ROOT/.views/tpT-ppP (the first open of a
           file computes its CRCs); nothing is written
  offline  what a conversion does: torch.load every source shard, reshard (the fixture's
           reference, torch.cat and slicing), torch.save the new shards to a plain directory on
           the same disk, torch.load them

Prints `view/offline` time ratios (goal <= 0.25), the temporary bytes each route writes, the time
to the first byte of a view file (fresh mount: plan + CRCs) and the daemon's peak RSS.

  convert  `ckptfs convert` of a plain copy of the source (no mount) into a new directory, from a
           cold page cache, its files checked equal to the mounted view's, bit for bit; against
           the offline route's conversion alone (its torch.save included, not the loads after):
           `convert/offline` (goal <= 0.3) and its peak RSS. It syncs what it wrote (syncfs)
           before the directory appears; the offline route's torch.save does not.

A second checkpoint of the same model saved with the distributed optimizer (distrib_optim.pt
beside every rank file, buckets from overlap_grad_reduce) goes to tp2-pp2 the same two ways. Its
offline route is a conversion written here for a TP change at the same PP: torch.load of every
source file, each parameter's fp32 state cut from the flat tensors by Megatron's layout
(tests/reshard/megatron_distopt.py), merged and split with the weights by their rules, laid out
again for the target, torch.save, torch.load of the new files.

A mixture-of-experts checkpoint (tests/reshard/megatron_moe_fixture.py: SequentialMLP experts,
every layer MoE, the optimizer a [dense, experts] ChainedOptimizer) saved at TP 2 x PP 2 x EP 4
goes to tp1-pp2-ep2 and to hf (MixtralForCausalLM) the same two ways; its offline routes are the
conversions in bench/moe_offline.py (torch.load of every source rank file, TP shards merged,
experts renumbered, the optimizer laid out again, torch.save / safetensors, and for tp1-pp2-ep2
torch.load of the new files). Each view is checked equal to its conversion, bit for bit.

  /usr/bin/python3 bench/bench_reshard.py --gib 2
  /usr/bin/python3 bench/bench_reshard.py --only moe --moe-gib 1
"""
import argparse
import copy
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import torch

# DeepSpeed's and Megatron's checkpoints hold more than tensors (args, numpy values); the
# frameworks load them with weights_only=False, torch >= 2.6's default being True.
os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "reshard"))
import megatron_distopt as md  # noqa: E402
import megatron_fixture as mf  # noqa: E402
import megatron_moe_fixture as mm  # noqa: E402
import benchjson  # noqa: E402  (bench/, the script's own folder)
import moe_offline as mo  # noqa: E402
import convert_route as cr  # noqa: E402


def sh(*args):
    return subprocess.run([str(a) for a in args], check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True).stdout


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def du(path):
    """Bytes of the regular files under path, not counting the virtual .views trees."""
    total = 0
    for d, dirs, files in os.walk(path):
        dirs[:] = [x for x in dirs if x != ".views"]
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
    return total


def proc_field(pid, name, fname="status"):
    for line in Path(f"/proc/{pid}/{fname}").read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1])
    return 0


def write_safetensors(path, tensors):
    """A safetensors file of {name: tensor} (bf16/fp32), as save_pretrained writes one."""
    names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors.values():
            f.write(t.contiguous().view(torch.uint8).numpy().tobytes())


def cold_loads(pid, work, paths, first=None):
    """torch.load of every path in turn from a cold page cache, the first byte of `first` (else
    of paths[0]) read ahead of them: (seconds, seconds to that first byte, bytes the daemon
    wrote, growth of the cache directory)."""
    drop_caches()
    written0, cache0 = proc_field(pid, "write_bytes", "io"), du(work / "cache")
    t0 = time.perf_counter()
    with open(first or paths[0], "rb") as f:
        f.read(1)
    ttfb = time.perf_counter() - t0
    for path in paths:
        torch.load(path)
    s = time.perf_counter() - t0
    return s, ttfb, proc_field(pid, "write_bytes", "io") - written0, du(work / "cache") - cache0


def cold_read_whole(pid, work, d):
    """read_whole(d) from a cold page cache: (seconds, bytes read, bytes the daemon wrote, growth
    of the cache directory)."""
    drop_caches()
    written0, cache0 = proc_field(pid, "write_bytes", "io"), du(work / "cache")
    t0 = time.perf_counter()
    n = read_whole(d)
    s = time.perf_counter() - t0
    return s, n, proc_field(pid, "write_bytes", "io") - written0, du(work / "cache") - cache0


def write_hf_dir(out, sd):
    """A new directory `out` holding sd as save_pretrained writes it under its 5 GB shard size:
    one safetensors shard and the index."""
    out.mkdir(parents=True)
    shard = "model-00001-of-00001.safetensors"
    write_safetensors(out / shard, sd)
    total = sum(t.numel() * t.element_size() for t in sd.values())
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": {k: shard for k in sorted(sd)}}))


def offline_hf(root, cfg, T, P, out):
    """The offline route to a Hugging Face directory: load every rank file, merge TP and PP, map
    to HF's names (QKV split per query group, SwiGLU into gate and up, vocabulary unpadded) and
    write the safetensors shards (one, under save_pretrained's 5 GB) and the index."""
    ranks = {(t, p): torch.load(root / "iter_0000100" / mf.rank_name(t, p, P) / mf.FILE,
                                map_location="cpu")["model"] for t in range(T) for p in range(P)}
    per = cfg.num_layers // P
    cat = lambda key, p, dim: torch.cat([ranks[(t, p)][key] for t in range(T)], dim)  # noqa: E731
    sd = {"model.embed_tokens.weight":
          cat("embedding.word_embeddings.weight", 0, 0)[:cfg.vocab_size]}
    qh, hd, g = cfg.num_attention_heads // cfg.groups, cfg.head_dim, cfg.groups
    for p in range(P):
        for i in range(per):
            pre, hf = f"decoder.layers.{i}.", f"model.layers.{p * per + i}."
            qkv = cat(pre + "self_attention.linear_qkv.weight", p, 0).view(g, (qh + 2) * hd, -1)
            sd[hf + "input_layernorm.weight"] = ranks[(0, p)][pre + "input_layernorm.weight"]
            sd[hf + "self_attn.q_proj.weight"] = qkv[:, :qh * hd].reshape(-1, cfg.hidden_size)
            sd[hf + "self_attn.k_proj.weight"] = qkv[:, qh * hd:(qh + 1) * hd].reshape(
                -1, cfg.hidden_size)
            sd[hf + "self_attn.v_proj.weight"] = qkv[:, (qh + 1) * hd:].reshape(-1, cfg.hidden_size)
            sd[hf + "self_attn.o_proj.weight"] = cat(pre + "self_attention.linear_proj.weight", p, 1)
            sd[hf + "post_attention_layernorm.weight"] = ranks[(0, p)][pre + "pre_mlp_layernorm.weight"]
            halves = [ranks[(t, p)][pre + "mlp.linear_fc1.weight"].chunk(2) for t in range(T)]
            sd[hf + "mlp.gate_proj.weight"] = torch.cat([h[0] for h in halves])
            sd[hf + "mlp.up_proj.weight"] = torch.cat([h[1] for h in halves])
            sd[hf + "mlp.down_proj.weight"] = cat(pre + "mlp.linear_fc2.weight", p, 1)
    sd["model.norm.weight"] = ranks[(0, P - 1)]["decoder.final_layernorm.weight"]
    write_hf_dir(out, sd)
    os.sync()
    return sd


def offline_distopt(src, cfg, Ts, T, P, out):
    """The conversion of a distributed-optimizer checkpoint from TP=Ts to TP=T at the same
    PP=P (see the docstring): reads src/iter_0000100, writes out/iter_0000100."""
    keys = ("param", "exp_avg", "exp_avg_sq")
    dkey = (torch.bfloat16, torch.float32)

    rows = cfg.padded_vocab(T)
    for p in range(P):
        files = [torch.load(src / "iter_0000100" / mf.rank_name(t, p, P) / mf.FILE)
                 for t in range(Ts)]
        dists = [torch.load(src / "iter_0000100" / mf.rank_name(t, p, P) / mf.DISTRIB_FILE)
                 for t in range(Ts)]
        names = [k for k, v in files[0]["model"].items()
                 if torch.is_tensor(v) and not k.endswith("_extra_state")]

        def states(t):
            """{key: {name: tensor}} of source rank t, cut by its layout."""
            params = [(n, files[t]["model"][n].numel()) for n in names]
            offsets, _, _ = md.rank_layout(cfg, P, p, params)
            flat = dists[t][0][dkey]
            return {k: {n: flat[k][o:o + files[t]["model"][n].numel()].view(
                files[t]["model"][n].shape) for (n, _), o in zip(params, offsets)} for k in keys}
        src_states = [states(t) for t in range(Ts)]
        full_w, full_s = {}, {k: {} for k in keys}
        for n in names:
            rule = mf.rule_of(n, cfg.swiglu)
            full_w[n] = mf.join_shards(rule, [f["model"][n] for f in files])
            for k in keys:
                full_s[k][n] = mf.join_shards(rule, [s[k][n] for s in src_states])
        for t in range(T):
            prim = files[t * Ts // T]
            model = type(prim["model"])()
            for k, v in prim["model"].items():
                model[k] = mf.split_full(mf.rule_of(k, cfg.swiglu), full_w[k], T, t, rows) \
                    if k in full_w else v
            sd = dict(prim)
            sd["model"] = model
            args = copy.copy(prim["args"])
            args.tensor_model_parallel_size = T
            args.padded_vocab_size = rows
            sd["args"] = args
            params = [(n, model[n].numel()) for n in names]
            offsets, total, _ = md.rank_layout(cfg, P, p, params)
            world = {}
            for k in keys:
                flat = torch.zeros(total, dtype=torch.float32)
                for (n, numel), o in zip(params, offsets):
                    flat[o:o + numel] = mf.split_full(mf.rule_of(n, cfg.swiglu), full_s[k][n],
                                                      T, t, rows).reshape(-1)
                world[k] = flat
            world["numel_unpadded"] = total
            d = out / "iter_0000100" / mf.rank_name(t, p, P)
            d.mkdir(parents=True, exist_ok=True)
            torch.save(sd, d / mf.FILE)
            torch.save({"buckets_coalesced": True, 0: {dkey: world}}, d / mf.DISTRIB_FILE)


def distopt_case(root, cfg, work, pid, T, P):
    """tp4-pp2 -> tpT-ppP of a distributed-optimizer checkpoint: (view s, offline s, first byte
    s, daemon written, cache growth, offline written)."""
    mf.save_checkpoint(root, cfg, 4, 2)
    os.sync()
    names = (mf.FILE, mf.DISTRIB_FILE)
    print(f"distributed optimizer: {du(root) / 2**30:.2f} GiB at TP 4 x PP 2", flush=True)
    view = root / ".views" / f"tp{T}-pp{P}" / "iter_0000100"
    view_s, ttfb, vw, cg = cold_loads(
        pid, work, [view / mf.rank_name(t, p, P) / n for p in range(P) for t in range(T)
                    for n in names], first=view / mf.rank_name(0, 0, P) / mf.DISTRIB_FILE)
    drop_caches()
    off = work / "offline-distopt"
    t0 = time.perf_counter()
    offline_distopt(root, cfg, 4, T, P, off)
    for p in range(P):
        for t in range(T):
            for name in names:
                torch.load(off / "iter_0000100" / mf.rank_name(t, p, P) / name)
    offline_s = time.perf_counter() - t0
    ow = du(off)
    # Both routes made the same files (rank 0 of each stage, compared whole).
    for p in range(P):
        rank = mf.rank_name(0, p, P)
        a, b = torch.load(view / rank / mf.DISTRIB_FILE), torch.load(off / "iter_0000100" / rank /
                                                                      mf.DISTRIB_FILE)
        for k in ("param", "exp_avg", "exp_avg_sq"):
            assert torch.equal(a[0][(torch.bfloat16, torch.float32)][k],
                               b[0][(torch.bfloat16, torch.float32)][k]), (rank, k)
    shutil.rmtree(off)
    print(f"tp4-pp2 -> tp{T}-pp{P} (distributed optimizer): view {view_s:.1f} s, offline "
          f"{offline_s:.1f} s, first byte {ttfb:.2f} s", flush=True)
    return view_s, offline_s, ttfb, vw, cg, ow


def read_whole(d):
    """Reads every file under d to its end; the bytes read."""
    n = 0
    for f in sorted(d.iterdir()):
        with open(f, "rb", buffering=0) as fh:
            while chunk := fh.read(16 << 20):
                n += len(chunk)
    return n


def dense_cases(mnt, gib, work, pid):
    """The dense checkpoint's figures: (tpT-ppP results, hf, distributed optimizer)."""
    # hidden 2048, 16 heads in 4 query groups, SwiGLU ffn 5632, vocab 32000: about 630 MiB per
    # layer with the optimizer (14 bytes per parameter), 0.9 GiB for the tied embeddings.
    layers = max(2, 2 * round((gib * 1024 - 900) / 630 / 2))
    cfg = mf.ModelConfig(era="mcore", num_layers=layers, hidden_size=2048, num_attention_heads=16,
                         num_query_groups=4, ffn_hidden_size=5632, swiglu=True, vocab_size=32000,
                         make_vocab_size_divisible_by=128, bias=False, normalization="RMSNorm",
                         position_embedding_type="rope")
    results = []
    root = mnt / "ckpt"
    t0 = time.perf_counter()
    mf.save_checkpoint(root, cfg, 4, 2)
    os.sync()
    src_bytes = du(root)
    plain = cr.plain_copy(root, work / "plain-dense")
    print(f"source: {layers} layers, TP 4 x PP 2, {src_bytes / 2**30:.2f} GiB, "
          f"saved in {time.perf_counter() - t0:.1f} s", flush=True)
    for T, P in ((2, 2), (4, 1), (2, 1)):
        spec = f"tp{T}-pp{P}"
        view = root / ".views" / spec / "iter_0000100"
        # View route.
        view_s, ttfb, view_written, cache_grew = cold_loads(
            pid, work, [view / mf.rank_name(t, p, P) / mf.FILE for p in range(P) for t in range(T)])
        # Offline route.
        drop_caches()
        off = work / f"offline-{spec}"
        t0 = time.perf_counter()
        ref = mf.reference_shard(root, T, P)
        mf.write_reference(ref, off, "iter_0000100")
        conv_s = time.perf_counter() - t0
        del ref
        for p in range(P):
            for t in range(T):
                torch.load(off / "iter_0000100" / mf.rank_name(t, p, P) / "model_optim_rng.pt")
        offline_s = time.perf_counter() - t0
        offline_written = du(off)
        shutil.rmtree(off)
        results.append((spec, view_s, offline_s, ttfb, view_written, cache_grew,
                        offline_written))
        converted(f"tp4-pp2->{spec}", plain, root / ".views" / spec, conv_s, work)
        print(f"tp4-pp2 -> {spec}: view {view_s:.1f} s, offline {offline_s:.1f} s, "
              f"first byte {ttfb:.2f} s", flush=True)
    # The hf view read whole vs the offline route to the same directory.
    hf_view_s, hf_bytes, hf_written, hf_cache = cold_read_whole(pid, work, root / ".views" / "hf")
    drop_caches()
    off = work / "offline-hf"
    t0 = time.perf_counter()
    offline_hf(root, cfg, 4, 2, off)
    hf_offline_s = time.perf_counter() - t0
    hf_offline_bytes = du(off)
    converted("tp4-pp2->hf", plain, root / ".views" / "hf", hf_offline_s, work)
    shutil.rmtree(plain)
    # Both routes made the same tensors.
    view_index = json.loads((root / ".views" / "hf" / "model.safetensors.index.json").read_text())
    off_index = json.loads((off / "model.safetensors.index.json").read_text())
    assert view_index["metadata"] == off_index["metadata"], (view_index, off_index)
    assert sorted(view_index["weight_map"]) == sorted(off_index["weight_map"])
    shutil.rmtree(off)
    print(f"tp4-pp2 -> hf: view {hf_view_s:.1f} s ({hf_bytes / 2**30:.2f} GiB), offline "
          f"{hf_offline_s:.1f} s", flush=True)
    dcfg = mf.ModelConfig(**{**cfg.__dict__, "distributed_optimizer": True,
                             "extra_args": dict(overlap_grad_reduce=True)})
    shutil.rmtree(root)
    dist = distopt_case(mnt / "ckpt-distopt", dcfg, work, pid, 2, 2)
    return results, (hf_view_s, hf_offline_s, hf_written, hf_cache, hf_offline_bytes), dist


CONVERTS = []  # (figure, convert s, offline conversion s, peak RSS KiB, bytes written)
ARGS = None  # the command line (main)


def converted(figure, plain, view, offline_s, work):
    """The convert route of `view`'s spec from `plain` against the offline conversion's
    `offline_s` (its torch.save included, not the loads after); the result is checked equal to
    the mounted view, bit for bit."""
    dst = work / "converted"
    s, rss = cr.convert(ARGS.bin, plain, dst, view.name, drop_caches)
    written = du(dst)
    files = cr.same_files(dst, view)
    shutil.rmtree(dst)
    CONVERTS.append((figure, s, offline_s, rss, written))
    print(f"{figure}: convert {s:.1f} s ({files} files equal to the view's, peak RSS "
          f"{rss / 1024:.0f} MiB), offline conversion {offline_s:.1f} s", flush=True)


def moe_config(gib):
    """hidden 1024, 16 heads in 4 query groups, 8 experts of ffn 1024, vocab 2000 (the embeddings'
    share of a layer's experts is Mixtral's), every layer MoE; the dense part (attention, router,
    norms, embeddings) is on each of the 4 EP ranks: 14 bytes per parameter with the optimizer,
    about 476 MiB per layer and 224 MiB of embeddings. Below two layers' worth the hidden and
    expert sizes halve."""
    size = lambda H, n: 14 * (n * (4 * 2.5 * H * H + 24 * H * H) + 4 * 2 * 2048 * H) / 2**30  # noqa
    H = 1024
    while H > 256 and size(H, 2) > 1.25 * gib:
        H //= 2
    layers = max(2, 2 * round(gib / size(H, 2)))
    return mm.MoeConfig(num_layers=layers, hidden_size=H, num_attention_heads=16,
                        num_query_groups=4, ffn_hidden_size=2816, moe_ffn_hidden_size=H,
                        num_experts=8, vocab_size=2000, make_vocab_size_divisible_by=128)


def moe_case(root, cfg, work, pid):
    """tp2-pp2-ep4 -> tp1-pp2-ep2 and -> hf of an MoE checkpoint: {target: (view s, offline s,
    first byte s or None, daemon written, cache growth, offline written)}."""
    t0 = time.perf_counter()
    mm.save_checkpoint(root, cfg, 2, 2, 4)
    os.sync()
    print(f"MoE source: {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_experts} "
          f"experts, TP 2 x PP 2 x EP 4, {du(root) / 2**30:.2f} GiB, saved in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    out = {}
    view = root / ".views" / "tp1-pp2-ep2" / mo.ITER
    ranks = [mm.rank_name(0, p, e, 2, 2) for p in range(2) for e in range(2)]
    view_s, ttfb, vw, cg = cold_loads(pid, work, [view / r / mm.FILE for r in ranks])
    drop_caches()
    off = work / "offline-moe"
    t0 = time.perf_counter()
    mo.convert_ep(root, off, 2, 2, 4, 1, 2)
    conv_s = time.perf_counter() - t0
    for r in ranks:
        torch.load(off / mo.ITER / r / mm.FILE)
    offline_s = time.perf_counter() - t0
    ow = du(off)
    mo.compare_ep(view, off / mo.ITER, 2, 2)
    shutil.rmtree(off)
    out["tp1-pp2-ep2"] = (view_s, offline_s, ttfb, vw, cg, ow)
    plain = cr.plain_copy(root, work / "plain-moe")
    converted("moe tp2-pp2-ep4->tp1-pp2-ep2", plain, root / ".views" / "tp1-pp2-ep2", conv_s,
              work)
    print(f"tp2-pp2-ep4 -> tp1-pp2-ep2: view {view_s:.1f} s, offline {offline_s:.1f} s, first "
          f"byte {ttfb:.2f} s (every tensor equal)", flush=True)
    view_s, n, vw, cg = cold_read_whole(pid, work, root / ".views" / "hf")
    drop_caches()
    off = work / "offline-moe-hf"
    t0 = time.perf_counter()
    mo.convert_hf(root, off, 2, 2, 4, write_hf_dir)
    offline_s = time.perf_counter() - t0
    ow = du(off)
    count = mo.compare_hf(root / ".views" / "hf", off)
    shutil.rmtree(off)
    out["hf"] = (view_s, offline_s, None, vw, cg, ow)
    converted("moe tp2-pp2-ep4->hf", plain, root / ".views" / "hf", offline_s, work)
    shutil.rmtree(plain)
    print(f"tp2-pp2-ep4 -> hf: view {view_s:.1f} s ({n / 2**30:.2f} GiB), offline "
          f"{offline_s:.1f} s ({count} tensors equal)", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0, help="approximate source checkpoint size")
    ap.add_argument("--moe-gib", type=float, default=1.0,
                    help="approximate size of the mixture-of-experts source")
    ap.add_argument("--only", choices=("dense", "moe"),
                    help="run only the dense or the mixture-of-experts figures")
    ap.add_argument("--dir", default="/var/tmp/ckptfs-bench-reshard")
    ap.add_argument("--bin", default=str(REPO / "build" / "tools" / "ckptfs"))
    benchjson.add_argument(ap)
    args = ap.parse_args()
    global ARGS
    ARGS = args
    results_json = benchjson.Results("reshard", args.json)

    work = Path(args.dir)
    if work.exists():
        subprocess.run(["fusermount3", "-u", str(work / "mnt")], stderr=subprocess.DEVNULL)
        shutil.rmtree(work)
    (work / "mnt").mkdir(parents=True)
    mnt = work / "mnt"
    out = sh(args.bin, "mount", mnt, "--cache-dir", work / "cache")
    pid = int(re.search(r"daemon pid (\d+)", out).group(1))
    results, moe = [], {}
    try:
        if args.only != "moe":
            results, hf, dist = dense_cases(mnt, args.gib, work, pid)
            shutil.rmtree(mnt / "ckpt-distopt")
        if args.only != "dense":
            moe = moe_case(mnt / "ckpt-moe", moe_config(args.moe_gib), work, pid)
        rss = proc_field(pid, "VmHWM")
    finally:
        subprocess.run([args.bin, "umount", mnt], stdout=subprocess.DEVNULL)
    print()
    if results:
        for spec, v, o, ttfb, vw, cg, ow in results:
            print(f"tp4-pp2->{spec:8s} view/offline = {v / o:.2f}   (view {v:.1f} s, offline "
                  f"{o:.1f} s; written: daemon {vw} B, cache dir +{max(cg, 0)} B, offline "
                  f"{ow / 2**30:.2f} GiB; first byte {ttfb:.2f} s)")
            results_json.add(f"tp4-pp2->{spec}", v / o, subject="view", baseline="offline",
                             better="lower", goal=0.25, subject_s=v, baseline_s=o,
                             first_byte_s=ttfb, view_written=vw, offline_written=ow)
        v, o, vw, cg, ow = hf
        print(f"tp4-pp2->hf       view/offline = {v / o:.2f}   (view {v:.1f} s, offline "
              f"{o:.1f} s; written: daemon {vw} B, cache dir +{max(cg, 0)} B, offline "
              f"{ow / 2**30:.2f} GiB)")
        results_json.add("tp4-pp2->hf", v / o, subject="view", baseline="offline",
                         better="lower", goal=0.25, subject_s=v, baseline_s=o,
                         view_written=vw, offline_written=ow)
        v, o, ttfb, vw, cg, ow = dist
        print(f"tp4-pp2->tp2-pp2 distributed optimizer view/offline = {v / o:.2f}   (view "
              f"{v:.1f} s, offline {o:.1f} s; written: daemon {vw} B, cache dir +{max(cg, 0)} B, "
              f"offline {ow / 2**30:.2f} GiB; first byte {ttfb:.2f} s)")
        results_json.add("distopt tp4-pp2->tp2-pp2", v / o, subject="view", baseline="offline",
                         better="lower", goal=0.25, subject_s=v, baseline_s=o,
                         first_byte_s=ttfb, view_written=vw, offline_written=ow)
    for spec, (v, o, ttfb, vw, cg, ow) in moe.items():
        first = "" if ttfb is None else f"; first byte {ttfb:.2f} s"
        print(f"moe tp2-pp2-ep4->{spec:11s} view/offline = {v / o:.2f}   (view {v:.1f} s, "
              f"offline {o:.1f} s; written: daemon {vw} B, cache dir +{max(cg, 0)} B, offline "
              f"{ow / 2**30:.2f} GiB{first})")
        extra = {} if ttfb is None else {"first_byte_s": ttfb}
        results_json.add(f"moe tp2-pp2-ep4->{spec}", v / o, subject="view", baseline="offline",
                         better="lower", goal=0.25, subject_s=v, baseline_s=o,
                         view_written=vw, offline_written=ow, **extra)
    for figure, s, o, peak, written in CONVERTS:
        print(f"{figure:30s} convert/offline = {s / o:.2f}   (ckptfs convert {s:.1f} s, peak RSS "
              f"{peak / 1024:.0f} MiB, {written / 2**30:.2f} GiB written; offline conversion "
              f"{o:.1f} s)")
        results_json.add(f"convert {figure}", s / o, subject="convert", baseline="offline",
                         better="lower", goal=0.3, subject_s=s, baseline_s=o,
                         peak_rss_mib=round(peak / 1024))
    print(f"daemon peak RSS = {rss / 1024:.0f} MiB (includes the source's save)")
    results_json.note("daemon_peak_rss_mib", round(rss / 1024))
    results_json.write()


if __name__ == "__main__":
    main()
