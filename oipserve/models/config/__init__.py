"""``config.pbtxt`` parsed against Triton's ``model_config.proto`` (``parse``), what oipserve
does with every field (``fields``), Triton's JSON form (``json_form``), and ONNX Runtime's
session parameters (``session_options``), and ``sequence_batching`` (``sequence``), and
``ensemble_scheduling`` (``ensemble``), ragged batching's ``allow_ragged_batch``,
``batch_input`` and ``batch_output`` (``batch_io_config``), and padded batching's
``pad_batch`` parameter (``padding_config``).
"""
