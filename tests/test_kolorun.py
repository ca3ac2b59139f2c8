"""kolorun's command line: output prefixes, per-rank files, start timeouts, errors, check-build."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, REPO, kill_quietly, pid_alive, run_kolorun, worker_env

#: Joins the job with kolo's engine alone, as ``import kolo.torch as hvd; hvd.init()`` does but
#: without torch's 3 CPU-seconds of import: these tests are about the launcher (scripts that use
#: kolo.torch under kolorun are the collectives, engine and training suites).
INIT = "from kolo import _core as hvd, _lifecycle; _lifecycle.init(); "

PRINT_RANKS = (
    f"import json; {INIT}"
    "print(json.dumps(dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), "
    "local_size=hvd.local_size(), cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size())))"
)


def rank_lines(stdout: str) -> dict[int, dict]:
    found = {}
    for line in stdout.splitlines():
        prefix, _, payload = line.partition("<stdout>:")
        if payload.startswith("{"):
            info = json.loads(payload)
            assert prefix == f"[{info['rank']}]", line
            found[info["rank"]] = info
    return found


def test_local_ranks_get_prefixed_output_and_consecutive_assignment() -> None:
    result = run_kolorun(["-np", "3", "python", "-c", PRINT_RANKS], timeout=120)
    assert result.returncode == 0, result.stderr
    ranks = rank_lines(result.stdout)
    assert sorted(ranks) == [0, 1, 2]
    for rank, info in ranks.items():
        assert info == dict(
            rank=rank, size=3, local_rank=rank, local_size=3, cross_rank=0, cross_size=1
        )


def test_stderr_is_prefixed_and_output_files_are_written(tmp_path) -> None:
    code = f"import sys; {INIT}print('out', hvd.rank()); print('err', hvd.rank(), file=sys.stderr)"
    result = run_kolorun(
        ["-np", "2", "--output-filename", str(tmp_path), "python", "-c", code], timeout=120
    )
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:out {rank}" in result.stdout
        assert f"[{rank}]<stderr>:err {rank}" in result.stderr
        assert (tmp_path / f"rank.{rank}" / "stdout").read_text().strip() == f"out {rank}"
        assert f"err {rank}" in (tmp_path / f"rank.{rank}" / "stderr").read_text()


def test_nonzero_exit_is_reported_with_rank_and_code() -> None:
    code = (
        "import os, sys, time; i = int(os.environ['KOLO_TASK_INDEX']); "
        "time.sleep(0 if i else 60); sys.exit(7 if i else 0)"
    )
    result = run_kolorun(["-np", "2", "python", "-c", code], timeout=60)
    assert result.returncode == 7, (result.returncode, result.stderr)
    assert "rank 1" in result.stderr and "7" in result.stderr, result.stderr


def test_start_timeout_names_how_many_ranks_registered() -> None:
    code = (
        "import os; from kolo import _lifecycle; "
        "_lifecycle.init() if os.environ['KOLO_TASK_INDEX'] == '0' else None"
    )
    result = run_kolorun(["-np", "2", "--start-timeout", "15", "python", "-c", code], timeout=90)
    assert result.returncode != 0
    assert "RendezvousError" in result.stderr, result.stderr[-3000:]
    assert "1 of 2" in result.stderr, result.stderr[-3000:]


def test_bad_arguments_are_clear_errors() -> None:
    result = run_kolorun(["-np", "4", "-H", "localhost:2", "python", "-c", "pass"], timeout=30)
    assert result.returncode == 2
    assert "4" in result.stderr and "2" in result.stderr, result.stderr
    result = run_kolorun(["-np", "zero", "python"], timeout=30)
    assert result.returncode == 2
    assert "-np" in result.stderr, result.stderr
    result = run_kolorun(["-np", "2"], timeout=30)
    assert result.returncode == 2
    assert "command" in result.stderr.lower(), result.stderr


ENGINE_VARS = (
    "KOLO_FUSION_THRESHOLD",
    "KOLO_CYCLE_TIME",
    "KOLO_CACHE_CAPACITY",
    "KOLO_STALL_CHECK_DISABLE",
    "KOLO_LOG_LEVEL",
    "KOLO_TIMELINE",
)
PRINT_ENGINE_VARS = (
    f"import json, os; {INIT}"
    "print(json.dumps(dict(rank=hvd.rank(), "
    f"env={{k: os.environ.get(k) for k in {ENGINE_VARS!r}}})))"
)


def test_engine_flags_reach_every_rank_as_environment_variables() -> None:
    result = run_kolorun(
        [
            "-np",
            "2",
            "--fusion-threshold-mb",
            "2",
            "--cycle-time-ms",
            "3",
            "--cache-capacity",
            "7",
            "--no-stall-check",
            "--log-level",
            "DEBUG",
            "python",
            "-c",
            PRINT_ENGINE_VARS,
        ],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = rank_lines(result.stdout)
    assert sorted(ranks) == [0, 1], result.stdout
    for info in ranks.values():
        assert info["env"] == {
            "KOLO_FUSION_THRESHOLD": str(2 * 1024 * 1024),
            "KOLO_CYCLE_TIME": "3",
            "KOLO_CACHE_CAPACITY": "7",
            "KOLO_STALL_CHECK_DISABLE": "1",
            "KOLO_LOG_LEVEL": "debug",
            "KOLO_TIMELINE": None,
        }, info
    result = run_kolorun(["-np", "2", "--cycle-time-ms", "0", "python", "-c", "pass"], timeout=30)
    assert result.returncode == 2
    assert '--cycle-time-ms "0"' in result.stderr and "milliseconds" in result.stderr, result.stderr


def test_check_build_reports_this_build() -> None:
    result = run_kolorun(["--check-build"], timeout=30)
    assert result.returncode == 0, result.stderr
    assert "[X] PyTorch" in result.stdout
    assert "[X] TCP" in result.stdout
    assert "[ ] NCCL" in result.stdout
    # Collectives never run over MPI; kolo's transport plays Gloo's role; mpirun launches work.
    controllers, operations = result.stdout.split("Available Controllers:")[1].split(
        "Available Tensor Operations:"
    )
    assert "[ ] MPI\n" in operations and "[X] Gloo" in operations, operations
    assert "[X] Gloo" in controllers and "[X] mpirun/srun launches" in controllers, controllers
    assert "mpirun: OpenMPI" in controllers or shutil.which("mpirun") is None, controllers


def test_ctrl_c_stops_every_rank(tmp_path) -> None:
    code = (
        f"import os, sys, time; {INIT}"
        f"open(os.path.join({str(tmp_path)!r}, f'rank{{hvd.rank()}}.pid'), 'w')"
        ".write(str(os.getpid())); print('ready', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen(
        [str(BIN / "kolorun"), "-np", "2", "python", "-c", code],
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # kolorun as a terminal starts it: a suite run in the background (nohup, `cmd &`)
        # passes SIGINT on ignored, and Python then leaves it ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid") if p.read_text()]
            time.sleep(0.2)
        assert len(pids) == 2, "ranks did not start"
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert time.monotonic() - started < 30
        assert not [pid for pid in pids if pid_alive(pid)], "a rank survived Ctrl-C"
    finally:
        proc.kill()
        for pid in pids:
            kill_quietly(pid)


HOROVOD_RANK_VARS = (
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "HOROVOD_HOSTNAME",
    "HOROVOD_CONTROLLER",
    "HOROVOD_CPU_OPERATIONS",
    "KOLO_RANK",
)
#: Prints the environment a rank sees before anything of kolo is imported, then its rank.
PRINT_ENV = (
    "import json, os, sys; names = sys.argv[1].split(','); "
    "before = {k: os.environ.get(k) for k in names}; "
    f"{INIT}print(json.dumps(dict(rank=hvd.rank(), env=before)))"
)


def run_print_env(args: list[str], names, env=None, timeout: float = 120):
    result = run_kolorun(
        [*args, "python", "-c", PRINT_ENV, ",".join(names)], timeout=timeout, env=env
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    ranks = rank_lines(result.stdout)
    assert len(ranks) >= 1, result.stdout
    return result, ranks


def test_horovod_rank_variables_are_set_before_user_code_runs_as_horovodrun_sets_them() -> None:
    _, ranks = run_print_env(["-np", "3"], HOROVOD_RANK_VARS)
    assert sorted(ranks) == [0, 1, 2]
    for rank, info in ranks.items():
        assert info["env"] == {
            "HOROVOD_RANK": str(rank),
            "HOROVOD_SIZE": "3",
            "HOROVOD_LOCAL_RANK": str(rank),
            "HOROVOD_LOCAL_SIZE": "3",
            "HOROVOD_CROSS_RANK": "0",
            "HOROVOD_CROSS_SIZE": "1",
            "HOROVOD_HOSTNAME": "localhost",
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "KOLO_RANK": str(rank),
        }, info


def test_rank_variables_across_two_host_entries() -> None:
    # `localhost` and this machine's hostname both run locally but are two hosts (two
    # KOLO_HOSTNAMEs): Horovod's assignment gives 0,1 on the first and 2 on the second.
    me = socket.gethostname()
    if me.split(".")[0].lower() == "localhost":
        pytest.skip("this machine's hostname is localhost: no second local host entry")
    names = HOROVOD_RANK_VARS[:7]
    _, ranks = run_print_env(["-H", f"localhost:2,{me}:1"], names)
    expected = {
        0: ("0", "3", "0", "2", "0", "2", "localhost"),
        1: ("1", "3", "1", "2", "0", "1", "localhost"),
        2: ("2", "3", "0", "1", "1", "2", me),
    }
    assert sorted(ranks) == [0, 1, 2]
    for rank, info in ranks.items():
        assert info["env"] == dict(zip(names, expected[rank])), info


def test_config_file_keys_reach_the_ranks_and_flags_win(tmp_path) -> None:
    config = tmp_path / "horovod.yaml"
    config.write_text(
        "params:\n  fusion_threshold_mb: 32\n  cycle_time_ms: 5\n  cache_capacity: 256\n"
        "stall_check:\n  enabled: false\n  warning_time_seconds: 11\n"
        "timeline:\n  filename: tl.json\n"
        "library_options:\n  gloo_timeout_seconds: 90\n"
        "logging:\n  level: INFO\n"
    )
    names = (
        "HOROVOD_FUSION_THRESHOLD",
        "KOLO_FUSION_THRESHOLD",
        "HOROVOD_CYCLE_TIME",
        "HOROVOD_CACHE_CAPACITY",
        "HOROVOD_STALL_CHECK_DISABLE",
        "HOROVOD_STALL_CHECK_TIME_SECONDS",
        "HOROVOD_TIMELINE",
        "HOROVOD_GLOO_TIMEOUT_SECONDS",
        "KOLO_COLLECTIVE_TIMEOUT_SECONDS",
        "HOROVOD_LOG_LEVEL",
    )
    args = ["-np", "2", "--cycle-time-ms", "3", "--config-file", str(config)]
    args += ["--stall-check", "--timeline-filename", str(tmp_path / "mine.json")]
    _, ranks = run_print_env(args, names)
    assert sorted(ranks) == [0, 1]
    for info in ranks.values():
        assert info["env"] == {
            "HOROVOD_FUSION_THRESHOLD": str(32 << 20),
            "KOLO_FUSION_THRESHOLD": str(32 << 20),
            # Flags win over the file wherever they stand.
            "HOROVOD_CYCLE_TIME": "3",
            "HOROVOD_CACHE_CAPACITY": "256",
            "HOROVOD_STALL_CHECK_DISABLE": "0",
            "HOROVOD_STALL_CHECK_TIME_SECONDS": "11",
            "HOROVOD_TIMELINE": str(tmp_path / "mine.json"),
            "HOROVOD_GLOO_TIMEOUT_SECONDS": "90",
            "KOLO_COLLECTIVE_TIMEOUT_SECONDS": "90",
            "HOROVOD_LOG_LEVEL": "INFO",
        }, info


def test_bad_config_file_keys_and_values_are_usage_errors(tmp_path) -> None:
    config = tmp_path / "bad.yaml"
    for text, expected in [
        ("params:\n  fusion_treshold_mb: 32\n", "params.fusion_treshold_mb"),
        ("params:\n  cycle_time_ms: fast\n", "params.cycle_time_ms"),
        ("stall_check:\n  enabled: maybe\n", "stall_check.enabled"),
        ("tuning:\n  x: 1\n", "'tuning'"),
    ]:
        config.write_text(text)
        result = run_kolorun(["-np", "1", "--config-file", str(config), "true"], timeout=30)
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr and str(config) in result.stderr, result.stderr


def test_the_launching_environment_reaches_local_ranks_minus_the_deny_list() -> None:
    names = ("MY_APP_SETTING", "NCCL_DEBUG", "HOROVOD_FUSION_THRESHOLD", "OLDPWD", "SSH_CLIENT")
    names += ("BASH_FUNC_boom%%", "SHLVL", "PYTHONUNBUFFERED")
    env = {
        "MY_APP_SETTING": "it's $value",
        "NCCL_DEBUG": "INFO",
        "HOROVOD_FUSION_THRESHOLD": "1048576",
        "OLDPWD": "/elsewhere",
        "SSH_CLIENT": "10.0.0.1 1 22",
        "BASH_FUNC_boom%%": "() {  echo boom\n}",
        "SHLVL": "7",
        "PYTHONUNBUFFERED": "",
    }
    _, ranks = run_print_env(["-np", "2"], names, env=env)
    for info in ranks.values():
        assert info["env"] == {
            "MY_APP_SETTING": "it's $value",
            "NCCL_DEBUG": "INFO",
            "HOROVOD_FUSION_THRESHOLD": "1048576",
            "OLDPWD": None,
            "SSH_CLIENT": None,
            "BASH_FUNC_boom%%": None,
            "SHLVL": None,
            "PYTHONUNBUFFERED": "1",
        }, info


def test_prefix_output_with_timestamp() -> None:
    code = f"{INIT}print('hello', hvd.rank())"
    result = run_kolorun(["-np", "2", "-prefix-timestamp", "python", "-c", code], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    # asctime, like horovodrun: "Wed Nov 25 08:10:00 2026[0]<stdout>:hello 0"
    pattern = r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[(\d)\]<stdout>:hello (\d)$"
    found = [m.groups() for m in re.finditer(pattern, result.stdout, re.MULTILINE)]
    assert sorted(found) == [("0", "0"), ("1", "1")], result.stdout


def test_horovodrun_flags_kolo_lacks_print_one_notice_each_and_still_run() -> None:
    result = run_kolorun(
        "-np 1 --gloo --hierarchical-allreduce --torus-allreduce --autotune python -c pass".split(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # --gloo selects kolo's own controller, --hierarchical-allreduce its hierarchical path and
    # --autotune its autotuner: Horovod's effects, no notice.
    notes = [line for line in result.stderr.splitlines() if line.startswith("kolorun: note:")]
    assert [line.split(":")[2].strip() for line in notes] == [
        "--torus-allreduce",
    ], result.stderr
    version = run_kolorun(["-v"], timeout=30)
    assert version.returncode == 0 and version.stdout.strip()[0].isdigit(), version
    result = run_kolorun(["-cb"], timeout=30)
    assert result.returncode == 0 and "[X] TCP" in result.stdout


_AUTOTUNE_RANK = """
import sys, time
import torch
import kolo, kolo.torch as hvd
hvd.init()
rank = hvd.rank()
grads = [torch.ones(4096) for _ in range(3)]
for step in range(400):
    if rank == 1:
        time.sleep(0.0005 * (1 + step % 3))  # rank 1 is slow: its own timings differ
    for i, g in enumerate(grads):
        hvd.allreduce_(g, op=hvd.Sum, name=f"grad.{i}")
    active = kolo.engine_stats()["autotune_active"]
    if hvd.allreduce(torch.tensor([active]), op=hvd.Max, name="active").item() == 0:
        break
