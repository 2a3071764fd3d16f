"""What discovering plugins adds to start-up.

Every name a scenario gives is looked up among the entry points of five groups
(``mecsim.algorithms``, ``.models``, ``.datasets``, ``.channels``, ``.devices``), read once
per process from the installed distributions' metadata. This measures, in fresh
processes (``--trials`` of them), the seconds from ``import mecsim.registry`` to every
group's names known (importlib.metadata's pass over the installed distributions: the
cost ``mecsim run`` pays once), and, for scale, how long
``mecsim --help`` takes as a whole. Target: discovery under 50 ms.

    python benchmarks/speed/plugin_discovery.py [--trials 20] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

PROBE = """
import time
import mecsim.registry as r  # imports nothing it discovers: the registries start empty
t0 = time.perf_counter()
for reg in r.REGISTRIES.values():
    reg.names()
print(time.perf_counter() - t0)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\\n\\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="3 trials")
    args = ap.parse_args()
    trials = 3 if args.quick else args.trials
    discovery, help_s = [], []
    for _ in range(trials):
        out = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
        )
        discovery.append(float(out.stdout.strip()))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mecsim", "--help"], capture_output=True, check=True)
        help_s.append(time.perf_counter() - start)
    print(
        f"plugin discovery (5 groups, cold): median {1e3 * statistics.median(discovery):.1f} ms"
        f" (min {1e3 * min(discovery):.1f}, max {1e3 * max(discovery):.1f}; {trials} processes)"
    )
    print(f"mecsim --help, whole process:      median {1e3 * statistics.median(help_s):.0f} ms")


if __name__ == "__main__":
    main()
