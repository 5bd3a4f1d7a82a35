"""What a request is, and what happens to it before a worker runs it.

- ``inference``: the request and answer types between the fronts and the data plane.
- ``checks``: a request checked against its model before any data is decoded.
- ``parameters``, ``tensors``, ``images``, ``classification``: parameters, JSON values and
  BYTES, encoded images, Triton's classification extension.
- ``placement``: checked inputs into shared memory; ``client_regions``: clients' registered
  regions, over ``region_use`` (one region, a request's hold on it), ``region_parameters``
  (a tensor's shared-memory parameters) and ``shm_objects`` (a key's object, opened);
  ``json_offload``: large JSON bodies parsed by a worker; ``echo``: models the front
  answers itself.
- ``sequence_params``: ``sequence_id``, ``sequence_start``, ``sequence_end`` of a sequence
  model's request.
"""
