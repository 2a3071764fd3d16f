"""Where clients and servers run: Ray actors, or in-process.

Both executors drive the same plain classes (:class:`mecsim.agents.host.ClientHost`,
:class:`mecsim.agents.server.CentralServer` and, for a hierarchical algorithm, one
:class:`mecsim.agents.server.EdgeServer` per edge server) through the same steps; Ray is only a
thin wrapper around them, so a run gives the same records with either backend (a test
checks it).
"""
