"""One fixture dataset per test session, shared by the unet3d tests."""

import pytest

from benchmarks.unet3d.fixture import write_fixture


@pytest.fixture(scope="session")
def kits_fixture(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("unet3d") / "kits19")
