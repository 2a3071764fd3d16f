"""The error of a piecewise-constant rate for a moving client (docs/mobility-models.md).

An engine that takes a link's rate as constant over each piece of the mobility grid
(``step_s``) finishes a transfer at another time than one whose rate follows the
distance continuously. This measures the difference on the shipped channel's uplink
(Shannon, 10 MHz, 23 dBm, PL0 = −40 dB at 1 m, exponent 4, −174 dBm/Hz: SNR = 87 −
40 log10 d dB, 7 dB at 100 m) for three motions: walking away from the base station
from 100 m at 1.5 m/s, a car passing it at 30 m/s (50 m off the road, from 300 m
before), a car driving away from 100 m at 30 m/s. Reference: the same integral at 0.1 ms
pieces. Three rules for a piece's rate: the distance at the piece's *start* (causal: the
engine knows it when the piece begins), at its *mid*point, and *mid\**: the midpoint, but
for the piece in which the transfer ends the midpoint of the part it uses (the end found
by three fixed-point iterations).

    python benchmarks/approximations/mobility_piecewise.py [--quick]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

BANDWIDTH_HZ = 10e6
HORIZON_S = 120.0


def rate_bps(d_m: np.ndarray) -> np.ndarray:
    snr = 10 ** ((87.0 - 40.0 * np.log10(d_m)) / 10.0)
    out: np.ndarray = BANDWIDTH_HZ * np.log2(1.0 + snr)
    return out


def finish_s(
    bits: float, distance: Callable[[np.ndarray], np.ndarray], step_s: float, rule: str
) -> float:
    """When ``bits`` are through, starting at 0, with the rate constant over pieces of
    ``step_s`` (at the distance of each piece's start or midpoint)."""
    n = int(round(HORIZON_S / step_s))
    t = np.arange(n) * step_s
    r = rate_bps(distance(t + (step_s / 2 if rule in ("mid", "mid*") else 0.0)))
    sent = np.concatenate([[0.0], np.cumsum(r * step_s)])
    k = int(np.searchsorted(sent, bits)) - 1
    if k >= n:
        return float("inf")
    end = float(t[k] + (bits - sent[k]) / r[k])
    if rule == "mid*":  # the last piece is [t_k, end], not the whole step: its midpoint
        for _ in range(3):
            r_last = rate_bps(distance(np.array([(t[k] + end) / 2])))[0]
            end = float(t[k] + (bits - sent[k]) / r_last)
    return end


MOTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "walk away 1.5 m/s": lambda t: 100.0 + 1.5 * t,
    "car passing 30 m/s": lambda t: np.hypot(50.0, -300.0 + 30.0 * t),
    "car away 30 m/s": lambda t: 100.0 + 30.0 * t,
}
SIZES = {"0.8 MB (2NN)": 6.4e6, "8 MB": 64e6, "44.7 MB (ResNet-18)": 357.6e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reference at 1 ms pieces")
    args = parser.parse_args()
    reference_step = 1e-3 if args.quick else 1e-4
    print("transfer time (s) and its error against continuous motion")
    print(
        f"{'motion':<20} {'update':<20} {'exact s':>9}  "
        + "  ".join(
            f"{s:>4} s {rule:<5}" for s in ("1", "0.1") for rule in ("start", "mid", "mid*")
        )
    )
    for motion, distance in MOTIONS.items():
        for size, bits in SIZES.items():
            exact = finish_s(bits, distance, reference_step, "mid")
            if not np.isfinite(exact):
                print(f"{motion:<20} {size:<20} {'never':>9}  (out of range within 120 s)")
                continue
            cells = []
            for step in (1.0, 0.1):
                for rule in ("start", "mid", "mid*"):
                    err = (finish_s(bits, distance, step, rule) - exact) / exact * 100
                    cells.append(f"{err:>+10.3f} %")
            print(f"{motion:<20} {size:<20} {exact:>9.4f}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
