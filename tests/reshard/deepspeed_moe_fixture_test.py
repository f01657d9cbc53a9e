# Checks of the DeepSpeed MoE fixture and of its dpD reference (no mount needed):
#   /usr/bin/python3 -m pytest -q tests/reshard/deepspeed_moe_fixture_test.py
# The generator writes DeepSpeed's layout from the model; the reference works from the files
# alone. At the source's own DP the reference must give back the source files, and at any other
# DP files that DeepSpeed's load reads back as the model.
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import deepspeed_fixture as df  # noqa: E402
import deepspeed_moe_fixture as mf  # noqa: E402

SHAPES = {
    "dp4-ep2-0.14.4": (dict(dp=4, ep=2), (2, 8)),
    "dp2-ep2-own-3-layers": (dict(dp=2, ep=2, layers=3, psm="own"), (2, 4, 8)),
    "dp4-ep2-data-before-expert": (dict(dp=4, ep=2, layers=3, psm="own", data_before_expert=True),
                                   (2, 8)),
    "dp4-ep4": (dict(dp=4, ep=4), (4, 8)),
}


def test_expert_groups_follow_deepspeed():
    # [GROUPS] E + D: ranks 0..3 at EP 2 are EP ranks 0 1 0 1, expert-dp ranks 0 0 1 1.
    o = mf.Options(dp=4, ep=2)
    assert [o.split(r) for r in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    o = mf.Options(dp=4, ep=2, data_before_expert=True)
    assert [o.split(r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_reference_is_the_source_at_its_own_size_and_the_model_at_others(tmp_path, shape):
    kw, Ds = SHAPES[shape]
    root = tmp_path / "src"
    model = mf.generate(root, **kw)
    ref = mf.reference_dp(root, kw["dp"])
    same = df.Expected(ref.tag)
    same.update({k.split("/", 1)[1]: v for k, v in ref.items() if "/" in k})
    df.compare_tree(root / ref.tag, same, framework_written=True)
    for D in Ds:
        out = tmp_path / f"dp{D}"
        df.write_expected(mf.reference_dp(root, D), out)
        mf.compare_dp(root, out, D, model=model)


def test_layout_facts(tmp_path):
    mf.generate(tmp_path, dp=4, ep=2)
    tag = tmp_path / "global_step10"
    ms = torch.load(tag / "mp_rank_00_model_states.pt")
    assert "param_shapes" not in ms and ms["num_experts"] == [4, 4] and ms["dp_world_size"] == 4
    assert not [k for k in ms["module"] if "deepspeed_experts" in k]
    assert "layers.0.moe.deepspeed_moe.gate.wg.weight" in ms["module"]
    ex = torch.load(tag / "layer_1_expert_3_mp_rank_00_model_states.pt")
    assert list(ex) == [f"layers.1.moe.deepspeed_moe.experts.deepspeed_experts.3.{p}"
                        for p in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")]
    assert torch.load(tag / "expp_rank_1_mp_rank_00_optim_states.pt") == {"optimizer": None}
    sd = torch.load(tag / "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt")["optimizer_state_dict"]
    assert sd["partition_count"] == [4, 4, 2, 2]
    groups = sd[df.BASE]["param_groups"]
    assert [g["name"] for g in groups] == ["decay", "no_decay", "ep_size_2", "ep_size_2"]
    assert [g.get("moe") for g in groups] == [None, None, True, True]
    # Rank 3 is EP rank 1: its moe groups hold local experts 0 and 1 (global 2 and 3), and
    # 0.14.4's mappings name only the first half of each moe group.
    psm = sd[df.PSM][2]
    assert all(".deepspeed_experts.0." in n or ".deepspeed_experts.1." in n for n in psm)
    named = sum(fa.numel for r in (1, 3) for fa in torch.load(
        tag / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")["optimizer_state_dict"][
        df.PSM][2].values())
    assert named * 2 == sum(torch.load(tag / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")[
        "optimizer_state_dict"][df.SINGLE][2].numel() for r in (1, 3))
