"""tests/dcp: ferry.dcp under the real torch.distributed.checkpoint. Run from the build
directory with PYTHONPATH=<build>/python (the ctest python.dcp does)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
