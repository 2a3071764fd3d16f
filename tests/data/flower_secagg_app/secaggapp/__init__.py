"""secaggapp: the classic test app's SecAgg+ variant (classicapp/secagg.py) as an app
folder of its own; the classic app's folder is put on the import path."""

import sys
from pathlib import Path

_CLASSIC = str(Path(__file__).resolve().parents[2] / "flower_classic_app")
if _CLASSIC not in sys.path:
    sys.path.append(_CLASSIC)
