"""``benchmarks/bert/seeds.py``: the Triton kernels' dropout seeds, one draw a training
forward pass for every numbered module, a seed each; none in evaluation."""

import torch
from torch import nn

from benchmarks.bert.seeds import number, seed_of


def test_one_draw_a_training_forward_and_a_seed_a_module(monkeypatch):
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(), nn.Linear(2, 2), nn.Dropout())
    number(net, nn.Dropout)
    number(net, nn.Linear)   # a second optimisation: the same draw, the numbers go on
    assert [m.seed_index for m in net] == [2, 0, 3, 1]
    draws = []
    randint = torch.randint
    monkeypatch.setattr(torch, "randint", lambda *a, **k: draws.append(a) or randint(*a, **k))
    x = torch.zeros(1, 2)
    net(x)
    assert len(draws) == 1 and net.dropout_seeds.drawn.shape == (4,)
    seeds = [seed_of(m) for m in net]
    assert all(s.shape == (1,) and s.dtype == torch.int64 for s in seeds)
    assert len({int(s) for s in seeds}) == 4
    first = net.dropout_seeds.drawn
    net(x)
    assert len(draws) == 2 and not torch.equal(first, net.dropout_seeds.drawn)
    net.eval()
    net(x)
    assert len(draws) == 2 and all(seed_of(m) is None for m in net)
    assert seed_of(nn.Linear(1, 1)) is None   # not numbered: its kernel's caller draws


def test_the_triton_optimisations_number_their_modules_on_one_draw():
    from benchmarks.bert.attention import unpad
    from benchmarks.bert.attention_triton import TritonAttention, triton_attention
    from benchmarks.bert.layernorm_triton import TritonDenseLayerNorm, triton_layernorm
    from tests.benchmarks.bert.test_model import SMALL, built

    net = built(lambda m: (unpad(m), triton_attention(m), triton_layernorm(m)))
    users = [m for m in net.modules() if isinstance(m, (TritonAttention, TritonDenseLayerNorm))]
    assert len(users) == 3 * SMALL.num_hidden_layers   # an attention and two LayerNorms a layer
    assert sorted(m.seed_index for m in users) == list(range(len(users)))
    assert all(m.seeds is net.dropout_seeds for m in users)
    assert net.dropout_seeds.users == len(users)
