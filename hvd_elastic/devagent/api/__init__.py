"""Consul's HTTP API endpoints, one module per area (agent, health/catalog, kv, session, status)."""

from .dispatch import dispatch

__all__ = ["dispatch"]
