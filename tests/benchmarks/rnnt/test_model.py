"""RNN-T sizes, initialisation, mllog names, shapes on a tiny config, the packed joint
(``packed-joint``) against the padded one (its hidden layer also compiled: ``compiled-joint``),
and the row sums of its backward."""

import math
import re
from pathlib import Path

import mlperf_logging
import pytest
import torch

from benchmarks.rnnt import compiled_joint
from benchmarks.rnnt.model import RNNT, mllog_tensor_modules, mllog_tensor_names, stack_time
from benchmarks.rnnt.packed_joint import (
    add_relu_dropout,
    gather_add_relu_dropout,
    joint_packed,
    packed_index,
    row_sums,
)

RULES = Path(mlperf_logging.__file__).parent / "compliance_checker/training_1.1.0/closed_rnnt.yaml"
# the packed joint's hidden layer: embedding_bag (the reference) and compiled
GATHERS = (gather_add_relu_dropout, compiled_joint.gather_add_relu_dropout)
GATHER_IDS = ("embedding-bag", "compiled")
TINY = dict(vocab_size=11, in_feats=12, enc_hidden=16, pred_hidden=8, joint_hidden=10)


def _tiny(**kwargs):
    torch.manual_seed(0)
    return RNNT(**{**TINY, **kwargs})


def _batch(seed=0, B=3, T=9, U=4):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, T, TINY["in_feats"], generator=g)
    feat_lens = torch.tensor([T, T - 2, 3])[:B]
    labels = torch.randint(0, TINY["vocab_size"], (B, U), generator=g)
    label_lens = torch.tensor([U, 2, 0])[:B]
    return feats, feat_lens, labels, label_lens


def test_reference_sizes_and_parameter_count():
    """Per LSTM layer 4H(in + H) + 8H: pre_rnn 5,185,536 + 8,396,800; post_rnn 12,591,104 +
    2 x 8,396,800; embed 1023 x 512; dec_rnn 2 x 2,101,248; joint 262,656 + 524,800 + 525,312."""
    with torch.device("meta"):
        model = RNNT()
    assert sum(p.numel() for p in model.parameters()) == 49_006_080
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes["encoder.pre_rnn.lstm.weight_ih_l0"] == (4096, 240)
    assert shapes["encoder.pre_rnn.lstm.weight_hh_l1"] == (4096, 1024)
    assert shapes["encoder.post_rnn.lstm.weight_ih_l0"] == (4096, 2048)
    assert "encoder.post_rnn.lstm.weight_ih_l2" in shapes
    assert "encoder.post_rnn.lstm.weight_ih_l3" not in shapes
    assert shapes["prediction.embed.weight"] == (1023, 512)
    assert shapes["prediction.dec_rnn.lstm.weight_hh_l1"] == (2048, 512)
    assert shapes["joint_enc.weight"] == (512, 1024)
    assert shapes["joint_pred.weight"] == (512, 512)
    assert shapes["joint_net.weight"] == (1024, 512)
    assert model.blank == 1023


def test_mllog_names_are_exactly_the_ruleset_list_and_cover_every_parameter():
    wanted = re.search(r"sorted\(\[([^\]]+)\]\)", RULES.read_text()).group(1)
    wanted = re.findall(r"'(\w+)'", wanted)
    model = _tiny()
    assert sorted(mllog_tensor_names(model)) == sorted(wanted)
    named = [id(p) for m in mllog_tensor_modules(model).values() for p in m.parameters()]
    assert sorted(named) == sorted(id(p) for p in model.parameters())


@pytest.mark.parametrize("forget_gate_bias, scale", [(1.0, 0.5), (2.0, 1.0)])
def test_lstm_initialisation(forget_gate_bias, scale):
    """Forget-gate input bias = forget_gate_bias x scale, hidden bias 0 there; the rest is
    PyTorch's U(-1/sqrt(H), 1/sqrt(H)) times the scale."""
    model = _tiny(forget_gate_bias=forget_gate_bias, weights_init_scale=scale)
    for lstm in (model.encoder.pre_rnn, model.encoder.post_rnn, model.prediction.dec_rnn):
        H = lstm.lstm.hidden_size
        bound = scale / math.sqrt(H)
        for name, p in lstm.lstm.named_parameters():
            forget, other = p[H:2 * H], torch.cat((p[:H], p[2 * H:]))
            if name.startswith("bias_ih"):
                assert torch.all(forget == forget_gate_bias * scale)
            elif name.startswith("bias_hh"):
                assert torch.all(forget == 0)
            else:
                other = p
            assert other.abs().max() <= bound
            assert other.abs().max() > 0.8 * bound


def test_dropout_placement():
    model = RNNT(**TINY)
    for lstm, p in ((model.encoder.pre_rnn, 0.1), (model.encoder.post_rnn, 0.1),
                    (model.prediction.dec_rnn, 0.3)):
        assert lstm.lstm.dropout == p           # between the LSTM's layers
        assert lstm.dropout.p == p              # and on its output
    assert model.joint_dropout == 0.3


