"""``kolorun``: launch a command as N ranks, locally and over ssh (Horovod's ``horovodrun``).

Example::

    kolorun -np 2 python train.py
    kolorun -np 4 -H host1:2,host2:2 --config-file horovod.yaml python train.py

The launcher itself is native (``kolo._native.kolorun``); this module is its console entry
point: it reads ``--config-file`` (Horovod's YAML) and answers ``--check-build``.
:func:`parse_args` parses a kolorun command line without launching anything.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from typing import Any, Optional

from kolo import _core, _mpirun, _native
from kolo.exceptions import ConfigError, KoloError

__all__ = ["check_build", "main", "parse_args"]

#: ``--config-file`` keys (Horovod's ``config_parser.set_args_from_config``): section → key →
#: ``(flag, kind)``; ``kind`` is ``"value"`` (the flag takes the value) or ``"bool"`` (the flag
#: when true, the ``--no-`` / given opposite flag when false).
_CONFIG_KEYS: dict[str, dict[str, tuple[str, str]]] = {
    "params": {
        "fusion_threshold_mb": ("--fusion-threshold-mb", "value"),
        "cycle_time_ms": ("--cycle-time-ms", "value"),
        "cache_capacity": ("--cache-capacity", "value"),
        "hierarchical_allreduce": ("--hierarchical-allreduce", "bool"),
        "hierarchical_allgather": ("--hierarchical-allgather", "bool"),
        "torus_allreduce": ("--torus-allreduce", "bool"),
    },
    "autotune": {
        "enabled": ("--autotune", "bool"),
        "log_file": ("--autotune-log-file", "value"),
        "warmup_samples": ("--autotune-warmup-samples", "value"),
        "steps_per_sample": ("--autotune-steps-per-sample", "value"),
        "bayes_opt_max_samples": ("--autotune-bayes-opt-max-samples", "value"),
        "gaussian_process_noise": ("--autotune-gaussian-process-noise", "value"),
    },
    "timeline": {
        "filename": ("--timeline-filename", "value"),
        "mark_cycles": ("--timeline-mark-cycles", "bool"),
    },
    "stall_check": {
        "enabled": ("--stall-check", "bool"),
        "warning_time_seconds": ("--stall-check-warning-time-seconds", "value"),
        "shutdown_time_seconds": ("--stall-check-shutdown-time-seconds", "value"),
    },
    "library_options": {
        "mpi_threads_disable": ("--mpi-threads-disable", "bool"),
        "num_nccl_streams": ("--num-nccl-streams", "value"),
        "thread_affinity": ("--thread-affinity", "value"),
        "gloo_timeout_seconds": ("--gloo-timeout-seconds", "value"),
    },
    "logging": {
        "level": ("--log-level", "value"),
        "with_timestamp": ("--log-with-timestamp", "bool"),
    },
}

#: The flag a ``bool`` config key gives when false.
_FALSE_FLAGS = {
    "--stall-check": "--no-stall-check",
    "--log-with-timestamp": "--log-without-timestamp",
}

#: Section defaults Horovod applies when the section is present (``autotune.enabled`` is
#: false, ``stall_check.enabled`` true).
_SECTION_DEFAULTS = {"autotune": {"enabled": False}, "stall_check": {"enabled": True}}

_FRAMEWORKS = [
    ("TensorFlow", "tensorflow"),
    ("PyTorch", "torch"),
    ("Keras", "keras"),
    ("PyTorch Lightning", "lightning"),
    ("MXNet", "mxnet"),
]


def _mark(flag: bool) -> str:
    return "[X]" if flag else "[ ]"


def check_build() -> str:
    """The ``--check-build`` report: frameworks importable here, controllers and transports."""
    info = _native.build_info()
    lines = [f"kolo v{info['version']}:", "", "Available Frameworks:"]
    for label, module in _FRAMEWORKS:
        lines.append(f"    {_mark(importlib.util.find_spec(module) is not None)} {label}")
    mpi4py = _core.mpi_built()
    mpirun = _mpirun.mpi_implementation() if shutil.which("mpirun") else _mpirun.MISSING
    mpirun_text = "no mpirun on PATH" if mpirun == _mpirun.MISSING else f"mpirun: {mpirun}"
    lines += [
        "",
        "Available Controllers:",
        f"    {_mark(True)} kolo driver service (gRPC)",
        f"    {_mark(mpi4py)} MPI (mpi4py {'found' if mpi4py else 'not installed'}: "
        "init(comm=...), ProcessSet(comm))",
        f"    {_mark(_core.gloo_built())} Gloo (kolo's own controller plays its role)",
        f"    {_mark(True)} mpirun/srun launches (kolorun --mpi: {mpirun_text})",
        "",
        "Available Tensor Operations:",
        f"    {_mark(info['tcp'])} TCP",
        f"    {_mark(info['shm'])} Shared memory",
        f"    {_mark(info['nccl'])} NCCL",
        f"    {_mark(False)} DDL",
        f"    {_mark(False)} CCL",
        f"    {_mark(_core.mpi_enabled())} MPI",
        f"    {_mark(_core.gloo_built())} Gloo (kolo's TCP and shared memory play its role)",
        "",
        "GPU support (found at run time):",
        *_gpu_lines(),
    ]
    return "\n".join(lines)


def _gpu_lines() -> list[str]:
    found = _native.cuda_probe()
    if not found["built"]:
        return ["    this kolo was built without the `cuda` feature"]

    def line(label: str, ok: bool, detail: str) -> str:
        return f"    {_mark(ok)} {label}: {detail}"

    driver = (
        f"CUDA {found['driver_version'] // 1000}.{found['driver_version'] % 1000 // 10}, "
        f"{found['devices']} GPU(s)"
        if "driver_version" in found
        else found.get("cuda_error", "")
    )
    return [
        line("CUDA driver", found["cuda"], driver),
        line(
            "NCCL",
            "nccl_version" in found,
            f"{found['nccl_version']} ({found['nccl_path']})"
            if "nccl_version" in found
            else found.get("nccl_error", ""),
        ),
        line(
            "NVRTC (fusion pack kernel)",
            "nvrtc_version" in found,
            f"{found['nvrtc_version']} ({found['nvrtc_path']})"
            if "nvrtc_version" in found
            else found.get("nvrtc_error", ""),
        ),
    ]


def _config_flags(path: str) -> list[str]:
    """The flags equivalent to the YAML ``--config-file`` at ``path`` (Horovod's keys)."""
    try:
        import yaml
    except ImportError as err:
        raise ConfigError(
            f"--config-file {path}: reading YAML needs PyYAML: pip install pyyaml"
        ) from err
    try:
        with open(path) as handle:
            config = yaml.safe_load(handle)
    except OSError as err:
        raise ConfigError(f"--config-file {path}: cannot read it: {err}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"--config-file {path}: not valid YAML: {err}") from err
    if config is None:
        return []
    if not isinstance(config, dict):
        raise ConfigError(f"--config-file {path}: the top level must be a mapping of sections")
    flags: list[str] = []
    for section, values in config.items():
        if section == "controller":
            if not isinstance(values, str) or values.lower() not in ("gloo", "mpi"):
                raise ConfigError(
                    f"--config-file {path}: key controller: {values!r} is not a controller; "
                    "use gloo or mpi"
                )
            flags.append(f"--{values.lower()}")
            continue
        keys = _CONFIG_KEYS.get(section)
        if keys is None:
            known = ", ".join(["controller", *_CONFIG_KEYS])
            raise ConfigError(
                f"--config-file {path}: unknown key {section!r}; Horovod's keys are {known}"
            )
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"--config-file {path}: key {section}: must be a mapping")
        values = {**_SECTION_DEFAULTS.get(section, {}), **values}
        for key, value in values.items():
            flags += _config_flag(path, section, key, value, keys)
    return flags


def _config_flag(
    path: str, section: str, key: str, value: Any, keys: dict[str, tuple[str, str]]
) -> list[str]:
    name = f"{section}.{key}"
    if key not in keys:
        raise ConfigError(
            f"--config-file {path}: unknown key {name!r}; {section} takes " + ", ".join(keys)
        )
    if value is None:
        return []
    flag, kind = keys[key]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"--config-file {path}: key {name}: {value!r} is not true or false")
        tokens = [flag if value else _FALSE_FLAGS.get(flag, "--no-" + flag[2:])]
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"--config-file {path}: key {name}: {value!r} is not a value")
        tokens = [f"{flag}={value}"]
    try:
        _native.kolorun_parse(["-np", "1", *tokens, "x"])
    except ConfigError as err:
        raise ConfigError(f"--config-file {path}: key {name}: {err}") from None
    return tokens


