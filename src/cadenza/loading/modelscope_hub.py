"""ModelScope repositories (``modelscope:owner/name[@revision]``) through ModelScope's own client (the
``modelscope`` extra), behind the same two calls as ``cadenza.loading.hf_hub.HuggingFaceHub``: the file list, then a
download of the files the family reads into ModelScope's cache (``MODELSCOPE_CACHE``, default ``~/.cache/modelscope``;
``MODELSCOPE_ENDPOINT`` points it at another server). When the file list cannot be fetched, a copy in the cache is
used. Tested against a loopback server answering the two routes the client downloads through (docs/models.md)."""

from __future__ import annotations

from pathlib import Path

from cadenza.errors import CheckpointError
from cadenza.loading.hub_names import MODELSCOPE, HubName, failure_reason, require_hub_package


class ModelScopeHub:
    def __init__(self) -> None:
        require_hub_package(MODELSCOPE)

    def list_files(self, name: HubName) -> set[str]:
        from modelscope.hub.api import HubApi

        try:
            entries = HubApi().get_model_files(name.repo_id, revision=name.revision, recursive=True)
        except Exception as exc:  # noqa: BLE001 - unreachable, unknown repository or revision: its client says which
            cached = self._cached_folder(name)
            if cached is None:
                raise CheckpointError(f"ModelScope model {name}: {failure_reason(exc)} (and it is not in ModelScope's "
                                      "cache)") from exc
            return {p.relative_to(cached).as_posix() for p in cached.rglob("*") if p.is_file()}
        # Current clients list files only ({"Path", "Size"}); older ones listed folders too ("Type": "tree").
        return {e["Path"] for e in entries if isinstance(e, dict) and "Path" in e and e.get("Type", "blob") == "blob"}

    def _cached_folder(self, name: HubName) -> Path | None:
        from modelscope import snapshot_download

        try:
            return Path(snapshot_download(name.repo_id, revision=name.revision, local_files_only=True))
        except Exception:  # noqa: BLE001 - not cached
            return None

    def download(self, name: HubName, files: list[str]) -> Path:
        from modelscope import snapshot_download

        try:
            return Path(snapshot_download(name.repo_id, revision=name.revision, allow_patterns=files))
        except Exception as exc:  # noqa: BLE001 - the client's many error types become one message
            raise CheckpointError(f"downloading ModelScope model {name} stopped: {failure_reason(exc)}; run again to "
                                  "resume") from exc
