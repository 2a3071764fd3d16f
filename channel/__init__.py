"""Link models for mecsim: the KAPC Table 4 Shannon-rate channel (with its exponent path
loss or 3GPP TR 38.901 UMi/UMa), fixed rates, CSV traces, and the wired backhaul. No
torch, Ray or SimPy here: pure numpy."""

from __future__ import annotations

from .pathloss import Tr38901PathLoss
from .trace import BackhaulLink, TraceChannel
from .units import db_to_linear, dbm_to_w, linear_to_db, w_to_dbm
from .wireless import (
    ChannelModel,
    ClientRadio,
    FixedRateChannel,
    RoundChannel,
    ShannonChannel,
    interference_to_w,
    large_scale_gain,
    shannon_rate_bps,
    sinr,
)

__all__ = [
    "BackhaulLink",
    "ChannelModel",
    "ClientRadio",
    "FixedRateChannel",
    "RoundChannel",
    "ShannonChannel",
    "TraceChannel",
    "Tr38901PathLoss",
    "db_to_linear",
    "dbm_to_w",
    "interference_to_w",
    "large_scale_gain",
    "linear_to_db",
    "shannon_rate_bps",
    "sinr",
    "w_to_dbm",
]
