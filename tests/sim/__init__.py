"""A deterministic simulation of the whole poll system: every actor runs the layer's real code under one
seeded scheduler that picks who runs next at every call into a service (see README.md)."""
