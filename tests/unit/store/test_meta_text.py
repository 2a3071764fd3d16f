"""run.json's text with unchanged values' text kept (mecsim.store.runfolder.MetaText):
byte for byte ``json.dumps(meta, indent=1)``, call after call, as values change, are
mutated in place, or change type but not value."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mecsim.store.runfolder import MetaText

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)
_metas = st.dictionaries(st.text(max_size=6), _values, max_size=6)


@pytest.mark.slow  # 300 nested examples: 18-27 s on a loaded 2-core machine
@settings(max_examples=300, deadline=None)
@given(st.lists(_metas, min_size=1, max_size=5))
def test_every_call_is_json_dumps_indent_1(metas) -> None:
    text = MetaText()
    for meta in metas:
        assert text(meta) == json.dumps(meta, indent=1)


def test_values_mutated_in_place_or_equal_of_another_type_are_encoded_again() -> None:
    text = MetaText()
    devices = ["rpi3b"] * 3
    meta = {"rounds_done": 1, "client_devices": devices, "faults": [], "x": 0.0}
    assert text(meta) == json.dumps(meta, indent=1)
    devices.append("rpi4")  # the same list object, one more client
    meta["faults"].append({"round": 1, "kind": "crash"})
    meta["rounds_done"] = True  # == 1, encoded "true"
    meta["x"] = -0.0  # == 0.0, encoded "-0.0"
    out = text(meta)
    assert out == json.dumps(meta, indent=1)
    assert '"rpi4"' in out and '"rounds_done": true' in out and '"x": -0.0' in out
    assert text({}) == "{}"
