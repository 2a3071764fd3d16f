"""mecsim: a network-emulated Mobile Edge Computing testbed for personalised federated learning.

Real PyTorch training runs on Ray-hosted virtual clients; a SimPy model of the wireless
network and the device CPUs turns what the training did into the time a real testbed
would have taken. See README.md and docs/.
"""

__version__ = "0.2.0"

__all__ = ["Client", "__version__", "load_run", "replay", "simulate", "sweep"]


def __getattr__(name: str):
    """``mecsim.simulate``, ``mecsim.load_run``, ``mecsim.sweep``, ``mecsim.replay`` and
    ``mecsim.Client``, imported on first use.

    ``sweep`` and ``replay`` are callable modules (:func:`mecsim.analysis.whatif_sweep.sweep`,
    :func:`mecsim.analysis.replay.replay`), so ``mecsim.sweep(...)`` works however they
    were imported first.
    """
    if name in ("sweep", "replay"):
        # deferred: `import mecsim` stays light; replay and sweeps load torch
        from mecsim.analysis import replay
        from mecsim.analysis import whatif_sweep as sweep

        return {"sweep": sweep, "replay": replay}[name]
    if name in ("simulate", "load_run"):  # mecsim.api: mecsim run from Python, run folders
        from mecsim import api  # deferred: the run loop imports torch and Ray's glue

        return {"simulate": api.simulate, "load_run": api.load_run}[name]
    if name == "Client":  # the service's Python client (mecsim.interfaces.service.client)
        from mecsim.interfaces.service.client import Client  # deferred: httpx, on first use

        return Client
    raise AttributeError(f"module 'mecsim' has no attribute {name!r}")
