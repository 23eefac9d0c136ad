"""The tuning core: knob spaces and configs (``space``), the template interface (``template``),
search strategies (``search``), the driver that proposes, builds, measures and records (``tuner``),
records on disk (``records``), the errors users see (``errors``), and ``session``, the one place
that assembles them from options."""
