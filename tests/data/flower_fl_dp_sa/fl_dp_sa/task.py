# Copyright Flower Labs GmbH. Licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0). Copied from Flower's examples/fl-dp-sa
# (github.com/adap/flower, commit e818710190b2debe2aa63840298cb662df4d6945) for mecsim's
# tests; changed: load_data reads mecsim's embedded MNIST (no network
# here), nothing else.
"""fl_dp_sa: Flower Example using Differential Privacy and Secure Aggregation."""

from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_size = x.size(0)
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(batch_size, -1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def load_data(partition_id: int, num_partitions: int):
    """Load partition MNIST data.

    mecsim: the MNIST test set embedded in mecsim (10,000 images; no network here, and
    no flwr-datasets or torchvision) in place of Hugging Face's ylecun/mnist, cut as
    IidPartitioner cuts it (equal contiguous shards), split 80/20 with seed 42 and
    normalised as the original's transforms do (ToTensor, Normalize((0.5,), (0.5,)));
    batches of {"image", "label"}, 32 a batch, as before."""
    import numpy as np

    from mecsim.data.datasets import load_embedded_mnist

    ds = load_embedded_mnist()
    shard = np.array_split(np.arange(len(ds.labels)), num_partitions)[partition_id]
    order = np.random.default_rng(42).permutation(len(shard))
    n_test = int(round(0.2 * len(shard)))
    images = (torch.from_numpy(ds.images[shard].astype(np.float32)) / 255.0 - 0.5) / 0.5
    images = images.reshape(-1, 1, 28, 28)
    labels = torch.from_numpy(ds.labels[shard].astype(np.int64))

    def records(idx):
        return [{"image": images[i], "label": labels[i]} for i in idx]

    trainloader = DataLoader(records(order[n_test:]), batch_size=32, shuffle=True)
    testloader = DataLoader(records(order[:n_test]), batch_size=32)
    return trainloader, testloader


def train(net, trainloader, valloader, epochs, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.Adam(net.parameters())
    net.train()
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["image"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()

    train_loss, train_acc = test(net, trainloader, device)
    val_loss, val_acc = test(net, valloader, device)

    results = {
        "train_loss": train_loss,
        "train_accuracy": train_acc,
        "val_loss": val_loss,
        "val_accuracy": val_acc,
    }
    return results


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["image"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images.to(device))
            labels = labels.to(device)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    return loss, accuracy


def get_weights(net):
    return [val.cpu().numpy() for _, val in net.state_dict().items()]


def set_weights(net, parameters):
    params_dict = zip(net.state_dict().keys(), parameters)
    state_dict = OrderedDict({k: torch.tensor(v) for k, v in params_dict})
    net.load_state_dict(state_dict, strict=True)
