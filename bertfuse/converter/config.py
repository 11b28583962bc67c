"""bert_config.json (Google's layout) and the built-in example configurations."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bertfuse.errors import BertfuseError
from bertfuse.io import limits
from bertfuse.io.limits import CONFIG_BOUNDS

GELU_ERF = ("gelu", "gelu_exact", "gelu_erf")
GELU_TANH = ("gelu_new", "gelu_tanh", "gelu_fast", "gelu_pytorch_tanh", "gelu_approximate")
ACTIVATIONS = GELU_ERF + GELU_TANH + ("relu", "tanh")


@dataclass
class BertConfig:
    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    # Not in Google's file: the activation between dense layers of a ranking MLP head.
    head_activation: str = "relu"
    extra: dict = field(default_factory=dict)

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate(self, where: str = "bert_config") -> None:
        """Every size a positive integer within io/limits.py's CONFIG_BOUNDS (before
        anything is built from it), the activations known; `where` names the file."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if isinstance(value, float) and value.is_integer():
                value = int(value)
                setattr(self, name, value)
            check_size_value(name, value, where)
        if self.head_activation not in ACTIVATIONS:
            raise BertfuseError(f"{where}: unsupported head_activation "
                                f"{self.head_activation!r} (supported: {', '.join(ACTIVATIONS)})")
        if self.hidden_size % self.num_attention_heads:
            raise BertfuseError(
                f"{where}: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise BertfuseError(f"{where}: unsupported hidden_act {self.hidden_act!r} "
                                f"(supported: {', '.join(ACTIVATIONS)})")

    @classmethod
    def from_json(cls, path: str | Path) -> "BertConfig":
        raw = read_json(path)
        if not isinstance(raw, dict) or "vocab_size" not in raw:
            raise BertfuseError(f"{path}: not a BERT config (no vocab_size)")
        return cls.from_dict(path, raw)

    @classmethod
    def from_dict(cls, path: str | Path, raw: dict) -> "BertConfig":
        """A validated config from a JSON object; unknown keys are kept in `extra`."""
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__ and k != "extra"}
        extra = {k: v for k, v in raw.items() if k not in cls.__dataclass_fields__}
        try:
            cfg = cls(**known, extra=extra)
        except TypeError as exc:
            raise BertfuseError(f"{path}: bad config ({exc})") from None
        cfg.validate(str(path))
        return cfg

    def to_json(self) -> str:
        data = asdict(self)
        data.update(data.pop("extra"))
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def check_size_value(name: str, value, where: str = "bert_config") -> None:
    """A config size: a positive integer (not a bool) within io/limits.py's CONFIG_BOUNDS,
    checked before anything is built from it."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise BertfuseError(f"{where}: {name} must be a positive integer, got {value!r}")
    if value > CONFIG_BOUNDS[name]:
        raise BertfuseError(f"{where}: {name} {value} is over the limit of "
                            f"{CONFIG_BOUNDS[name]:,} (far above any released BERT); is the "
                            f"config edited?")


def read_json(path: str | Path, what: str = "bert_config.json"):
    """A config file's JSON, bounded in size and nesting (io/limits.py); every way it can
    fail is one BertfuseError line."""
    path = Path(path)
    try:
        return limits.read_json(path, limits.MAX_CONFIG_BYTES, what)
    except FileNotFoundError:
        raise BertfuseError(f"{path}: {what} not found") from None
    except OSError as exc:  # a directory, unreadable, ...
        raise BertfuseError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None


EXAMPLE_CONFIGS: dict[str, BertConfig] = {
    "tiny": BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=512,
                       max_position_embeddings=128),
    "shenma-3l": BertConfig(vocab_size=21128, hidden_size=768, num_hidden_layers=3,
                            num_attention_heads=12, intermediate_size=3072),
    "base": BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                       num_attention_heads=12, intermediate_size=3072),
    "large": BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
                        num_attention_heads=16, intermediate_size=4096),
    # The shapes of the small BERTs most deployed for ranking and embeddings: MiniLM-L12-H384
    # (head size 32) and TinyBERT-4L-312 (head size 26).
    "minilm": BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=12,
                         num_attention_heads=12, intermediate_size=1536),
    "tinybert": BertConfig(vocab_size=30522, hidden_size=312, num_hidden_layers=4,
                           num_attention_heads=12, intermediate_size=1200),
}
