"""The engines that run `ingest run`: `local` (this machine's processes; its `Run` also writes the report,
handles stop signals and exit codes for every engine) and Ray Data (`ray_driver`, the driver, and
`ray_stages`, what Ray runs on any node). `inflight` and `stop` are the local dispatcher's bounds and
the run's stop signals."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingest.engines.local import Run


def engine_for(cfg: dict[str, Any]) -> type[Run]:
    """The engine `[run] engine` names: the local `Run`, or `RayRun` (a one-line RunError where Ray is missing)."""
    from ingest.engines.local import Run, RunError

    if cfg["run"]["engine"] != "ray":
        return Run
    try:
        from ingest.engines.ray_driver import RayRun
    except ImportError as exc:
        raise RunError(f"the Ray engine needs Ray ({exc}); install it with pip install -e '.[ray]'") from None
    return RayRun
