"""The batcher's records: queued slice runs sort by priority, payload left out."""

from __future__ import annotations

from imaging_ai.batch_requests import ResultSlot, SliceRequest, SliceWork


def test_requests_sort_urgent_first_then_deadline_then_arrival() -> None:
    slot = ResultSlot(1)

    def req(rank: int, deadline: float, ns: int) -> SliceRequest:
        return SliceRequest(rank, deadline, ns, SliceWork(f"{rank}/{deadline}/{ns}", 0, (0,), slot))

    requests = [req(1, 50.0, 1), req(1, 10.0, 3), req(0, 99.0, 4), req(1, 10.0, 2)]
    ordered = [r.payload.study for r in sorted(requests)]
    assert ordered == ["0/99.0/4", "1/10.0/2", "1/10.0/3", "1/50.0/1"]
    assert req(0, 1.0, 1).priority == (0, 1.0, 1)