def test_stack_time_concatenates_consecutive_frames():
    x = torch.arange(2 * 5 * 2, dtype=torch.float32).reshape(2, 5, 2)
    y, lens = stack_time(x, torch.tensor([5, 3]), 2)
    assert y.shape == (2, 3, 4)
    assert y[0, 0].tolist() == [0, 1, 2, 3]
    assert y[0, 2].tolist() == [8, 9, 0, 0]
    assert lens.tolist() == [3, 2]


def test_forward_shapes_on_a_tiny_config():
    model = _tiny()
    feats, feat_lens, labels, _ = _batch()
    logits, enc_lens = model(feats, feat_lens, labels)
    assert logits.shape == (3, 5, 5, TINY["vocab_size"] + 1)
    assert enc_lens.tolist() == [5, 4, 2]


def test_padding_frames_do_not_change_valid_outputs():
    """Frames past the stacked length do not matter. As in the reference, an odd length's last
    stacked frame holds one padding frame (zeros from the loader), so that one does."""
    model = _tiny().eval()
    feats, feat_lens, _, _ = _batch()
    enc, enc_lens = model.encode(feats, feat_lens)
    noisy = feats.clone()
    noisy[1, 8:] = 100.0
    noisy[2, 4:] = -100.0
    enc_noisy, _ = model.encode(noisy, feat_lens)
    for b, n in enumerate(enc_lens.tolist()):
        torch.testing.assert_close(enc_noisy[b, :n], enc[b, :n])
    assert not torch.allclose(enc_noisy[2, 2:], enc[2, 2:])


def test_predict_step_matches_predict():
    model = _tiny().eval()
    _, _, labels, _ = _batch()
    full, _ = model.predict(labels)
    state, last = None, torch.full((3,), -1)
    for u in range(labels.shape[1] + 1):
        out, state = model.predict_step(last, state)
        torch.testing.assert_close(out, full[:, u])
        if u < labels.shape[1]:
            last = labels[:, u]


def test_packed_index_order():
    b, t, u = packed_index(torch.tensor([2, 1]), torch.tensor([2, 3]))
    assert list(zip(b.tolist(), t.tolist(), u.tolist())) == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 0, 2)]


@pytest.mark.parametrize("mode", ["eval", "train_without_dropout"])
def test_packed_joint_equals_padded_on_valid_pairs(mode):
    model = _tiny(joint_dropout=0.0 if mode != "eval" else 0.3, enc_dropout=0.0,
                  pred_dropout=0.0)
    model.train(mode != "eval")
    feats, feat_lens, labels, label_lens = _batch()
    enc, enc_lens = model.encode(feats, feat_lens)
    pred, _ = model.predict(labels)
    enc_a, pred_a = enc.detach().requires_grad_(), pred.detach().requires_grad_()
    enc_b, pred_b = enc.detach().requires_grad_(), pred.detach().requires_grad_()
    padded = model.joint(enc_a, pred_a)
    packed = joint_packed(model, enc_b, pred_b, enc_lens, label_lens)
    b, t, u = packed_index(enc_lens, label_lens + 1)
    assert len(packed) == (5 * 5 + 4 * 3 + 2 * 1)
    torch.testing.assert_close(packed, padded[b, t, u])
    upstream = torch.randn(packed.shape, generator=torch.Generator().manual_seed(1))
    grads = {}
    for name, out, inputs in (("padded", padded[b, t, u], (enc_a, pred_a)),
                              ("packed", packed, (enc_b, pred_b))):
        model.zero_grad()
        inputs_grad = torch.autograd.grad(out, inputs, upstream, retain_graph=True)
        out.backward(upstream)
        grads[name] = [*inputs_grad, model.joint_enc.weight.grad.clone(),
                       model.joint_pred.bias.grad.clone(), model.joint_net.weight.grad.clone()]
    for a, c in zip(grads["padded"], grads["packed"]):
        torch.testing.assert_close(c, a)


@pytest.mark.parametrize("gather", GATHERS, ids=GATHER_IDS)
def test_packed_joint_dropout_rate_and_scale(gather):
    f = torch.randn(400, 64, generator=torch.Generator().manual_seed(2))
    g = torch.randn(300, 64, generator=torch.Generator().manual_seed(3))
    rows_f = torch.randint(0, 400, (4000,), generator=torch.Generator().manual_seed(4))
    rows_g = torch.randint(0, 300, (4000,), generator=torch.Generator().manual_seed(5))
    clean = add_relu_dropout(f, g, rows_f, rows_g, 0.3, training=False, gather=gather)
    torch.manual_seed(6)
    dropped = add_relu_dropout(f, g, rows_f, rows_g, 0.3, training=True, gather=gather)
    positive = clean > 0
    zeroed = (dropped[positive] == 0).double().mean().item()
    assert zeroed == pytest.approx(0.3, abs=0.006)          # about 6 standard deviations
    kept = dropped > 0
    torch.testing.assert_close(dropped[kept], clean[kept] / 0.7)
    assert torch.all(dropped[~positive] == 0)


