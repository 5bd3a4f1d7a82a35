"""What the server tells operators: per-version statistics recorded on the inference path
(``stats``), the statistics extension's answer (``stats_report``), and ``/metrics`` in
Triton's names (``metrics/``).
"""
