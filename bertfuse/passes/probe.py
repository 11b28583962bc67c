"""Probe inputs for numeric checks, built from the graph's own inputs (bertfuse/io/inputs.py,
the one home of every random or probe input)."""

from bertfuse.io.inputs import PROBE_BATCH, PROBE_SEQ, probe_feeds, probe_mask  # noqa: F401
