"""Third-party log lines and --log-level: TensorFlow's, tf2onnx's, ONNX Runtime's and Ray's
Python loggers at the level asked for (default: warnings; with -q or --json only errors), for
the length of a command. Their C++ lines go to fd 2, which the CLI silences besides
(io/quiet.py) unless --debug or --log-level info|debug asks to see them."""

from __future__ import annotations

import argparse
import logging
import os
from contextlib import contextmanager
from typing import Iterator

LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO,
          "debug": logging.DEBUG}
# The libraries' own loggers (a child follows its parent unless it sets its own level).
THIRD_PARTY = ("tensorflow", "absl", "tf2onnx", "onnx_graphsurgeon", "onnxruntime", "keras",
               "ray", "ray.serve", "ray.data", "ray.train", "filelock", "urllib3", "h5py")
# TF_CPP_MIN_LOG_LEVEL for each level (0 all, 1 no INFO, 2 no WARNING, 3 no ERROR either).
_TF_CPP = {"error": "2", "warning": "1", "info": "0", "debug": "0"}


def log_level(args: argparse.Namespace) -> str:
    """--log-level, else error with -q or --json, else warning."""
    asked = getattr(args, "log_level", None)
    if asked:
        return asked
    return "error" if getattr(args, "quiet", False) or getattr(args, "json", False) else "warning"


def native_logs_wanted(args: argparse.Namespace) -> bool:
    """TF's and ORT's C++ lines on the terminal: --debug, or --log-level info|debug."""
    return bool(getattr(args, "debug", False)) or getattr(args, "log_level", None) in ("info",
                                                                                       "debug")


@contextmanager
def third_party_logs(args: argparse.Namespace) -> Iterator[str]:
    """The libraries' loggers at log_level(args) inside the block, restored after it."""
    name = log_level(args)
    level = LEVELS[name]
    saved = {n: logging.getLogger(n).level for n in THIRD_PARTY}
    if getattr(args, "log_level", None):  # asked for: TF's C++ side too (read at its import)
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = _TF_CPP[name]
    for n in THIRD_PARTY:
        logging.getLogger(n).setLevel(level)
    try:
        yield name
    finally:
        for n, lv in saved.items():
            logging.getLogger(n).setLevel(lv)
