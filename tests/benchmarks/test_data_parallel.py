"""Every data-parallel workload on 2 gloo ranks trains as one process does.

Each rank is built from its own seed, as the driver seeds them, then both train 2 steps on
the same synthetic batch with the same random draws (dropout, sampling). Gradients averaged
over identical halves equal one process's, so the weights after must too: this catches
replicas that start apart, gradients averaged wrongly and sharded optimizers that disagree.
(DLRM, whose batch is global, has its own test in tests/benchmarks/dlrm.)
"""

import json

import pytest
import torch
import torch.multiprocessing as mp

from tests.common.test_dist import _free_port, _rendezvous

TINY_BERT = {"vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 1,
             "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 16}

# (workload, per-rank batch, model flags of its cpu_tiny config, or smaller)
CASES = [
    ("resnet", 4, "--image-size 32 --optimizer lars --lr 2.0 --warmup-epochs 1"),
    ("ssd", 2, "--width 4 --max-boxes 8 --lr 0.05"),
    ("maskrcnn", 2, "--width 4 --fpn-channels 8 --box-head-dim 16 --mask-head-dim 8 "
                    "--min-size 64 --max-size 64 --rpn-batch-size-per-image 32 "
                    "--roi-batch-size-per-image 32 --lr 0.02"),
    ("rnnt", 2, "--vocab-size 48 --enc-hidden 64 --enc-pre-rnn-layers 1 "
                "--enc-post-rnn-layers 1 --pred-hidden 32 --pred-rnn-layers 1 "
                "--joint-hidden 64 --grad-accum 1 --opt flat-params --lr 0.01"),
    ("unet3d", 1, "--filters 8,16,32,64,80 --input-shape 64,32,32 --lr 0.05"),
    ("bert", 2, "--max-seq-length 16 --max-predictions 3 --opt flat-params,sharded-optimizer "
                "--lr 5e-3"),
]


def _train(rank, world, port, name, batch, flags, out):
    from common import dist
    from common.bench.worker import workload_class
    from common.precision import Precision
    from common.training import build_parser

    _rendezvous(rank, world, port)
    torch.set_num_threads(1)
    env = dist.init_distributed("cpu")
    cls = workload_class(name)
    argv = flags.split() + ["--precision", "fp32", "--seed", "0", "--device", "cpu"]
    args = cls.parse_bench_args(build_parser(cls), argv, "synthetic", batch, world)
    torch.manual_seed(100 + rank)   # each rank's own initial draws, as the driver seeds them
    wl = cls(args, env, Precision("fp32", "cpu"))
    wl.setup()
    if name == "unet3d":
        wl.lr.fill_(0.05)   # set each epoch by epoch_batches, which reads the dataset
    torch.manual_seed(7)
    data = wl.synthetic_batch(wl.rank_batch_size)

    def weights():
        return {k: v.detach().clone() for k, v in wl.net.state_dict().items()
                if v.is_floating_point()}
    start = weights()
    for step in range(2):
        torch.manual_seed(11 + step)   # the same dropout masks and samples on every rank
        wl.train_step(*data)
    out[rank] = {"start": start, "end": weights()}
    wl.close()
    dist.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("name,batch,flags", CASES, ids=[c[0] for c in CASES])
def test_two_gloo_ranks_train_as_one_process(name, batch, flags, tmp_path):
    if name == "bert":
        config = tmp_path / "bert_config.json"
        config.write_text(json.dumps(TINY_BERT))
        flags += f" --bert-config {config}"
    weights = {}
    for world in (1, 2):
        with mp.Manager() as manager:
            out = manager.dict()
            mp.spawn(_train, args=(world, _free_port(), name, batch, flags, out), nprocs=world,
                     join=True)
            weights[world] = dict(out)
    one = weights[1][0]["end"]
    assert any(not torch.equal(v, weights[1][0]["start"][k]) for k, v in one.items())
    for rank in (0, 1):
        two = weights[2][rank]["end"]
        assert two.keys() == one.keys()
        for k, v in one.items():
            torch.testing.assert_close(two[k], v, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, k=k, r=rank: f"rank {r}, {k}: {m}")
