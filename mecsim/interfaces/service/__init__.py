"""``mecsim serve``: the testbed as a long-running service.

- :mod:`~mecsim.interfaces.service.jobs`: SQLite state (runs, rounds, sweeps) and run folders;
- :mod:`~mecsim.interfaces.service.worker`: one Ray for the server's life, runs from a FIFO queue;
- :mod:`~mecsim.interfaces.service.app`: the FastAPI application (JSON API, /metrics, health);
- :mod:`~mecsim.interfaces.service.web`: the server-rendered web page;
- :mod:`~mecsim.interfaces.service.client`: :class:`.client.Client` (``mecsim.Client``);
- :mod:`~mecsim.interfaces.cli.service`: ``mecsim serve`` and the client verbs.

See docs/service.md.
"""
