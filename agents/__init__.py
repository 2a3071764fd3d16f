"""Clients, edge servers, and the algorithms they run (see agents.algorithms)."""
