"""Hugging Face downloads through ``huggingface_hub`` (the ``hub`` extra), behind the two calls ``loading/hub.py``
makes of every hub client: the repository's file list, then the download of the files wanted."""

from __future__ import annotations

from pathlib import Path

from cadenza.errors import CheckpointError
from cadenza.loading.hub_names import HUGGINGFACE, HubName, failure_reason, require_hub_package
from cadenza.loading.release_files import folder_files


class HuggingFaceHub:
    """``huggingface_hub``'s client with its defaults: the cache, endpoint, offline switch and token it reads from
    the environment, and its progress bars. A transfer that breaks off is resumed from where it stopped (a ranged
    request; files already complete are kept)."""

    def __init__(self) -> None:
        require_hub_package(HUGGINGFACE)

    def list_files(self, name: HubName) -> set[str]:
        from huggingface_hub import HfApi
        from huggingface_hub import errors as hf_errors

        try:
            info = HfApi().model_info(name.repo_id, revision=name.revision or "main")
            return {s.rfilename for s in info.siblings or ()}
        except hf_errors.RevisionNotFoundError as exc:
            raise CheckpointError(f"Hugging Face repository {name.repo_id} has no revision {name.revision!r}") \
                from exc
        except hf_errors.GatedRepoError as exc:
            raise CheckpointError(f"Hugging Face repository {name.repo_id} is gated: accept its terms on the hub "
                                  "and log in (HF_TOKEN)") from exc
        except hf_errors.RepositoryNotFoundError as exc:
            raise CheckpointError(f"no model folder {str(name)!r} here and no Hugging Face repository "
                                  f"{name.repo_id!r} ({_endpoint()}): check the name, or log in (HF_TOKEN) for a "
                                  "private one") from exc
        except Exception as exc:  # noqa: BLE001 - offline or unreachable: the cache may still have it
            cached = self._cached_listing(name)
            if cached is None:
                raise CheckpointError(f"Hugging Face model {name} is not in the cache ({_cache()}) and the hub "
                                      f"cannot be reached ({failure_reason(exc)})") from exc
            return cached

    def _cached_listing(self, name: HubName) -> set[str] | None:
        """The file list an earlier download recorded in the cache (huggingface_hub >= 1.x keeps the repository's
        tree), else the files of the cached snapshot; None when the revision was never downloaded."""
        import huggingface_hub

        revision = name.revision or "main"
        try:
            cached_tree = getattr(huggingface_hub, "get_cached_repo_tree", None)
            if cached_tree is not None:
                return {f.path for f in cached_tree(name.repo_id, revision=revision)}
            folder = huggingface_hub.snapshot_download(name.repo_id, revision=revision, local_files_only=True)
            return folder_files(Path(folder))
        except Exception:  # noqa: BLE001 - nothing recorded for this revision
            return None

    def download(self, name: HubName, files: list[str]) -> Path:
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(name.repo_id, revision=name.revision or "main", allow_patterns=files))
        except Exception as exc:  # noqa: BLE001 - the client's many error types become one message
            raise CheckpointError(f"downloading Hugging Face model {name} stopped: {failure_reason(exc)}; run again to "
                                  "resume (files already downloaded are kept)") from exc


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE
