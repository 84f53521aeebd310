"""The SSD fixture: the shared COCO-format fixture (``common.coco.fixture``).

    python -m benchmarks.ssd.fixture OUTDIR [--train N --val M --image-size S --classes K]
"""

import sys

from common.coco.fixture import main

if __name__ == "__main__":
    sys.exit(main())
