"""The throughput harness: sweeps GPUs x batch sizes x precisions x train/infer for any workload.

``python -m common.bench WORKLOAD ...`` (see ``__main__``) launches each point
through torchrun (``worker``), or a baseline in another framework through its
own Python (``external``), then writes ``report.json``, ``report.csv`` and
PNG plots (``report``); ``record`` builds each point's figures. ``probe``
measures the device's peak matmul rate for model-FLOPs utilisation.
"""
