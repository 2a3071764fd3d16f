"""The ``dataset:`` section (its partitions) and the ``model:`` section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

import mecsim.registry as registry
from mecsim.scenario.schema.base import MAX_COUNT, PositiveFloat, _resolvable, _Strict


class IidPartition(_Strict):
    method: Literal["iid"] = "iid"
    samples_per_client: int | None = Field(
        default=None,
        gt=0,
        description="null: split each pool into equal disjoint parts; N: each "
        "client draws N train samples uniformly from the pool (without replacement within "
        "a client; clients may share samples), for more clients than the pool has samples",
    )
    test_samples_per_client: int | None = Field(
        default=None,
        gt=0,
        description="with samples_per_client: each client's test samples (default: 1)",
    )


class DirichletPartition(_Strict):
    method: Literal["dirichlet"]
    alpha: PositiveFloat = Field(description="Dirichlet concentration over clients, per class")
    min_samples: int = Field(default=1, ge=0, description="redraw until every client has this many")


class ShardsPartition(_Strict):
    method: Literal["shards"]
    shards_per_client: int = Field(default=2, ge=1)


class PrimarySecondaryPartition(_Strict):
    method: Literal["primary_secondary"]
    samples_per_client: int = Field(gt=0, le=MAX_COUNT)
    test_samples_per_client: int = Field(gt=0, le=MAX_COUNT)


Partition = Annotated[
    IidPartition | DirichletPartition | ShardsPartition | PrimarySecondaryPartition,
    Field(discriminator="method"),
]


class DatasetConfig(_Strict):
    name: str = Field(
        default="mnist-embedded",
        min_length=1,
        description="mnist-embedded, mnist-embedded-3x32 (the embedded MNIST padded to "
        "32x32 and repeated over 3 channels: a CIFAR-shaped stand-in; nothing is "
        "downloaded), mnist, fashion-mnist, cifar10, cifar100, or a dataset plugin "
        "(`mecsim plugins`)",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        return _resolvable(registry.DATASETS, name)

    root: str | None = Field(
        default=None, min_length=1, description="directory holding the dataset files"
    )
    train_size: int | None = Field(default=None, gt=0, description="train pool size (subsample)")
    test_size: int | None = Field(default=None, gt=0, description="test pool size (subsample)")
    partition: Partition = Field(default_factory=IidPartition)


class ModelConfig(_Strict):
    name: str = Field(
        default="mlp_2nn",
        min_length=1,
        description="mlp_2nn, mtfl_cnn, kapc_cnn, phsfl_cnn, resnet18, or a model plugin "
        "(`mecsim plugins`)",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        return _resolvable(registry.MODELS, name)
