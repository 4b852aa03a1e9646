"""Cache eviction and admission policies: interfaces, registry by name, contract kit and cache simulator.

How the pieces fit (a cache or table owner only needs the first three):

* :mod:`~torchrec_ascend.policies.base`: the interfaces (:class:`EvictionPolicy`, :class:`AdmissionPolicy`) and
  :class:`PolicySpec`, what plugins return from the ``torchrec_ascend_policies`` hook.
* :mod:`~torchrec_ascend.policies.registry`: ``create_eviction_policy(name, capacity, **options)``,
  ``create_admission_policy(name, **options)``, ``list_policies()``; names such as ``"ttl+lfu"`` compose
  (:mod:`~torchrec_ascend.policies.compose`), and every policy comes wrapped in a validating
  :mod:`~torchrec_ascend.policies.checked` wrapper.
* :mod:`~torchrec_ascend.policies.cadence`: when and how much to evict, with minimum-residency protection.
* Building blocks for policy authors: :mod:`~torchrec_ascend.policies.scored` (per-slot scores, the lowest chosen
  by one native radix selection), :mod:`~torchrec_ascend.policies.key_table` (bounded key -> score table),
  ``hashing``, ``options``.
* Tools: :mod:`~torchrec_ascend.policies.contract` (``check_policy``: hypothesis checks every policy must pass)
  and :mod:`~torchrec_ascend.policies.simulator` (hit rates against Belady's optimum on the
  :mod:`~torchrec_ascend.policies.traces`).

The built-in policies live in ``builtin/`` (import name ``torchrec_ascend.policies.builtin``) and load
through the entry point ``builtin_policies``, exactly like third-party ones (``plugins/s3fifo``).

Example::

    from torchrec_ascend.policies.registry import create_eviction_policy
    policy = create_eviction_policy("lfu", capacity=100_000)
"""
