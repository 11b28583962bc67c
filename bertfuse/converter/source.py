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
    backend: str = ""  # which TF computed the last reference (for the report)
    _session: Any = None

    @property
    def tf_node_count(self) -> int:
        """Compute nodes of the TF graph (weights and their placeholders excluded)."""
        skip = {"Const", "Placeholder", "NoOp"}
        return sum(1 for n in self.graph_def.node if n.op not in skip)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs the TF graph on role-keyed inputs; returns canonical-name-keyed outputs."""
        return self.run_many([feeds])[0]

    def run_many(self, feed_sets: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """The TF reference for each feed set, with oneDNN's rewrites off: in this process when
        its TF has them off, else in a worker process (see converter/reference.py)."""
        from bertfuse.converter import reference

        if reference.in_process():
            if self._session is None:
                self._session = reference.new_session(self.graph_def)
            self.backend = reference.describe("in-process")
            return reference.run_graph(self.graph_def, self.weights, self.inputs,
                                       self.input_dtypes, self.outputs, feed_sets,
                                       self._session)
        self.backend = reference.describe("subprocess")
        return reference.run_in_subprocess(self, feed_sets)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
