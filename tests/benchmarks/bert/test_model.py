"""BERT-large shapes and parameter count, the plain model's signatures, attention paths,
fused chains, flat buffer, checkpoint errors."""

import inspect
import re
from pathlib import Path

import pytest
import torch
from mlperf_logging import compliance_checker

from benchmarks.bert import model as bert_model
from benchmarks.bert.attention import SdpaSelfAttention, bucketed_packing, unpad
from benchmarks.bert.checkpoint import load_checkpoint
from benchmarks.bert.fusions import (
    FusedDenseLayerNorm,
    FusedGeluIntermediate,
    bias_dropout_add_layer_norm,
)
from benchmarks.bert.model import (
    BertConfig,
    BertForPreTraining,
    DenseLayerNorm,
    Intermediate,
    SelfAttention,
    swap_class,
)
from benchmarks.bert.workload import mllog_tensor_names
from common.errors import UserError
from common.flat_params import FlatParameters
from common.fusion import compiled

RULES = Path(compliance_checker.__file__).parent / "training_1.1.0" / "closed_bert.yaml"
SMALL = BertConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=64, max_position_embeddings=16)

# BERT-large, vocab 30522 padded to 30528, hidden H=1024, FFN F=4096, 24 layers:
# embeddings 30528*H + 512*H + 2*H + 2*H (LayerNorm)            = 31,789,056
# per layer  4*(H*H + H) + 2*H + (H*F + F) + (F*H + H) + 2*H      = 12,596,224 (x24)
# pooler H*H + H; MLM transform H*H + H + 2*H; MLM bias 30528; NSP 2*H + 2
# (the MLM decoder is tied to the word embeddings)
BERT_LARGE_PARAMS = (31_789_056 + 24 * 12_596_224 + 1_049_600 + 1_051_648 + 30_528 + 2_050)


def test_bert_large_parameter_count_and_shapes():
    assert BERT_LARGE_PARAMS == 336_232_258
    with torch.device("meta"):
        model = BertForPreTraining(BertConfig())
    assert sum(p.numel() for p in model.parameters()) == BERT_LARGE_PARAMS
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes["bert.embeddings.word_embeddings.weight"] == (30528, 1024)
    assert shapes["bert.encoder.layer.23.intermediate.dense.weight"] == (4096, 1024)
    assert shapes["bert.encoder.layer.23.output.dense.weight"] == (1024, 4096)
    assert shapes["cls.seq_relationship.weight"] == (2, 1024)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_mllog_tensor_names_are_exactly_the_ruleset_list():
    with torch.device("meta"):
        model = BertForPreTraining(BertConfig())
    wanted = re.findall(r'"((?:bert|cls)/[^"]+)"', RULES.read_text())
    assert len(wanted) == 398
    assert sorted(mllog_tensor_names(model)) == sorted(wanted)


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 61, (3, 16), generator=g)
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[0, 11:] = 0
    mask[2, 6:] = 0
    ids = ids * mask
    seg = torch.zeros_like(ids)
    seg[:, 4:] = 1
    seg *= mask
    pos = torch.tensor([[1, 3, 10], [2, 15, 0], [1, 5, 0]])
    return ids, seg, mask, pos


def test_the_model_takes_no_optimisation_switch():
    """The plain network alone: the optimisations swap the built modules' classes
    (attention.py, fusions.py, flat_lamb.py)."""
    allowed = {"self", "c", "d_in", "embedding", "x", "mask", "residual", "first_token",
               "input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked",
               "first", "q", "k", "v", "p"}
    classes = [c for _, c in inspect.getmembers(bert_model, inspect.isclass)
               if issubclass(c, torch.nn.Module) and c.__module__ == bert_model.__name__]
    assert len(classes) == 13
    for cls in classes:
        for name in ("__init__", "forward", "attend", "heads"):
            if name in vars(cls):
                assert set(inspect.signature(vars(cls)[name]).parameters) <= allowed, (cls, name)


def sdpa(model):
    swap_class(model, SelfAttention, SdpaSelfAttention)


def fuse(model):
    swap_class(model, Intermediate, FusedGeluIntermediate)
    swap_class(model, DenseLayerNorm, FusedDenseLayerNorm)


def built(transform=None, like=None, c=SMALL):
    """A model of ``c`` with ``like``'s weights, then ``transform``ed as the optimisations do."""
    model = BertForPreTraining(c)
    if like is not None:
        model.load_state_dict(like.state_dict())
    if transform is not None:
        transform(model)
    return model.eval()


