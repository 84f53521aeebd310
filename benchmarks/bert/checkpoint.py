"""Loading the reference's PyTorch phase-1 checkpoint (``model.ckpt-28252.pt``, from its
``convert_tf_checkpoint.py``) into ``BertForPreTraining``; word-embedding and decoder rows of
the unpadded vocabulary (30522) fill the first rows of the padded ones.
"""

from __future__ import annotations

from pathlib import Path

import torch

from common.errors import UserError

EXPECTED = ("a PyTorch file holding {'model': state_dict} with parameter names like "
            "bert.encoder.layer.0.attention.self.query.weight (the reference's converted "
            "phase-1 checkpoint)")


def load_checkpoint(model: torch.nn.Module, path: Path) -> None:
    path = Path(path)
    if path.suffix == ".index" or path.with_suffix(path.suffix + ".index").exists():
        raise UserError(f"{path}: a TensorFlow checkpoint; convert it first. Expected {EXPECTED}")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unpickling failure means a foreign format
        raise UserError(f"{path}: not a readable checkpoint ({type(exc).__name__}). "
                        f"Expected {EXPECTED}") from exc
    state = raw.get("model", raw) if isinstance(raw, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path}: no state dict inside. Expected {EXPECTED}")
    own = model.state_dict()
    missing = [k for k in own if k not in state and k != "cls.predictions.decoder.weight"]
    if missing:
        raise UserError(f"{path}: lacks {len(missing)} parameter(s), e.g. {missing[0]}. "
                        f"Expected {EXPECTED}")
    vocab = model.config.vocab_size
    with torch.no_grad():
        for name, dst in own.items():
            if name not in state:
                continue
            src = state[name]
            if src.shape == dst.shape:
                dst.copy_(src)
            elif src.shape[1:] == dst.shape[1:] and src.shape[0] == vocab:
                dst[:vocab].copy_(src)   # unpadded vocabulary rows
            else:
                raise UserError(f"{path}: {name} has shape {tuple(src.shape)}, the model "
                                f"{tuple(dst.shape)} (vocab/checkpoint or bert config mismatch)")
