#!/usr/bin/python3
"""The universal view of a DeepSpeed ZeRO-2 checkpoint against the offline conversion, both
measured in this run.

A ZeRO-2 checkpoint in DeepSpeed's layout (bf16 weights, fp32 masters, Adam's exp_avg and
exp_avg_sq; the DeepSpeed classes are tests/reshard/deepspeed_fixture.py's stand-ins) is saved at
DP=4 into a ckptfs mount. Then, page cache dropped before each route:

  view     torch.load of every file under ROOT/.views/universal (what DeepSpeed's universal
           loading reads); nothing is written
  offline  the work of DeepSpeed's ds_to_universal, one process: torch.load each optimizer file,
           torch.save every parameter fragment of every state to a temporary directory, then per
           parameter and state torch.load the fragments, torch.cat, torch.save the merged file,
           write optimizer_state.pt, copy the model-states file, remove the temporary directory

Prints `universal view/offline` (goal <= 0.25), the offline route's temporary and output bytes,
and what the daemon wrote during the view route.

  /usr/bin/python3 bench/bench_ds_universal.py --gib 2
"""
import argparse
import collections
import os
import re
import shutil
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
import deepspeed_fixture as df  # noqa: E402  (the DeepSpeed classes' stand-ins, partition math)

sys.path.insert(0, str(REPO / "bench"))
import benchjson  # noqa: E402
from bench_reshard import drop_caches, du, proc_field, sh  # noqa: E402

TAG = "global_step100"
DP = 4


def params(layers, hidden):
    """[(name, shape, group)]: weights decay (group 0), norms and biases do not (group 1)."""
    h = hidden
    out = [("language_model.embedding.word_embeddings.weight", (32000, h), 0)]
    for i in range(layers):
        p = f"language_model.encoder.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,), 1),
                (p + "self_attention.query_key_value.weight", (3 * h, h), 0),
                (p + "self_attention.query_key_value.bias", (3 * h,), 1),
                (p + "self_attention.dense.weight", (h, h), 0),
                (p + "post_attention_layernorm.weight", (h,), 1),
                (p + "mlp.dense_h_to_4h.weight", (4 * h, h), 0),
                (p + "mlp.dense_4h_to_h.weight", (h, 4 * h), 0)]
    out.append(("language_model.encoder.final_layernorm.weight", (h,), 1))
    return out


