"""The process's plumbing, used by every layer above: listening sockets (``listeners``),
byte I/O under the protocols (``http_io``), work kept off the event loop (``off_loop``),
memory returned to the system (``memory_trim``), the garbage collector's settings
(``collector``), busy polling at low load (``busy_poll``), the loop's CPU beside its worker
(``colocation``), what a client's cancelled requests still cost the workers
(``abandoned_work``), a client connection's share of the workers' queues
(``worker_share``) and starting the child programs, workers and other HTTP fronts
(``workerproc``).
"""
