"""flowerapp: A Flower / PyTorch app."""

import torch
import torch.nn as nn
import torch.nn.functional as F
import numpy as np
from torch.utils.data import DataLoader, Dataset


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


# ---------------------------------------------------------------------------------
# The one change from the app `flwr new` generates (its PyTorch template, Flower 1.24):
# the template's load_data downloads CIFAR-10 from Hugging Face with flwr-datasets and
# transforms it with torchvision. This load_data reads data that are on the machine
# without a download instead: the MNIST test set embedded in mecsim, padded to 32 x 32
# and repeated over three channels so that the template's Net, train and test run
# unchanged. Everything else in this app is the template's code as generated.
# ---------------------------------------------------------------------------------
_images = None  # Cache the data set


class _Partition(Dataset):
    """Items as flwr-datasets gives them: {"img": tensor, "label": int}."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"img": self.images[i], "label": int(self.labels[i])}


def load_data(partition_id: int, num_partitions: int):
    """Load partition MNIST data (IID partitions, as the template's IidPartitioner)."""
    global _images
    if _images is None:
        from mecsim.data.datasets import load_embedded_mnist

        ds = load_embedded_mnist()
        x = torch.from_numpy(ds.images.astype(np.float32) / 255.0)
        x = F.pad(x, (2, 2, 2, 2)).repeat(1, 3, 1, 1)  # 1x28x28 -> 3x32x32
        _images = ((x - 0.5) / 0.5, torch.from_numpy(ds.labels.copy()))
    images, labels = _images
    part = np.array_split(np.arange(len(labels)), num_partitions)[partition_id]
    # Divide data on each node: 80% train, 20% test
    order = np.random.default_rng(42).permutation(part)
    cut = int(round(len(order) * 0.8))
    train_idx, test_idx = order[:cut], order[cut:]
    trainloader = DataLoader(
        _Partition(images[train_idx], labels[train_idx]), batch_size=32, shuffle=True
    )
    testloader = DataLoader(_Partition(images[test_idx], labels[test_idx]), batch_size=32)
    return trainloader, testloader


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
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
    net.eval()
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
