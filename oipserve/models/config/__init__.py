"""``config.pbtxt`` parsed against Triton's ``model_config.proto`` (``parse``), what oipserve
does with every field (``fields``), Triton's JSON form (``json_form``), and ONNX Runtime's
session parameters (``session_options``), and ``sequence_batching`` (``sequence``), and
``ensemble_scheduling`` (``ensemble``).
"""
