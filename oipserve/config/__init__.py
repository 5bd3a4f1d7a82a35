"""What the operator decided, read once: one frozen ``Settings`` from the flags and
``OIPSERVE_*`` variables (``settings``; the command line's flags and help in ``flags``), and
the restricted-API groups with their flags' syntax (``access``), and the flags of Triton's that
take items (``metrics_config``, ``cache_config``, ``backend_config``).
"""
