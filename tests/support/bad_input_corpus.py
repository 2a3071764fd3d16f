"""An adversarial corpus of malformed scenario files, and a harness that runs it.

Every case is a scenario file (plus, for some, command-line arguments or files beside it)
that ``mecsim validate`` and ``mecsim run`` must refuse: exit code 2, one line per
problem naming the file and the field (or the setting), no traceback, nothing written,
no code run, no file content echoed.

The corpus is used two ways:

- ``tests/unit/interfaces/test_bad_input.py`` runs every case in-process through
  ``mecsim.interfaces.cli.main``;
- ``python tests/support/bad_input_corpus.py [--src DIR] [--only NAME...]`` runs every case
  in a subprocess against the source tree ``DIR`` (default: this checkout) and prints the
  tally of outcomes, so a tree without the checks can be compared with one that has them.
"""

from __future__ import annotations

import copy
import os
import pickle
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: A small valid scenario: 4 clients, 400 training images, 1 round, in-process. Each case
#: breaks one thing in it (so a case that is wrongly accepted trains for a few seconds).
BASE: dict[str, Any] = {
    "name": "corpus",
    "seed": 1,
    "rounds": 1,
    "dataset": {
        "name": "mnist-embedded",
        "train_size": 400,
        "test_size": 100,
        "partition": {"method": "iid"},
    },
    "model": {"name": "mlp_2nn"},
    "topology": {"clients": 4},
    "channel": {"model": "shannon"},
    "training": {"epochs": 1, "batch_size": 16, "lr": 0.05},
    "metrics": {"enabled": False},
    "outputs": {"dir": "runs", "table_format": "csv"},
    "execution": {"backend": "local", "hosts": 1},
}

MARKER = "CODE-WAS-EXECUTED"  # a crafted pickle would create this file beside the scenario


@dataclass
class Case:
    """One malformed input. ``text`` is the scenario file (bytes), ``args`` extra
    ``mecsim run`` arguments (``{DIR}`` is replaced by the case directory), ``field`` a
    string the refusal must contain (the field or setting it names), ``validate`` whether
    ``mecsim validate`` alone must refuse it too (False for command-line settings)."""

    name: str
    text: bytes
    field: str
    args: list[str] = field(default_factory=list)
    validate: bool = True
    setup: Callable[[Path], None] | None = None
    scenario_path: str | None = None  # use this path instead of the written file
    forbidden: tuple[str, ...] = ()  # strings that must not appear in the output
    # run without root's powers (privileged ports, permission bits): in-process tests
    # skip it under root, the subprocess harness drops the capabilities (setpriv)
    unprivileged: bool = False
    busy_port: bool = False  # {BUSY_PORT} in text/args: a port held open during the run


def _dump(data: dict[str, Any]) -> bytes:
    return yaml.safe_dump(data, sort_keys=False).encode()


def _with(path: str, value: Any, base: dict[str, Any] | None = None) -> bytes:
    """BASE with the dotted ``path`` set to ``value`` (intermediate mappings created)."""
    data = copy.deepcopy(BASE if base is None else base)
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return _dump(data)


def _merge(**sections: Any) -> bytes:
    data = copy.deepcopy(BASE)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict) and key != "channel":
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return _dump(data)


def _raw(text: str) -> bytes:
    """BASE followed by raw YAML text (for what a dict cannot express)."""
    return _dump(BASE) + text.encode()


