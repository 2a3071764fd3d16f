"""Flower's own example apps run on mecsim with only their data loading changed.

tests/data/flower_example_<name> are Flower's examples/quickstart-pytorch,
examples/advanced-pytorch and examples/custom-mods (github.com/adap/flower, commit
fdef7afb), copied with their licence header; only ``load_data`` (and the server's
centralised test set) changed, to read mecsim's embedded MNIST (10,000 images): padded
to 32x32 and repeated to 3 channels where the model is CIFAR-10's. Each runs in-process
(``--backend local``) on 4 clients for 2 rounds; the tests check the rounds, that bytes,
FLOPs and times are charged, that accuracy is recorded, and that the app's own behaviour
(its files, its mods) shows.

The parameter counts are worked from each model's layers:

- quickstart-pytorch and custom-mods (``Net`` of PyTorch's 60-minute blitz, 3 input
  channels): conv1 3*6*5*5 + 6 = 456, conv2 6*16*5*5 + 16 = 2,416, fc1 400*120 + 120 =
  48,120, fc2 120*84 + 84 = 10,164, fc3 84*10 + 10 = 850: 62,006 values;
- advanced-pytorch (Fashion-MNIST's CNN): conv1 1*16*5*5 + 16 = 416, conv2
  16*32*5*5 + 32 = 12,832, fc1 512*128 + 128 = 65,664, fc2 128*10 + 10 = 1,290: 80,202.

A model's message holds its float32 values (4 bytes each) and a little more (array
names, shapes, the config, metadata): each train message down and reply up is at least
4 x values bytes and at most 4,000 bytes more.

FLOPs, as torch's FlopCounterMode counts them (2 a multiply-add; ReLU and pooling not
counted): a sample's forward pass is 2 x its multiply-adds; training adds the backward
pass, 2 x forward for each layer but the first conv (its input needs no gradient: only
the weight's, 1 x forward). Multiply-adds a sample:

- blitz Net (3x32x32 in): conv1 6*28*28 outputs x 75 = 352,800, conv2 16*10*10 x 150 =
  240,000, the linear layers 48,000 + 10,080 + 840 = 58,920; training 2 x 2 x 352,800
  + 3 x 2 x (240,000 + 58,920) = 3,204,720 FLOPs, evaluation 2 x 651,720 = 1,303,440;
- advanced Net (1x28x28 in): conv1 16*24*24 x 25 = 230,400, conv2 32*8*8 x 400 =
  819,200, linear 65,536 + 1,280; training 2 x 2 x 230,400 + 3 x 2 x 886,016 =
  6,237,696 FLOPs.

Each optimiser step adds SGD with momentum's update, 4 FLOPs a parameter (all three
apps train with ``SGD(momentum=0.9)``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from support.paths import DATA

pytest.importorskip("flwr", reason='Flower is not installed: pip install "mecsim[flower]"')

#: quickstart-pytorch's and custom-mods' Net (see the module's docstring)
BLITZ_VALUES = 62_006
#: advanced-pytorch's Net
FMNIST_VALUES = 80_202
#: what a model's message may hold beyond its float32 values
OVERHEAD_BYTES = 4_000
#: training and evaluation FLOPs a sample (see the module's docstring)
BLITZ_TRAIN_FLOPS = 3_204_720
BLITZ_EVAL_FLOPS = 1_303_440
FMNIST_TRAIN_FLOPS = 6_237_696
#: SGD with momentum's update, FLOPs a parameter and step
SGD_MOMENTUM_FLOPS = 4


def run(tmp_path: Path, app: Path, name: str, env=None, **over) -> Path:
    """``mecsim run --backend local`` of ``app`` (4 clients, 2 rounds) in this process
    with ``tmp_path`` as the working directory (the apps write their files there), the
    app's environment switches set for the while; the run's folder."""
    data = {
        "name": name,
        "seed": 0,
        "rounds": 2,
        "topology": {"clients": 4},
        "algorithm": {"name": "flower", "params": {"app": str(app)}},
        "checkpoint": {"every": 0},
        "metrics": {"enabled": False},
        "outputs": {"dir": str(tmp_path / name)},
        **over,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    from mecsim.interfaces.cli import main

    err = io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stderr(err):
            code = main(["run", str(path), "--quiet", "--no-plots", "--backend", "local"])
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert code == 0, err.getvalue()[-2000:]
    return sorted((tmp_path / name).iterdir())[-1]


def check_costs(folder: Path, values: int, train_flops: int, selected: int) -> pd.DataFrame:
    """2 rounds of ``selected`` clients each, every one completed; each train message
    down and each reply up carries the model's ``values`` float32 values (and at most
    OVERHEAD_BYTES more); each trained client charged ``train_flops`` a sample and SGD's
    update a step; times and energy charged. rounds.csv."""
    rounds = pd.read_csv(folder / "rounds.csv")
    clients = pd.read_csv(folder / "clients.csv")
    trained = clients[clients["selected"]]
    assert len(trained) == 2 * selected
    assert (trained["steps"] == np.ceil(trained["num_samples"] / 32)).all()  # batches of 32
    flops = trained["num_samples"] * train_flops + trained["steps"] * values * SGD_MOMENTUM_FLOPS
    assert np.allclose(trained["gflops"], flops / 1e9, rtol=1e-12)
    assert list(rounds["round"]) == [0, 1]  # Flower's rounds 1 and 2
    assert (rounds["selected"] == selected).all() and (rounds["completed"] == selected).all()
    for column in ("bytes_down", "bytes_up"):
        per_message = rounds[column] / selected
        assert (per_message >= 4 * values).all(), column
        assert (per_message <= 4 * values + OVERHEAD_BYTES).all(), column
    assert (rounds["client_gflops"] > 0).all()
    assert (rounds["round_time_s"] > 0).all() and (rounds["energy_j"] > 0).all()
    assert (rounds["eval_time_s"] > 0).all() and (rounds["eval_bytes_up"] > 0).all()
    return rounds


@pytest.mark.slow
def test_flowers_quickstart_pytorch_runs_with_only_its_data_loading_changed(
    tmp_path: Path,
) -> None:
    """quickstart-pytorch: FedAvg over all 4 clients, half of them evaluated a round
    (its fraction-evaluate 0.5), the server's centralised evaluation on the 10,000
    images recorded, and the final model saved where the app saves it (final_model.pt
    in the working directory), with the CNN's 62,006 values."""
    import torch

    folder = run(tmp_path, DATA / "flower_example_quickstart_pytorch", "quickstart")
    rounds = check_costs(folder, BLITZ_VALUES, BLITZ_TRAIN_FLOPS, selected=4)
    # IidPartitioner's 4 shards of the 10,000 images: 2,000 to train, 500 to evaluate
    clients = pd.read_csv(folder / "clients.csv")
    assert (clients.loc[clients["selected"], "num_samples"] == 2000).all()
    assert (rounds["eval_clients"] == 2).all()
    assert np.allclose(rounds["eval_gflops"], 2 * 500 * BLITZ_EVAL_FLOPS / 1e9, rtol=1e-12)
    assert rounds["mean_accuracy"].between(0, 1).all()
    assert rounds["central_accuracy"].between(0, 1).all()
    model = torch.load(tmp_path / "final_model.pt")
    assert sum(t.numel() for t in model.values()) == BLITZ_VALUES


@pytest.mark.slow
def test_flowers_advanced_pytorch_runs_with_only_its_data_loading_changed(
    tmp_path: Path,
) -> None:
    """advanced-pytorch: its CustomFedAvg (fraction-train 0.5 here: 2 of the 4 clients
    a round) on Dirichlet(1.0) label shares, W&B switched off by wandb's own switch
    (WANDB_MODE=disabled); the strategy's own files (outputs/<date>/<time>/: the run
    config, results.json a round, the best model's checkpoint) are written, and its
    server-side accuracy is the one mecsim records as central_accuracy."""
    pytest.importorskip("wandb", reason="advanced-pytorch's strategy.py imports wandb")
    import torch

    folder = run(
        tmp_path,
        DATA / "flower_example_advanced_pytorch",
        "advanced",
        env={"WANDB_MODE": "disabled", "WANDB_SILENT": "true"},
        algorithm={
            "name": "flower",
            "params": {
                "app": str(DATA / "flower_example_advanced_pytorch"),
                "run_config": {"fraction-train": 0.5},
            },
        },
    )
    rounds = check_costs(folder, FMNIST_VALUES, FMNIST_TRAIN_FLOPS, selected=2)
    assert (rounds["eval_clients"] == 2).all()  # fraction-evaluate 0.5
    assert rounds["mean_accuracy"].between(0, 1).all()
    (save_path,) = (tmp_path / "outputs").glob("*/*")
    assert json.loads((save_path / "run_config.json").read_text())["fraction-train"] == 0.5
    results = json.loads((save_path / "results.json").read_text())
    assert [r["round"] for r in results] == [1, 2]
    central = [r["evaluate_metrics_serverapp"]["accuracy"] for r in results]
    assert np.allclose(rounds["central_accuracy"], central, rtol=0, atol=1e-12)
    best = max(central)
    assert list(save_path.glob(f"model_state_acc_{best}_round_*.pth"))
    model = torch.load(tmp_path / "final_model.pt")
    assert sum(t.numel() for t in model.values()) == FMNIST_VALUES


