# Checks of the MoE fixture against facts of Megatron's layout (no mount needed):
#   /usr/bin/python3 -m pytest tests/reshard/megatron_moe_fixture_test.py
# The view tests compare a view with this fixture written at the target shape, so the fixture
# itself must follow Megatron: the expert numbering, the three expert forms holding the same
# weights, and the chained optimizer's form.
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import megatron_moe_fixture as mm  # noqa: E402


def load(root, tp, pp, ep):
    return {k: torch.load(d / mm.FILE) for k, d in mm.rank_dirs(root, tp, pp, ep).items()}


def experts_of(sd, form, layer, le, hidden):
    """{local k: (fc1, fc2)} as the module reads them (GroupedMLP: view(Le, H, -1), transposed
    back to Linear's [out, in])."""
    m = sd["model"]
    x = f"decoder.layers.{layer}.mlp.experts."
    out = {}
    for k in range(le):
        if form == "sequential":
            out[k] = (m[x + f"local_experts.{k}.linear_fc1.weight"],
                      m[x + f"local_experts.{k}.linear_fc2.weight"])
        elif form == "te":
            out[k] = (m[x + f"linear_fc1.weight{k}"], m[x + f"linear_fc2.weight{k}"])
        else:
            w1 = m[x + "weight1"].view(le, hidden, -1)[k].t()
            w2 = m[x + "weight2"].view(le, -1, hidden)[k].t()
            out[k] = (w1, w2)
    return out


@pytest.mark.parametrize("tp,ep", [(1, 2), (2, 4)])
def test_the_three_forms_hold_the_same_experts_under_the_same_numbering(tmp_path, tp, ep):
    cfg = {f: mm.MoeConfig(form=f) for f in ("sequential", "te", "grouped")}
    files = {}
    for f, c in cfg.items():
        mm.save_checkpoint(tmp_path / f, c, tp, 1, ep)
        files[f] = load(tmp_path / f, tp, 1, ep)
    le = 8 // ep
    for (t, p, e), sd in files["sequential"].items():
        seq = experts_of(sd, "sequential", 0, le, 32)
        for f in ("te", "grouped"):
            other = experts_of(files[f][(t, p, e)], f, 0, le, 32)
            for k in range(le):
                assert torch.equal(seq[k][0], other[k][0]) and torch.equal(seq[k][1], other[k][1])
    # Local expert k of EP rank e is global expert e * E/EP + k: the same as local expert
    # e * le + k of the checkpoint at EP 1.
    mm.save_checkpoint(tmp_path / "one", cfg["sequential"], tp, 1, 1)
    one = load(tmp_path / "one", tp, 1, 1)
    for (t, p, e), sd in files["sequential"].items():
        mine = experts_of(sd, "sequential", 1, le, 32)
        whole = experts_of(one[(t, 0, 0)], "sequential", 1, 8, 32)
        for k in range(le):
            assert torch.equal(mine[k][0], whole[e * le + k][0])


def test_dense_shards_are_the_same_on_every_ep_rank(tmp_path):
    mm.save_checkpoint(tmp_path, mm.MoeConfig(shared_size=16, shared_gate=True), 2, 1, 4)
    files = load(tmp_path, 2, 1, 4)
    for t in range(2):
        a, b = files[(t, 0, 0)]["model"], files[(t, 0, 3)]["model"]
        dense = [k for k in a if ".mlp.experts." not in k]
        assert dense == [k for k in b if ".mlp.experts." not in k]
        for k in dense:
            assert (a[k] is None and b[k] is None) or torch.equal(a[k], b[k]), k


def test_optimizer_is_chained_only_with_experts_on_their_own(tmp_path):
    # EP 2, layers 1 and 2 dense: stage 1 (layers 2, 3) has experts, with PP 4 stage 1 (layer 1)
    # has none.
    cfg = mm.MoeConfig(layer_freq=[1, 0, 0, 1])
    mm.save_checkpoint(tmp_path / "a", cfg, 1, 4, 2)
    files = load(tmp_path / "a", 1, 4, 2)
    assert isinstance(files[(0, 0, 1)]["optimizer"], list)
    dense, experts = files[(0, 0, 1)]["optimizer"]
    assert all(not g["is_expert_parallel"] for g in dense["optimizer"]["param_groups"])
    assert all(g["is_expert_parallel"] for g in experts["optimizer"]["param_groups"])
    ids = sorted(i for g in experts["optimizer"]["param_groups"] for i in g["params"])
    assert ids == list(range(len(ids))) and len(ids) == 2 * 4  # fc1, fc2 of 4 local experts
    assert isinstance(files[(0, 1, 0)]["optimizer"], dict)  # a stage without experts
    mm.save_checkpoint(tmp_path / "b", cfg, 1, 1, 1)  # EP 1: one optimizer
    assert isinstance(load(tmp_path / "b", 1, 1, 1)[(0, 0, 0)]["optimizer"], dict)


def test_rank_names_follow_get_checkpoint_name():
    assert mm.rank_name(3, 0, 0, 1, 1) == "mp_rank_03"
    assert mm.rank_name(3, 0, 5, 1, 8) == "mp_rank_03_005"
    assert mm.rank_name(3, 1, 5, 2, 8) == "mp_rank_03_001_005"
