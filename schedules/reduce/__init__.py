"""Reductions: whole-tensor and per-row reductions with the vector split (``reduction``), and the
row operators softmax, layer norm, RMS norm and row sums (``rows``)."""
