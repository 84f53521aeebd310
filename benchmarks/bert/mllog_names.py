"""The TensorFlow names of BERT's parameters that ``closed_bert.yaml`` lists for the
``weights_initialization`` events, from this model's (the reference's PyTorch) names."""

from __future__ import annotations

from torch import nn


def mllog_tensor_name(name: str) -> str:
    """``bert.encoder.layer.3.attention.self.query.weight`` -> the TF name closed_bert.yaml uses."""
    parts = name.split(".")
    leaf = parts.pop()
    path = "/".join(parts).replace("layer/", "layer_")
    if name == "cls.predictions.bias":
        return "cls/predictions/output_bias"
    if parts[:2] == ["cls", "seq_relationship"]:
        return f"{path}/output_{'weights' if leaf == 'weight' else 'bias'}"
    if parts[-1].endswith("embeddings"):
        return path
    if parts[-1] == "LayerNorm":
        return f"{path}/{'gamma' if leaf == 'weight' else 'beta'}"
    return f"{path}/{'kernel' if leaf == 'weight' else 'bias'}"


def mllog_tensor_names(model: nn.Module) -> list[str]:
    return [mllog_tensor_name(n) for n, _ in model.named_parameters()]
