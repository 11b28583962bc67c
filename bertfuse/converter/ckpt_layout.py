"""Which Google TF1 checkpoint family a checkpoint is, told by its variable names, and its config.

Three layouts share BERT's math (modeling.py in this package builds all three):

* BERT (google-research/bert): `bert/embeddings/...`, one variable set per layer under
  `bert/encoder/layer_N/...`, pooler `bert/pooler/dense`; bert_config.json.
* ALBERT (google-research/albert): embeddings of width embedding_size, then
  `bert/encoder/embedding_hidden_mapping_in` up to hidden_size; the layers share weights,
  `bert/encoder/transformer/group_G/inner_group_I/...` with layer l running group
  int(l / num_hidden_layers * num_hidden_groups) and its inner groups in turn; LayerNorms
  `LayerNorm` (after attention) and `LayerNorm_1` (after the FFN); ALBERT's modeling.py's
  `gelu` is the tanh approximation; albert_config.json.
* ELECTRA (google-research/electra): BERT's variables under `electra/`, embeddings of width
  embedding_size projected by `electra/embeddings_project` when it differs from hidden_size,
  no pooler (its "pooled output" is the first token). Pre-training writes no config: the
  model's sizes come from the --hparams of run_pretraining.py (model_size, vocab_size,
  embedding_size, model_hparam_overrides), which `--config` reads as ELECTRA does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bertfuse.converter.config import BertConfig, check_size_value, read_json
from bertfuse.errors import BertfuseError

BERT_ROLES = {"query": "attention/self/query", "key": "attention/self/key",
              "value": "attention/self/value", "attn_out": "attention/output/dense",
              "attn_ln": "attention/output/LayerNorm", "inter": "intermediate/dense",
              "out": "output/dense", "out_ln": "output/LayerNorm"}
ALBERT_ROLES = {"query": "attention_1/self/query", "key": "attention_1/self/key",
                "value": "attention_1/self/value", "attn_out": "attention_1/output/dense",
                "attn_ln": "LayerNorm", "inter": "ffn_1/intermediate/dense",
                "out": "ffn_1/intermediate/output/dense", "out_ln": "LayerNorm_1"}
# run_pretraining.py / training_utils.get_bert_config: sizes by model_size.
ELECTRA_SIZES = {"small": (256, 12), "base": (768, 12), "large": (1024, 24)}
CONFIG_NAMES = {"bert": ("bert_config.json", "albert_config.json"),
                "albert": ("albert_config.json", "bert_config.json"),
                "electra": ("bert_config.json",)}


@dataclass
class Layout:
    family: str  # "bert", "albert" or "electra"
    scope: str  # the top variable scope: "bert" or "electra"
    pooler: bool  # the checkpoint has <scope>/pooler/dense

    @property
    def embeddings(self) -> str:
        return f"{self.scope}/embeddings"

    def projection(self, cfg: BertConfig) -> str | None:
        """The dense layer from embedding_size up to hidden_size, where they differ."""
        if embedding_size(cfg) == cfg.hidden_size:
            return None
        if self.family == "albert":
            return "bert/encoder/embedding_hidden_mapping_in"
        if self.family == "electra":
            return "electra/embeddings_project"
        raise BertfuseError("bert_config: embedding_size differs from hidden_size, which "
                            "Google's BERT layout has no projection for")

    def blocks(self, cfg: BertConfig) -> list[dict[str, str]]:
        """One attention + FFN block after another: role -> variable prefix. ALBERT's shared
        blocks name the same variables again."""
        if self.family != "albert":
            return [{r: f"{self.scope}/encoder/layer_{i}/{s}" for r, s in BERT_ROLES.items()}
                    for i in range(cfg.num_hidden_layers)]
        layers, groups = cfg.num_hidden_layers, _int(cfg, "num_hidden_groups")
        out = []
        for layer in range(layers):
            group = int(layer / layers * groups)
            for inner in range(_int(cfg, "inner_group_num")):
                p = f"bert/encoder/transformer/group_{group}/inner_group_{inner}"
                out.append({r: f"{p}/{s}" for r, s in ALBERT_ROLES.items()})
        return out


def _int(cfg: BertConfig, key: str) -> int:
    return int(cfg.extra.get(key, 1))


def embedding_size(cfg: BertConfig) -> int:
    return int(cfg.extra.get("embedding_size") or cfg.hidden_size)


def detect_layout(prefix: str, names: set[str]) -> Layout:
    def has(start: str) -> bool:
        return any(n.startswith(start) for n in names)

    if has("bert/encoder/transformer/group_"):
        return Layout("albert", "bert", "bert/pooler/dense/kernel" in names)
    if has("bert/embeddings/") or has("bert/encoder/layer_"):
        return Layout("bert", "bert", "bert/pooler/dense/kernel" in names)
    if has("electra/embeddings/") or has("electra/encoder/layer_"):
        return Layout("electra", "electra", "electra/pooler/dense/kernel" in names)
    some = min(names, default="(no variables)")
    raise BertfuseError(f"{prefix}: checkpoint layout not recognised (no bert/ or electra/ "
                        f"encoder variables of Google's BERT, ALBERT or ELECTRA; it has "
                        f"e.g. {some}); for another model, convert the SavedModel or "
                        f"frozen graph its own code exports")


def find_config(checkpoint_dir: Path, layout: Layout, given: str | None) -> str:
    """--config wins; else the family's config file beside the checkpoint."""
    if given:
        return given
    for name in CONFIG_NAMES[layout.family]:
        if (checkpoint_dir / name).exists():
            return str(checkpoint_dir / name)
    if layout.family == "electra":
        raise BertfuseError(f"{checkpoint_dir}: an ELECTRA checkpoint carries no config: pass "
                            f"--config FILE, the --hparams JSON it was trained with (or a "
                            f"bert_config.json with embedding_size)")
    names = " or ".join(CONFIG_NAMES[layout.family])
    raise BertfuseError(f"{checkpoint_dir}: no {names} beside the checkpoint; pass --config FILE")


