"""`CheckpointManifest`: the commit record of one checkpoint (DESIGN §1 contract, §6).

A checkpoint folder `step-<NNNNNNNN>/` exists only once its `MANIFEST.json` does: the manifest
is written last, in one atomic PUT / rename, after every rank's files are uploaded. It lists
each file with its stored size and digest, so a reader can prove the folder is whole before
any byte reaches a model. The digest's algorithm is recorded per file, by the field that
holds it: `blake3` since format 2 (issue 58: SHA-256 ran at about the disk's rate and bound
save and restore), `sha256` in format-1 manifests written before, which stay readable and
are verified with SHA-256 (`ManifestFile.algorithm`; hashers in
`trainyard.plugins.storage.hashing`).

Manifests are JSON, never pickles, and they are untrusted input when read: every path must be
relative and stay inside the checkpoint folder (no `..`, no absolute paths, no backslashes);
a manifest that breaks this is rejected as a whole. No torch import here.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)

from trainyard.plugins.storage.errors import UnsafeKeyError
from trainyard.plugins.storage.hashing import ALGORITHMS
from trainyard.plugins.storage.store import HashAlgorithm, check_key

FORMAT_VERSION = 2
"""1: every file's digest is SHA-256; 2: each file names its algorithm (BLAKE3 when written)."""
HASH_ALGORITHM: HashAlgorithm = "blake3"
"""What new manifests record for every file."""
MANIFEST_NAME = "MANIFEST.json"
MAX_MANIFEST_BYTES = 64 << 20
"""A manifest lists files, not data; anything this large is not one of ours."""

_STEP_DIR = re.compile(r"^step-(\d{8,})$")
Compression = Literal["none", "zstd"]


def step_dir(step: int) -> str:
    """`step-00001234`: zero-padded so lexical order (S3 listings) is numeric order."""
    if step < 0:
        raise ValueError(f"step must be ≥ 0, got {step}")
    return f"step-{step:08d}"


def parse_step_dir(name: str) -> int | None:
    """The step of a `step-NNNNNNNN` folder name, or None for anything else."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def check_manifest_path(path: str) -> str:
    """A file path inside a checkpoint folder: relative, no `..`, not the manifest itself."""
    try:
        check_key(path)
    except UnsafeKeyError as e:
        raise ValueError(f"unsafe path in manifest: {e}") from e
    if path == MANIFEST_NAME:
        raise ValueError(f"a manifest cannot list itself ({MANIFEST_NAME!r})")
    return path


class ManifestFile(BaseModel):
    """One stored file. `size` and its digest (`blake3` or `sha256`: exactly one) describe the
    bytes *as stored* (compressed if `compression` says so), so verification never needs to
    decompress."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    """Relative to the checkpoint folder, '/'-separated."""
    size: NonNegativeInt
    blake3: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    compression: Compression = "none"
    raw_size: NonNegativeInt | None = None
    """Bytes after decompression (equals `size` when uncompressed)."""
    rank: NonNegativeInt | None = None
    """The rank that wrote it (diagnostics: which node produced a corrupt shard)."""

    @model_validator(mode="before")
    @classmethod
    def _known_algorithm(cls, data: Any) -> Any:
        """A digest under a name this reader does not know (a newer writer's algorithm, a
        typo) is refused by that name, not as pydantic's "extra inputs": the operator reading
        the catalog's warning learns which algorithm, and which ones this version verifies."""
        if isinstance(data, dict) and data.get("blake3") is None and data.get("sha256") is None:
            unknown = sorted(k for k in data if k not in cls.model_fields)
            if unknown:
                raise ValueError(f"{data.get('path')!r}: unknown digest algorithm "
                                 f"{', '.join(map(repr, unknown))}; this version verifies "
                                 f"{' or '.join(ALGORITHMS)} (written by a newer Trainyard?)")
        return data

    @field_validator("path")
    @classmethod
    def _safe_path(cls, value: str) -> str:
        return check_manifest_path(value)

    @model_validator(mode="after")
    def _one_digest(self) -> ManifestFile:
        if (self.blake3 is None) == (self.sha256 is None):
            raise ValueError(f"{self.path}: a manifest file has exactly one digest, blake3 or "
                             f"sha256 (got {'both' if self.blake3 else 'neither'})")
        return self

    @classmethod
    def hashed(cls, algorithm: HashAlgorithm, digest: str, **fields: Any) -> ManifestFile:
        """The entry for a file whose `algorithm` digest is `digest`."""
        return cls(**fields, **{algorithm: digest})

    @property
    def algorithm(self) -> HashAlgorithm:
        return "blake3" if self.blake3 is not None else "sha256"

    @property
    def digest(self) -> str:
        """The hex digest of the stored bytes, in `algorithm`."""
        return self.blake3 or self.sha256 or ""

    def mismatch(self, size: int, digest: str) -> str | None:
        """What is wrong with stored bytes of `size` and `digest` (in `algorithm`), or None."""
        if size != self.size:
            return f"size {size} != manifest {self.size}"
        if digest != self.digest:
            name = {"blake3": "BLAKE3", "sha256": "SHA-256"}[self.algorithm]
            return f"{name} {digest[:12]}… != manifest {self.digest[:12]}… (corrupt)"
        return None


