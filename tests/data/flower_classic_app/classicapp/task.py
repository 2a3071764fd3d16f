"""The model and the data (as tests/data/flower_seeded_app's): a small MLP; 200 MNIST
images to train on per partition, 50 to test on."""

import numpy as np
import torch
from torch import nn


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))


def load_data(partition_id: int, num_partitions: int):
    from mecsim.data.datasets import load_embedded_mnist

    ds = load_embedded_mnist()
    # 250 images a partition (wrapping round the 10,000 when there are more than 40)
    idx = (np.arange(250) + partition_id * 250) % len(ds.labels)
    x = torch.from_numpy(ds.images[idx].astype(np.float32) / 255.0)
    y = torch.from_numpy(ds.labels[idx].copy())
    return (x[:200], y[:200]), (x[200:], y[200:])


def train(net: nn.Module, data, epochs: int, lr: float, seed: int) -> float:
    gen = torch.Generator().manual_seed(seed)
    x, y = data
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), 32):
            b = order[i : i + 32]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x[b]), y[b])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return float(np.mean(losses))


def test(net: nn.Module, data) -> tuple[float, float]:
    x, y = data
    with torch.no_grad():
        out = net(x)
        accuracy = float((out.argmax(1) == y).float().mean())
        return float(nn.functional.cross_entropy(out, y)), accuracy
