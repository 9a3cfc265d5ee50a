"""The MiniLM embedder, offline from its PyPI package: a paraphrase is nearer than an
unrelated sentence, a text is itself, and the model unpacks once."""
from __future__ import annotations

from pipelines.cache.similarity import Embedder, model_dir


def test_a_paraphrase_is_nearer_than_an_unrelated_text(tmp_path):
    directory = model_dir(tmp_path)
    assert (directory / "config.json").exists() and model_dir(tmp_path) == directory
    embedder = Embedder(directory)
    same = embedder.similarity("The cat sat on the mat.", "A cat was sitting on the mat.")
    other = embedder.similarity("The cat sat on the mat.", "Quarterly revenue rose by eight percent.")
    assert same > 0.7 > other, (same, other)
    assert embedder.similarity("x y z", "x y z") == 1.0
    [vector] = embedder.embed(["hello"])
    assert abs(sum(v * v for v in vector) - 1.0) < 1e-4 and len(vector) == 384
