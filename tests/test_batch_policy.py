"""The batch-size policy and its knobs: preferred sizes, then the max, then the queue delay."""

from __future__ import annotations

import pytest

from imaging_ai.batch_policy import BatchingConfig, choose_batch_size


def test_batch_size_prefers_preferred_sizes_then_max_then_waits() -> None:
    plain = BatchingConfig(max_batch_size=8)
    assert choose_batch_size(3, plain, expired=False) == 0
    assert choose_batch_size(3, plain, expired=True) == 3
    assert choose_batch_size(20, plain, expired=False) == 8
    preferred = BatchingConfig(max_batch_size=8, preferred_batch_sizes=(2, 4))
    assert choose_batch_size(3, preferred, expired=False) == 2
    assert choose_batch_size(7, preferred, expired=False) == 4
    assert choose_batch_size(1, preferred, expired=True) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": 4, "preferred_batch_sizes": (8,)}, "preferred_batch_sizes"),
        ({"max_queue_delay_ms": -1.0}, "max_queue_delay_ms"),
        ({"max_batch_size": 8, "max_pending": 4}, "max_pending"),
    ],
)
def test_config_names_the_bad_knob(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchingConfig(**kwargs)  # type: ignore[arg-type]