def save_source(root, layers, hidden):
    """Writes ROOT/TAG/mp_rank_00_model_states.pt, the DP optimizer files and ROOT/latest."""
    ps = params(layers, hidden)
    groups = [[(n, s) for n, s, g in ps if g == k] for k in (0, 1)]
    totals = [sum(df._numel(s) for _, s in g) for g in groups]
    gen = torch.Generator().manual_seed(7)
    flats = [{k: torch.randn(df.aligned_numel(t, DP), generator=gen) * scale
              for k, scale in (("fp32", 0.05), ("exp_avg", 1e-3), ("exp_avg_sq", 1e-5))}
             for t in totals]
    for g, t in zip(flats, totals):
        for x in g.values():
            x[t:] = 0  # the alignment padding
    tdir = root / TAG
    tdir.mkdir(parents=True)
    cfg = {"train_batch_size": 32, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    module, shapes = collections.OrderedDict(), []
    for g, flat in zip(groups, flats):
        bit16 = flat["fp32"].to(torch.bfloat16)
        off, sm = 0, collections.OrderedDict()
        for n, s in g:
            module[n] = bit16[off:off + df._numel(s)].view(s)
            sm[n] = torch.Size(s)
            off += df._numel(s)
        shapes.append(sm)
    torch.save(dict(module=module, buffer_names=[], optimizer=None, param_shapes=shapes,
                    frozen_param_shapes=collections.OrderedDict(), shared_params={},
                    frozen_param_fragments=collections.OrderedDict(), lr_scheduler=None,
                    data_sampler=None, random_ltd=None, sparse_tensor_module_names=set(),
                    skipped_steps=0, global_steps=100, global_samples=3200, dp_world_size=DP,
                    mp_world_size=1, ds_config=cfg, ds_version=df.DS_VERSION),
               tdir / "mp_rank_00_model_states.pt")
    del module
    for r in range(DP):
        fp32, state, pads, maps, pgroups = [], {}, [], [], []
        for i, (g, flat, t) in enumerate(zip(groups, flats, totals)):
            size = df.partition_size(t, DP)
            part = {k: v[r * size:(r + 1) * size].clone() for k, v in flat.items()}
            pad = df.rank_padding(t, DP, r)
            fp32.append(part["fp32"][:size - pad])
            state[i] = {"step": 100, "exp_avg": part["exp_avg"], "exp_avg_sq": part["exp_avg_sq"]}
            pads.append(pad)
            maps.append(df.slice_mappings([(n, df._numel(s)) for n, s in g], t, DP, r))
            pgroups.append({"lr": 1e-4, "bias_correction": True, "betas": [0.9, 0.95],
                            "eps": 1e-8, "weight_decay": 0.1 if i == 0 else 0.0, "step": 0,
                            "params": [i]})
        osd = {"loss_scaler": df._obj(df.LossScaler, cur_scale=1.0, dynamic=False),
               "dynamic_loss_scale": False, "overflow": False, "clip_grad": 1.0,
               "base_optimizer_state": {"state": state, "param_groups": pgroups},
               "single_partition_of_fp32_groups": fp32,
               "zero_stage": df.ZeroStageEnum.gradients, "group_paddings": pads,
               "partition_count": [DP, DP], "ds_version": df.DS_VERSION,
               "param_slice_mappings": maps}
        torch.save({"optimizer_state_dict": osd, "ds_config": cfg, "ds_version": df.DS_VERSION},
                   tdir / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    (root / "latest").write_text(TAG)
    return ps


def offline(src, out):
    """ds_to_universal's work, in one process; returns the temporary directory's peak bytes."""
    tmp = out / "tmp"
    shapes = {}
    for r in range(DP):
        sd = torch.load(src / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt",
                        map_location="cpu")["optimizer_state_dict"]
        base = sd["base_optimizer_state"]["state"]
        for g, maps in enumerate(sd["param_slice_mappings"]):
            states = {"fp32": sd["single_partition_of_fp32_groups"][g],
                      "exp_avg": base[g]["exp_avg"], "exp_avg_sq": base[g]["exp_avg_sq"]}
            for name, frag in maps.items():
                d = tmp / name / "0"
                d.mkdir(parents=True, exist_ok=True)
                for k, v in states.items():
                    torch.save(v.narrow(0, frag.start, frag.numel).clone(), d / f"{k}.{r:02d}")
                torch.save(base[g]["step"], d / f"step.{r:02d}")
        del sd, base, states
    tmp_bytes = du(tmp)
    model = torch.load(src / "mp_rank_00_model_states.pt", map_location="cpu")
    for g in model["param_shapes"]:
        shapes.update(g)
    del model
    for name, shape in shapes.items():
        d, o = tmp / name / "0", out / "zero" / name
        o.mkdir(parents=True)
        for k in ("fp32", "exp_avg", "exp_avg_sq"):
            frags = [torch.load(p) for p in sorted(d.glob(f"{k}.*"))]
            torch.save({"cat_dim": 0, "param": torch.cat(frags, 0).reshape(shape)}, o / f"{k}.pt")
        torch.save(torch.load(sorted(d.glob("step.*"))[0]), o / "step.pt")
    sd = torch.load(src / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                    map_location="cpu")["optimizer_state_dict"]
    opt = {k: v for k, v in sd.items() if k not in ("base_optimizer_state", "param_slice_mappings",
                                                    "single_partition_of_fp32_groups")}
    opt["group_paddings"] = [0] * len(opt["group_paddings"])
    opt["param_groups"] = sd["base_optimizer_state"]["param_groups"]
    del sd
    torch.save(opt, out / "zero" / "optimizer_state.pt")
    shutil.copy2(src / "mp_rank_00_model_states.pt", out)
    shutil.rmtree(tmp)
    return tmp_bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0, help="approximate optimizer state size")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--dir", default="/var/tmp/ckptfs-bench-ds")
    ap.add_argument("--bin", default=str(REPO / "build" / "tools" / "ckptfs"))
    benchjson.add_argument(ap)
    args = ap.parse_args()
    results_json = benchjson.Results("ds_universal", args.json)

    work = Path(args.dir)
    if work.exists():
        subprocess.run(["fusermount3", "-u", str(work / "mnt")], stderr=subprocess.DEVNULL)
        shutil.rmtree(work)
    (work / "mnt").mkdir(parents=True)
    h = args.hidden
    # 12 bytes of optimizer state per parameter; 12 h^2 parameters a layer, 32000 h embedding.
    layers = max(1, round((args.gib * 2**30 / 12 - 32000 * h) / (12 * h * h)))
    mnt = work / "mnt"
    out = sh(args.bin, "mount", mnt, "--cache-dir", work / "cache")
    pid = int(re.search(r"daemon pid (\d+)", out).group(1))
    try:
        root = mnt / "ckpt"
        t0 = time.perf_counter()
        ps = save_source(root, layers, h)
        os.sync()
        optim = sum(f.stat().st_size for f in (root / TAG).glob("*optim_states.pt"))
        print(f"source: {layers} layers, hidden {h}, {len(ps)} parameters, DP {DP}: optimizer "
              f"files {optim / 2**30:.2f} GiB, all {du(root) / 2**30:.2f} GiB, saved in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)

        view = root / ".views" / "universal"
        drop_caches()
        written0, cache0 = proc_field(pid, "write_bytes", "io"), du(work / "cache")
        t0 = time.perf_counter()
        tag = (view / "latest_universal").read_text()
        files = sorted(p for p in (view / tag).rglob("*.pt"))
        for p in files:
            torch.load(p, map_location="cpu")
        view_s = time.perf_counter() - t0
        view_written = proc_field(pid, "write_bytes", "io") - written0
        cache_grew = du(work / "cache") - cache0
        print(f"view: {len(files)} files loaded in {view_s:.1f} s", flush=True)

        drop_caches()
        off = work / "offline" / f"{TAG}_universal"
        off.mkdir(parents=True)
        t0 = time.perf_counter()
        tmp_bytes = offline(root / TAG, off)
        os.sync()
        offline_s = time.perf_counter() - t0
        out_bytes = du(off)
        print(f"offline: converted in {offline_s:.1f} s", flush=True)
        # Both routes did the same work: a few parameters' files agree.
        states = [p for p in files if p.parent.parent.name == "zero"]
        for p in states[:: max(1, len(states) // 8)]:
            a, b = torch.load(p), torch.load(off / p.relative_to(view / tag))
            same = a == b if p.name == "step.pt" else \
                a["cat_dim"] == b["cat_dim"] and torch.equal(a["param"], b["param"])
            assert same, f"view and offline differ in {p.relative_to(view)}"
        rss = proc_field(pid, "VmHWM")
    finally:
        subprocess.run([args.bin, "umount", mnt], stdout=subprocess.DEVNULL)
    print()
    print(f"universal view/offline = {view_s / offline_s:.2f}   (view {view_s:.1f} s, "
          f"offline {offline_s:.1f} s)")
    print(f"temporary bytes: view 0 (daemon wrote {view_written} B, cache dir "
          f"+{max(cache_grew, 0)} B); offline {tmp_bytes / 2**30:.2f} GiB temporary + "
          f"{out_bytes / 2**30:.2f} GiB output")
    print(f"daemon peak RSS = {rss / 1024:.0f} MiB (includes the source's save)")
    results_json.add("universal", view_s / offline_s, subject="view", baseline="offline",
                     better="lower", subject_s=view_s, baseline_s=offline_s,
                     view_written=view_written, offline_temporary=tmp_bytes)
    results_json.note("daemon_peak_rss_mib", round(rss / 1024))
    results_json.write()


if __name__ == "__main__":
    main()
