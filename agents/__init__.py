"""Clients, edge servers, and the algorithms they run (see mecsim.agents.algorithms)."""
