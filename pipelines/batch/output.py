"""What a tenant may download of a summarization job: the Parquet parts its manifest
lists, once the job has ended with output. A part is named by its file name under the
job's `data/` folder; only names the manifest lists can be read, so a name never reaches
outside the job's own output.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import IO

from models import batch_keys as keys
from models.batch import BatchState
from pipelines.generation.submission import SubmissionError
from pipelines.objectstore import ObjectNotFound, ObjectStore


@dataclass(frozen=True)
class OutputPart:
    name: str  # e.g. part-00000.parquet
    key: str
    rows: int
    bytes: int


def _manifest(job: BatchState, store: ObjectStore) -> dict:
    if job.output_uri is None:
        ended = job.terminal
        message = (f"summarization {job.batch_id} is {job.status} and has no output" if ended else
                   f"summarization {job.batch_id} is {job.status}; its output can be downloaded once it ends")
        raise SubmissionError(409, "output_not_ready", message, param="summarization_id")
    try:
        return json.loads(store.get_bytes(keys.manifest_key(job.summarization.output_prefix)))
    except ObjectNotFound:
        raise SubmissionError(409, "output_not_ready",
                              f"summarization {job.batch_id} has no manifest in the object store") from None


def output_parts(job: BatchState, store: ObjectStore) -> tuple[dict, list[OutputPart]]:
    """The job's manifest and the parts it lists, in its order."""
    manifest = _manifest(job, store)
    data = job.summarization.output_prefix + "data/"
    parts = []
    for entry in manifest.get("files", []):
        key = store.key_for_uri(entry["uri"])
        if key is None or not key.startswith(data) or "/" in key[len(data):]:
            continue  # not one of the job's own data files: never served
        size = store.size(key)
        if size is not None:
            parts.append(OutputPart(key[len(data):], key, int(entry.get("rows", 0)), size))
    return manifest, parts


def open_part(job: BatchState, store: ObjectStore, name: str) -> tuple[OutputPart, IO[bytes]]:
    """The listed part called `name`, open for reading."""
    for part in output_parts(job, store)[1]:
        if part.name == name:
            return part, store.open_read(part.key)
    raise SubmissionError(404, "not_found", f"summarization {job.batch_id} has no output part {name!r}",
                          param="name")