stats = kolo.engine_stats()
mine = torch.tensor([stats[k] for k in (
    "autotune_trials", "fusion_threshold", "cycle_time_us", "cache_enabled")], dtype=torch.int64)
every = hvd.allgather(mine.unsqueeze(0), name="settings")
assert (every == every[0]).all(), every
print("tuned", rank, step, *mine.tolist(), flush=True)
hvd.shutdown()
"""


def test_kolorun_autotune_agrees_on_every_rank_and_writes_horovods_log(tmp_path: Path) -> None:
    log = tmp_path / "autotune.csv"
    flags = (
        "-np 2 --autotune --autotune-warmup-samples 0 --autotune-steps-per-sample 2 "
        f"--autotune-bayes-opt-max-samples 7 --autotune-log-file {log}"
    ).split()
    result = run_kolorun([*flags, "python", "-c", _AUTOTUNE_RANK], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    # "[rank]<stdout>:tuned rank step trials fusion_threshold cycle_time_us cache_enabled"
    tuned = [
        line.split(":tuned ")[1].split() for line in result.stdout.splitlines() if ":tuned " in line
    ]
    assert len(tuned) == 2, result.stdout
    # The same settings, trial count included, on both ranks, and the search ended early.
    assert tuned[0][2:] == tuned[1][2:] and int(tuned[0][2]) >= 3, tuned
    lines = log.read_text().splitlines()
    assert lines[0] == (
        "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,"
        "cycle_time_ms,tensor_fusion_threshold,score"
    )
    assert len(lines) >= 4 and all(len(line.split(",")) == 7 for line in lines), lines
    assert float(lines[-1].split(",")[5]) * (1 << 20) == pytest.approx(int(tuned[0][3]), rel=1e-4)


def test_parse_args_contract() -> None:
    from kolo.exceptions import ConfigError
    from kolo.runner import parse_args

    parsed = parse_args(["-np", "2", "--mpi", "-i", "/k", "--network-interfaces", "a,b", "x"])
    assert parsed["num_proc"] == 2 and parsed["ssh_identity_file"] == "/k"
    assert parsed["network_interfaces"] == ["a", "b"]
    assert parsed["controller"] == "mpi" and parsed["notices"] == []
    parsed = parse_args(["-np", "2", "--jsrun", "x"])
    assert [flag for flag, _ in parsed["notices"]] == ["--jsrun"]
    assert "jsrun" in parsed["notices"][0][1]
    for bad in (["-np", "2", "--bogus", "x"], ["-np", "2", "--cache-capacity", "-1", "x"]):
        with pytest.raises(ConfigError):
            parse_args(bad)


def test_kolo_run_returns_results_by_rank_and_raises_a_failing_ranks_error() -> None:
    import kolo
    from kolo.exceptions import RankFailedError

    # Defined here so cloudpickle ships them by value (the ranks cannot import this module).
    def rank_times_ten(offset, extra=0):
        import kolo.torch as hvd

        hvd.init()
        value = hvd.rank() * 10 + offset + extra
        return {"rank": hvd.rank(), "value": value, "env": os.environ["HOROVOD_RANK"]}

    def fails_on_rank_one():
        import kolo.torch as hvd

        hvd.init()
        if hvd.rank() == 1:
            raise ValueError("rank one refuses")
        hvd.barrier()
        return hvd.rank()

    results = kolo.run(rank_times_ten, (3,), {"extra": 0}, 3)
    assert results == [{"rank": r, "value": r * 10 + 3, "env": str(r)} for r in range(3)]
    with pytest.raises(RankFailedError) as caught:
        kolo.run(fails_on_rank_one, num_proc=2, start_timeout=60)
    assert caught.value.rank == 1
    assert "rank one refuses" in caught.value.remote_traceback
    assert "ValueError" in str(caught.value)
    assert isinstance(caught.value, RuntimeError)  # what horovod.run raises


def test_elastic_option_errors_through_parse_args() -> None:
    """Bad elastic combinations are ConfigErrors naming the option and the fix, raised while
    parsing (kolo.runner.parse_args, so kolo.run and the kolorun script share them)."""
    from kolo.exceptions import ConfigError
    from kolo.runner import parse_args

    parsed = parse_args(["-np", "4", "--min-np", "2", "--max-np", "8", "--slots", "2",
                         "--blacklist-cooldown-range", "10", "100", "--host-discovery-script",
                         "/d.sh", "python", "train.py"])  # fmt: skip
    assert parsed["elastic"] is True and parsed["notices"] == []
    assert (parsed["num_proc"], parsed["min_num_proc"], parsed["max_num_proc"]) == (4, 2, 8)
    assert parsed["slots_per_host"] == 2 and parsed["cooldown_range"] == (10, 100)
    fixed = parse_args(["-np", "2", "--max-np", "4", "x"])
    assert fixed["elastic"] is False
    assert [flag for flag, _ in fixed["notices"]] == ["--max-np"]
    cases = {
        "--min-np 3 is more than --max-np 2": ["-np", "2", "--min-np", "3", "--max-np", "2"],
        "-np 1 is less than --min-np 2": ["-np", "1", "--min-np", "2"],
        "-np 5 is more than --max-np 4": ["-np", "5", "--min-np", "2", "--max-np", "4"],
        "give the hosts once": ["-np", "2", "--host-discovery-script", "/d.sh", "-H", "a:2"],
        "lower limit of 1": ["-np", "2", "--blacklist-cooldown-range", "0", "10"],
        "upper limit of 3600": ["-np", "2", "--blacklist-cooldown-range", "1", "3601"],
        "MIN 9 is more than MAX 3": ["-np", "2", "--blacklist-cooldown-range", "9", "3"],
        "drop --mpi": ["-np", "2", "--min-np", "2", "--mpi"],
        "needs -np N": ["--host-discovery-script", "/d.sh"],
        '--elastic-timeout "0"': ["-np", "2", "--elastic-timeout", "0"],
    }
    for said, options in cases.items():
        with pytest.raises(ConfigError, match=re.escape(said)):
            parse_args([*options, "python", "train.py"])


def test_network_interfaces_list_reaches_the_driver_data_plane_and_nccl() -> None:
    names = ("NCCL_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "KOLO_DATA_ADDR", "KOLO_DRIVER_ADDR")
    _, ranks = run_print_env(["-np", "2", "--network-interfaces", "lo,lo"], names)
    assert sorted(ranks) == [0, 1]
    for info in ranks.values():
        assert info["env"]["NCCL_SOCKET_IFNAME"] == "lo"
        assert info["env"]["HOROVOD_GLOO_IFACE"] == "lo"
        assert info["env"]["KOLO_DATA_ADDR"] == "lo"
        assert info["env"]["KOLO_DRIVER_ADDR"].startswith("127.0.0.1:")


ENGINE_CORES = """
import glob, time, torch, kolo.torch as hvd
hvd.init()