@pytest.mark.parametrize("transform", [sdpa, unpad])
def test_attention_paths_match_plain_on_real_tokens(transform):
    torch.manual_seed(0)
    plain = built()
    other = built(transform, plain)
    batch = _batch()
    mlm_p, nsp_p = plain(*batch)
    mlm_o, nsp_o = other(*batch)
    torch.testing.assert_close(mlm_o, mlm_p, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nsp_o, nsp_p, atol=1e-5, rtol=1e-5)
    # gradients agree too
    for m in (plain, other):
        m.zero_grad()
        mlm, nsp = m(*batch)
        (mlm.square().mean() + nsp.square().mean()).backward()
    for (n, a), (_, b) in zip(plain.named_parameters(), other.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=n)


def test_bucketed_packing_shapes_and_fillers():
    _, _, mask, _ = _batch()                      # 11, 16 and 6 real tokens
    index, offsets = bucketed_packing(mask.numpy(), micro=1, bucket=8)
    assert index.shape == (1, 40) and offsets.shape == (1, 3 + 1 + 3)
    assert offsets[0].tolist() == [0, 11, 27, 33, 40, 40, 40]   # a filler sequence of 7
    flat = mask.flatten().numpy()
    assert flat[index[0, :33]].all() and not flat[index[0, 33:]].any()
    assert len(set(index[0].tolist())) == 40                 # no position twice
    # two micro-batches share the larger one's bucket
    index, offsets = bucketed_packing(mask[:2].numpy(), micro=2, bucket=20)
    assert index.shape == (2, 16) and offsets.tolist() == [[0, 11, 16], [0, 16, 16]]


def test_fillers_cover_a_micro_batch_far_smaller_than_the_largest():
    """Every packed row is in a sequence, however much smaller a micro-batch is than the
    largest (attention writes no row outside its sequences: on the GPU such a row kept
    whatever memory held, and its weight gradients NaN), and the small micro-batch's outputs
    are the padded model's."""
    g = torch.Generator().manual_seed(1)
    mask = torch.zeros(4, 16, dtype=torch.long)
    mask[:2] = 1                                   # micro-batch 0: 32 tokens
    mask[2:, :3] = 1                               # micro-batch 1: 6 tokens, 26 short of it
    ids, seg = torch.randint(5, 61, (4, 16), generator=g) * mask, torch.zeros_like(mask)
    pos = torch.tensor([[1, 2, 0]] * 4)
    index, offsets = bucketed_packing(mask.numpy(), micro=2, bucket=8)
    assert index.shape == (2, 32) and offsets[:, -1].tolist() == [32, 32]
    assert (offsets[:, 1:] - offsets[:, :-1] <= 16).all()   # no sequence longer than seq
    padded = built(sdpa)
    packed = built(unpad, padded)
    small = [t[2:] for t in (ids, seg, mask, pos)]
    torch.testing.assert_close(
        packed(*small, torch.from_numpy(index[1]), torch.from_numpy(offsets[1])),
        padded(*small), atol=1e-5, rtol=1e-5)


