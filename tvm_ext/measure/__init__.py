"""Building and measuring a candidate: compiled programs (``program``), the builder's pool
(``builder``), measurement jobs as data (``measure``) and the runners that run them (``runner``),
the backends' executors (``executors``), output checks (``checks``), the timing protocol
(``timing``, ``cuda_graph``) and the worker processes' pools and lifetimes (``pools``, ``lifetime``)."""
