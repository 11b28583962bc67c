"""TF1 checkpoint + its config in Google's layouts (BERT, ALBERT, ELECTRA) -> TFSource.

The layout is told by the variable names (ckpt_layout.py); the graph is rebuilt from the
config with modeling.py's math (modeling.py in this package); variables are read from the
checkpoint by name. `--config` wins over the config file beside the checkpoint. Fine-tuning
extras (adam slots, global_step, cls/ pre-training heads; ELECTRA's generator and prediction
heads) are ignored. A classifier/ranking head (BERT, ALBERT) is detected by its variables:
Google's `output_weights`/`output_bias`, and dense layers `<scope>/dense[_N]/kernel|bias`
outside bert/ and cls/ (a ranking MLP), applied in order after the pooler.
"""

from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path

import numpy as np

from bertfuse.converter.ckpt_layout import (Layout, detect_layout, find_config, natural,
                                            read_config)
from bertfuse.converter.config import BertConfig
from bertfuse.converter.modeling import HeadSpec, build_bert_graph, expected_shapes
from bertfuse.converter.source import TFSource
from bertfuse.errors import BertfuseError
from bertfuse.optional import optional

_SLOT = re.compile(r"(/adam_[mv]|/Adam(_1)?|/Momentum|/ExponentialMovingAverage)$")
_HEAD_DENSE = re.compile(r"^(?!bert/|cls/)(.+/dense(_\d+)?)/kernel$")


def find_checkpoint(path: str) -> str:
    """Returns the checkpoint prefix from a dir or a prefix."""
    p = Path(path)
    if p.is_dir():
        return _latest_prefix(p)
    prefix = str(p)
    if prefix.endswith(".index") or ".data-" in prefix:
        prefix = re.sub(r"(\.index|\.data-\d+-of-\d+)$", "", prefix)
    if not os.path.exists(prefix + ".index"):
        raise BertfuseError(f"{path}: no checkpoint found (expected {prefix}.index)")
    return prefix


def _latest_prefix(directory: Path) -> str:
    indexes = sorted(glob.glob(str(directory / "*.index")), key=os.path.getmtime)
    if not indexes:
        raise BertfuseError(f"{directory}: no TF checkpoint (*.index) in this directory")
    return indexes[-1][: -len(".index")]


def _head_spec(names: set[str], cfg: BertConfig, layout: Layout) -> HeadSpec | None:
    if layout.family == "electra":
        return None  # its generator/ and *_predictions/ dense layers are pre-training heads
    mlp = []
    for name in names:
        m = _HEAD_DENSE.match(name)
        if m and f"{m.group(1)}/bias" in names and not _SLOT.search(name):
            mlp.append(m.group(1))
    # dense, dense_1, dense_2 ... in numeric order
    mlp.sort(key=lambda s: (s.rsplit("/", 1)[0], int(s.rsplit("_", 1)[1]) if s[-1].isdigit() else 0))
    has_output = "output_weights" in names and "output_bias" in names
    if not mlp and not has_output:
        return None
    if not layout.pooler:
        raise BertfuseError(f"the checkpoint has a classifier head "
                            f"({(mlp or ['output_weights'])[0]}) but no pooler "
                            f"({layout.scope}/pooler/dense) for it to read")
    return HeadSpec(mlp, has_output, cfg.head_activation)


def _check_consistent(prefix: str, cfg: BertConfig, var_shapes: dict,
                      wanted: dict[str, tuple[int, ...]], layout: Layout) -> None:
    """The config's graph uses every encoder (bert/, electra/) variable of the checkpoint,
    and each variable it needs is there with its shape; the first offender is named. (TF is
    rebuilt from the same config, so parity cannot see a config that truncates the
    checkpoint.)"""
    names = set(var_shapes)
    missing = sorted((n for n in wanted if n not in names), key=natural)
    if missing:
        raise BertfuseError(f"config does not match checkpoint: the config "
                            f"({cfg.num_hidden_layers} layers) needs {missing[0]}, which the "
                            f"checkpoint lacks ({len(missing)} variables missing)")
    for name, shp in wanted.items():
        if tuple(var_shapes[name]) != shp:
            raise BertfuseError(f"config does not match checkpoint: {name} has shape "
                                f"{list(var_shapes[name])}, config implies {list(shp)}")
    unused = sorted((n for n in names if n.startswith(f"{layout.scope}/") and n not in wanted
                     and not _SLOT.search(n)), key=natural)
    if unused:
        raise BertfuseError(f"config does not match checkpoint: the checkpoint has {unused[0]}, "
                            f"which the config ({cfg.num_hidden_layers} layers) does not use "
                            f"({len(unused)} variables unused)")


def load_checkpoint(path: str, config_path: str | None = None) -> TFSource:
    tf = optional("tensorflow", why="TensorFlow runs the source model (tf extra)")

    prefix = find_checkpoint(path)
    try:
        reader = tf.train.load_checkpoint(prefix)
        var_shapes = reader.get_variable_to_shape_map()
    except Exception as exc:  # TF raises DataLossError/NotFoundError/... on corrupt files
        raise BertfuseError(f"{prefix}: cannot read checkpoint ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:200]})") from None
    names = set(var_shapes)
    layout = detect_layout(prefix, names)
    cfg = read_config(find_config(Path(prefix).parent, layout, config_path), layout)
    wanted = expected_shapes(cfg, layout)
    _check_consistent(prefix, cfg, var_shapes, wanted, layout)
    head = _head_spec(names, cfg, layout)
    head_vars = []
    if head:
        head_vars = [f"{p}/{s}" for p in head.mlp for s in ("kernel", "bias")]
        if head.has_output:
            head_vars += ["output_weights", "output_bias"]
    weights: dict[str, np.ndarray] = {}
    try:
        for name in list(wanted) + head_vars:
            weights[name] = np.ascontiguousarray(reader.get_tensor(name), dtype=np.float32)
    except Exception as exc:
        raise BertfuseError(f"{prefix}: cannot read variable values ({type(exc).__name__}); "
                            f"is the .data file truncated or corrupt?") from None

    graph = tf.Graph()
    with graph.as_default():
        placeholders = {
            name: tf.compat.v1.placeholder(tf.float32, value.shape, name=f"w/{name}")
            for name, value in weights.items()
        }
        ids = tf.compat.v1.placeholder(tf.int32, [None, None], name="input_ids")
        mask = tf.compat.v1.placeholder(tf.int32, [None, None], name="input_mask")
        segs = tf.compat.v1.placeholder(tf.int32, [None, None], name="segment_ids")
        outputs = build_bert_graph(tf, cfg, placeholders.__getitem__, ids, mask, segs, head,
                                   layout)
    graph_def = graph.as_graph_def()
    return TFSource(
        kind="checkpoint",
        path=prefix,
        graph_def=graph_def,
        weights={f"w/{k}": v for k, v in weights.items()},
        inputs={"input_ids": "input_ids:0", "input_mask": "input_mask:0",
                "segment_ids": "segment_ids:0"},
        input_dtypes={r: np.dtype(np.int32) for r in ("input_ids", "input_mask", "segment_ids")},
        outputs={k: t.name for k, t in outputs.items()},
        original_names={"input_ids": "input_ids", "input_mask": "input_mask",
                        "segment_ids": "segment_ids", **{k: k for k in outputs}},
        vocab_size=cfg.vocab_size,
        type_vocab_size=cfg.type_vocab_size,
        max_positions=cfg.max_position_embeddings,
        config=json.loads(cfg.to_json()),
    )
