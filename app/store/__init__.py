"""The store capability: LangGraph's long-term memory (``BaseStore``) as a gateway capability.

Items live under a tuple namespace (LangGraph's, inside the gateway namespace that is the tenant)
with a key, a JSON object value, timestamps and an optional TTL; each item's vectors (one per
embedded field) are written with it, in one transaction of the vectors database. See
``app.store.capability``.
"""
