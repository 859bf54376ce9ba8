"""The counters capability: named 64-bit counters per namespace, kept outside the gateway's tree.

It exists for ``tests/test_capability_model.py``, which serves it with one setting
(``extra_capabilities: ["tests.counters.capability:CAPABILITY"]``), and it is written exactly as
``docs/architecture.md`` ("How to add a capability") says: one package, plain FastAPI and
SQLAlchemy, its samples for the shared tests, its table created by its lifecycle.
"""