def engine_cores():
    for path in glob.glob('/proc/self/task/*/status'):
        try:
            text = open(path).read()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        fields = dict(line.split(':\\t', 1) for line in text.splitlines())
        if fields['Name'] == 'kolo-engine':
            return fields['Cpus_allowed_list']

deadline = time.monotonic() + 20  # the engine thread may not have run yet
while engine_cores() is None and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.2)  # named before it pins itself
print(f"engine of local rank {hvd.local_rank()} on {engine_cores()}")
hvd.allreduce(torch.zeros(1))  # no rank leaves (stopping the others' engines) before all read
"""


def test_thread_affinity_pins_each_engine_thread_to_its_core() -> None:
    """Horovod's HOROVOD_THREAD_AFFINITY: one core per local rank, read by the real engine."""
    result = run_kolorun(["-np", "1", "--thread-affinity", "1", "python", "-c", ENGINE_CORES])
    assert result.returncode == 0, result.stderr
    assert "engine of local rank 0 on 1\n" in result.stdout, result.stdout
    result = run_kolorun(
        ["-np", "2", "python", "-c", ENGINE_CORES], env={"HOROVOD_THREAD_AFFINITY": "1,0"}
    )
    assert result.returncode == 0, result.stderr
    assert "[0]<stdout>:engine of local rank 0 on 1" in result.stdout, result.stdout
    assert "[1]<stdout>:engine of local rank 1 on 0" in result.stdout, result.stdout
    # One core for two local ranks: Horovod logs an error and pins nothing.
    result = run_kolorun(["-np", "2", "--thread-affinity", "1", "python", "-c", ENGINE_CORES])
    assert result.returncode == 0, result.stderr
    assert "expected 2 core ids" in result.stderr, result.stderr
    assert "engine of local rank 0 on 0-" in result.stdout, result.stdout