class CheckpointManifest(BaseModel):
    """The JSON written to `step-<N>/MANIFEST.json`."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    format_version: Literal[1, 2] = FORMAT_VERSION
    job: str = Field(min_length=1, max_length=253)
    run: str | None = Field(default=None, max_length=63)
    """The training run that wrote it; with `job`, compared with the folder that holds the
    manifest (`catalog.read_manifest`): a manifest claiming another job or run is invalid."""
    step: NonNegativeInt
    created_at: AwareDatetime
    world_size: PositiveInt
    plan: dict[str, Any] | None = None
    """The parallelism `Plan` the checkpoint was written under (its JSON object), if known."""
    metrics: dict[str, float] = Field(default_factory=dict)
    files: list[ManifestFile]
    extra_state: list[str] = Field(default_factory=list)
    """Per-rank JSON files (step, RNG states, scheduler, sampler) — paths also in `files`."""
    torch_version: str | None = None

    @field_validator("extra_state")
    @classmethod
    def _safe_extra_paths(cls, value: list[str]) -> list[str]:
        return [check_manifest_path(p) for p in value]

    @model_validator(mode="after")
    def _consistent(self) -> CheckpointManifest:
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            dupes = sorted({p for p in paths if paths.count(p) > 1})
            raise ValueError(f"manifest lists files more than once: {dupes}")
        missing = sorted(set(self.extra_state) - set(paths))
        if missing:
            raise ValueError(f"extra_state names files the manifest does not list: {missing}")
        if self.format_version == 1 and any(f.algorithm != "sha256" for f in self.files):
            raise ValueError("a format-1 manifest lists SHA-256 digests only")
        return self

    @property
    def stored_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def state_bytes(self) -> int:
        """Uncompressed bytes of everything in the checkpoint."""
        return sum(f.raw_size if f.raw_size is not None else f.size for f in self.files)

    def file(self, path: str) -> ManifestFile:
        for entry in self.files:
            if entry.path == path:
                return entry
        raise KeyError(f"step {self.step}: manifest lists no file {path!r}")

    def to_json_bytes(self) -> bytes:
        return self.model_dump_json(indent=2).encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> CheckpointManifest:
        """Parse untrusted manifest bytes (size-capped, JSON only)."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise ValueError(f"manifest is {len(data)} bytes; the limit is {MAX_MANIFEST_BYTES}")
        try:
            document = json.loads(data)
        except RecursionError as e:  # `[[[[…` nested past the parser's stack: not a manifest
            raise ValueError("manifest JSON nests too deeply") from e
        return cls.model_validate(document)


def manifest_sha256(data: bytes) -> str:
    """The identity of a manifest's bytes: the SHA-256 that MLflow's checkpoint tags, exported
    models and quarantine markers record (`trainyard.checkpoint.sha256`). A few kilobytes, so
    the hash's speed does not matter here, and the recorded identities stay comparable."""
    return hashlib.sha256(data).hexdigest()


def utc_now() -> datetime:
    return datetime.now(UTC)
