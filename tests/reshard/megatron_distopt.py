"""Megatron-LM's distributed optimizer in the legacy checkpoint format, for megatron_fixture.py:
the `optimizer` entry of model_optim_rng.pt and the distrib_optim.pt beside it, as a run with
--use-distributed-optimizer writes them.

Read from Megatron-LM (core_v0.13 and main of 2026-11), not inferred:
  [SAVE]   megatron/training/checkpointing.py save_checkpoint: with use_distributed_optimizer and
           ckpt_format torch, optimizer.save_parameter_state(dirname(model file)/distrib_optim.pt)
           on every rank; ChainedOptimizer of one optimizer delegates to it.
  [STATE]  megatron/core/optimizer/distrib_optimizer.py DistributedOptimizer.state_dict(): the
           model file's `optimizer` is {'optimizer': inner state dict without 'state', every
           param group without 'params' (TE/apex FusedAdam: 'step' an int in each group)},
           plus 'grad_scaler' with fp16 only.
  [DPZERO] get_parameter_state_dp_zero / save_parameter_state (DP rank 0 writes):
           {'buckets_coalesced': True, gbuf_idx: {(param_dtype, grad_dtype): {'param': fp32[N],
           'exp_avg': fp32[N], 'exp_avg_sq': fp32[N], 'numel_unpadded': N}}}, N the buffer's
           numel_unpadded = the sum of its buckets' numel_unpadded: every bucket's padding to the
           DP size stripped, the gaps between parameters kept (zeros).
  [LAYOUT] _compute_per_buffer_param_layout and optimizer/param_layout.py: parameters in reverse
           order of chunk.parameters(); each start padded to a multiple of 64; a bucket closes
           once its span (param end - bucket start) reaches bucket_size, and around any
           parameter marked shared_embedding (a bucket of its own: the bucket before it closes at
           the padded start); bucket ends padded to lcm(DP, 128) (x 2**16 with
           pad_buckets_for_high_nccl_busbw), so bucket starts are multiples of 64.
  [BUCKET] megatron/training/training.py resolve_ddp_bucket_size and get_model: ddp_num_buckets
           -> num_parameters // ddp_num_buckets; else ddp_bucket_size; else max(4e7, 1e6 * DP*CP);
           None (one bucket) without overlap_grad_reduce, on pipeline ranks > 0, for model chunks
           after the first.
  [TIED]   megatron/core/models/common/language_module/language_module.py
           setup_embeddings_and_output_layer: with tied embeddings and PP > 1, the first stage's
           word embeddings and the last stage's output_layer.weight are shared_embedding.
  [GRAD]   grad_dtype fp32 with accumulate_allreduce_grads_in_fp32 (which --bf16 turns on).
"""
import math

import torch


def bucket_size(cfg, pps, p, num_parameters):
    """[BUCKET] the bucket size stage p's first model chunk uses, or None for one bucket."""
    a = cfg.extra_args
    if not a.get("overlap_grad_reduce") or p > 0:
        return None
    if a.get("ddp_num_buckets"):
        return num_parameters // a["ddp_num_buckets"]
    if a.get("ddp_bucket_size"):
        return a["ddp_bucket_size"]
    return max(40_000_000, 1_000_000 * cfg.data_parallel_size)


def layout(numels, shared, size, dp):
    """[LAYOUT] Megatron's buffer for parameters of `numels` (in registration order), `shared`
    marking shared_embedding: each parameter's offset in the coalesced (compact) tensors of
    distrib_optim.pt, the buffer's numel_unpadded and the number of buckets."""
    pad = lambda x, d: int(math.ceil(x / d) * d)  # noqa: E731
    end_div = math.lcm(dp, 128)
    padded = {}  # param index -> (start in the padded buffer, bucket id)
    unpadded, bucket_starts = [], []
    start = bstart = 0
    members = []

    def close(end):
        nonlocal bstart
        unpadded.append(end - bstart)
        bucket_starts.append(bstart)
        bstart = pad(end, end_div)

    end = 0
    for i in reversed(range(len(numels))):
        start = pad(start, 64)
        if shared[i] and members:
            close(start)
            members = []
            start = bstart
        end = start + numels[i]
        padded[i] = (start, len(unpadded))
        members.append(i)
        if (size is not None and end - bstart >= size) or shared[i]:
            close(end)
            members = []
            start = bstart
        else:
            start = end
    if members:
        close(end)
    base = [sum(unpadded[:b]) for b in range(len(unpadded))]
    offsets = [padded[i][0] - bucket_starts[padded[i][1]] + base[padded[i][1]]
               for i in range(len(numels))]
    return offsets, sum(unpadded), len(unpadded)


def rank_layout(cfg, pps, p, params):
    """The layout of stage p's rank whose parameters are params, [(name, numel)] in registration
    order: (offsets, numel_unpadded, buckets). [TIED] marks the shared embeddings, [BUCKET] the
    bucket size."""
    shared = [cfg.tied and pps > 1 and ((p == 0 and n.endswith("word_embeddings.weight")) or
                                        (p == pps - 1 and n.endswith("output_layer.weight")))
              for n, _ in params]
    numels = [n for _, n in params]
    return layout(numels, shared, bucket_size(cfg, pps, p, sum(numels)), cfg.data_parallel_size)


def rank_state(cfg, pps, p, params, states, groups_sd, iteration):
    """The rank's `optimizer` entry [STATE] and distrib_optim.pt [DPZERO]. params: [(name,
    numel)] in registration order; states: {key: [fp32 tensor per param]} for 'param',
    'exp_avg', 'exp_avg_sq'; groups_sd: the torch optimizer's param_groups."""
    offsets, total, nbuckets = rank_layout(cfg, pps, p, params)
    world = {}
    for key in ("param", "exp_avg", "exp_avg_sq"):
        flat = torch.zeros(total, dtype=torch.float32)
        for i, t in enumerate(states[key]):
            flat[offsets[i]:offsets[i] + t.numel()] = t.reshape(-1)
        world[key] = flat
    world["numel_unpadded"] = total
    distrib = {"buckets_coalesced": True, 0: {(torch.bfloat16, torch.float32): world}}
    groups = []
    for g in groups_sd:
        g = {k: v for k, v in g.items() if k != "params"}
        g["step"] = iteration  # TE's FusedAdam keeps the step in the group
        groups.append(g)
    return {"optimizer": {"param_groups": groups}}, distrib, nbuckets
