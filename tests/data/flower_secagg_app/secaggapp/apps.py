"""The ServerApp and ClientApp of classicapp/secagg.py."""

from classicapp.secagg import client, server

__all__ = ["client", "server"]
