"""A tiny, deterministic Llama for tests and the embedded quick start: random weights from
a seeded generator and a byte-level BPE tokenizer trained on `tiny_corpus`, written as a
normal Hugging Face directory that vLLM loads. The same seed gives byte-identical files,
so the model_revision pinned on events is reproducible on any machine."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any

MARKER = ".ledgerlm-tiny-model.json"
FORMAT = 1  # bump when the recipe below changes, so stale directories are regenerated

HIDDEN = 128
HEADS = 2
KV_HEADS = 1
HEAD_DIM = 64  # vLLM's CPU attention rejects head dims below 32
LAYERS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 2048
VOCAB = 2048
# Other shapes of the same recipe: "small" (~40M parameters) costs the engine enough per
# token that its batches are compute-bound on a CPU, as a real model's are on any device.
SHAPES = {
    "tiny": {"hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
             "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS},
    "small": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 6,
              "num_attention_heads": 12, "num_key_value_heads": 4},
}
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2
PAD, BOS, EOS = SPECIAL_TOKENS

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def make_tiny_model(directory: Path, *, seed: int = 0, shape: str = "tiny") -> Path:
    """Write the tiny model (or another of `SHAPES`) into `directory` (created if needed)
    and return it. A directory already holding a complete model for this seed and shape is
    left as it is."""
    directory = Path(directory)
    if is_complete(directory, seed=seed, shape=shape):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer_json, vocab_size = _train_tokenizer()
    config = _model_config(vocab_size, shape)
    files = {
        "config.json": _json_bytes(config),
        "generation_config.json": _json_bytes(
            {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
        ),
        "model.safetensors": _weights(config, seed),
        "tokenizer.json": tokenizer_json.encode(),
        "tokenizer_config.json": _json_bytes(_tokenizer_config()),
    }
    for name, data in files.items():
        _write_atomic(directory / name, data)
    # The marker goes last: a directory without it is incomplete and gets rewritten.
    marker = {
        "format": FORMAT,
        "seed": seed,
        **({} if shape == "tiny" else {"shape": shape}),
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    }
    _write_atomic(directory / MARKER, _json_bytes(marker))
    return directory


def is_complete(directory: Path, *, seed: int = 0, shape: str = "tiny") -> bool:
    try:
        marker = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("format") != FORMAT or marker.get("seed") != seed or marker.get("shape", "tiny") != shape:
        return False
    for name, digest in marker.get("files", {}).items():
        try:
            if hashlib.sha256((Path(directory) / name).read_bytes()).hexdigest() != digest:
                return False
        except OSError:
            return False
    return bool(marker.get("files"))


def _train_tokenizer() -> tuple[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from workers.tiny_corpus import CORPUS

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    # Like Llama: a prompt starts with <s>, so vLLM and count_tokens agree on its length.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tokenizer.token_to_id(BOS))],
    )
    return tokenizer.to_str(pretty=True), tokenizer.get_vocab_size(with_added_tokens=True)


def _model_config(vocab_size: int, shape: str = "tiny") -> dict[str, Any]:
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab_size,
        **SHAPES[shape],
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["LlamaForCausalLM"],
        dtype="float32",
    ).to_diff_dict()
    # The version stamp would make the files differ between installs for no reason.
    config.pop("transformers_version", None)
    return config


def _weights(config: dict[str, Any], seed: int) -> bytes:
    import torch
    from safetensors.torch import save
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        shapes = {
            name: tuple(tensor.shape)
            for name, tensor in LlamaForCausalLM(LlamaConfig(**config)).state_dict().items()
        }
    # Our own generator, filled in sorted name order: transformers' init order may change.
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shapes[name])
        else:
            tensors[name] = torch.empty(shapes[name]).normal_(0.0, 0.02, generator=generator)
    return save(tensors, metadata={"format": "pt"})


def _tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """`ledgerlm model make-tiny DIR [--seed N]`: print the model directory."""
    parser = argparse.ArgumentParser(prog="ledgerlm model make-tiny")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(make_tiny_model(args.directory, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
