"""Batched greedy decoding on a hand-made joint, and on a tiny RNN-T against a per-utterance
transcription of the reference's loop."""

import torch
from torch import nn

from benchmarks.rnnt.decoding import greedy_decode
from benchmarks.rnnt.model import RNNT

BLANK = 7


class ScriptedModel(nn.Module):
    """A fake transducer: the joint's arg-max at frame ``t`` after ``u`` labels of utterance
    ``b`` is ``script[b][(t, u)]`` (blank where absent). The encoder output carries ``(b, t)``,
    the prediction network's output and state the number of labels fed since the start."""

    def __init__(self, script):
        super().__init__()
        self.script = script

    def encode(self, feats, feat_lens):
        B, T, _ = feats.shape
        enc = torch.stack(torch.broadcast_tensors(torch.arange(B)[:, None], torch.arange(T)), -1)
        return enc.float(), feat_lens

    def predict_step(self, labels, state):
        count = torch.zeros(1, len(labels), 1) if state is None else state[0]
        count = count + (labels >= 0).float()[None, :, None]
        return count[0], (count, count)

    def joint_step(self, enc, pred):
        assert not self.training
        logits = torch.zeros(len(enc), BLANK + 1)
        for row, ((b, t), (u,)) in enumerate(zip(enc.long().tolist(), pred.long().tolist())):
            logits[row, self.script[b].get((t, u), BLANK)] = 1.0
        return logits


SCRIPT = [
    {(0, 0): 3, (2, 1): 1, (2, 2): 2},                  # 3 at frame 0, then 1 2 at frame 2
    {(0, 0): 5, (0, 1): 5, (0, 2): 5, (0, 3): 5, (1, 2): 4, (1, 4): 6},
    {},                                                 # only blanks
    {(0, 0): 2, (3, 1): 6},                             # frame 3 is past its length (3)
    {(t, u): 6 for t in range(4) for u in range(200)},  # never a blank
]


def _decode(script, **limits):
    model = ScriptedModel(script).train()
    feats = torch.zeros(len(script), 4, 1)
    feat_lens = torch.tensor([4, 4, 4, 3, 4])[:len(script)]
    out = greedy_decode(model, feats, feat_lens, blank=BLANK, **limits)
    assert model.training                               # the flag comes back
    return out


def test_scripted_joint_gives_the_expected_sequences():
    out = _decode(SCRIPT, max_symbols=10)
    assert out == [[3, 1, 2], [5, 5, 5, 5, 6], [], [2], [6] * 10]


def test_at_most_max_symbols_per_step_labels_per_frame():
    """Utterance 1 with 2 per frame: 5 5 at frame 0, then frame 1 (after 2 labels): 4, then
    frame 1 after 3 labels: blank; utterance 4: 2 per frame over 4 frames."""
    out = _decode(SCRIPT, max_symbols_per_step=2, max_symbols=300)
    assert out[1] == [5, 5, 4]
    assert out[4] == [6] * 8
    out = _decode(SCRIPT, max_symbols=300)
    assert out[4] == [6] * 120                          # 30 per frame by default


def test_at_most_max_symbols_per_utterance():
    out = _decode(SCRIPT[4:], max_symbols=7)
    assert out == [[6] * 7]


def reference_greedy(model, enc, enc_len, blank, max_per_step=30, max_symbols=300):
    """The reference's ``_greedy_decode`` for one utterance, with the total limit checked
    after each label (the batched decoder's exact cap)."""
    state, labels = None, []
    for t in range(enc_len):
        added = 0
        while added < max_per_step and len(labels) < max_symbols:
            last = torch.tensor([labels[-1] if labels else -1])
            pred, new_state = model.predict_step(last, state)
            k = model.joint_step(enc[None, t], pred)[0].argmax().item()
            if k == blank:
                break
            labels.append(k)
            state = new_state
            added += 1
    return labels


def tiny_rnnt(seed: int = 0) -> RNNT:
    """A tiny RNN-T whose greedy labels vary with ``t`` and ``u``, blanks included."""
    torch.manual_seed(seed)
    model = RNNT(vocab_size=9, in_feats=6, enc_hidden=16, pred_hidden=8, joint_hidden=12,
                 weights_init_scale=4.0)
    with torch.no_grad():
        for layer in (model.joint_enc, model.joint_pred, model.joint_net):
            layer.weight *= 3
        model.joint_net.bias[model.blank] += 0.5
    return model


def test_batched_equals_per_utterance_loop_on_a_tiny_rnnt():
    model = tiny_rnnt()
    feats = torch.randn(4, 14, 6) * 2
    feat_lens = torch.tensor([14, 9, 2, 11])
    out = greedy_decode(model, feats, feat_lens, blank=model.blank, max_symbols=12,
                        max_symbols_per_step=3)
    model.eval()
    with torch.no_grad():
        enc, enc_lens = model.encode(feats, feat_lens)
        expected = [reference_greedy(model, enc[b], int(enc_lens[b]), model.blank, 3, 12)
                    for b in range(4)]
    assert out == expected
    lengths = [len(o) for o in out]
    assert max(lengths) == 12 and any(0 < n < 12 for n in lengths)  # capped, ended early
    assert len(set(out[1])) > 1
