"""A transport that writes events to local files, as openlineage-python's ``file`` does."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime

from .._errors import ConfigError
from ._base import DELIVERED, Outcome, SerializedEvent

__all__ = ["FileTransport"]


class FileTransport:
    """Writes events to ``log_file_path``.

    With ``append=True`` every event is one line (JSON lines) appended to that file.
    With ``append=False`` (openlineage-python's default) every event gets a file of
    its own, ``{log_file_path}-{YYYYmmdd-HHMMSS.ffffff}.json``.

    A write that fails (disk full, permissions) is retried with backoff: the events
    stay buffered, and the error is in ``Stats.last_error``.  Writes are small and
    local, so they run on the sidecar's loop; interpreter exit cannot start threads.

    Raises:
        ConfigError: the path's directory does not exist or is not writable, or (with
            ``append``) the path is a directory: no event could ever be written.
    """

    def __init__(self, log_file_path: str | os.PathLike[str], *, append: bool = False) -> None:
        self.log_file_path = os.fspath(log_file_path)
        self.append = append
        directory = os.path.dirname(os.path.abspath(self.log_file_path))
        problem = (
            f"its directory {directory} does not exist"
            if not os.path.isdir(directory)
            else f"its directory {directory} is not writable by this process"
            if not os.access(directory, os.W_OK | os.X_OK)
            else "it is a directory"
            if append and os.path.isdir(self.log_file_path)
            else None
        )
        if problem:
            raise ConfigError(
                f"log_file_path={self.log_file_path!r}: {problem}; point it at a file in a writable "
                "directory (OPENLINEAGE__TRANSPORT__LOG_FILE_PATH)"
            )

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        if self.append:
            try:
                with open(self.log_file_path, "ab") as f:  # noqa: ASYNC230 - see the class docstring
                    f.write(b"\n".join([event.body for event in batch]) + b"\n")
            except OSError as exc:
                return [self._failed(exc)] * len(batch)
            return [DELIVERED] * len(batch)
        outcomes: list[Outcome] = []
        for event in batch:
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S.%f")
            path = f"{self.log_file_path}-{stamp}.json"
            n = 1
            while os.path.exists(path):  # noqa: ASYNC240 - two events in one microsecond keep both files
                path = f"{self.log_file_path}-{stamp}-{n}.json"
                n += 1
            try:
                with open(path, "wb") as f:  # noqa: ASYNC230 - see the class docstring
                    f.write(event.body + b"\n")
            except OSError as exc:
                # Keep order: this event and every later one go again.
                outcomes.extend([self._failed(exc)] * (len(batch) - len(outcomes)))
                break
            outcomes.append(DELIVERED)
        return outcomes

    def _failed(self, exc: OSError) -> Outcome:
        return Outcome.retry("file_error", f"cannot write {self.log_file_path}: {exc}")

    async def aclose(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"FileTransport({self.log_file_path!r}, append={self.append})"
