"""imaging-ai's development kit: what the tests, benchmarks and training use, never the daemon.

``phantom`` (synthetic chest CT with truth), ``bench`` (the `imaging-ai bench` benchmarks and
the daemon-as-a-subprocess harness), ``fake_engines`` (a fixed-latency backend, a failing GPU),
``faults`` (the plans behind IMAGING_AI_FAULT), ``mllp_listener`` (a stand-in RIS), ``commands``
(`imaging-ai phantom` and `imaging-ai bench`) and ``warm_fixture`` (writes the daemon's warm-up
fixture). It reaches the daemon only through the daemon's extension points
(`imaging_ai.plugins`), registered in ``devkit/pyproject.toml``.
"""
