"""flowerapp: A Flower / PyTorch app.

As `flwr new` generates it, but for where the final model is saved: the template writes
``final_model.pt`` into the working directory, which under mecsim is that of the process
the ServerApp runs in (on Ray, where Ray was started). Here the path is the run config's
``final-model-path`` (absolute, e.g. in the run's folder or a temporary one); empty, the
default, saves nothing.
"""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flowerapp.task import Net

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    fraction_train: float = context.run_config["fraction-train"]
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["lr"]

    # Load global model
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize FedAvg strategy
    strategy = FedAvg(fraction_train=fraction_train)

    # Start strategy, run FedAvg for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
    )

    # Save final model to disk, where the run config says (nowhere by default)
    path = str(context.run_config.get("final-model-path", ""))
    if path:
        print(f"\nSaving final model to {path}...")
        state_dict = result.arrays.to_torch_state_dict()
        torch.save(state_dict, path)
