"""``benchmarks.dlrm.standin``: Criteo Terabyte's table sizes and click counts (a fraction) in
the reference's binary format, for dry runs."""

import numpy as np

from benchmarks.dlrm import standin
from benchmarks.dlrm.data import COUNTS_FILE, CRITEO_TB_SIZES, EVAL_FILE, TRAIN_FILE


def test_a_fraction_of_criteo_terabyte_at_its_table_sizes(tmp_path):
    root = standin.write_standin(tmp_path / "tb", fraction=0.000002)
    assert np.load(root / COUNTS_FILE)["counts"].tolist() == CRITEO_TB_SIZES
    for name, clicks in ((TRAIN_FILE, 8390), (EVAL_FILE, 178)):   # 4,195,197,692 and 89,137,319
        records = np.fromfile(root / name, dtype="<i4").reshape(-1, 40)
        assert len(records) == clicks
        labels, dense, ids = records[:, 0], records[:, 1:14], records[:, 14:]
        assert set(np.unique(labels)) <= {0, 1} and (dense >= 0).all()
        assert (ids >= 0).all() and (ids < np.array(CRITEO_TB_SIZES)).all()
    train = np.fromfile(root / TRAIN_FILE, dtype="<i4").reshape(-1, 40)
    assert 0.02 < train[:, 0].mean() < 0.05                  # one click in 30
    assert len(np.unique(train[:, 14])) > 1000               # the 39.9M-row table, power law
    assert standin.write_standin(tmp_path / "tb", fraction=0.000002) == root   # reused
