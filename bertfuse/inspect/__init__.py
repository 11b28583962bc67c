"""Graph checks a CI can run, and pictures a person can read.

* ``summary``: inspect a model without reading its weight bytes; the stable summary JSON.
* ``diff``: what changed between two models or summaries, with an exit-code policy.
* ``draw``: one encoder layer (raw beside fused) through Graphviz ``dot``.
"""

from bertfuse.inspect.summary import SUMMARY_FORMAT, load_light, summarize

__all__ = ["SUMMARY_FORMAT", "load_light", "summarize"]
