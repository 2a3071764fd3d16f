"""The numbers of docs/channel.md: the KAPC Table 4 channel read literally, the unit
question of its interference, and the +20 dB calibration against Table 5's transfer times.

Pure numpy (no training, a second or two):

    python benchmarks/papers/channel_calibration.py [--seeds 200] [--clients 10] [--quick]

1. the median client (d = 300 m, B = 20 MHz, p = 26.5 dBm; the downlink at 50 MHz,
   30 dBm) step by step: gain, received power, thermal noise, SNR, Shannon rate and the
   seconds to move ResNet18's 42.65 MiB;
2. the same client with Table 4's interference mean (1) read in each unit;
3. populations: the mean over 4,000 clients of the literal model, and the round's
   slowest-of-``--clients`` transfer averaged over ``--seeds`` seeded client
   populations for SNR offsets 0 / +10 / +20 / +30 dB, with and without interference;
4. the downlink disciplines for K concurrent personalised downloads (full band each,
   equal split, a shared band) at +20 dB;
5. the calibration's assumption: the offset that fits Table 5 if its U-Comm / D-Comm are
   the round's *average* client's transfer time rather than its slowest client's (the
   +20 dB fit), found by root-finding on the mean over the same populations, and what the
   slowest client (mecsim's critical-path columns) takes at that offset.
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.optimize import brentq

from mecsim.channel import ClientRadio, ShannonChannel, dbm_to_w, large_scale_gain, linear_to_db

RESNET18_BITS = 42.65 * 2**20 * 8
PAPER_UP_S, PAPER_DOWN_S = 19.28, 7.16  # KAPC+BLS (TMC 2024) Table 5, FedAvg row


def median_client() -> None:
    d, b_ul, p_dbm, b_dl, p_dl_dbm = 300.0, 20e6, 26.5, 50e6, 30.0
    g = float(large_scale_gain(d))
    n0_dbm_hz = -174.0
    print("1. median client (d = 300 m, B = 20 MHz, p = 26.5 dBm), no interference")
    print(f"   gain g = 10^(-40/10) * 300^-4 = {g:.4e} ({float(linear_to_db(g)):.2f} dB)")
    for name, b, p in (("uplink", b_ul, p_dbm), ("downlink", b_dl, p_dl_dbm)):
        rx_dbm = p + float(linear_to_db(g))
        noise_dbm = n0_dbm_hz + 10 * np.log10(b)
        snr_db = rx_dbm - noise_dbm
        rate = b * np.log2(1 + 10 ** (snr_db / 10))
        rate20 = b * np.log2(1 + 10 ** ((snr_db + 20) / 10))
        print(
            f"   {name}: received {rx_dbm:.2f} dBm, noise N0*B {noise_dbm:.2f} dBm, "
            f"SNR {snr_db:.2f} dB, rate {rate / 1e6:.3f} Mbit/s -> ResNet18 "
            f"{RESNET18_BITS / rate:.1f} s; +20 dB: SNR {snr_db + 20:.2f} dB, "
            f"{rate20 / 1e6:.2f} Mbit/s -> {RESNET18_BITS / rate20:.2f} s"
        )


def interference_units() -> None:
    print("2. the same uplink with Table 4's interference mean I = 1 read in each unit")
    radio = ClientRadio(np.array([300.0]), np.array([20e6]), np.array([26.5]))
    for unit in ("W", "mW", "dBm", "noise"):
        ch = ShannonChannel(
            interference_unit=unit, ul_interference_std=0.0, dl_interference_std=0.0
        )
        rc = ch.draw_round(radio, [0], np.random.default_rng(0))
        rate = float(rc.uplink_rate_bps[0])
        print(
            f"   I = 1 {unit:5s}: {float(rc.ul_interference_w[0]):.3e} W, "
            f"SINR {float(rc.uplink_snr_db[0]):7.2f} dB, rate {rate:.3e} bit/s -> "
            f"ResNet18 {RESNET18_BITS / rate:.3g} s"
        )


def populations(seeds: int, k: int) -> None:
    ch = ShannonChannel(interference=False)
    rng = np.random.default_rng(0)
    radio = ch.draw_clients(4000, rng)
    rc = ch.draw_round(radio, np.arange(4000), rng)
    t = RESNET18_BITS / rc.uplink_rate_bps
    print(
        f"3. literal model, 4,000 clients (seed 0): ResNet18 upload median "
        f"{np.median(t):.1f} s, mean {t.mean():.1f} s; median uplink SNR "
        f"{np.median(rc.uplink_snr_db):.2f} dB"
    )
    print(
        f"   slowest of {k} clients, mean over {seeds} seeded populations "
        f"(paper: {PAPER_UP_S} s up / {PAPER_DOWN_S} s down):"
    )
    for interference in (False, True):
        for offset in (0.0, 10.0, 20.0, 30.0):
            up, down = slowest(
                ShannonChannel(snr_offset_db=offset, interference=interference), seeds, k
            )
            label = "N(1,4)/N(1,9) x N0*B" if interference else "none"
            print(
                f"   offset {offset:+5.1f} dB, interference {label:20s}: "
                f"up {up:8.2f} s ({up / PAPER_UP_S:6.2f}x), down {down:8.2f} s "
                f"({down / PAPER_DOWN_S:6.2f}x)"
            )


def slowest(ch: ShannonChannel, seeds: int, k: int) -> tuple[float, float]:
    ups, downs = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        radio = ch.draw_clients(k, rng)
        rc = ch.draw_round(radio, np.arange(k), rng)
        ups.append((RESNET18_BITS / rc.uplink_rate_bps).max())
        downs.append((RESNET18_BITS / rc.downlink_rate_bps).max())
    return float(np.mean(ups)), float(np.mean(downs))


def downlink_disciplines(seeds: int, k: int) -> None:
    print(
        f"4. {k} concurrent personalised downloads of ResNet18 at +20 dB, no interference "
        f"(mean over {seeds} populations of the last download's finish):"
    )
    full = ShannonChannel(snr_offset_db=20.0, interference=False)
    split = ShannonChannel(snr_offset_db=20.0, interference=False, downlink_mode="equal_split")
    res = {
        "full band each": [],
        "equal split (B/K, full power each)": [],
        "shared band (time-shared)": [],
    }
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        radio = full.draw_clients(k, rng)
        state = rng.bit_generator.state
        f = full.draw_round(radio, np.arange(k), rng)
        rng.bit_generator.state = state
        s = split.draw_round(radio, np.arange(k), rng)
        t_full = RESNET18_BITS / f.downlink_rate_bps
        res["full band each"].append(t_full.max())
        res["equal split (B/K, full power each)"].append(
            (RESNET18_BITS / s.downlink_rate_bps).max()
        )
        res["shared band (time-shared)"].append(shared_finish(t_full))
    for name, values in res.items():
        print(f"   {name:36s}: {np.mean(values):7.2f} s")
    p_w = float(dbm_to_w(30.0))
    print(
        f"   (equal split keeps the server's {p_w:.0f} W on every sub-band: K times the "
        "power of one transmitter)"
    )


def transfer_times(ch: ShannonChannel, seeds: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(seeds, k) upload and download seconds of ResNet18, one row per seeded population."""
    ups, downs = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        radio = ch.draw_clients(k, rng)
        rc = ch.draw_round(radio, np.arange(k), rng)
        ups.append(RESNET18_BITS / rc.uplink_rate_bps)
        downs.append(RESNET18_BITS / rc.downlink_rate_bps)
    return np.array(ups), np.array(downs)