def test_log_lines_show_the_time_unless_hidden() -> None:
    joined = INIT
    stamp = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}: kolo INFO pid \d+\] joined job"
    for flags, shown in (
        ([], True),
        (["--log-with-timestamp"], True),
        (["--log-without-timestamp"], False),
        (["--log-hide-timestamp", "--no-log-hide-timestamp"], True),
    ):
        result = run_kolorun(["-np", "1", "--log-level", "info", *flags, "python", "-c", joined])
        assert result.returncode == 0, result.stderr
        assert "kolorun: note" not in result.stderr, result.stderr
        assert bool(re.search(stamp, result.stderr)) == shown, (flags, result.stderr)
        assert "[0]<stderr>:[kolo INFO pid" in result.stderr or shown, result.stderr


SIMULATED_HOSTS = (
    "import os; index = int(os.environ['KOLO_TASK_INDEX']); "
    "os.environ['KOLO_HOSTNAME'] = f'simhost{index // 2}'; "
    "import torch, kolo.torch as hvd; hvd.init(); "
    "s = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum).tolist(); "
    "g = hvd.allgather(torch.tensor([hvd.rank()])).tolist(); "
    "print(f'rank {hvd.rank()} local {hvd.local_rank()} of {hvd.local_size()}: {s} {g}')"
)