@pytest.mark.parametrize("gather", GATHERS, ids=GATHER_IDS)
def test_add_relu_dropout_gradient(gather):
    f = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    rows_f, rows_g = torch.tensor([0, 1, 1, 5, 2, 0, 3]), torch.tensor([3, 0, 2, 2, 1, 0, 3])
    assert torch.autograd.gradcheck(
        lambda a, c: add_relu_dropout(a, c, rows_f, rows_g, 0.3, training=False,
                                      gather=gather), (f, g))
    torch.manual_seed(7)
    out = add_relu_dropout(f, g, rows_f, rows_g, 0.5, training=True, gather=gather)
    grad_f, = torch.autograd.grad(out.sum(), f)
    pre = f[rows_f] + g[rows_g]
    expected = torch.zeros_like(f).index_add_(0, rows_f, (out > 0).double() * 2.0)
    torch.testing.assert_close(grad_f, expected)
    assert (pre > 0).sum() > (out > 0).sum() > 0            # some positive entries dropped


@pytest.mark.parametrize("segments", [False, True])
def test_row_sums_add_each_row_to_its_target(segments):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(50, 3, generator=g, dtype=torch.float64)
    rows = torch.randint(0, 9, (50,), generator=g)
    rows[rows == 4] = 5                                     # row 4 gets nothing
    expected = torch.stack([x[rows == i].sum(0) for i in range(10)])
    torch.testing.assert_close(row_sums(x, rows, 10, segments), expected, rtol=1e-12, atol=0)


def test_row_sums_accumulate_bf16_in_float32_on_the_cpu():
    """1000 bf16 rows of 0.01: a bf16 accumulator stalls at 4, an fp32 one reaches 10."""
    total = row_sums(torch.full((1000, 2), 0.01, dtype=torch.bfloat16),
                     torch.zeros(1000, dtype=torch.long), 1)
    assert total.dtype == torch.bfloat16
    assert total[0, 0].item() == pytest.approx(10.0, rel=1e-2)


@pytest.mark.parametrize("gather", GATHERS, ids=GATHER_IDS)
def test_add_relu_dropout_keeps_its_inputs_dtype_under_autocast(gather):
    """``embedding_bag`` is on no autocast list: the sum stays in the Linear outputs' dtype."""
    gen = torch.Generator().manual_seed(9)
    f, g = (torch.randn(n, 5, generator=gen).bfloat16() for n in (6, 4))
    rows_f, rows_g = torch.tensor([0, 1, 5, 2]), torch.tensor([3, 0, 2, 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = add_relu_dropout(f, g, rows_f, rows_g, 0.3, training=False, gather=gather)
    assert out.dtype == torch.bfloat16           # CPU embedding_bag may round a tie up
    torch.testing.assert_close(out, (f[rows_f] + g[rows_g]).relu())


def test_compiled_joint_equals_the_embedding_bag_joint_without_dropout():
    gen = torch.Generator().manual_seed(10)
    f, g = torch.randn(70, 16, generator=gen), torch.randn(30, 16, generator=gen)
    rows_f, rows_g = (torch.randint(0, n, (500,), generator=gen) for n in (70, 30))
    expected = gather_add_relu_dropout(f, g, rows_f, rows_g, 0.0)
    out = compiled_joint.gather_add_relu_dropout(f, g, rows_f, rows_g, 0.0)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    # another number of rows runs the same compiled kernel (dynamic), and stays right
    torch.testing.assert_close(compiled_joint.gather_add_relu_dropout(f, g, rows_f[:77],
                                                                      rows_g[:77], 0.0),
                               expected[:77], rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_joint_on_the_gpu_equals_the_reference_and_drops_at_the_rate():
    gen = torch.Generator().manual_seed(11)
    f, g = (torch.randn(n, 512, generator=gen).bfloat16().cuda() for n in (2000, 800))
    rows_f, rows_g = (torch.randint(0, n, (100_000,), generator=gen).cuda() for n in (2000, 800))
    clean = gather_add_relu_dropout(f, g, rows_f, rows_g, 0.0)
    out = compiled_joint.gather_add_relu_dropout(f, g, rows_f, rows_g, 0.0)
    torch.testing.assert_close(out, clean, rtol=0, atol=0)
    dropped = compiled_joint.gather_add_relu_dropout(f, g, rows_f, rows_g, 0.3)
    positive = clean > 0
    assert (dropped[positive] == 0).float().mean().item() == pytest.approx(0.3, abs=0.001)
    kept = dropped > 0
    assert torch.all(dropped[~positive] == 0)
    # one rounding to bf16 of the scaled sum, against two (the sum, then the scaling)
    torch.testing.assert_close(dropped[kept].float(), clean[kept].float() / 0.7, rtol=8e-3,
                               atol=0)
