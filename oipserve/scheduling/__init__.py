"""The dynamic batcher: a ``dynamic_batching`` block as a policy (``policy``), the per-version
queues and batch formation (``scheduler``), and its microsecond timer (``precise_timer``).
The sequence batcher's lanes, slots and batch rows (``sequence``).
"""