@pytest.mark.slow
def test_flowers_custom_mods_runs_with_only_its_data_loading_changed(tmp_path: Path) -> None:
    """custom-mods: its ClientApp's TensorBoard mod (the one the example switches on;
    the W&B mod stays commented out, as published) wraps every ClientApp call: it
    writes, for each node and round, the metrics the ClientApp returned and the call's
    (host) time; the train losses are the ones mecsim records (2,000 examples); the run's
    costs and accuracies as for quickstart-pytorch (the same CNN on the same data)."""
    pytest.importorskip("wandb", reason="custom-mods' mods.py imports wandb")
    pytest.importorskip("tensorboard", reason="custom-mods' TensorBoard mod needs tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = run(tmp_path, DATA / "flower_example_custom_mods", "mods")
    rounds = check_costs(folder, BLITZ_VALUES, BLITZ_TRAIN_FLOPS, selected=4)
    assert (rounds["eval_clients"] == 2).all()  # fraction-evaluate 0.4, at least 2
    assert rounds["mean_accuracy"].between(0, 1).all()
    assert rounds["central_accuracy"].between(0, 1).all()
    (run_dir,) = (tmp_path / ".runs_history").iterdir()  # one Flower run
    nodes = sorted(run_dir.iterdir())
    assert len(nodes) == 4  # every node trained
    logged: dict[int, list[float]] = {1: [], 2: []}
    evaluated = 0
    for node in nodes:
        events = EventAccumulator(str(node))
        events.Reload()
        assert [e.step for e in events.Scalars("fit_time")] == [1, 2]
        assert all(e.value > 0 for e in events.Scalars("fit_time"))
        # num-examples of its train replies (2,000) and of its evaluate replies (500)
        examples = [e.value for e in events.Scalars("num-examples")]
        assert sorted(examples) == [500] * (len(examples) - 2) + [2000, 2000]
        evaluated += len(examples) - 2
        for e in events.Scalars("train_loss"):
            logged[e.step].append(e.value)
    assert evaluated == 4  # 2 evaluated a round
    clients = pd.read_csv(folder / "clients.csv")
    for rnd, losses in logged.items():
        recorded = clients.loc[clients["round"] == rnd - 1, "train_loss"]
        assert np.allclose(sorted(losses), sorted(recorded), rtol=1e-6)
