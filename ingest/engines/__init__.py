"""The engines that run `ingest run`: `local` (this machine's processes; its `Run` also writes the report,
handles stop signals and exit codes for every engine) and Ray Data (`ray_driver`, the driver, and
`ray_stages`, what Ray runs on any node). `inflight` and `stop` are the local dispatcher's bounds and
the run's stop signals."""
