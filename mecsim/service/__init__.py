"""``mecsim serve``: the testbed as a long-running service.

- :mod:`~mecsim.service.store`: SQLite state (runs, rounds, sweeps) and run folders;
- :mod:`~mecsim.service.worker`: one Ray for the server's life, runs from a FIFO queue;
- :mod:`~mecsim.service.app`: the FastAPI application (JSON API, /metrics, health);
- :mod:`~mecsim.service.web`: the server-rendered web page;
- :mod:`~mecsim.service.client`: :class:`~mecsim.service.client.Client` (``mecsim.Client``);
- :mod:`~mecsim.service.cli`: ``mecsim serve`` and the client verbs.

See docs/service.md.
"""
