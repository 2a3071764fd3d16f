# Copyright Flower Labs GmbH. Licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0). Copied from Flower's examples/advanced-pytorch
# (github.com/adap/flower, commit fdef7afb1dca3030553be302366cfd285ed6632c) for mecsim's
# tests; changed: the data loading reads mecsim's embedded MNIST (no network here):
# load_data, the transforms as tensor arithmetic (no torchvision), and
# load_global_test_set for the server; and UserConfig imported from flwr.app, where
# Flower 1.38-1.42 have it (flwr.common.typing has it no more); nothing else.
"""pytorch-example: A Flower / PyTorch app."""

import json
from datetime import datetime
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from flwr.app import UserConfig  # mecsim: flwr.common.typing in the original (not in 1.38-1.42)
from torch.utils.data import DataLoader

FM_NORMALIZATION = ((0.1307,), (0.3081,))


def EVAL_TRANSFORMS(img):
    """mecsim: torchvision's Compose([ToTensor(), Normalize(*FM_NORMALIZATION)]) as
    tensor arithmetic, on a 28x28 uint8 image: a 1x28x28 float tensor."""
    (mean,), (std,) = FM_NORMALIZATION
    return (img.to(torch.float32).reshape(1, 28, 28) / 255.0 - mean) / std


def TRAIN_TRANSFORMS(img):
    """mecsim: torchvision's Compose([RandomCrop(28, padding=4), RandomHorizontalFlip(),
    ToTensor(), Normalize(*FM_NORMALIZATION)]) as tensor arithmetic: the image padded
    with 4 black pixels a side, a 28x28 crop at an offset drawn from torch's generator
    (as torchvision draws it), flipped left-right with probability 0.5, normalised."""
    padded = F.pad(img.to(torch.float32).reshape(1, 28, 28), (4, 4, 4, 4))
    top, left = (int(v) for v in torch.randint(0, 9, (2,)))
    crop = padded[:, top : top + 28, left : left + 28]
    if torch.rand(1) < 0.5:
        crop = crop.flip(-1)
    (mean,), (std,) = FM_NORMALIZATION
    return (crop / 255.0 - mean) / std


class Net(nn.Module):
    """Model (simple CNN adapted for Fashion-MNIST)"""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 32 * 4 * 4)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["image"]
            labels = batch["label"]
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()

    avg_trainloss = running_loss / len(trainloader)
    return avg_trainloss


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["image"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy


class _Images(torch.utils.data.Dataset):
    """mecsim: images of mecsim's embedded MNIST (uint8) and their labels, each item
    {"image": transform(image), "label": label} as the original's with_transform gives."""

    def __init__(self, index, transform):
        import numpy as np

        from mecsim.data.datasets import load_embedded_mnist

        ds = load_embedded_mnist()
        self.images = torch.from_numpy(ds.images[index].reshape(-1, 28, 28))
        self.labels = torch.from_numpy(ds.labels[index].astype(np.int64))
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"image": self.transform(self.images[i]), "label": self.labels[i]}


def load_global_test_set():
    """mecsim: the whole embedded MNIST (10,000 images) with the eval transforms."""
    import numpy as np

    from mecsim.data.datasets import load_embedded_mnist

    return _Images(np.arange(len(load_embedded_mnist().labels)), EVAL_TRANSFORMS)


def load_data(partition_id: int, num_partitions: int):
    """Load partition FashionMNIST data.

    mecsim: the MNIST test set embedded in mecsim (10,000 images) in place of
    Fashion-MNIST's train split, cut by label with Dirichlet(alpha=1.0) shares drawn
    with seed 42 (as DirichletPartitioner(partition_by="label", alpha=1.0, seed=42)
    cuts, redrawn until every partition has its minimum of 10; not its exact draws),
    split 80/20 with seed 42; train and eval transforms as before."""
    import numpy as np

    from mecsim.data.datasets import load_embedded_mnist

    labels = load_embedded_mnist().labels
    rng = np.random.default_rng(42)
    while True:
        parts = [[] for _ in range(num_partitions)]
        for k in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == k))
            cuts = (np.cumsum(rng.dirichlet([1.0] * num_partitions)) * len(idx)).astype(int)
            for part, chunk in zip(parts, np.split(idx, cuts[:-1])):
                part.extend(chunk.tolist())
        if min(len(p) for p in parts) >= 10:
            break
    partition = np.array(sorted(parts[partition_id]))
    # Divide data on each node: 80% train, 20% test
    order = np.random.default_rng(42).permutation(len(partition))
    n_test = int(np.ceil(0.2 * len(partition)))
    train_partition = _Images(partition[order[n_test:]], TRAIN_TRANSFORMS)
    test_partition = _Images(partition[order[:n_test]], EVAL_TRANSFORMS)
    trainloader = DataLoader(train_partition, batch_size=32, shuffle=True)
    testloader = DataLoader(test_partition, batch_size=32)
    return trainloader, testloader


def create_run_dir(config: UserConfig) -> tuple[Path, str]:
    """Create a directory where to save results from this run."""
    # Create output directory given current timestamp
    current_time = datetime.now()
    run_dir = current_time.strftime("%Y-%m-%d/%H-%M-%S")
    # Save path is based on the current directory
    save_path = Path.cwd() / f"outputs/{run_dir}"
    save_path.mkdir(parents=True, exist_ok=False)

    # Save run config as json
    with open(f"{save_path}/run_config.json", "w", encoding="utf-8") as fp:
        json.dump(config, fp)

    return save_path, run_dir
