"""The conformance suite: does this install behave like TorchRec's reference semantics on this device?

Run it with ``torchrec-ascend conformance [--device cpu|cuda|npu] [--emulate] [--world-size N] [--policy NAME ...]
[--quick] [--junit FILE] [--only CHECK ...]``, or through pytest (the same checks, the same options)::

    pytest -p torchrec_ascend.conformance_tests.pytest_plugin --pyargs torchrec_ascend.conformance_tests \\
        --conformance-device npu --conformance-world-size 8

Layout: ``test_<check>.py`` is one check (injection, sharding, hash_tables, key_value, pipeline, checkpoint,
policies, errors); ``cases.py`` derives each check's cases from the device's backend profile; ``config.py`` holds
the run's settings; ``harness.py`` and ``pytest_plugin.py`` are the pytest glue and the summary table
(``summary.py``). The multi-process scripts the checks launch through ``launch.py`` live in ``stock/`` (stock
torch and torchrec only), ``plugin/``, ``pipeline/``, ``errors/``; ``injection/`` holds the doctor probe;
``emulated_run.py`` starts a script on ``torchrec_ascend.testing``'s emulated NPU (``--device npu --emulate``).

Every case that trains reports where its parameters, optimizer state, batches and outputs lived; a case that
trained anywhere but the device under test fails, and a run that checked nothing (every case skipped, or the device
absent) exits non-zero. On the emulated NPU the per-batch parts' host<->device copies and host syncs are counted
and held to their budgets (``harness.TRANSFER_BUDGET``).
"""
