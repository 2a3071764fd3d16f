"""The ``training:`` section (local epochs, optimiser) and the ``algorithm:`` section
(its name and its own ``params``, validated by the algorithm's ``Params`` model)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

import mecsim.registry as registry
from mecsim.scenario.schema.base import MAX_COUNT, PositiveFloat, _loc, _resolvable, _Strict


class TrainingConfig(_Strict):
    epochs: int = Field(default=1, ge=1, description="local epochs per round (E)")
    batch_size: int = Field(default=32, ge=1, le=MAX_COUNT)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: PositiveFloat = 0.01
    momentum: float = Field(default=0.0, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)


class AlgorithmConfig(_Strict):
    name: str = Field(default="fedavg", description="fedavg, local, ... (see `mecsim algorithms`)")
    params: dict[str, Any] = Field(default_factory=dict, description="algorithm hyper-parameters")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        _resolvable(registry.ALGORITHMS, name)
        registry.algorithm(name)  # PluginError (a ValueError): fails to import, not a pair
        return name

    @model_validator(mode="after")
    def _params_fit(self) -> AlgorithmConfig:
        """Validate ``params`` against the algorithm's own Params model."""
        server_cls, _ = registry.algorithm(self.name)
        try:
            server_cls.Params(**self.params)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ValueError(
                f"params.{_loc(err['loc'])}: {err['msg']} (algorithm {self.name})"
            ) from None
        return self


class CompressorConfig(_Strict):
    """What clients' uploads become on the air (docs/compressors.md): a compressor of the
    ``mecsim.compressors`` group, or none."""

    name: str | None = Field(
        default=None,
        description="quantize, topk, random_mask, or a compressor plugin (`mecsim plugins "
        "--kind compressor`); null: uploads go as they are",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="the compressor's parameters (its Params)"
    )

    @field_validator("name")
    @classmethod
    def _known(cls, name: str | None) -> str | None:
        if name is None:
            return None
        _resolvable(registry.COMPRESSORS, name)
        registry.COMPRESSORS.get(name)  # PluginError (a ValueError): fails to import
        return name

    @model_validator(mode="after")
    def _params_fit(self) -> CompressorConfig:
        if self.name is None:
            if self.params:
                raise ValueError("params: no compressor is named (compressor.name is null)")
            return self
        params_model = getattr(registry.COMPRESSORS.get(self.name), "Params", None)
        if params_model is not None:
            try:
                params_model(**self.params)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(
                    f"params.{_loc(err['loc'])}: {err['msg']} (compressor {self.name})"
                ) from None
        return self
