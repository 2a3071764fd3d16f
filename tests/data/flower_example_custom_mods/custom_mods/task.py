# Copyright Flower Labs GmbH. Licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0). Copied from Flower's examples/custom-mods
# (github.com/adap/flower, commit fdef7afb1dca3030553be302366cfd285ed6632c) for mecsim's
# tests; changed: load_data and load_centralized_dataset read mecsim's
# embedded MNIST (no network here), nothing else.
"""custom_mods: A Flower app with custom mods."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz')"""

    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def _mnist_as_cifar(index=None):
    """mecsim: images of the MNIST test set embedded in mecsim (10,000; no network here,
    and no flwr-datasets or torchvision) in place of CIFAR-10, shaped as the model wants
    CIFAR-10's: each 28x28 image zero-padded by 2 pixels to 32x32 and repeated to 3
    channels; normalised as the original's transforms do (ToTensor: /255, then
    Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))). Records of {"img", "label"}."""
    import numpy as np

    from mecsim.data.datasets import load_embedded_mnist

    ds = load_embedded_mnist()
    index = np.arange(len(ds.labels)) if index is None else index
    images = torch.from_numpy(ds.images[index].astype(np.float32)).reshape(-1, 1, 28, 28)
    images = F.pad(images / 255.0, (2, 2, 2, 2)).repeat(1, 3, 1, 1)
    images = (images - 0.5) / 0.5
    labels = torch.from_numpy(ds.labels[index].astype(np.int64))
    return [{"img": images[i], "label": labels[i]} for i in range(len(index))]


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """Load partition CIFAR10 data.

    mecsim: the embedded MNIST (see _mnist_as_cifar), cut as IidPartitioner cuts it
    (equal contiguous shards), split 80/20 with seed 42; DataLoaders as before."""
    import numpy as np

    from mecsim.data.datasets import load_embedded_mnist

    n = len(load_embedded_mnist().labels)
    shard = np.array_split(np.arange(n), num_partitions)[partition_id]
    order = np.random.default_rng(42).permutation(len(shard))
    n_test = int(round(0.2 * len(shard)))
    trainloader = DataLoader(
        _mnist_as_cifar(shard[order[n_test:]]), batch_size=batch_size, shuffle=True
    )
    testloader = DataLoader(_mnist_as_cifar(shard[order[:n_test]]), batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    """Load test set and return dataloader.

    mecsim: the whole embedded MNIST (see _mnist_as_cifar), 128 a batch as before."""
    return DataLoader(_mnist_as_cifar(), batch_size=128)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
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
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy
