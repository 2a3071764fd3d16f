"""Validation of mecsim's communication times against packet-level references (ns-3)."""
