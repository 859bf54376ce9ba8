"""The checkpoints capability: LangGraph graph state (threads, checkpoints, blobs, pending writes)."""
