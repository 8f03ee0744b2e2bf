"""The engines that run `ingest run`: `run` (every engine's `Run`: start, the report, stop signals, exit
codes), `local` (`LocalRun`: this machine's processes) and Ray (`ray_driver`, the driver, and
`ray_flow`, its side in Ray, and `ray_stages`, what Ray runs on any node). `inflight` and `stop` are the local dispatcher's bounds and
the run's stop signals; `warm` is the pipeline `ingest watch` keeps up between its syncs (each sync a `LocalRun`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingest.engines.run import Run


def engine_for(cfg: dict[str, Any]) -> type[Run]:
    """The engine `[run] engine` names: `LocalRun`, or `RayRun` (a one-line RunError where Ray is missing)."""
    from ingest.engines.run import RunError

    if cfg["run"]["engine"] != "ray":
        from ingest.engines.local import LocalRun

        return LocalRun
    try:
        from ingest.engines.ray_driver import RayRun
    except ImportError as exc:
        raise RunError(f"the Ray engine needs Ray ({exc}); install it with pip install -e '.[ray]'") from None
    return RayRun