def read_config(path: str, layout: Layout) -> BertConfig:
    if layout.family == "bert":
        return BertConfig.from_json(path)
    raw = read_json(path, "config")
    if not isinstance(raw, dict):
        raise BertfuseError(f"{path}: not a BERT config (not a JSON object)")
    if layout.family == "electra" and "hidden_size" not in raw:
        raw = electra_hparams(path, raw)
    elif "vocab_size" not in raw:
        raise BertfuseError(f"{path}: not a BERT config (no vocab_size)")
    if layout.family == "albert":
        # AlbertConfig's defaults (albert_xxlarge's), and its modeling.py's tanh gelu.
        raw = {"embedding_size": 128, "hidden_size": 4096, "num_attention_heads": 64,
               "intermediate_size": 16384, "hidden_act": "gelu", **raw}
        if raw["hidden_act"] == "gelu":
            raw["hidden_act"] = "gelu_tanh"
        if raw.get("net_structure_type", 0) != 0:
            raise BertfuseError(f"{path}: ALBERT net_structure_type "
                                f"{raw['net_structure_type']!r} is not supported (only 0)")
    cfg = BertConfig.from_dict(path, raw)
    for key in ("embedding_size", "num_hidden_groups", "inner_group_num"):
        value = cfg.extra.get(key)
        if value is not None:
            check_size_value(key, value, str(path))
    return cfg


def electra_hparams(path: str, hp: dict) -> dict:
    """ELECTRA's --hparams -> its BertConfig, as configure_pretraining.py and
    util/training_utils.get_bert_config derive it."""
    size = hp.get("model_size", "small")
    if size not in ELECTRA_SIZES:
        raise BertfuseError(f"{path}: not a BERT config nor ELECTRA hparams (model_size "
                            f"{size!r}; ELECTRA knows small, base, large)")
    overrides = hp.get("model_hparam_overrides", {})
    if not isinstance(overrides, dict):
        raise BertfuseError(f"{path}: model_hparam_overrides must be a JSON object")
    hidden, layers = ELECTRA_SIZES[size]
    args = {"hidden_size": hidden, "num_hidden_layers": layers,
            "vocab_size": hp.get("vocab_size", 30522), **overrides}
    args["num_attention_heads"] = max(1, args["hidden_size"] // 64) \
        if isinstance(args["hidden_size"], int) else args["hidden_size"]
    args["intermediate_size"] = 4 * args["hidden_size"] \
        if isinstance(args["hidden_size"], int) else args["hidden_size"]
    args.update(overrides)
    embedding = hp.get("embedding_size", 128 if size == "small" else None)
    if embedding is not None:
        args["embedding_size"] = embedding
    return args


def natural(name: str) -> list:
    """layer_2 before layer_10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
