"""The canonical interface every TF source (checkpoint, SavedModel, frozen, Keras) maps to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

ROLES = ("input_ids", "input_mask", "segment_ids")


@dataclass
class TFSource:
    """A TF BERT as a GraphDef whose large weights are placeholders, plus those weights.

    `inputs` maps a role (input_ids / input_mask / segment_ids) to the TF tensor name,
    `outputs` maps a canonical output name to the TF tensor name, `original_names` maps the
    canonical names back to what the user's model called them.
    """

    kind: str
    path: str
    graph_def: Any
    weights: dict[str, np.ndarray]
    inputs: dict[str, str]
    input_dtypes: dict[str, np.dtype]
    outputs: dict[str, str]
    original_names: dict[str, str] = field(default_factory=dict)
    vocab_size: int | None = None
    type_vocab_size: int = 2
    max_positions: int | None = None
    fixed_seq: int | None = None
    config: dict | None = None  # bert_config.json contents, where the source has one
    _session: Any = None

    @property
    def tf_node_count(self) -> int:
        """Compute nodes of the TF graph (weights and their placeholders excluded)."""
        skip = {"Const", "Placeholder", "NoOp"}
        return sum(1 for n in self.graph_def.node if n.op not in skip)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs the TF graph on role-keyed inputs; returns canonical-name-keyed outputs."""
        import tensorflow as tf

        if self._session is None:
            graph = tf.Graph()
            with graph.as_default():
                tf.graph_util.import_graph_def(self.graph_def, name="")
            self._session = tf.compat.v1.Session(graph=graph)
        feed = {self.inputs[r]: feeds[r].astype(self.input_dtypes[r]) for r in self.inputs}
        feed.update({f"{name}:0": value for name, value in self.weights.items()})
        names = list(self.outputs)
        values = self._session.run([self.outputs[n] for n in names], feed_dict=feed)
        return dict(zip(names, values))

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
