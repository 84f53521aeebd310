"""One COCO-format fixture per test session, shared by the coco tests."""

import pytest

from common.coco.fixture import write_fixture


@pytest.fixture(scope="session")
def coco_root(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("coco") / "coco2017")
