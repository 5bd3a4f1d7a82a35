"""Model versions and how they come and go.

- ``registry``: versions and their readiness (``ModelRegistry``).
- ``manager``: loading, reloading and unloading versions on workers (``ModelManager``);
  ``instance_groups``: where a version's instances go (its ``instance_group`` resolved as
  Triton does); ``composing``: an ensemble's composing models, loaded and unloaded with it.
- ``repository``: the repository directory and its version policy; ``uploads``: files sent
  with a load.
- ``metadata``: tensor metadata; ``autofill``: a missing or partial configuration completed
  from the graph, as Triton does; ``labels``: an output's label files; ``config_response``:
  the config extension's answer.
- ``config/``: ``config.pbtxt`` parsed against Triton's proto.
- ``ensemble``: an ensemble's version (ready while its steps' models are) and its load-time
  checks against them (docs/ensembles.md).
"""