def test_hierarchical_flags_choose_each_collectives_path() -> None:
    """Two simulated hosts of two ranks: --no-hierarchical-allreduce runs allreduce as a flat
    TCP ring while allgather keeps the hierarchical path (--hierarchical-allgather)."""
    result = run_kolorun(
        ["-np", "4", "--log-level", "debug", "--no-hierarchical-allreduce",
         "--hierarchical-allgather", "python", "-c", SIMULATED_HOSTS],
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kolorun: note" not in result.stderr, result.stderr
    for rank in range(4):
        line = f"rank {rank} local {rank % 2} of 2: [10.0, 10.0, 10.0] [0, 1, 2, 3]"
        assert line in result.stdout, result.stdout
    assert result.stderr.count("layout hierarchical") == 4, result.stderr
    assert result.stderr.count("allreduce across hosts: a flat TCP ring") == 4, result.stderr
    assert result.stderr.count("allgather across hosts: hierarchical") == 4, result.stderr


def test_a_hostfile_entry_that_looks_like_an_ssh_option_is_refused_and_runs_nothing(
    tmp_path,
) -> None:
    # ssh would read `-oProxyCommand=...` as an option and run it through the local shell.
    marker = tmp_path / "proxy-command-ran"
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"-oProxyCommand=touch${{IFS}}{marker} slots=1\n")
    result = run_kolorun(["--hostfile", str(hostfile), "-np", "1", "true"], timeout=60)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert f"{hostfile} line 1" in result.stderr, result.stderr
    assert "-oProxyCommand" in result.stderr and "option" in result.stderr, result.stderr
    assert not marker.exists()
    result = run_kolorun(["-H", f"-oProxyCommand=touch {marker}", "true"], timeout=60)
    assert result.returncode == 2 and "-H entry" in result.stderr, result.stderr
    assert not marker.exists()