def average_reading(seeds: int, k: int) -> None:
    def mean_s(offset: float, link: int) -> float:
        times = transfer_times(ShannonChannel(snr_offset_db=offset, interference=False), seeds, k)
        return float(times[link].mean())

    up20, down20 = (mean_s(20.0, i) for i in (0, 1))
    print(
        f"5. the average of {k} clients (mean over {seeds} populations), no interference: "
        f"+20 dB gives up {up20:.2f} s ({up20 / PAPER_UP_S:.2f}x), down {down20:.2f} s "
        f"({down20 / PAPER_DOWN_S:.2f}x)"
    )
    fits = [
        brentq(lambda o, i=i, t=t: mean_s(o, i) - t, 0.0, 30.0, xtol=1e-3)
        for i, t in ((0, PAPER_UP_S), (1, PAPER_DOWN_S))
    ]
    print(f"   offsets that fit the average reading: up {fits[0]:+.2f} dB, down {fits[1]:+.2f} dB")
    both = sum(fits) / 2
    up, down = transfer_times(ShannonChannel(snr_offset_db=both, interference=False), seeds, k)
    print(
        f"   at {both:+.2f} dB: average up {up.mean():.2f} s, down {down.mean():.2f} s; "
        f"the slowest of {k} (mecsim's U-Comm / D-Comm columns) up "
        f"{up.max(axis=1).mean():.2f} s ({up.max(axis=1).mean() / PAPER_UP_S:.2f}x), down "
        f"{down.max(axis=1).mean():.2f} s ({down.max(axis=1).mean() / PAPER_DOWN_S:.2f}x)"
    )


def shared_finish(solo_s: np.ndarray) -> float:
    """Egalitarian processor sharing, all jobs start at 0: the last finishes at sum(solo)."""
    return float(np.sum(solo_s))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=200)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument(
        "--quick",
        action="store_true",
        help="20 seeded populations instead of --seeds (seconds; a smoke run)",
    )
    args = p.parse_args()
    if args.quick:
        args.seeds = min(args.seeds, 20)
    median_client()
    interference_units()
    populations(args.seeds, args.clients)
    downlink_disciplines(args.seeds, args.clients)
    average_reading(args.seeds, args.clients)


if __name__ == "__main__":
    main()
