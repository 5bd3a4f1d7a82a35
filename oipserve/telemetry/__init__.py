"""What the server tells operators: per-version statistics recorded on the inference path
(``stats``; ``stats_row``: a version's counters as another HTTP front sends them), the
statistics extension's answer (``stats_report``), and ``/metrics`` in Triton's names
(``metrics/``).
"""