def test_bucketed_unpad_step_matches_padded_outputs_and_gradients():
    torch.manual_seed(0)
    padded = built(sdpa)   # no dropout (eval); gradients still flow
    packed = built(unpad, padded)
    batch = _batch()
    pack = [torch.from_numpy(t[0]) for t in bucketed_packing(batch[2].numpy(), 1, 8)]
    outs = []
    for model, extra in ((padded, []), (packed, pack)):
        model.zero_grad()
        mlm, nsp = model(*batch, *extra)
        (mlm.square().mean() + nsp.square().mean()).backward()
        outs.append((mlm, nsp))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    for (n, a), (_, b) in zip(padded.named_parameters(), packed.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flash_varlen_matches_padded_sdpa_on_gpu():
    torch.manual_seed(0)
    c = BertConfig(vocab_size=61, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=256, max_position_embeddings=16)
    padded = built(sdpa, c=c).cuda()
    packed = built(unpad, padded, c=c).cuda()
    batch = [t.cuda() for t in _batch()]
    pack = [torch.from_numpy(t[0]).cuda() for t in bucketed_packing(batch[2].cpu().numpy(), 1, 8)]
    grads = []
    for model, extra in ((padded, []), (packed, pack)):
        with torch.autocast("cuda", torch.bfloat16):
            mlm, nsp = model(*batch, *extra)
        (mlm.float().square().mean() + nsp.float().square().mean()).backward()
        grads.append(model.bert.encoder.layer[0].attention.self.query.weight.grad)
        if model is padded:
            want = mlm.float()
    torch.testing.assert_close(mlm.float(), want, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(grads[1], grads[0], atol=3e-2, rtol=5e-2)


def test_unpadded_hidden_states_ignore_padding():
    torch.manual_seed(0)
    model = built(unpad)
    ids, seg, mask, pos = _batch()
    noisy = ids.clone()
    noisy[mask == 0] = 7  # garbage in the padding must not change any output
    torch.testing.assert_close(model(noisy, seg, mask, pos), model(ids, seg, mask, pos))


@pytest.mark.parametrize("make, fused_cls, inputs", [
    (lambda: Intermediate(SMALL), FusedGeluIntermediate, [(6, 32)]),
    (lambda: DenseLayerNorm(SMALL, 32), FusedDenseLayerNorm, [(6, 32), (6, 32)]),
], ids=["gelu", "layernorm"])
def test_fused_chains_match_the_eager_modules(make, fused_cls, inputs):
    """Each compiled chain (bias out of the GEMM) equals the plain module, forward and backward,
    without dropout."""
    torch.manual_seed(3)
    plain, fused = make().eval(), make().eval()
    with torch.no_grad():
        for p in plain.parameters():
            p.normal_()
    fused.load_state_dict(plain.state_dict())
    swap_class(fused, type(plain), fused_cls)
    assert type(fused) is fused_cls
    xs = [torch.randn(*shape, requires_grad=True) for shape in inputs]
    outs, grads = [], []
    for m in (plain, fused):
        out = m(*xs)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), [*xs, *m.parameters()]))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_fused_dropout_drops_p_of_the_positions():
    """About p of the positions are dropped: after the row's LayerNorm the dropped zeros are
    the values below the row mean."""
    y = compiled(bias_dropout_add_layer_norm)(torch.ones(4000, 32), torch.zeros(32),
                                              torch.zeros(4000, 32), None, None, 0.25, 1e-12)
    assert torch.isfinite(y).all() and abs((y < 0).float().mean().item() - 0.25) < 0.01


def test_fused_model_matches_plain_model_without_dropout():
    torch.manual_seed(0)
    plain = built(sdpa)
    fused = built(lambda m: (sdpa(m), fuse(m)), plain)
    torch.testing.assert_close(fused(*_batch()), plain(*_batch()), atol=1e-5, rtol=1e-5)


def test_flat_buffer_model_is_bit_identical():
    torch.manual_seed(0)
    plain = built(sdpa)
    flat_model = built(sdpa, plain)
    flat = FlatParameters(flat_model, world_size=3)
    assert flat.data.numel() % 3 == 0 and flat.numel == sum(p.numel() for p in plain.parameters())
    for p in flat_model.parameters():
        assert p.untyped_storage().data_ptr() == flat.data.untyped_storage().data_ptr()
    batch = _batch()
    for a, b in zip(plain(*batch), flat_model(*batch)):
        assert torch.equal(a, b)
    for m in (plain, flat_model):
        mlm, nsp = m(*batch)
        (mlm.sum() + nsp.sum()).backward()
    for (n, a), b in zip(plain.named_parameters(), flat_model.parameters()):
        assert torch.equal(a.grad, b.grad), n
    start = flat.offsets[-1]
    assert torch.equal(flat.grad[start:start + flat.sizes[-1]], flat.params[-1].grad.flatten())


def test_checkpoint_round_trip_and_errors(tmp_path):
    torch.manual_seed(0)
    src = BertForPreTraining(SMALL)
    state = {k: v for k, v in src.state_dict().items()}
    state["bert.embeddings.word_embeddings.weight"] = state[
        "bert.embeddings.word_embeddings.weight"][:SMALL.vocab_size].clone()
    state.pop("cls.predictions.decoder.weight")
    ckpt = tmp_path / "model.ckpt-28252.pt"
    torch.save({"model": state}, ckpt)
    dst = BertForPreTraining(SMALL)
    load_checkpoint(dst, ckpt)
    torch.testing.assert_close(dst.bert.encoder.layer[1].output.dense.weight,
                               src.bert.encoder.layer[1].output.dense.weight)
    emb = dst.bert.embeddings.word_embeddings.weight
    torch.testing.assert_close(emb[:SMALL.vocab_size], state[
        "bert.embeddings.word_embeddings.weight"])

    other_vocab = BertForPreTraining(BertConfig(**{**SMALL.__dict__, "vocab_size": 100}))
    with pytest.raises(UserError, match="vocab/checkpoint"):
        load_checkpoint(other_vocab, ckpt)
    torch.save({"model": {"encoder.weight": torch.zeros(2)}}, tmp_path / "bad.pt")
    with pytest.raises(UserError, match="Expected a PyTorch file"):
        load_checkpoint(dst, tmp_path / "bad.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="not a readable checkpoint"):
        load_checkpoint(dst, tmp_path / "junk.pt")
