"""Takes a model's batching knobs and the slices waiting; gives how many to batch now.

Triton's dynamic-batcher policy: a batch leaves at once when the waiting slices fill a preferred
size (or the max batch size), else once its oldest slice has waited the max queue delay
(`imaging_ai.batch_queue.SliceQueue.take` waits for that); `BatchingConfig` holds the knobs and
the bound on slices queued per model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchingConfig:
    """Triton's knobs (max batch size, preferred batch sizes, max queue delay) and a queue bound.

    `max_pending` is the most slices queued for the model at once; `infer` blocks beyond it.
    """

    max_batch_size: int = 32
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ms: float = 5.0
    max_pending: int = 512

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size = {self.max_batch_size}: expected >= 1")
        bad = [s for s in self.preferred_batch_sizes if not 1 <= s <= self.max_batch_size]
        if bad:
            raise ValueError(
                f"preferred_batch_sizes = {self.preferred_batch_sizes}: {bad} outside "
                f"1..max_batch_size ({self.max_batch_size})"
            )
        if self.max_queue_delay_ms < 0:
            raise ValueError(f"max_queue_delay_ms = {self.max_queue_delay_ms}: expected >= 0")
        if self.max_pending < self.max_batch_size:
            raise ValueError(
                f"max_pending = {self.max_pending}: expected >= max_batch_size "
                f"({self.max_batch_size}), so that a full batch can queue"
            )


def choose_batch_size(waiting: int, config: BatchingConfig, expired: bool) -> int:
    """How many of the `waiting` requests to batch now; 0 means wait for more.

    Parameters
    ----------
    waiting : int
        Requests in the queue.
    config : BatchingConfig
        The model's batching knobs.
    expired : bool
        The oldest request has waited the max queue delay (or the batcher is draining).

    Returns
    -------
    int
        The largest preferred size `waiting` fills; else a full max batch; else, once expired,
        everything waiting; else 0.
    """
    fits = [s for s in config.preferred_batch_sizes if s <= waiting]
    if fits:
        return max(fits)
    if waiting >= config.max_batch_size:
        return config.max_batch_size
    return waiting if expired else 0