class _Exec:
    """A pickle payload that runs a shell command when unpickled."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _cifar_dir(payload: bytes) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        root = d / "cifar" / "cifar-10-batches-py"
        root.mkdir(parents=True)
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            (root / name).write_bytes(payload)

    return setup


def _mkdir(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).mkdir(parents=True)


def _touch(name: str, text: str = "x\n") -> Callable[[Path], None]:
    return lambda d: (d / name).write_text(text)


def _nest(depth: int, open_: str, close: str) -> bytes:
    return _raw(f"description: {open_ * depth}{close * depth}\n")


def _alias_bomb() -> bytes:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 9)}]")
    body = "\n".join(lines) + "\n"
    return _dump(BASE) + (body + "evaluation: {target_accuracy: *a9}\n").encode()


def cases() -> list[Case]:
    """The corpus (a fresh list; cases are materialised by :func:`materialise`)."""
    exec_payload = pickle.dumps(_Exec(f"touch {MARKER}"), protocol=2)
    tiny_profile = {
        "flops_per_s": 1e9,
        "step_overhead_s": 0.0,
        "ram_bytes": 1000,
        "flops_source": "test",
        "step_overhead_source": "test",
    }
    inf_profile = {**tiny_profile, "ram_bytes": 2**30, "flops_per_s": float("inf")}
    c = [
        # ------------------------------------------------------------- encoding, YAML shape
        Case("invalid_utf8", _dump(BASE) + b"description: caf\xe9 \xff\xfe\n", "UTF-8"),
        Case("nul_byte", _dump(BASE) + b"description: a\x00b\n", "YAML"),
        Case("duplicate_top_key", _raw("rounds: 3\n"), "duplicate key 'rounds'"),
        Case(
            "duplicate_nested_key",
            _dump({k: v for k, v in BASE.items() if k != "training"})
            + b"training:\n  lr: 0.1\n  batch_size: 16\n  lr: 0.2\n",
            "duplicate key 'lr'",
        ),
        Case("deep_flow_sequence", _nest(20000, "[", "]"), "nest"),
        Case(
            "deep_flow_mapping",
            _raw("description: " + "{a: " * 20000 + "1" + "}" * 20000 + "\n"),
            "nest",
        ),
        Case("empty_file", b"", "empty scenario"),
        Case("comments_only", b"# nothing here\n\n# at all\n", "empty scenario"),
        Case("top_level_list", b"- rounds: 1\n- seed: 2\n", "top level"),
        Case("top_level_scalar", b"just some text\n", "top level"),
        Case(
            "python_object_tag",
            _raw(f"description: !!python/object/apply:os.system ['touch {MARKER}']\n"),
            "YAML",
        ),
        # 9**10 values written in ten short lines: refused while read, not after
        Case("alias_bomb", _alias_bomb(), "100,000 values"),
        Case(
            "wide_mapping",
            _raw("description: {" + ", ".join(f"k{i}: 1" for i in range(5000)) + "}\n"),
            "more than 1,000 keys",
        ),
        Case("long_scalar", _raw("description: " + "x" * 70_000 + "\n"), "65,536 characters"),
        Case("oversized_file", _dump(BASE) + b"# padding\n" * 220_000, "larger than"),
        Case(
            "scenario_is_directory",
            b"",
            "cannot read",
            scenario_path="{DIR}/adir",
            setup=_mkdir("adir"),
        ),
        Case("scenario_is_char_device", b"", "not a regular file", scenario_path="/dev/zero"),
        # ---------------------------------------------------------------- non-finite numbers
        Case("lr_inf", _with("training.lr", float("inf")), "training.lr"),
        Case("lr_nan", _with("training.lr", float("nan")), "training.lr"),
        Case(
            "snr_offset_minus_inf",
            _with("channel.snr_offset_db", float("-inf")),
            "channel.snr_offset_db",
        ),
        Case(
            "distance_nan", _with("channel.distance_m", [float("nan"), 500.0]), "channel.distance_m"
        ),
        Case(
            "distance_negative", _with("channel.distance_m", [-100.0, 500.0]), "channel.distance_m"
        ),
        Case(
            "distance_reversed", _with("channel.distance_m", [500.0, 100.0]), "channel.distance_m"
        ),
        Case(
            "bandwidth_inf",
            _with("channel.uplink.bandwidth_hz", float("inf")),
            "channel.uplink.bandwidth_hz",
        ),
        Case(
            "bandwidth_zero",
            _with("channel.uplink.bandwidth_hz", [0.0, 1e6]),
            "channel.uplink.bandwidth_hz",
        ),
        Case(
            "tx_power_nan",
            _with("channel.uplink.tx_power_dbm", float("nan")),
            "channel.uplink.tx_power_dbm",
        ),
        Case(
            "tx_power_overflows",
            _with("channel.uplink.tx_power_dbm", 1e6),
            "channel.uplink.tx_power_dbm",
        ),
        Case(
            "downlink_power_inf",
            _with("channel.downlink.tx_power_dbm", float("inf")),
            "channel.downlink.tx_power_dbm",
        ),
        Case("path_loss_nan", _with("channel.path_loss_db", float("nan")), "channel.path_loss_db"),
        Case(
            "pathloss_3gpp_without_carrier",
            _with("channel.path_loss", {"model": "38.901-umi"}),
            "channel.path_loss.carrier_ghz",
        ),
        Case(
            "pathloss_carrier_above_100_ghz",
            _with("channel.path_loss", {"model": "38.901-uma", "carrier_ghz": 140.0}),
            "channel.path_loss.carrier_ghz",
        ),
        Case(
            "pathloss_3gpp_distance_below_10_m",
            _merge(
                channel={
                    "model": "shannon",
                    "distance_m": [1.0, 500.0],
                    "path_loss": {"model": "38.901-umi", "carrier_ghz": 3.5},
                }
            ),
            "channel.distance_m",
        ),
        Case(
            "geometry_sites_not_edge_servers",
            _with("geometry", {"sites": {"layout": "hex", "rings": 1}}),
            "topology.edge_servers",
        ),
        Case(
            "geometry_client_outside_the_area",
            _merge(
                topology={"clients": 4, "edge_servers": 1},
                geometry={
                    "area": {"width_m": 500.0, "height_m": 500.0},
                    "sites": {"layout": "explicit", "positions_m": [[250.0, 250.0]]},
                    "clients": {
                        "placement": "explicit",
                        "positions_m": [[10.0, 10.0], [20.0, 20.0], [30.0, 30.0], [600.0, 1.0]],
                    },
                },
            ),
            "geometry.clients.positions_m.3",
        ),
        Case(
            "geometry_strongest_without_a_radio_channel",
            _merge(
                channel={
                    "model": "fixed_rate",
                    "uplink": {"rate_bps": 1e6},
                    "downlink": {"rate_bps": 1e6},
                },
                geometry={"sites": {"rings": 0}, "association": {"rule": "strongest"}},
            ),
            "geometry.association.rule",
        ),
        Case(
            "noise_psd_inf",
            _with("channel.noise_psd_dbm_per_hz", float("inf")),
            "channel.noise_psd_dbm_per_hz",
        ),
        Case(
            "interference_mean_nan",
            _with("channel.interference", {"unit": "noise", "uplink_mean": float("nan")}),
            "channel.interference.uplink_mean",
        ),
        Case("deadline_inf", _with("deadline_s", float("inf")), "deadline_s"),
        Case(
            "backhaul_latency_nan", _with("backhaul.latency_s", float("nan")), "backhaul.latency_s"
        ),
        Case(
            "weight_decay_inf",
            _with("training.weight_decay", float("inf")),
            "training.weight_decay",
        ),
        Case(
            "fixed_rate_inf",
            _merge(
                channel={
                    "model": "fixed_rate",
                    "uplink": {"rate_bps": float("inf")},
                    "downlink": {"rate_bps": 1e6},
                }
            ),
            "channel.uplink.rate_bps",
        ),
        Case(
            "dirichlet_alpha_inf",
            _with("dataset.partition", {"method": "dirichlet", "alpha": float("inf")}),
            "dataset.partition.alpha",
        ),
        Case(
            "profile_flops_inf",
            _merge(devices={"clients": [{"profile": "x"}], "profiles": {"x": inf_profile}}),
            "devices.profiles.x.flops_per_s",
        ),
        Case(
            "target_accuracy_nan",
            _with("evaluation.target_accuracy", [float("nan")]),
            "evaluation.target_accuracy",
        ),
        Case(
            "algorithm_param_nan",
            _merge(algorithm={"name": "fedprox", "params": {"mu": float("nan")}}),
            "algorithm.params.mu",
        ),
        # ------------------------------------------- a dedicated band and a shared medium
        Case(
            "uplink_own_bands_shared",  # each client its own band, and time-shared too
            _merge(
                channel={
                    "model": "shannon",
                    "uplink": {"bandwidth_hz": [10e6, 30e6], "shared": True},
                }
            ),
            "channel.uplink.access",
        ),
        Case(
            "uplink_dedicated_but_shared",
            _merge(channel={"model": "shannon", "uplink": {"access": "dedicated", "shared": True}}),
            "channel.uplink.access",
        ),
        Case(
            "uplink_cell_band_per_client",  # the cell's band cannot be drawn per client
            _merge(
                channel={
                    "model": "shannon",
                    "uplink": {"access": "shared_cell", "bandwidth_hz": [10e6, 30e6]},
                }
            ),
            "channel.uplink.access",
        ),
        # ------------------------------------------------------------------------- seeds
        Case("seed_float_1e23", _with("seed", 1e23), "seed"),
        Case("seed_text_1e23", _raw("seed: 1e23\n").replace(b"seed: 1\n", b""), "seed"),
        Case("seed_beyond_64_bits", _with("seed", 2**70), "seed"),
        Case("seed_boolean", _with("seed", True), "seed"),
        Case("seed_negative", _with("seed", -1), "seed"),
        # ------------------------------------------------------------------- cross-field
        Case(
            "mtfl_fedavg_adam_with_sgd",
            _merge(
                algorithm={"name": "mtfl", "params": {"strategy": "fedavg_adam"}},
                training={"optimizer": "sgd"},
            ),
            "training.optimizer",
        ),
        Case(
            "mtfl_private_bn_without_bn",
            _merge(
                algorithm={"name": "mtfl", "params": {"private": "yb"}}, model={"name": "kapc_cnn"}
            ),
            "algorithm",
        ),
        Case(
            "phsfl_cut_layer_beyond_model",
            _merge(
                algorithm={"name": "phsfl", "params": {"cut_layer": 50}},
                model={"name": "phsfl_cnn"},
            ),
            "algorithm.params.cut_layer",
        ),
        Case(
            "phsfl_on_resnet18",
            _merge(algorithm={"name": "phsfl"}, model={"name": "resnet18"}),
            "model",
        ),
        Case(
            "dcpfl_partial_participation",
            _merge(algorithm={"name": "dcpfl"}, topology={"clients": 4, "participation": 0.5}),
            "topology.participation",
        ),
        Case(
            "kmeans_more_clusters_than_clients",
            _merge(algorithm={"name": "kmeans_cluster", "params": {"clusters": 9}}),
            "algorithm.params.clusters",
        ),
        Case(
            "device_groups_exceed_clients",
            _merge(
                devices={
                    "clients": [{"profile": "rpi4", "count": 3}, {"profile": "rpi2b", "count": 3}]
                }
            ),
            "devices.clients",
        ),
        Case("more_clients_than_samples", _with("topology.clients", 500), "topology.clients"),
        Case("a_trillion_clients", _with("topology.clients", 10**12), "topology.clients"),
        Case(
            "embedded_pools_too_large",
            _with("dataset", {"name": "mnist-embedded", "train_size": 9000, "test_size": 2000}),
            "dataset",
        ),
        Case(
            "too_many_shards",
            _with("dataset.partition", {"method": "shards", "shards_per_client": 200}),
            "dataset.partition",
        ),
        Case(
            "batch_no_machine_can_hold",
            _with("training.batch_size", 100_000_000),
            "training.batch_size",
        ),
        Case(
            "batch_exceeds_device_ram",
            _merge(training={"batch_size": 150_000}, devices={"clients": [{"profile": "rpi2b"}]}),
            "training.batch_size",
        ),
        Case(
            "device_with_no_ram",
            _merge(devices={"clients": [{"profile": "tiny"}], "profiles": {"tiny": tiny_profile}}),
            "training.batch_size",
        ),
        Case("batch_of_one_with_batchnorm", _with("training.batch_size", 1), "training.batch_size"),
        Case(
            "algorithm_params_not_a_mapping",
            _with("algorithm", {"name": "fedavg", "params": [1, 2]}),
            "algorithm.params",
        ),
        # ------------------------------------------------------------- ports and hosts
        Case(
            "metrics_port_busy",
            _with("metrics", {"enabled": True, "port": "{BUSY_PORT}"}),
            "metrics.port",
            busy_port=True,
        ),
        Case(
            "metrics_port_privileged",
            _with("metrics", {"enabled": True, "port": 81}),
            "metrics.port",
            unprivileged=True,
        ),
        Case(
            "metrics_port_out_of_range",
            _with("metrics", {"enabled": True, "port": 70000}),
            "metrics.port",
        ),
        Case(
            "metrics_port_flag_out_of_range",
            _with("metrics", {"enabled": True}),
            "metrics.port",
            args=["--metrics-port", "70000"],
            validate=False,
        ),
        Case(
            "metrics_host_unresolvable",
            _with("metrics", {"enabled": True, "host": "no-such-host.invalid", "port": 0}),
            "metrics.host",
        ),
        Case(
            "metrics_host_all_interfaces",
            _with("metrics", {"enabled": True, "host": "0.0.0.0", "port": 0}),
            "metrics.host",
        ),
        Case(
            "ray_address_unresolvable",
            _with("execution", {"backend": "ray", "ray_address": "no-such-host.invalid:6379"}),
            "execution.ray_address",
        ),
        # ------------------------------------------------------------------------- paths
        Case(
            "trace_path_is_directory",
            _merge(channel={"model": "trace", "path": "{DIR}/traces"}),
            "channel.path",
            setup=_mkdir("traces"),
        ),
        Case(
            "trace_path_missing",
            _merge(channel={"model": "trace", "path": "{DIR}/no.csv"}),
            "channel.path",
        ),
        Case(
            "trace_path_etc_passwd",
            _merge(channel={"model": "trace", "path": "/etc/passwd"}),
            "channel.path",
            forbidden=("root:",),
        ),
        Case(
            "trace_path_with_markup",
            _merge(channel={"model": "trace", "path": "{DIR}/a[/]b[bold]/t.csv"}),
            "channel.path",
            forbidden=("MarkupError",),
        ),
        Case(
            "trace_path_char_device",
            _merge(channel={"model": "trace", "path": "/dev/zero"}),
            "channel.path",
        ),
        Case(
            "trace_without_rows_for_a_client",
            _merge(channel={"model": "trace", "path": "{DIR}/t.csv"}),
            "channel",
            setup=_touch("t.csv", "time_s,client_id,uplink_mbps,downlink_mbps\n0,0,1,1\n"),
        ),
        Case(
            "dataset_root_missing",
            _with("dataset", {"name": "mnist", "root": "{DIR}/nope"}),
            "dataset.root",
        ),
        Case(
            "dataset_root_is_a_file",
            _with("dataset", {"name": "mnist", "root": "{DIR}/afile"}),
            "dataset.root",
            setup=_touch("afile"),
        ),
        Case(
            "dataset_root_without_files",
            _with("dataset", {"name": "cifar10", "root": "{DIR}/empty"}),
            "dataset",
            setup=_mkdir("empty"),
        ),
        Case(
            "cifar_crafted_pickle",
            _with("dataset", {"name": "cifar10", "root": "{DIR}/cifar"}),
            "dataset",
            setup=_cifar_dir(exec_payload),
        ),
        Case(
            "cifar_not_a_pickle",
            _with("dataset", {"name": "cifar10", "root": "{DIR}/cifar"}),
            "dataset",
            setup=_cifar_dir(b"\x00garbage, not a pickle" * 10),
        ),
        # ------------------------------------------------------------ names and outputs
        Case("run_id_traversal", _with("outputs.run_id", "../../escaped"), "outputs.run_id"),
        Case("run_id_with_slash", _with("outputs.run_id", "a/b"), "outputs.run_id"),
        Case("run_id_too_long", _with("outputs.run_id", "r" * 300), "outputs.run_id"),
        Case("run_id_dot_dot", _with("outputs.run_id", ".."), "outputs.run_id"),
        Case("name_traversal", _with("name", "../../escaped"), "name"),
        Case("name_with_markup", _with("name", "[bold]x[/]"), "name"),
        Case(
            "run_id_flag_traversal",
            _dump(BASE),
            "run_id",
            args=["--run-id", "../escaped"],
            validate=False,
        ),
        Case(
            "outputs_dir_is_a_file",
            _with("outputs.dir", "{DIR}/afile"),
            "outputs.dir",
            setup=_touch("afile"),
        ),
        Case(
            "outputs_dir_not_writable",
            _with("outputs.dir", "{DIR}/locked/runs"),
            "outputs.dir",
            setup=lambda d: (d / "locked").mkdir(mode=0o555),
            unprivileged=True,
        ),
        Case(
            "run_folder_exists",
            _with("outputs.run_id", "taken"),
            "outputs.run_id",
            setup=_mkdir("runs/taken"),
        ),
        Case("misspelt_field", _with("topology.participaton", 0.5), "topology.participaton"),
    ]
    names = [x.name for x in c]
    assert len(names) == len(set(names)), "case names must be unique"
    return c


def materialise(case: Case, directory: Path, port: int | None = None) -> tuple[Path, list[str]]:
    """Write the case into ``directory``: returns (scenario path, extra run arguments).

    ``{DIR}`` in the text and arguments becomes ``directory``, ``{BUSY_PORT}`` becomes
    ``port`` (a port the caller holds open, see :func:`busy_port`).
    """
    directory.mkdir(parents=True, exist_ok=True)
    if case.setup is not None:
        case.setup(directory)
    text = case.text.replace(b"{DIR}", str(directory).encode())
    if port is not None:
        text = text.replace(b"'{BUSY_PORT}'", str(port).encode())
    path = directory / f"{case.name}.yaml"
    if case.scenario_path is None:
        path.write_bytes(text)
    else:
        path = Path(case.scenario_path.replace("{DIR}", str(directory)))
    args = [a.replace("{DIR}", str(directory)) for a in case.args]
    return path, args


def busy_port() -> socket.socket:
    """A listening socket on 127.0.0.1 (keep it open while the case runs)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def snapshot(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


# ------------------------------------------------------------------------ the tally


@dataclass
class Outcome:
    case: str
    command: str
    flags: list[str]  # see judge(); ["clean"] when refused as it should be
    code: int | None
    first_line: str


def judge(
    case: Case,
    command: str,
    code: int | None,
    out: str,
    err: str,
    path: Path,
    before: set[str],
    after: set[str],
    directory: Path,
) -> list[str]:
    """Every way the outcome falls short (several can hold at once), or ["clean"]:

    hang (no exit in time), code-run (the crafted input ran code), traceback (a Python
    traceback or an exit code other than 0 and 2), accepted (exit 0: silently taken),
    written (files left behind although the input is bad: a half-written run folder),
    echoed (a file's contents in the output), unclear (exit 2 without a line naming the
    file and the field)."""
    text = out + err
    flags = []
    if code is None:
        flags.append("hang")
    if (directory / MARKER).exists():
        flags.append("code-run")
    if "Traceback" in text or code not in (None, 0, 2):
        flags.append("traceback")
    if code == 0:
        flags.append("accepted")
    if after - before - {MARKER}:
        flags.append("written")
    if any(s in text for s in case.forbidden):
        flags.append("echoed")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if code == 2 and (
        not lines or case.field not in err or not any(path.name in ln for ln in lines)
    ):
        flags.append("unclear")
    return flags or ["clean"]


#: Root without the powers that make these cases moot: binding ports below 1024 and
#: ignoring permission bits (util-linux setpriv drops them from the bounding set).
UNPRIVILEGED_PREFIX = ["setpriv", "--bounding-set=-net_bind_service,-dac_override,-dac_read_search"]


def _run_subprocess(
    src: Path, argv: list[str], cwd: Path, timeout: float, unprivileged: bool
) -> tuple[int | None, str, str]:
    import resource
    import subprocess

    home = cwd.parent / f"{cwd.name}.home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(src),
        "HOME": str(home),
        "MPLCONFIGDIR": str(home / "mpl"),
        "COLUMNS": "200",
    }

    def limits() -> None:  # a runaway allocation fails instead of taking the machine
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    prefix = UNPRIVILEGED_PREFIX if unprivileged and os.geteuid() == 0 else []
    try:
        p = subprocess.run(
            [*prefix, sys.executable, "-m", "mecsim", *argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=limits,
            errors="replace",
        )
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:

        def txt(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        return None, txt(exc.stdout), txt(exc.stderr)


def tally(
    src: Path, work: Path, only: list[str] | None = None, timeout: float = 180.0
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for case in cases():
        if only and case.name not in only:
            continue
        for command in ("validate", "run"):
            if command == "validate" and not case.validate:
                continue
            directory = work / f"{case.name}-{command}"
            holder = busy_port() if case.busy_port else None
            try:
                port = holder.getsockname()[1] if holder is not None else None
                path, args = materialise(case, directory, port)
                before = snapshot(directory)
                argv = (
                    ["validate", str(path)]
                    if command == "validate"
                    else ["run", str(path), "--no-plots", *args]
                )
                code, out, err = _run_subprocess(src, argv, directory, timeout, case.unprivileged)
                after = snapshot(directory)
            finally:
                if holder is not None:
                    holder.close()
            flags = judge(case, command, code, out, err, path, before, after, directory)
            first = next((ln for ln in (err + out).splitlines() if ln.strip()), "")
            outcomes.append(Outcome(case.name, command, flags, code, first[:160]))
            print(f"{'+'.join(flags):20s} {command:8s} {case.name}: {first[:150]}", flush=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    import argparse
    import collections
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--src",
        default=str(Path(__file__).resolve().parents[2]),
        help="source tree to test (its mecsim, agents and channel packages)",
    )
    p.add_argument("--only", nargs="*", help="case names")
    p.add_argument("--timeout", type=float, default=180.0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mecsim-corpus-") as tmp:
        outcomes = tally(Path(args.src), Path(tmp), args.only, args.timeout)
    for command in ("validate", "run"):
        mine = [o for o in outcomes if o.command == command]
        counts = collections.Counter(f for o in mine for f in o.flags)
        bad = sum(o.flags != ["clean"] for o in mine)
        print(
            f"{command}: {len(mine)} cases, {len(mine) - bad} refused cleanly, {bad} not; "
            "flags: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        )
    print(f"{len(cases())} cases in the corpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