def _expand_config_file(argv: list[str], parsed: dict[str, Any]) -> list[str]:
    """``argv`` with ``--config-file`` replaced by the file's flags, placed first so the
    command line wins over the file (as in Horovod)."""
    end = parsed["options_end"]
    options: list[str] = []
    skip = False
    for token in argv[:end]:
        if skip:
            skip = False
        elif token == "--config-file":
            skip = True
        elif not token.startswith("--config-file="):
            options.append(token)
    return [*_config_flags(str(parsed["config_file"])), *options, *argv[end:]]


def parse_args(argv: list[str]) -> dict[str, Any]:
    """Parses a kolorun (horovodrun) command line without launching anything.

    Returns a dict: ``action`` (``"launch"``, ``"help"``, ``"version"`` or
    ``"check_build"``) and, for a launch, the options (``num_proc``, ``hosts``, ``hostfile``,
    ``host_discovery_script``, ``start_timeout``, ``network_interfaces``, ``ssh_port``,
    ``ssh_identity_file``, ``verbose``, ``output_filename``, ``prefix_output_with_timestamp``,
    ``disable_cache``, ``controller``, ``mpi_args``, ``binding_args``, the elastic options as
    given ``min_num_proc``/``max_num_proc``/``slots_per_host``/``elastic_timeout``/
    ``reset_limit``/``cooldown_range`` (a ``(min, max)`` tuple), ``elastic`` (whether they make
    the launch elastic: a discovery script or ``--min-np``), ``config_file``), ``env`` (the
    variables the tuning flags and the config file set on every rank), ``notices`` (a list of
    ``(flag, text)``: each given flag kolo accepts without Horovod's effect, and what kolo does
    instead) and ``command``.
    Raises :class:`~kolo.exceptions.ConfigError` for an unknown flag, a bad value, or a bad
    config file key.

    Example::

        from kolo.runner import parse_args

        parsed = parse_args(["-np", "2", "--jsrun", "python", "train.py"])
        assert parsed["num_proc"] == 2
        assert parsed["notices"][0][0] == "--jsrun"
    """
    argv = [str(arg) for arg in argv]
    parsed = _native.kolorun_parse(argv)
    if parsed["action"] != "launch" or not parsed["config_file"]:
        return parsed
    expanded = _native.kolorun_parse(_expand_config_file(argv, parsed))
    expanded["config_file"] = parsed["config_file"]
    return expanded


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of the ``kolorun`` console script; exits with the job's status."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        parsed = _native.kolorun_parse(args)
        if parsed["action"] == "check_build":
            print(check_build())
            sys.exit(0)
        if parsed["action"] == "launch" and parsed["config_file"]:
            args = _expand_config_file(args, parsed)
            parsed = _native.kolorun_parse(args)
        if parsed["action"] == "launch" and parsed["controller"] == "mpi":
            _mpirun.exec_mpirun(parsed)
        code = _native.kolorun(args)
    except ConfigError as err:
        print(f"kolorun: error: {err}", file=sys.stderr)
        print("kolorun: run 'kolorun --help' for usage", file=sys.stderr)
        sys.exit(2)
    except KoloError as err:
        print(f"kolorun: {type(err).__name__}: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("kolorun: interrupted; every rank was stopped", file=sys.stderr)
        sys.exit(130)
    sys.exit(code)


if __name__ == "__main__":
    main()