def _peak_rss_kib(pid: int) -> int:
    """VmHWM (the peak resident set) of a live process, in KiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def test_a_rank_writing_1_gib_without_a_newline_keeps_kolorun_memory_bounded() -> None:
    # The rank writes 1 GiB of 'a' and no newline; kolorun forwards it in 64 KiB pieces, each
    # with the rank prefix, holding one piece at a time.
    gib = 1 << 30
    process = subprocess.Popen(
        [str(BIN / "kolorun"), "-np", "1", "sh", "-c", "head -c 1G /dev/zero | tr '\\0' a"],
        cwd=REPO,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    peak_kib = 0
    total = newlines = 0
    first = b""
    deadline = time.monotonic() + 60
    while True:
        chunk = process.stdout.read1(1 << 20)
        if not chunk:
            break
        if len(first) < 64:
            first += chunk[: 64 - len(first)]
        total += len(chunk)
        newlines += chunk.count(b"\n")
        peak_kib = max(peak_kib, _peak_rss_kib(process.pid))
        assert time.monotonic() < deadline, "kolorun did not finish forwarding within 60 s"
    peak_kib = max(peak_kib, _peak_rss_kib(process.pid))
    assert process.wait(timeout=30) == 0, process.stderr.read()[-3000:]
    prefix = b"[0]<stdout>:"
    pieces = gib // (64 << 10)
    assert first.startswith(prefix + b"aaaa"), first
    assert newlines == pieces, newlines
    assert total == gib + pieces * (len(prefix) + 1), total
    # A Python interpreter with kolo loaded is ~100 MiB; a held 1 GiB line would show.
    assert 0 < peak_kib < 300 * 1024, f"kolorun peaked at {peak_kib} KiB"


def test_mpirun_path_refuses_option_like_hosts_too(tmp_path) -> None:
    from kolo._mpirun import OPEN_MPI, mpirun_argv
    from kolo.exceptions import ConfigError
    from kolo.runner import parse_args

    hostfile = tmp_path / "hosts"
    hostfile.write_text("-oProxyCommand=touch${IFS}/tmp/x slots=1\n")
    for args in (
        ["--mpi", "-H", "-oProxyCommand=x:1", "true"],
        ["--mpi", "-H", "me@-oProxyCommand=x", "true"],
        ["--mpi", "--hostfile", str(hostfile), "true"],
    ):
        with pytest.raises(ConfigError, match="refused"):
            mpirun_argv(parse_args(args), OPEN_MPI, [])
    ok = mpirun_argv(parse_args(["--mpi", "-H", "node1:2,me@node2:2", "true"]), OPEN_MPI, [])
    assert "node1:2,me@node2:2" in ok
