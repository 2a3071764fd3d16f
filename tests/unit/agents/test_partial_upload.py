"""An upload of another size than the server's upload_size() is refused before
aggregation, and the refusal says what to change."""

from __future__ import annotations

import numpy as np
import pytest

from mecsim.agents.algorithms.base import AlgorithmError, ClientResult, check_upload


def result(values: int) -> ClientResult:
    return ClientResult(
        client_id=0,
        weights=np.zeros(values, dtype=np.float32),
        upload_nbytes=4 * values,
        num_samples=1,
        train_loss=0.0,
        trace=(),
        flops=1.0,
        steps=1,
        peak_memory_bytes=0,
    )


def test_an_upload_of_part_of_the_model_is_refused_naming_upload_size() -> None:
    check_upload("fedrep", result(582_026), 582_026)
    check_upload("fedrep", result(576_896), None)  # None: uploads vary in size
    with pytest.raises(AlgorithmError) as caught:
        check_upload("fedrep", result(576_896), 582_026)
    said = str(caught.value)
    assert said.startswith(
        "algorithm 'fedrep': client 0 uploaded 576896 values, the server expects 582026"
    )
    assert "override the server class's upload_size() to return that part's size" in said
