"""Compare channel/phy.py's Wi-Fi cell model with the ns-3 reference (reference/wifi.json).

    python validation/wifi_compare.py [collision_cost]

For each case: the model's MCS from the distance (the SNR ns-3 computes, the thresholds
ns-3's IdealWifiManager uses), its upload times, and the ns-3 times (mean over seeds).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mecsim_phy", ROOT / "channel" / "phy.py")
assert _spec is not None and _spec.loader is not None
phy = importlib.util.module_from_spec(_spec)
sys.modules["mecsim_phy"] = phy
_spec.loader.exec_module(phy)


def compare(mac: object) -> list[dict[str, object]]:
    reference = json.loads((ROOT / "validation" / "reference" / "wifi.json").read_text())
    rows = []
    for case in reference["cases"]:
        runs = case["runs"]
        summary = runs[0]["summary"]
        width = int(summary["width_mhz"])
        stations = runs[0]["stations"]
        distance_m = np.array([s["distance_m"] for s in stations])
        upload_bytes = np.array([s["bytes"] for s in stations], dtype=float)
        snr_db = phy.wifi_snr_db(distance_m, summary["tx_power_dbm"], width)
        mcs = phy.he_mcs_for_snr(snr_db, width)
        model_s = phy.wifi_cell_upload_times_s(upload_bytes, mcs, width, mac=mac)
        ns3_s = np.mean([[s["time_s"] for s in r["stations"]] for r in runs], axis=0)
        ns3_last = [r["summary"]["last_time_s"] for r in runs]
        rows.append(
            {
                "case": case["case"],
                "mcs_model": mcs.tolist(),
                "mcs_ns3": [s["mcs"] for s in stations],
                "ns3_time_s": np.round(ns3_s, 4).tolist(),
                "model_time_s": np.round(model_s, 4).tolist(),
                "ns3_last_s": round(float(np.mean(ns3_last)), 4),
                "ns3_last_range_s": [min(ns3_last), max(ns3_last)],
                "model_last_s": round(float(model_s.max()), 4),
                "error": round(float(model_s.max() / np.mean(ns3_last) - 1.0), 3),
            }
        )
    return rows


if __name__ == "__main__":
    mac = phy.WifiCellMac()
    if len(sys.argv) > 1:
        mac = replace(mac, collision_cost=float(sys.argv[1]))
    for row in compare(mac):
        print(json.dumps(row))
